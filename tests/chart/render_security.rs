//! Security values: the admin server over HTTPS (probes and ServiceMonitor
//! follow), and the Sentinels' own credentials from a Secret.

use serde_json::json;

use crate::helm::*;

const ADMIN_TLS: &str = "admin.tls.enabled=true,admin.tls.existingSecret=metrics-cert";

/// `targetlease <rendered args> --help` is accepted: the flags exist.
fn the_binary_accepts(r: &Rendered) {
    let args: Vec<String> = r
        .args()
        .iter()
        .map(|a| a.replace("$(POD_IP)", "10.1.2.3"))
        .collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_targetlease"))
        .args(&args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`targetlease {}` is refused:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn admin_tls_serves_https_to_the_probes_and_the_service_monitor() {
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            ADMIN_TLS,
            "--set",
            "metrics.serviceMonitor.enabled=true",
        ],
    );
    let args = r.args();
    for flag in [
        "--admin-tls-cert-file=/etc/targetlease/admin-tls/tls.crt",
        "--admin-tls-key-file=/etc/targetlease/admin-tls/tls.key",
    ] {
        assert!(args.contains(&flag.to_string()), "{args:?}");
    }
    the_binary_accepts(&r);
    assert_eq!(
        r.volume("admin-tls")["secret"],
        json!({
            "secretName": "metrics-cert",
            "defaultMode": 288,
            "items": [
                { "key": "tls.crt", "path": "tls.crt" },
                { "key": "tls.key", "path": "tls.key" },
            ]
        })
    );
    let mounts = r.container()["volumeMounts"].as_array().unwrap().clone();
    let mount = mounts.iter().find(|m| m["name"] == "admin-tls").unwrap();
    assert!(
        mount["subPath"].is_null(),
        "a subPath mount never sees a rotated Secret"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(
            r.container()[probe]["httpGet"]["scheme"],
            "HTTPS",
            "{probe}"
        );
    }
    let ep = &r.get("ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(ep["scheme"], "https");
    assert_eq!(
        ep["tlsConfig"],
        json!({
            "serverName": "tl-targetlease-metrics.tl-system.svc",
            "ca": { "secret": { "name": "metrics-cert", "key": "ca.crt" } }
        })
    );

    // The scrape's TLS settings can be given whole.
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            ADMIN_TLS,
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set-json",
            r#"metrics.serviceMonitor.tlsConfig={"serverName":"metrics.example","ca":{"configMap":{"name":"ca","key":"ca.crt"}}}"#,
        ],
    );
    assert_eq!(
        r.get("ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"],
        json!({ "serverName": "metrics.example", "ca": { "configMap": { "name": "ca", "key": "ca.crt" } } })
    );

    // Off by default: plain HTTP probes and scrapes, no certificate mounted.
    let r = template(
        "tl",
        "tl-system",
        &["--set", "metrics.serviceMonitor.enabled=true"],
    );
    assert!(!r.args().iter().any(|a| a.starts_with("--admin-tls")));
    assert!(r.container()["livenessProbe"]["httpGet"]["scheme"].is_null());
    let ep = &r.get("ServiceMonitor")["spec"]["endpoints"][0];
    assert!(ep["scheme"].is_null() && ep["tlsConfig"].is_null(), "{ep}");

    refused(
        &["--set", "admin.tls.enabled=true"],
        "admin.tls.enabled needs admin.tls.existingSecret",
    );
}

#[test]
fn sentinel_credentials_are_mounted_from_their_own_secret() {
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "store.url=valkey-sentinel://sentinel:26379?sentinelServiceName=mymaster",
            "--set",
            "store.auth.existingSecret=data-pw,valkey.sentinelAuth.existingSecret=sentinel-pw",
            "--set",
            "valkey.sentinelAuth.username=watcher,valkey.sentinelAuth.passwordKey=pw",
        ],
    );
    let args = r.args();
    for flag in [
        "--password-file=/etc/targetlease/store-auth/password",
        "--sentinel-username=watcher",
        "--sentinel-password-file=/etc/targetlease/valkey-sentinel-auth/password",
    ] {
        assert!(args.contains(&flag.to_string()), "{args:?}");
    }
    the_binary_accepts(&r);
    assert_eq!(
        r.volume("valkey-sentinel-auth")["secret"],
        json!({
            "secretName": "sentinel-pw",
            "defaultMode": 288,
            "items": [{ "key": "pw", "path": "password" }]
        })
    );
    let env = serde_json::to_string(&r.container()["env"]).unwrap();
    assert!(!env.contains("SENTINEL"), "credentials are not env: {env}");
    // Without values, no Sentinel credentials at all.
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "store.url=valkey-sentinel://sentinel:26379?sentinelServiceName=mymaster",
        ],
    );
    assert!(!r.args().iter().any(|a| a.starts_with("--sentinel")));

    refused(
        &["--set", "valkey.sentinelAuth.existingSecret=sentinel-pw"],
        "valkey.sentinelAuth needs a Sentinel URL",
    );
    // TLS through Sentinels with the system roots alone is refused, as the
    // binary does.
    let tls_sentinel = "store.url=valkeys-sentinel://sentinel:26379?sentinelServiceName=mymaster";
    refused(
        &["--set", tls_sentinel],
        "TLS through Sentinels needs store.tls.enabled with store.tls.caKey",
    );
    accepted(&[
        "--set",
        tls_sentinel,
        "--set",
        "store.tls.enabled=true,store.tls.existingSecret=valkey-ca",
    ]);
    accepted(&[
        "--set",
        tls_sentinel,
        "--set",
        "store.tls.serverName=valkey.internal",
    ]);
}

