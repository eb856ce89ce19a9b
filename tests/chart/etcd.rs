//! The operator as the chart configures it for an existing etcd: a real
//! 3-member cluster serving clients over TLS only, with
//! `--client-cert-auth` and user authentication on (the role
//! docs/install.md gives). The chart is rendered with the values
//! docs/install.md shows, its Secrets are real Secrets on the API server,
//! mounted where the rendered pod mounts them (as the kubelet would: each
//! item of each Secret volume at `mountPath/path`), and the binary runs with
//! the rendered arguments as the chart's ServiceAccount. It holds a lease
//! in etcd, hands it over and releases it there.

use std::collections::BTreeMap;
use std::path::Path;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, Permission, TlsOptions};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;
use targetlease::operator::crd::Phase;
use targetlease::store::etcd::{EtcdConfig, EtcdStore};
use targetlease::store::valkey::{Secret as Password, TlsFiles};
use targetlease::store::{LeaseStore, Outcome, Target};

use crate::cluster::{SOON, install_identity, service_account_kubeconfig};
use crate::helm::{Rendered, template};
use crate::support::etcd_cluster::{ClientTls, EtcdCluster};
use crate::support::operator_env::{OperatorEnv, summary};
use crate::support::tls::{Issued, TestCa};

const PASSWORD: &str = "chart-etcd-pw-Tz58";

/// Arguments the test environment gives every operator itself (its own
/// admin port, lease-id key file and namespaces): the rendered ones for
/// these are left out.
const ENV_OWN: [&str; 5] = [
    "--admin-addr",
    "--lease-id-key-secret",
    "--lease-id-key-file",
    "--floor-namespace",
    "--watch-namespace",
];

