//! The lease-id key generated in the cluster, once, on a real API server:
//! replicas racing to create it agree on one key, an existing Secret is read
//! and never changed, a foreign Secret is refused, and the chart's RBAC is
//! exactly enough. Then the real binary: two operator processes started at
//! once as the chart's ServiceAccount create one Secret between them, and a
//! key Secret planted before the installation is refused.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use targetlease::operator::lease_id::LeaseIdKey;
use targetlease::operator::lease_id::secret::{KeyError, Origin, load_or_create};

use crate::cluster::{SOON, client_from, install_identity, service_account_kubeconfig};
use crate::support::kube_env::{self, eventually};
use crate::support::valkey_server::{ValkeyServer, free_port};

/// The Secret name the chart passes (`<fullname>-lease-id-key`).
fn key_secret_name(args: &[String]) -> String {
    args.iter()
        .find_map(|a| a.strip_prefix("--lease-id-key-secret="))
        .expect("the chart passes --lease-id-key-secret by default")
        .to_string()
}

#[tokio::test]
async fn replicas_racing_for_the_key_agree_on_one_and_never_change_it() {
    let cp = kube_env::shared().await;
    let ns = cp.namespace("chart-key").await;
    let release = install_identity(cp, &ns).await;
    let name = key_secret_name(&release.rendered.args());
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        service_account_kubeconfig(cp, &ns, &release.service_account, dir.path()).await;
    // Eight "replicas", each with its own client authenticated as the
    // chart's ServiceAccount, holding only the chart's RBAC.
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client_from(&kubeconfig).await);
    }
    eventually("RBAC in force for the ServiceAccount", SOON, || {
        let api: Api<Secret> = Api::namespaced(clients[0].clone(), &ns);
        let name = name.clone();
        async move { matches!(api.get_opt(&name).await, Ok(None)).then_some(()) }
    })
    .await;
    let calls = clients.iter().map(|c| load_or_create(c, &ns, &name));
    let results: Vec<_> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("a replica got no key: {e}")))
        .collect();
    let created = results
        .iter()
        .filter(|(_, o)| *o == Origin::Created)
        .count();
    assert_eq!(created, 1, "exactly one replica creates the Secret");
    let derived: BTreeSet<String> = results.iter().map(|(k, _)| k.derive("probe")).collect();
    assert_eq!(derived.len(), 1, "every replica derives the same lease ids");

    // Later starts read it, unchanged.
    let (again, origin) = load_or_create(&clients[0], &ns, &name).await.unwrap();
    assert_eq!(origin, Origin::Existing);
    assert_eq!(Some(&again.derive("probe")), derived.iter().next());

    // It is immutable: not even an admin can change the key in place.
    let secrets: Api<Secret> = Api::namespaced(cp.client(), &ns);
    let secret = secrets.get(&name).await.unwrap();
    assert_eq!(secret.immutable, Some(true));
    let stored = &secret.data.as_ref().unwrap()["key"].0;
    assert_eq!(stored.len(), 64);
    assert_eq!(
        Some(&LeaseIdKey::new(stored).unwrap().derive("probe")),
        derived.iter().next(),
        "every replica uses the key the Secret holds (the winner's)"
    );
    let change = json!({ "data": { "key": "Y2hhbmdlZC1jaGFuZ2VkLWNoYW5nZWQ=" } });
    let refused = secrets
        .patch(&name, &PatchParams::default(), &Patch::Merge(&change))
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "{refused:?}"
    );

    // The chart grants nothing more: another Secret is out of reach (a
    // refusal, reported at once, not retried).
    let other = load_or_create(&clients[0], &ns, "someone-elses").await;
    assert!(
        matches!(&other, Err(KeyError::Permanent(m)) if m.contains("forbidden") || m.contains("cannot get")),
        "{:?}",
        other.map(|(_, o)| o)
    );
}

#[tokio::test]
async fn a_secret_without_the_key_is_refused_not_repaired() {
    let cp = kube_env::shared().await;
    let ns = cp.namespace("chart-key-foreign").await;
    let secrets: Api<Secret> = Api::namespaced(cp.client(), &ns);
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": { "name": "tl-targetlease-lease-id-key" },
        "stringData": { "password": "not ours" },
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let r = load_or_create(&cp.client(), &ns, "tl-targetlease-lease-id-key").await;
    assert!(
        matches!(&r, Err(KeyError::Permanent(m)) if m.contains("has no data key `key`")),
        "{:?}",
        r.map(|(_, o)| o)
    );
    let after = secrets.get("tl-targetlease-lease-id-key").await.unwrap();
    let keys: Vec<_> = after.data.unwrap().into_keys().collect();
    assert_eq!(keys, ["password"], "left as it was");
}

struct Operators(Vec<Child>);