/// The Sentinels' own TLS material comes from a Secret of its own, mounted
/// as files the `--sentinel-tls-*` flags name; without values there are no
/// such flags, and values that cannot work are refused.
#[test]
fn sentinel_tls_material_is_mounted_from_its_own_secret() {
    let tls_sentinel = "store.url=valkeys-sentinel://sentinel:26379?sentinelServiceName=mymaster";
    let data_tls = "store.tls.enabled=true,store.tls.existingSecret=valkey-ca";
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            tls_sentinel,
            "--set",
            data_tls,
            "--set",
            "valkey.sentinelTls.enabled=true,valkey.sentinelTls.existingSecret=sentinel-tls",
            "--set",
            "valkey.sentinelTls.caKey=sentinel-ca.pem,valkey.sentinelTls.certKey=c.pem,valkey.sentinelTls.keyKey=k.pem",
            "--set",
            "valkey.sentinelTls.serverName=sentinel.internal",
        ],
    );
    let args = r.args();
    for flag in [
        "--tls-ca-file=/etc/targetlease/store-tls/ca.crt",
        "--sentinel-tls-ca-file=/etc/targetlease/valkey-sentinel-tls/ca.crt",
        "--sentinel-tls-cert-file=/etc/targetlease/valkey-sentinel-tls/tls.crt",
        "--sentinel-tls-key-file=/etc/targetlease/valkey-sentinel-tls/tls.key",
        "--sentinel-tls-server-name=sentinel.internal",
    ] {
        assert!(args.contains(&flag.to_string()), "{flag} missing: {args:?}");
    }
    the_binary_accepts(&r);
    assert_eq!(
        r.volume("valkey-sentinel-tls")["secret"],
        json!({
            "secretName": "sentinel-tls",
            "defaultMode": 288,
            "items": [
                { "key": "sentinel-ca.pem", "path": "ca.crt" },
                { "key": "c.pem", "path": "tls.crt" },
                { "key": "k.pem", "path": "tls.key" },
            ]
        })
    );
    let mounts = r.container()["volumeMounts"].as_array().unwrap().clone();
    let mount = mounts
        .iter()
        .find(|m| m["name"] == "valkey-sentinel-tls")
        .unwrap();
    assert_eq!(mount["mountPath"], "/etc/targetlease/valkey-sentinel-tls");
    assert_eq!(mount["readOnly"], true);

    // A CA alone: no client certificate flags.
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            tls_sentinel,
            "--set",
            data_tls,
            "--set",
            "valkey.sentinelTls.enabled=true,valkey.sentinelTls.existingSecret=sentinel-tls",
        ],
    );
    let ours: Vec<_> = r
        .args()
        .into_iter()
        .filter(|a| a.starts_with("--sentinel-tls"))
        .collect();
    assert_eq!(
        ours,
        ["--sentinel-tls-ca-file=/etc/targetlease/valkey-sentinel-tls/ca.crt"]
    );
    // Without values, none of them.
    let r = template(
        "tl",
        "tl-system",
        &["--set", tls_sentinel, "--set", data_tls],
    );
    assert!(!r.args().iter().any(|a| a.starts_with("--sentinel-tls")));
    assert!(
        r.container()["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["name"] != "valkey-sentinel-tls")
    );

    refused(
        &[
            "--set",
            tls_sentinel,
            "--set",
            data_tls,
            "--set",
            "valkey.sentinelTls.enabled=true",
        ],
        "valkey.sentinelTls.enabled needs valkey.sentinelTls.existingSecret",
    );
    refused(
        &[
            "--set",
            tls_sentinel,
            "--set",
            data_tls,
            "--set",
            "valkey.sentinelTls.enabled=true,valkey.sentinelTls.existingSecret=s,valkey.sentinelTls.certKey=c.pem",
        ],
        "valkey.sentinelTls.certKey and valkey.sentinelTls.keyKey go together",
    );
    // Enabled with nothing to mount (no CA, no client certificate).
    refused(
        &[
            "--set",
            tls_sentinel,
            "--set",
            data_tls,
            "--set",
            "valkey.sentinelTls.enabled=true,valkey.sentinelTls.existingSecret=s,valkey.sentinelTls.caKey=",
        ],
        "valkey.sentinelTls.enabled mounts nothing without valkey.sentinelTls.caKey",
    );
    refused(
        &[
            "--set",
            "store.url=valkey-sentinel://sentinel:26379?sentinelServiceName=mymaster",
            "--set",
            "valkey.sentinelTls.serverName=sentinel.internal",
        ],
        "valkey.sentinelTls needs a TLS Sentinel URL",
    );
    refused(&["--set", "valkey.sentinelTls.bogus=1"], "sentinelTls");
}
