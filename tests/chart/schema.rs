//! `values.schema.json` (and the template's own checks, for tools that skip
//! the schema) refuse values that would only crash-loop the operator later.

use crate::helm::*;

fn set(s: &str) -> [&str; 2] {
    ["--set", s]
}

#[test]
fn mistakes_that_leak_secrets_or_do_not_exist_are_refused() {
    refused(
        &set("valkey.url=redis://user:secret@valkey:6379"),
        "/valkey/url",
    );
    refused(
        &set("valkey.url=valkey://user:secret@valkey:6379"),
        "/valkey/url",
    );
    for url in [
        "valkey://valkey:6379",
        "valkey-cluster://a:7000",
        "redis://valkey:6379",
    ] {
        accepted(&set(&format!("valkey.url={url}")));
    }
    refused(&set("valkey.url=http://valkey:6379"), "/valkey/url");
    refused(&set("replicas=3"), "replicas");
    refused(&set("replicaCount=0"), "/replicaCount");
    refused(&set("valkey.durability=sometimes"), "/valkey/durability");
    refused(
        &set("valkey.url=rediss://v:6380,valkey.tls.enabled=true"),
        "valkey.tls.enabled needs valkey.tls.existingSecret",
    );
    refused(
        &set(
            "valkey.url=rediss://v:6380,valkey.tls.enabled=true,valkey.tls.existingSecret=s,valkey.tls.certKey=tls.crt",
        ),
        "go together",
    );
}

#[test]
fn durability_needs_at_least_one_replica() {
    refused(
        &set("valkey.durability=replicas:0"),
        "at '/valkey/durability': 'replicas:0' does not match",
    );
    refused(&set("valkey.durability=replicas:"), "/valkey/durability");
    refused(&set("valkey.durability=replicas:01"), "/valkey/durability");
    for ok in ["none", "aof", "replicas:1", "replicas:12"] {
        let r = accepted(&set(&format!("valkey.durability={ok}")));
        assert!(r.args().contains(&format!("--durability={ok}")), "{ok}");
    }
}

#[test]
fn zero_durations_are_refused() {
    for field in [
        "valkey.timeout",
        "leaderElection.leaseDuration",
        "leaderElection.renewDeadline",
        "leaderElection.retryPeriod",
        "metrics.serviceMonitor.interval",
        "metrics.serviceMonitor.scrapeTimeout",
    ] {
        let path = format!("/{}", field.replace('.', "/"));
        for zero in ["0s", "0ms", "00s", "0m0s", "0h"] {
            refused(&set(&format!("{field}={zero}")), &path);
        }
    }
    let r = accepted(&set("valkey.timeout=1500ms"));
    assert!(r.args().contains(&"--timeout=1500ms".to_string()));
    accepted(&set("valkey.timeout=10s,leaderElection.retryPeriod=1s"));
}

#[test]
fn braces_in_the_key_prefix_are_refused() {
    // The keys' hash tags follow the prefix: a brace in it moves every key
    // of a target into another slot, or splits a target across slots.
    for prefix in ["tl{a}", "{tl}", "tl}", "tl{"] {
        refused(
            &["--set-string", &format!("valkey.keyPrefix={prefix}")],
            "/valkey/keyPrefix",
        );
    }
    refused(&["--set-string", "valkey.keyPrefix="], "/valkey/keyPrefix");
    let r = accepted(&set("valkey.keyPrefix=team-a:tl"));
    assert!(r.args().contains(&"--key-prefix=team-a:tl".to_string()));
}

#[test]
fn tls_settings_need_a_tls_url() {
    let tls = "valkey.tls.enabled=true,valkey.tls.existingSecret=valkey-tls";
    // TLS material with a plain-text URL: the operator would connect in the clear.
    refused(
        &set(tls),
        "at '/valkey/url': 'redis://valkey:6379' does not match pattern '^(rediss|valkeys)",
    );
    refused(
        &["--set", tls, "--skip-schema-validation"],
        "valkey.tls.enabled needs a TLS URL (valkeys://, rediss://",
    );
    // A server name for a connection without TLS would be ignored silently.
    refused(
        &set("valkey.tls.serverName=valkey.internal"),
        "at '/valkey/url'",
    );
    refused(
        &set("valkey.url=redis-cluster://valkey:6379,valkey.tls.serverName=valkey.internal"),
        "at '/valkey/url'",
    );
    refused(
        &[
            "--set",
            "valkey.tls.serverName=valkey.internal",
            "--skip-schema-validation",
        ],
        "valkey.tls.serverName needs a TLS URL",
    );
    for url in [
        "rediss://valkey:6380",
        "rediss-cluster://valkey:6380",
        "valkeys://valkey:6380",
        "valkeys-sentinel://s:26379?sentinelServiceName=m",
    ] {
        let r = accepted(&set(&format!(
            "valkey.url={url},{tls},valkey.tls.serverName=valkey.internal"
        )));
        assert!(
            r.args()
                .contains(&"--tls-server-name=valkey.internal".to_string()),
            "{url}"
        );
    }
    // A rediss:// URL alone (system roots) may name the server too.
    let r = accepted(&set(
        "valkey.url=rediss://valkey:6380,valkey.tls.serverName=valkey.internal",
    ));
    assert!(
        r.args()
            .contains(&"--tls-server-name=valkey.internal".to_string())
    );
    assert!(!r.args().iter().any(|a| a.starts_with("--tls-ca-file")));
}

#[test]
fn unknown_log_levels_are_refused() {
    for level in [
        "verbose",
        "information",
        "info,targetlease=loud",
        "=debug",
        "info,",
        "targetlease",
    ] {
        refused(
            &[
                "--set-string",
                &format!("operator.logLevel={}", level.replace(',', "\\,")),
            ],
            "/operator/logLevel",
        );
    }
    for level in [
        "info",
        "WARN",
        "off",
        "info,targetlease=debug",
        "warn,kube_runtime::controller=info",
    ] {
        let r = accepted(&[
            "--set-string",
            &format!("operator.logLevel={}", level.replace(',', "\\,")),
        ]);
        let env = &r.container()["env"];
        let rust_log = env
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "RUST_LOG")
            .unwrap();
        assert_eq!(rust_log["value"], level);
    }
}

#[test]
fn other_new_values_are_checked_too() {
    refused(&set("admin.address=localhost"), "/admin/address");
    refused(&set("revisionHistoryLimit=-1"), "/revisionHistoryLimit");
    refused(
        &set("metrics.prometheusRule.reconcileErrorRatio=0"),
        "/metrics/prometheusRule/reconcileErrorRatio",
    );
    refused(
        &["--set-json", r#"extraEnv=[{"value":"x"}]"#],
        "/extraEnv/0",
    );
    refused(
        &["--set-json", r#"extraVolumeMounts=[{"name":"x"}]"#],
        "/extraVolumeMounts/0",
    );
    refused(&set("networkPolicy.enabld=true"), "networkPolicy");
}
