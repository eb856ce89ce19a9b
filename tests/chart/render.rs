//! `helm lint` and `helm template`: what the chart renders for default and
//! non-default values, checked object by object.

use std::process::Command;

use serde_json::json;

use crate::helm::*;
use crate::render_rbac::{DEFAULT_ELECTION_LEASE, DEFAULT_FLOORS, expected_role_rules};

#[test]
fn helm_lint_passes_with_default_and_non_default_values() {
    let chart = chart();
    let out = helm_ok(&["lint", "--strict", "--kube-version", KUBE_VERSION, &chart]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
    helm_ok(&[
        "lint",
        "--strict",
        "--kube-version",
        KUBE_VERSION,
        &chart,
        "--set",
        "replicaCount=3,store.url=rediss://valkey:6380,store.tls.enabled=true,store.tls.existingSecret=valkey-tls",
        "--set",
        "metrics.serviceMonitor.enabled=true,store.auth.existingSecret=valkey-auth",
    ]);
}

#[test]
fn the_chart_ships_the_generated_crd() {
    let generated = std::fs::read_to_string(repo().join("crds/targetlease.dev_targetleases.yaml"))
        .expect("crds/targetlease.dev_targetleases.yaml");
    let shipped = std::fs::read_to_string(
        repo().join("charts/targetlease/crds/targetlease.dev_targetleases.yaml"),
    )
    .expect("charts/targetlease/crds/targetlease.dev_targetleases.yaml");
    assert!(
        shipped == generated,
        "the chart's CRD drifted: cp crds/targetlease.dev_targetleases.yaml charts/targetlease/crds/"
    );
}

// ---------------------------------------------------------- rendering ---

/// Pod Security Standard "restricted", checked field by field.
pub fn assert_restricted(r: &Rendered) {
    let pod = &r.get("Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(pod["securityContext"]["runAsUser"].as_u64().unwrap() > 0);
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod[field].is_null() || pod[field] == false, "{field}");
    }
    let sc = &r.container()["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(sc["capabilities"]["add"].is_null());
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    for v in pod["volumes"].as_array().unwrap() {
        assert!(v["hostPath"].is_null(), "no hostPath volumes");
    }
}

/// Secrets reach the process only as files: no env var carries a value from a Secret.
fn assert_no_secret_in_env(r: &Rendered) {
    let c = r.container();
    assert!(c["envFrom"].is_null(), "no envFrom");
    let names: Vec<_> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert!(
                e["valueFrom"]["secretKeyRef"].is_null(),
                "env from a Secret: {e}"
            );
            e["name"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        names,
        [
            "POD_NAME",
            "POD_NAMESPACE",
            "POD_IP",
            "POD_SERVICE_ACCOUNT",
            "RUST_LOG"
        ]
    );
    assert!(
        !r.args().iter().any(|a| a.starts_with("--password=")),
        "no password flag"
    );
}

#[test]
fn default_values_render_a_restricted_highly_available_operator() {
    let r = template("tl", "tl-system", &[]);
    let kinds: Vec<_> = r.kinds().into_iter().collect();
    assert_eq!(
        kinds,
        [
            "ClusterRole", // the operator's, and the aggregated read-only one
            "ClusterRoleBinding",
            "Deployment",
            "NetworkPolicy", // ingress to the admin port from the monitoring namespace
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy", // status writers, pod marks, lease metadata
            "ValidatingAdmissionPolicyBinding"
        ],
        "no ServiceMonitor by default; the policy without any --api-versions; \
         no Secret (the operator creates the lease-id key)"
    );
    for doc in &r.0 {
        let cluster_scoped = doc["kind"].as_str().unwrap().starts_with("Cluster")
            || doc["kind"]
                .as_str()
                .unwrap()
                .starts_with("ValidatingAdmissionPolicy");
        assert_eq!(
            doc["metadata"]["namespace"].is_null(),
            cluster_scoped,
            "{}",
            doc["kind"]
        );
        if !cluster_scoped {
            assert_eq!(doc["metadata"]["namespace"], "tl-system");
        }
    }

    let deploy = r.get("Deployment");
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(
        deploy["spec"]["strategy"]["type"], "RollingUpdate",
        "with election, new pods stand by until the old leader hands over"
    );
    let pod = &deploy["spec"]["template"];
    assert_eq!(pod["spec"]["serviceAccountName"], "tl-targetlease");
    let selector = &deploy["spec"]["selector"]["matchLabels"];
    for (k, v) in selector.as_object().unwrap() {
        assert_eq!(&pod["metadata"]["labels"][k], v);
    }
    assert_restricted(&r);
    assert_no_secret_in_env(&r);

    let c = r.container();
    assert_eq!(
        c["ports"],
        json!([{ "name": "admin", "containerPort": 8080, "protocol": "TCP" }])
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(
        c["env"][0],
        json!({ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } })
    );
    assert_eq!(
        c["env"][1],
        json!({ "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } })
    );
    let args = r.args();
    for expected in [
        "operator",
        "--store-url=redis://valkey:6379",
        "--lease-id-key-secret=tl-targetlease-lease-id-key",
        "--floor-namespace=tl-system",
        "--floor-configmap=targetlease-token-floors",
        "--admin-addr=$(POD_IP):8080",
        "--leader-election",
        "--leader-election-namespace=tl-system",
        "--leader-election-lease=targetlease-operator",
        "--leader-election-duration=15s",
        "--leader-election-renew-deadline=10s",
        "--leader-election-retry-period=2s",
        "--log-format=json",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--password-file")));
    assert!(!args.iter().any(|a| a.starts_with("--tls-")));
    assert!(!args.iter().any(|a| a.starts_with("--watch-namespace")));

    assert_eq!(deploy["spec"]["revisionHistoryLimit"], 5);
    // The lease-id key comes from the API (tests/chart/gitops.rs), not a file.
    assert!(!args.iter().any(|a| a.starts_with("--lease-id-key-file")));
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    assert!(!volumes.iter().any(|v| v["name"] == "lease-id-key"));

    let pdb = r.get("PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], selector);

    let svc = r.get("Service");
    assert_eq!(
        svc["spec"]["ports"],
        json!([{ "name": "metrics", "port": 8080, "targetPort": "admin", "protocol": "TCP" }])
    );
    assert_eq!(&svc["spec"]["selector"], selector);
}

const NON_DEFAULT: &[&str] = &[
    "--set",
    "replicaCount=3",
    "--set",
    "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "--set",
    "store.url=rediss://valkey.data.svc:6380,valkey.durability=replicas:1,store.keyPrefix=tl",
    "--set",
    "store.auth.username=targetlease,store.auth.existingSecret=valkey-auth,store.auth.passwordKey=pw",
    "--set",
    "store.tls.enabled=true,store.tls.existingSecret=valkey-tls,store.tls.certKey=tls.crt,store.tls.keyKey=tls.key",
    "--set",
    "store.tls.serverName=valkey.internal",
    "--set",
    "leaseIdKey.existingSecret=my-lease-id-key",
    "--set",
    "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.labels.release=prom",
    "--set",
    "admissionPolicy.enabled=false",
    "--set",
    "operator.watchNamespace=apps,operator.concurrency=4,operator.logFormat=text",
    "--set",
    "podDisruptionBudget.maxUnavailable=2",
];

#[test]
fn non_default_values_render_tls_an_existing_password_and_a_service_monitor() {
    let r = template("prod", "ops", NON_DEFAULT);
    assert_eq!(r.get("Deployment")["spec"]["replicas"], 3);
    assert_eq!(
        r.container()["image"],
        "ghcr.io/targetlease/targetlease@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    );
    assert!(
        !r.kinds().contains("ValidatingAdmissionPolicy"),
        "turned off"
    );
    assert!(r.find("Secret").is_none(), "an existing lease-id key");
    assert_eq!(
        r.release_role()["rules"],
        expected_role_rules(
            DEFAULT_FLOORS,
            Some("apps"),
            Some(DEFAULT_ELECTION_LEASE),
            None
        ),
        "with an existing key Secret the operator gets no access to Secrets"
    );
    assert_restricted(&r);
    assert_no_secret_in_env(&r);

    let args = r.args();
    for expected in [
        "--store-url=rediss://valkey.data.svc:6380",
        "--durability=replicas:1",
        "--key-prefix=tl",
        "--username=targetlease",
        "--password-file=/etc/targetlease/store-auth/password",
        "--tls-ca-file=/etc/targetlease/store-tls/ca.crt",
        "--tls-cert-file=/etc/targetlease/store-tls/tls.crt",
        "--tls-key-file=/etc/targetlease/store-tls/tls.key",
        "--tls-server-name=valkey.internal",
        "--watch-namespace=apps",
        "--concurrency=4",
        "--log-format=text",
        "--floor-namespace=ops",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    // Each file flag points into a read-only mount of the right Secret key.
    let mounts = r.container()["volumeMounts"].as_array().unwrap().clone();
    let mount = |name: &str| {
        let m = mounts.iter().find(|m| m["name"] == name).unwrap();
        assert_eq!(m["readOnly"], true, "{name}");
        m["mountPath"].as_str().unwrap().to_string()
    };
    assert_eq!(mount("store-auth"), "/etc/targetlease/store-auth");
    assert_eq!(mount("store-tls"), "/etc/targetlease/store-tls");
    assert_eq!(mount("lease-id-key"), "/etc/targetlease/lease-id");
    assert_eq!(
        r.volume("store-auth")["secret"],
        json!({ "secretName": "valkey-auth", "defaultMode": 0o440,
                "items": [{ "key": "pw", "path": "password" }] })
    );
    assert_eq!(
        r.volume("store-tls")["secret"]["items"],
        json!([{ "key": "ca.crt", "path": "ca.crt" }, { "key": "tls.crt", "path": "tls.crt" },
               { "key": "tls.key", "path": "tls.key" }])
    );
    assert_eq!(
        r.volume("lease-id-key")["secret"]["secretName"],
        "my-lease-id-key"
    );

    let sm = r.get("ServiceMonitor");
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(
        sm["spec"]["selector"]["matchLabels"],
        r.get("Service")["metadata"]["labels"]
            .as_object()
            .map(|l| {
                json!({
                    "app.kubernetes.io/name": l["app.kubernetes.io/name"],
                    "app.kubernetes.io/instance": l["app.kubernetes.io/instance"],
                })
            })
            .unwrap()
    );
    assert_eq!(r.get("PodDisruptionBudget")["spec"]["maxUnavailable"], 2);
}

/// The chart and the binary agree on flag names: `targetlease <rendered args> --help`
/// fails on any flag the binary does not know or a value it cannot parse.
#[test]
fn the_binary_accepts_the_rendered_arguments() {
    for (what, r) in [
        ("default", template("tl", "tl-system", &[])),
        ("non-default", template("prod", "ops", NON_DEFAULT)),
    ] {
        // As the kubelet expands `$(POD_IP)`, in a pod of either family.
        for pod_ip in ["10.1.2.3", "fd00::5"] {
            let args: Vec<String> = r
                .args()
                .iter()
                .map(|a| a.replace("$(POD_IP)", pod_ip))
                .collect();
            let out = Command::new(env!("CARGO_BIN_EXE_targetlease"))
                .args(&args)
                .arg("--help")
                .output()
                .expect("run targetlease");
            assert!(
                out.status.success(),
                "{what} values: `targetlease {}` is refused:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