#[tokio::test]
async fn the_charts_operator_holds_a_lease_in_etcd_over_tls_with_a_user() {
    let mut env = OperatorEnv::start_without_operator("chart-etcd").await;
    let (cp, ns) = (env.cp, env.ns.clone());
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "etcd");
    let member = ca.issue("etcd-member", &["127.0.0.1"], false);
    // Its common name is no etcd user: etcd would take it for the user name
    // of a request without a password's token, so only the password lets
    // this certificate's holder in.
    let client = ca.issue("operator-client", &[], true);
    let cluster = {
        let tls = ClientTls {
            cert: member.cert.clone(),
            key: member.key.clone(),
            client_ca: Some(ca.ca_file()),
        };
        tokio::task::spawn_blocking(move || EtcdCluster::start_tls(tls))
            .await
            .expect("start the etcd cluster")
    };
    enable_auth(&cluster, &ca, &client).await;

    // The Secrets docs/install.md has the user create.
    let file = |p: &Path| std::fs::read(p).unwrap();
    create_secret(
        &env,
        "etcd-client-tls",
        [
            ("ca.crt", file(&ca.ca_file())),
            ("tls.crt", file(&client.cert)),
            ("tls.key", file(&client.key)),
        ],
    )
    .await;
    create_secret(
        &env,
        "targetlease-etcd",
        [("password", PASSWORD.as_bytes().to_vec())],
    )
    .await;

    // The chart's identity and RBAC, then its Deployment with the etcd values.
    let release = install_identity(cp, &ns).await;
    let values = dir.path().join("etcd-values.yaml");
    std::fs::write(&values, documented_values(&cluster.url(), &ns)).unwrap();
    let values = values.to_str().unwrap();
    let rendered = template(
        &ns,
        &ns,
        &["-f", values, "--show-only", "templates/deployment.yaml"],
    );
    let root = dir.path().join("pod");
    mount_secrets(&env, &rendered, &root).await;
    let (url, args) = operator_args(&rendered, &root);
    assert!(url.starts_with("etcds://"), "{url}");
    for expected in [
        "--username=targetlease",
        "--password-file=",
        "--tls-cert-file=",
    ] {
        assert!(
            args.iter().any(|a| a.starts_with(expected)),
            "{expected} in {args:?}"
        );
    }

    let kubeconfig =
        service_account_kubeconfig(cp, &ns, &release.service_account, dir.path()).await;
    env.run_operators_as(kubeconfig);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    env.start_operator_on(&url, &args);

    // What the operator holds is in etcd, read as the same user over TLS.
    let store = EtcdStore::connect(&EtcdConfig {
        url: url.clone(),
        username: Some("targetlease".into()),
        password: Some(Password::new(PASSWORD)),
        tls: TlsFiles {
            ca_file: Some(ca.ca_file()),
            cert_file: Some(client.cert.clone()),
            key_file: Some(client.key.clone()),
            server_name: None,
        },
        ..EtcdConfig::default()
    })
    .await
    .expect("connect to etcd as the targetlease user");
    let target = Target::new(&ns, "ledger");
    // The cluster does demand both: without the user's password, or without
    // the client certificate, nothing is read.
    let tls = |cert: bool| TlsFiles {
        ca_file: Some(ca.ca_file()),
        cert_file: cert.then(|| client.cert.clone()),
        key_file: cert.then(|| client.key.clone()),
        server_name: None,
    };
    for (what, username, password, tls) in [
        ("no user", None, None, tls(true)),
        (
            "no client certificate",
            Some("targetlease".to_string()),
            Some(Password::new(PASSWORD)),
            tls(false),
        ),
    ] {
        let cfg = EtcdConfig {
            url: url.clone(),
            username,
            password,
            tls,
            ..EtcdConfig::default()
        };
        if let Ok(other) = EtcdStore::connect(&cfg).await {
            let got = other.get(&target).await;
            assert!(got.is_err(), "{what}: read {got:?}");
        }
    }
    let spec = |id: &str| json!({ "target": "ledger", "holder": { "identity": id } });
    env.create("first", spec("first")).await;
    let first = env.wait_phase("first", Phase::Held, SOON).await;
    assert_eq!(
        summary(&first),
        (Some(Phase::Held), Some("first".into()), Some(1)),
        "operator log:\n{}",
        env.operator_log(0)
    );
    let got = store.get(&target).await.unwrap();
    assert_eq!(got.outcome, Outcome::Found, "{got:?}");
    let lease = got.lease.unwrap();
    assert_eq!((lease.owner.as_str(), lease.fencing_token), ("first", 1));
    let in_valkey = env.store().await.get(&target).await.unwrap().outcome;
    assert_eq!(in_valkey, Outcome::NotFound, "nothing went to Valkey");

    env.create("second", spec("second")).await;
    env.wait_phase("second", Phase::Pending, SOON).await;
    env.delete("first").await;
    env.wait_gone("first", SOON).await;
    let second = env.wait_phase("second", Phase::Held, SOON).await;
    assert_eq!(summary(&second).2, Some(2));
    env.delete("second").await;
    env.wait_gone("second", SOON).await;
    let got = store.get(&target).await.unwrap();
    assert_eq!(got.outcome, Outcome::NotFound, "released in etcd: {got:?}");

    let log = env.operator_log(0);
    for secret in [PASSWORD, "PRIVATE KEY"] {
        assert!(!log.contains(secret), "the log shows a secret:\n{log}");
    }
}

