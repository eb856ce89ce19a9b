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
            "store.url=redis://user:secret@valkey:6379",
            "/store/url",
            "without credentials",
        ),
        (
            "store.url=http://valkey:6379",
            "/store/url",
            "a valkey://, valkeys://, redis:// or rediss:// URL",
        ),
        ("store.keyPrefix=tl{a}", "/store/keyPrefix", "no braces"),
        ("store.timeout=0s", "/store/timeout", "more than zero"),
        (
            "store.timeout=10",
            "/store/timeout",
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
            "store.tls.serverName=valkey.internal",
            "/store/url",
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
        &set("store.url=redis://user:secret@valkey:6379"),
        "/store/url",
    );
    refused(
        &set("store.url=valkey://user:secret@valkey:6379"),
        "/store/url",
    );
    refused(
        &set("store.url=valkey-cluster://a:7000?node=user:secret@b:7001"),
        "/store/url",
    );
    for url in [
        "valkey://valkey:6379",
        "valkey-cluster://a:7000",
        "redis://valkey:6379",
    ] {
        accepted(&set(&format!("store.url={url}")));
    }
    refused(&set("store.url=http://valkey:6379"), "/store/url");
    refused(&set("replicas=3"), "replicas");
    refused(&set("replicaCount=0"), "/replicaCount");
    refused(&set("valkey.durability=sometimes"), "/valkey/durability");
    refused(
        &set("store.url=rediss://v:6380,store.tls.enabled=true"),
        "store.tls.enabled needs store.tls.existingSecret",
    );
    refused(
        &set(
            "store.url=rediss://v:6380,store.tls.enabled=true,store.tls.existingSecret=s,store.tls.certKey=tls.crt",
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
        "store.timeout",
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
    let r = accepted(&set("store.timeout=1500ms"));
    assert!(r.args().contains(&"--timeout=1500ms".to_string()));
    accepted(&set("store.timeout=10s,leaderElection.retryPeriod=1s"));
}

#[test]
fn braces_in_the_key_prefix_are_refused() {
    // The keys' hash tags follow the prefix: a brace in it moves every key
    // of a target into another slot, or splits a target across slots.
    for prefix in ["tl{a}", "{tl}", "tl}", "tl{"] {
        refused(
            &["--set-string", &format!("store.keyPrefix={prefix}")],
            "/store/keyPrefix",
        );
    }
    refused(&["--set-string", "store.keyPrefix="], "/store/keyPrefix");
    let r = accepted(&set("store.keyPrefix=team-a:tl"));
    assert!(r.args().contains(&"--key-prefix=team-a:tl".to_string()));
}

#[test]
fn tls_settings_need_a_tls_url() {
    let tls = "store.tls.enabled=true,store.tls.existingSecret=valkey-tls";
    // TLS material with a plain-text URL: the operator would connect in the clear.
    refused(
        &set(tls),
        "at '/store/url': value must be 'a TLS URL (valkeys:// or rediss://, or its -cluster or -sentinel form; etcds:// for etcd)",
    );
    refused(
        &["--set", tls, "--skip-schema-validation"],
        "store.tls.enabled needs a TLS URL (valkeys://, rediss://",
    );
    // A server name for a connection without TLS would be ignored silently.
    refused(
        &set("store.tls.serverName=valkey.internal"),
        "at '/store/url'",
    );
    refused(
        &set("store.url=redis-cluster://valkey:6379,store.tls.serverName=valkey.internal"),
        "at '/store/url'",
    );
    refused(
        &[
            "--set",
            "store.tls.serverName=valkey.internal",
            "--skip-schema-validation",
        ],
        "store.tls.serverName needs a TLS URL",
    );
    for url in [
        "rediss://valkey:6380",
        "rediss-cluster://valkey:6380",
        "valkeys://valkey:6380",
        "valkeys-sentinel://s:26379?sentinelServiceName=m",
    ] {
        let r = accepted(&set(&format!(
            "store.url={url},{tls},store.tls.serverName=valkey.internal"
        )));
        assert!(
            r.args()
                .contains(&"--tls-server-name=valkey.internal".to_string()),
            "{url}"
        );
    }
    // A rediss:// URL alone (system roots) may name the server too.
    let r = accepted(&set(
        "store.url=rediss://valkey:6380,store.tls.serverName=valkey.internal",
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
