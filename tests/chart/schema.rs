//! `values.schema.json` (and the template's own checks, for tools that skip
//! the schema) refuse values that would only crash-loop the operator later.

use crate::helm::*;

fn set(s: &str) -> [&str; 2] {
    ["--set", s]
}

/// What helm says when it refuses `extra` (it must refuse).
fn refusal(extra: &[&str]) -> String {
    let chart = chart();
    let mut args = vec!["template", "t", &chart, "--kube-version", KUBE_VERSION];
    args.extend_from_slice(extra);
    let out = helm(&args);
    assert!(!out.status.success(), "{extra:?} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every string rule of the schema refuses in words, as the CRD's CEL
/// rules do, never by echoing a regular expression (nor the value: a URL
/// may carry a password).
#[test]
fn refusals_state_the_rule_in_words() {
    for (value, path, words) in [
        (
            "valkey.durability=replicas:0",
            "/valkey/durability",
            "none, aof or replicas:N with N at least 1",
        ),
        (
            "valkey.url=redis://user:secret@valkey:6379",
            "/valkey/url",
            "without credentials",
        ),
        (
            "valkey.url=http://valkey:6379",
            "/valkey/url",
            "a valkey://, valkeys://, redis:// or rediss:// URL",
        ),
        ("valkey.keyPrefix=tl{a}", "/valkey/keyPrefix", "no braces"),
        ("valkey.timeout=0s", "/valkey/timeout", "more than zero"),
        (
            "valkey.timeout=10",
            "/valkey/timeout",
            "a duration such as 500ms, 10s, 5m or 1h30m",
        ),
        (
            "operator.logLevel=loud",
            "/operator/logLevel",
            "a log level (trace, debug, info, warn, error or off)",
        ),
        (
            "operator.floorConfigMap=Floors",
            "/operator/floorConfigMap",
            "a Kubernetes name: lower-case letters",
        ),
        (
            "serviceAccount.name=a_b",
            "/serviceAccount/name",
            "empty, or a Kubernetes name",
        ),
        (
            "image.digest=sha256:abc",
            "/image/digest",
            "empty, or sha256: and 64 lower-case hex digits",
        ),
        (
            "admin.address=localhost",
            "/admin/address",
            "or an IP address",
        ),
        (
            "valkey.tls.serverName=valkey.internal",
            "/valkey/url",
            "a TLS URL (valkeys:// or rediss://",
        ),
    ] {
        let said = refusal(&["--set-string", value]);
        assert!(
            said.contains(&format!("at '{path}': value must be '")) && said.contains(words),
            "{value}: {said}"
        );
        assert!(
            !said.contains("pattern") && !said.contains("^("),
            "{value}: {said}"
        );
        assert!(
            !said.contains("secret@"),
            "{value}: the value is not echoed: {said}"
        );
    }
    // The words themselves are no value either.
    refused(
        &[
            "--set-string",
            "valkey.durability=none\\, aof or replicas:N with N at least 1",
        ],
        "at '/valkey/durability'",
    );
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
    refused(
        &set("valkey.url=valkey-cluster://a:7000?node=user:secret@b:7001"),
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
    let words =
        "at '/valkey/durability': value must be 'none, aof or replicas:N with N at least 1'";
    for bad in [
        "replicas:0",
        "replicas:",
        "replicas:01",
        "replica:1",
        "sometimes",
    ] {
        refused(&set(&format!("valkey.durability={bad}")), words);
    }
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

/// The chart points the operator at etcd through the same URL value:
/// `etcd://` and `etcds://` (with its TLS files) render as the store URL,
/// and credentials in the URL are refused as for Valkey.
#[test]
fn an_etcd_url_renders_with_its_tls_files() {
    let r = accepted(&[
        "--set-string",
        r"valkey.url=etcd://e0:2379\,e1:2379\,e2:2379",
    ]);
    assert!(
        r.args()
            .contains(&"--valkey-url=etcd://e0:2379,e1:2379,e2:2379".to_string()),
        "{:?}",
        r.args()
    );
    let r = accepted(&set(
        "valkey.url=etcds://etcd.data.svc:2379,valkey.tls.enabled=true,valkey.tls.existingSecret=etcd-tls,valkey.tls.certKey=tls.crt,valkey.tls.keyKey=tls.key",
    ));
    for expected in [
        "--valkey-url=etcds://etcd.data.svc:2379",
        "--tls-ca-file=/etc/targetlease/valkey-tls/ca.crt",
        "--tls-cert-file=/etc/targetlease/valkey-tls/tls.crt",
        "--tls-key-file=/etc/targetlease/valkey-tls/tls.key",
    ] {
        assert!(
            r.args().iter().any(|a| a == expected),
            "{expected} in {:?}",
            r.args()
        );
    }
    refused(
        &set("valkey.url=etcd://e0:2379,valkey.tls.enabled=true,valkey.tls.existingSecret=t"),
        "at '/valkey/url'",
    );
    refused(&set("valkey.url=etcd://app:pw@e0:2379"), "at '/valkey/url'");
}

#[test]
fn tls_settings_need_a_tls_url() {
    let tls = "valkey.tls.enabled=true,valkey.tls.existingSecret=valkey-tls";
    // TLS material with a plain-text URL: the operator would connect in the clear.
    refused(
        &set(tls),
        "at '/valkey/url': value must be 'a TLS URL (valkeys:// or rediss://, or its -cluster or -sentinel form)",
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