/// The `etcd-values.yaml` of docs/install.md, its URL naming the test's
/// members, watching the test's namespace.
fn documented_values(url: &str, ns: &str) -> String {
    let doc = std::fs::read_to_string(crate::helm::repo().join("docs/install.md")).unwrap();
    let start = "```yaml\n# etcd-values.yaml\n";
    let block = doc
        .split_once(start)
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("docs/install.md has an etcd-values.yaml block");
    let mut urls = 0;
    let mut values: String = block
        .lines()
        .map(|line| {
            if line.starts_with("  url: etcds://") {
                urls += 1;
                format!("  url: \"{url}\"\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    assert_eq!(
        urls, 1,
        "one etcds:// URL in the documented values:\n{block}"
    );
    values.push_str(&format!("operator: {{watchNamespace: \"{ns}\"}}\n"));
    values
}

/// The documented role on `targetlease/`, given to user `targetlease`;
/// a root user; then auth on. Over TLS with the client certificate, as the
/// members require one.
async fn enable_auth(cluster: &EtcdCluster, ca: &TestCa, client: &Issued) {
    let pem = |p: &Path| std::fs::read(p).unwrap();
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(pem(&ca.ca_file())))
        .identity(Identity::from_pem(pem(&client.cert), pem(&client.key)));
    let endpoints: Vec<String> = cluster
        .endpoints()
        .iter()
        .map(|e| format!("https://{e}"))
        .collect();
    let mut c = Client::connect(endpoints, Some(ConnectOptions::new().with_tls(tls)))
        .await
        .expect("connect to etcd over TLS");
    c.role_add("root").await.unwrap();
    c.user_add("root", "root-pw", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.role_add("targetlease").await.unwrap();
    c.role_grant_permission(
        "targetlease",
        Permission::read_write("targetlease/").with_prefix(),
    )
    .await
    .unwrap();
    c.user_add("targetlease", PASSWORD, None).await.unwrap();
    c.user_grant_role("targetlease", "targetlease")
        .await
        .unwrap();
    c.auth_enable().await.expect("enable auth");
}

async fn create_secret<const N: usize>(env: &OperatorEnv, name: &str, data: [(&str, Vec<u8>); N]) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v)))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("create Secret {name}: {e}"));
}

/// Writes each item of each Secret volume of the rendered pod to
/// `root/<mountPath>/<path>`, from the Secret on the API server.
async fn mount_secrets(env: &OperatorEnv, rendered: &Rendered, root: &Path) {
    let spec = &rendered.get("Deployment")["spec"]["template"]["spec"];
    let mounts = rendered.container()["volumeMounts"].as_array().unwrap();
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns);
    let mut mounted = Vec::new();
    for volume in spec["volumes"].as_array().unwrap() {
        let Some(name) = volume["secret"]["secretName"].as_str() else {
            continue;
        };
        let mount_path = mounts
            .iter()
            .find(|m| m["name"] == volume["name"])
            .and_then(|m| m["mountPath"].as_str())
            .unwrap_or_else(|| panic!("volume {} is not mounted", volume["name"]));
        let data = secrets
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("the pod mounts Secret {name}: {e}"))
            .data
            .unwrap_or_default();
        let dir = root.join(mount_path.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        for item in volume["secret"]["items"].as_array().unwrap() {
            let key = item["key"].as_str().unwrap();
            let value = data
                .get(key)
                .unwrap_or_else(|| panic!("Secret {name} has no key {key}"));
            std::fs::write(dir.join(item["path"].as_str().unwrap()), &value.0).unwrap();
        }
        mounted.push(name.to_string());
    }
    mounted.sort();
    assert_eq!(mounted, ["etcd-client-tls", "targetlease-etcd"]);
}

/// The rendered store URL and the rendered arguments the test environment
/// does not give itself, with the pod's file paths moved under `root`.
fn operator_args(rendered: &Rendered, root: &Path) -> (String, Vec<String>) {
    let args = rendered.args();
    assert_eq!(args.first().map(String::as_str), Some("operator"));
    let url = args
        .iter()
        .find_map(|a| a.strip_prefix("--store-url="))
        .expect("--store-url in the rendered arguments")
        .to_string();
    let prefix = format!("{}/etc/targetlease/", root.display());
    let rest = args[1..]
        .iter()
        .filter(|a| !a.starts_with("--store-url="))
        .filter(|a| !ENV_OWN.iter().any(|own| a.starts_with(own)))
        .map(|a| a.replace("/etc/targetlease/", &prefix))
        .collect();
    (url, rest)
}
