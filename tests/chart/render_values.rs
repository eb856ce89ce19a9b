//! Values users of mature charts expect: security contexts (OpenShift),
//! extra env and volumes, Deployment annotations, revision history, the
//! admin address, the ServiceMonitor's relabelings, and the NetworkPolicy.

use serde_json::json;

use crate::helm::*;
use crate::render::assert_restricted;

#[test]
fn security_contexts_are_values_and_openshift_drops_the_ids() {
    let openshift = repo().join("contrib/openshift/values.yaml");
    let r = template("tl", "tl-system", &["-f", openshift.to_str().unwrap()]);
    let pod = &r.get("Deployment")["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(
        *pod,
        json!({ "runAsNonRoot": true, "seccompProfile": { "type": "RuntimeDefault" } }),
        "restricted-v2 assigns user, group and fsGroup itself"
    );
    let sc = &r.container()["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert!(sc["runAsUser"].is_null());
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));

    // Defaults: restricted, with fixed ids; each field can be overridden.
    assert_restricted(&template("tl", "tl-system", &[]));
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "podSecurityContext.runAsUser=1001,securityContext.readOnlyRootFilesystem=false",
        ],
    );
    let pod = &r.get("Deployment")["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(pod["runAsUser"], 1001);
    assert_eq!(pod["fsGroup"], 65532);
    assert_eq!(
        r.container()["securityContext"]["readOnlyRootFilesystem"],
        false
    );
}

#[test]
fn extra_env_volumes_annotations_and_history_reach_the_deployment() {
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set-json",
            r#"extraEnv=[{"name":"HTTPS_PROXY","value":"http://proxy:3128"},{"name":"TZ","valueFrom":{"configMapKeyRef":{"name":"tz","key":"tz"}}}]"#,
            "--set-json",
            r#"extraVolumes=[{"name":"ca","configMap":{"name":"corp-ca"}}]"#,
            "--set-json",
            r#"extraVolumeMounts=[{"name":"ca","mountPath":"/etc/ssl/corp","readOnly":true}]"#,
            "--set-string",
            "deploymentAnnotations.reloader\\.stakater\\.com/auto=true",
            "--set",
            "revisionHistoryLimit=2",
        ],
    );
    let deploy = r.get("Deployment");
    assert_eq!(
        deploy["metadata"]["annotations"]["reloader.stakater.com/auto"],
        "true"
    );
    assert!(
        deploy["spec"]["template"]["metadata"]["annotations"].is_null(),
        "Deployment annotations stay on the Deployment"
    );
    assert_eq!(deploy["spec"]["revisionHistoryLimit"], 2);
    let env = r.container()["env"].as_array().unwrap().clone();
    let names: Vec<_> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "POD_NAME",
            "POD_NAMESPACE",
            "POD_IP",
            "POD_SERVICE_ACCOUNT",
            "RUST_LOG",
            "HTTPS_PROXY",
            "TZ"
        ]
    );
    assert_eq!(env[6]["valueFrom"]["configMapKeyRef"]["name"], "tz");
    assert_eq!(r.volume("ca")["configMap"]["name"], "corp-ca");
    let mounts = r.container()["volumeMounts"].as_array().unwrap().clone();
    assert!(
        mounts.contains(&json!({ "name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": true }))
    );
    assert!(
        mounts.iter().any(|m| m["name"] == "tmp"),
        "the chart's own mounts stay"
    );
}

#[test]
fn the_admin_server_listens_on_the_pods_own_ip_by_default() {
    let r = template("tl", "tl-system", &[]);
    assert!(
        r.args()
            .contains(&"--admin-addr=$(POD_IP):8080".to_string())
    );
    let env = r.container()["env"].as_array().unwrap().clone();
    let pod_ip = env.iter().find(|e| e["name"] == "POD_IP").expect("POD_IP");
    assert_eq!(
        pod_ip["valueFrom"],
        json!({ "fieldRef": { "fieldPath": "status.podIP" } })
    );
    let r = template(
        "tl",
        "tl-system",
        &["--set", "admin.address=0.0.0.0,admin.port=9090"],
    );
    assert!(r.args().contains(&"--admin-addr=0.0.0.0:9090".to_string()));
    let r = template("tl", "tl-system", &["--set", "admin.address=[::]"]);
    assert!(r.args().contains(&"--admin-addr=[::]:8080".to_string()));
}