impl Drop for Operators {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Two operator processes (the binary, the chart's arguments for the key,
/// leader election and the floor ConfigMap) start at once as the chart's
/// ServiceAccount in a namespace without the Secret: one creates it, the
/// other reads it, and both stay up.
#[tokio::test]
async fn two_operator_replicas_starting_at_once_create_one_key() {
    let cp = kube_env::shared().await;
    crate::support::operator_env::install_crd(&cp.client()).await;
    let ns = cp.namespace("chart-key-bin").await;
    let release = install_identity(cp, &ns).await;
    let args = release.rendered.args();
    let name = key_secret_name(&args);
    let chart_args: Vec<&String> = args
        .iter()
        .filter(|a| {
            a.starts_with("--lease-id-key-secret")
                || a.starts_with("--floor-configmap")
                || *a == "--leader-election"
                || a.starts_with("--leader-election-lease")
        })
        .collect();
    assert_eq!(chart_args.len(), 4, "{chart_args:?}");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        service_account_kubeconfig(cp, &ns, &release.service_account, dir.path()).await;
    let valkey = ValkeyServer::start();
    let mut operators = Operators(Vec::new());
    let mut logs = Vec::new();
    for i in 0..2 {
        let log = dir.path().join(format!("operator-{i}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_targetlease"))
            .arg("operator")
            .args(&chart_args)
            .args(["--admin-addr", &format!("127.0.0.1:{}", free_port())])
            .args(["--valkey-url", &valkey.url()])
            .args(["--floor-namespace", &ns, "--watch-namespace", &ns])
            .args(["--log-format", "text"])
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", format!("operator-{i}"))
            .env("POD_NAMESPACE", &ns)
            .env("POD_SERVICE_ACCOUNT", &release.service_account)
            .env("RUST_LOG", "targetlease=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start targetlease operator");
        operators.0.push(child);
        logs.push(log);
    }
    let read = |i: usize| std::fs::read_to_string(&logs[i]).unwrap_or_default();
    let origins = eventually("both replicas to have the lease-id key", SOON, || {
        let lines: Vec<String> = (0..2).map(read).collect();
        async move {
            let origins: Vec<&str> = lines
                .iter()
                .filter_map(|l| {
                    // The line that reports the key in use (not a retry warning).
                    l.lines()
                        .filter(|line| line.contains("lease-id key"))
                        .find_map(|line| {
                            ["Created", "Existing"]
                                .into_iter()
                                .find(|o| line.contains(&format!("origin={o}")))
                        })
                })
                .collect();
            (origins.len() == 2).then(|| origins.join(","))
        }
    })
    .await;
    let mut sorted: Vec<&str> = origins.split(',').collect();
    sorted.sort();
    assert_eq!(
        sorted,
        ["Created", "Existing"],
        "logs:\n{}\n---\n{}",
        read(0),
        read(1)
    );
    let secrets: Api<Secret> = Api::namespaced(cp.client(), &ns);
    let secret = secrets
        .get(&name)
        .await
        .expect("the Secret one replica created");
    let key = String::from_utf8(secret.data.unwrap()["key"].0.clone()).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..2 {
        assert!(!read(i).contains(&key), "operator {i} logged the key");
    }
    for (i, child) in operators.0.iter_mut().enumerate() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "operator {i} exited:\n{}",
            read(i)
        );
    }
}

/// Someone allowed to create Secrets in the release namespace plants a key
/// before the chart is installed, hoping to derive every lease id. The
/// operator (the real binary, as the chart's ServiceAccount, with the chart's
/// arguments and its ServiceAccount from the downward API) refuses the key
/// because it predates the installation, exits, and leaves the Secret alone.
#[tokio::test]
async fn a_key_secret_planted_before_the_install_is_refused() {
    let cp = kube_env::shared().await;
    crate::support::operator_env::install_crd(&cp.client()).await;
    let ns = cp.namespace("chart-key-planted").await;
    let name = key_secret_name(&crate::helm::template(&ns, &ns, &[]).args());
    let secrets: Api<Secret> = Api::namespaced(cp.client(), &ns);
    let planted: Secret = serde_json::from_value(json!({
        "metadata": { "name": name },
        "stringData": { "key": "a key the planter knows, long enough to be used" },
    }))
    .unwrap();
    let planted = secrets
        .create(&PostParams::default(), &planted)
        .await
        .unwrap();
    // Creation times have whole seconds.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let release = install_identity(cp, &ns).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        service_account_kubeconfig(cp, &ns, &release.service_account, dir.path()).await;
    let valkey = ValkeyServer::start();
    let log = dir.path().join("operator.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_targetlease"))
        .arg("operator")
        .arg(format!("--lease-id-key-secret={name}"))
        .args(["--admin-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--valkey-url", &valkey.url()])
        .args(["--floor-namespace", &ns, "--watch-namespace", &ns])
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAME", "operator-0")
        .env("POD_NAMESPACE", &ns)
        .env("POD_SERVICE_ACCOUNT", &release.service_account)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start targetlease operator");
    let deadline = std::time::Instant::now() + SOON;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the operator is still running with the planted key:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("before this installation's ServiceAccount"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("a key the planter knows"),
        "the key is never shown: {stderr}"
    );
    let after = secrets.get(&name).await.unwrap();
    assert_eq!(
        after.metadata.resource_version, planted.metadata.resource_version,
        "left as it was"
    );
}