#[test]
fn the_service_monitor_takes_a_namespace_and_relabelings() {
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.namespace=monitoring",
            "--set-json",
            r#"metrics.serviceMonitor.relabelings=[{"action":"replace","targetLabel":"cluster","replacement":"prod"}]"#,
            "--set-json",
            r#"metrics.serviceMonitor.metricRelabelings=[{"action":"drop","sourceLabels":["__name__"],"regex":"targetlease_process_.*"}]"#,
        ],
    );
    let sm = r.get("ServiceMonitor");
    assert_eq!(sm["metadata"]["namespace"], "monitoring");
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"],
        json!(["tl-system"]),
        "it still scrapes the release namespace"
    );
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["relabelings"][0]["targetLabel"], "cluster");
    assert_eq!(ep["metricRelabelings"][0]["action"], "drop");
    let plain = template(
        "tl",
        "tl-system",
        &["--set", "metrics.serviceMonitor.enabled=true"],
    );
    let sm = plain.get("ServiceMonitor");
    assert_eq!(sm["metadata"]["namespace"], "tl-system");
    assert!(sm["spec"]["endpoints"][0]["relabelings"].is_null());
}

const POLICY: &[&str] = &[
    "--set",
    "networkPolicy.restrictEgress=true",
    "--set-json",
    r#"networkPolicy.apiServer.to=[{"ipBlock":{"cidr":"10.0.0.1/32"}}]"#,
    "--set-json",
    r#"networkPolicy.store.to=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"data"}},"podSelector":{"matchLabels":{"app":"valkey"}}}]"#,
];

#[test]
fn the_network_policy_admits_the_admin_port_and_reaches_only_dns_the_api_and_the_store() {
    // On by default: the admin port, from the monitoring namespace only.
    let r = template("tl", "tl-system", &[]);
    let np = r.get("NetworkPolicy");
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        np["spec"]["ingress"],
        json!([{ "ports": [{ "port": "admin", "protocol": "TCP" }],
                 "from": [{ "namespaceSelector": { "matchLabels": {
                     "kubernetes.io/metadata.name": "monitoring" } } }] }])
    );
    assert!(
        np["spec"]["egress"].is_null(),
        "egress unrestricted by default"
    );
    assert!(
        template("tl", "tl-system", &["--set", "networkPolicy.enabled=false"])
            .find("NetworkPolicy")
            .is_none(),
        "can be turned off"
    );
    // Restricting egress refuses to render a policy that would cut the
    // operator off.
    refused(
        &["--set", "networkPolicy.restrictEgress=true"],
        "networkPolicy.apiServer.to",
    );
    refused(&POLICY[..4], "networkPolicy.store.to");

    let mut anyone = POLICY.to_vec();
    anyone.extend_from_slice(&["--set-json", "networkPolicy.ingressFrom=[]"]);
    let r = template("tl", "tl-system", &anyone);
    let np = r.get("NetworkPolicy");
    assert_eq!(np["metadata"]["namespace"], "tl-system");
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"],
        r.get("Deployment")["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        np["spec"]["ingress"],
        json!([{ "ports": [{ "port": "admin", "protocol": "TCP" }] }]),
        "the admin port only, from anywhere unless ingressFrom says otherwise"
    );
    let egress = np["spec"]["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 3);
    assert_eq!(
        egress[0]["ports"],
        json!([{ "port": 53, "protocol": "UDP" }, { "port": 53, "protocol": "TCP" }])
    );
    assert_eq!(
        egress[0]["to"][0]["podSelector"]["matchLabels"]["k8s-app"],
        "kube-dns"
    );
    assert_eq!(
        egress[1]["to"],
        json!([{ "ipBlock": { "cidr": "10.0.0.1/32" } }])
    );
    assert_eq!(
        egress[1]["ports"],
        json!([{ "port": 6443, "protocol": "TCP" }, { "port": 443, "protocol": "TCP" }])
    );
    assert_eq!(
        egress[2]["to"][0]["podSelector"]["matchLabels"]["app"],
        "valkey"
    );
    assert_eq!(
        egress[2]["ports"],
        json!([{ "port": 6379, "protocol": "TCP" }])
    );

    let mut more = POLICY.to_vec();
    more.extend_from_slice(&[
        "--set-json",
        r#"networkPolicy.ingressFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#,
        "--set-json",
        r#"networkPolicy.extraEgress=[{"to":[{"ipBlock":{"cidr":"10.1.0.0/16"}}],"ports":[{"port":26379}]}]"#,
    ]);
    let r = template("tl", "tl-system", &more);
    let np = r.get("NetworkPolicy");
    assert_eq!(
        np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    assert_eq!(np["spec"]["egress"][3]["ports"][0]["port"], 26379);
}
