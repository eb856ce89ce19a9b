//! The chart pointed at etcd (`store.url=etcd://…` or `etcds://…`): the
//! operator gets the store URL, the etcd user's password file and the TLS
//! files from Secrets, and none of Valkey's own settings; what only Valkey
//! has is refused with an etcd URL, in words; the Valkey-named URL value of
//! before the rename is refused rather than ignored.

use serde_json::json;

use crate::helm::*;

fn set(s: &str) -> [&str; 2] {
    ["--set", s]
}

/// Every store setting an etcd user needs: three members over TLS, a
/// client certificate, a user with a password from a Secret.
const ETCD: &str = "store.url=etcds://etcd-0.etcd:2379\\,etcd-1.etcd:2379\\,etcd-2.etcd:2379,\
store.keyPrefix=payments,store.timeout=3s,\
store.auth.username=targetlease,store.auth.existingSecret=targetlease-etcd,store.auth.passwordKey=pw,\
store.tls.enabled=true,store.tls.existingSecret=etcd-client-tls,\
store.tls.certKey=tls.crt,store.tls.keyKey=tls.key";

#[test]
fn an_etcd_store_gets_its_url_credentials_and_tls_files_from_secrets() {
    let r = accepted(&set(ETCD));
    let args = r.args();
    for expected in [
        "--store-url=etcds://etcd-0.etcd:2379,etcd-1.etcd:2379,etcd-2.etcd:2379",
        "--key-prefix=payments",
        "--timeout=3s",
        "--username=targetlease",
        "--password-file=/etc/targetlease/store-auth/password",
        "--tls-ca-file=/etc/targetlease/store-tls/ca.crt",
        "--tls-cert-file=/etc/targetlease/store-tls/tls.crt",
        "--tls-key-file=/etc/targetlease/store-tls/tls.key",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    // Valkey's own settings are not passed: `--durability` other than none
    // is refused by the binary with an etcd URL, and the pool sizes mean
    // nothing to etcd.
    for valkey_only in [
        "--durability",
        "--pool-size",
        "--durable-pool-size",
        "--max-in-flight",
        "--valkey-url",
    ] {
        assert!(
            !args.iter().any(|a| a.starts_with(valkey_only)),
            "{valkey_only} in {args:?}"
        );
    }
    // The files come from the named Secrets, readable by the pod's group only.
    assert_eq!(
        r.volume("store-auth")["secret"],
        json!({ "secretName": "targetlease-etcd", "defaultMode": 0o440,
                "items": [{ "key": "pw", "path": "password" }] })
    );
    assert_eq!(
        r.volume("store-tls")["secret"],
        json!({ "secretName": "etcd-client-tls", "defaultMode": 0o440,
                "items": [{ "key": "ca.crt", "path": "ca.crt" },
                          { "key": "tls.crt", "path": "tls.crt" },
                          { "key": "tls.key", "path": "tls.key" }] })
    );
    let mounts = &r.container()["volumeMounts"];
    for (name, path) in [
        ("store-auth", "/etc/targetlease/store-auth"),
        ("store-tls", "/etc/targetlease/store-tls"),
    ] {
        let mount = mounts
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no mount {name}: {mounts}"));
        assert_eq!(
            (mount["mountPath"].as_str(), &mount["readOnly"]),
            (Some(path), &json!(true))
        );
    }
}

#[test]
fn a_plain_etcd_url_renders_without_tls_or_credentials() {
    let r = accepted(&[
        "--set-string",
        r"store.url=etcd://e0:2379\,e1:2379\,e2:2379",
    ]);
    let args = r.args();
    assert!(
        args.contains(&"--store-url=etcd://e0:2379,e1:2379,e2:2379".to_string()),
        "{args:?}"
    );
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--tls-") || a.starts_with("--password-file")),
        "{args:?}"
    );
}

#[test]
fn what_only_valkey_has_is_refused_with_an_etcd_url_in_words() {
    let words = "at '/valkey/durability': value must be 'none with an etcd URL (etcd acknowledges a write once a quorum has it)'";
    for mode in ["aof", "replicas:1"] {
        refused(
            &set(&format!(
                "store.url=etcd://e0:2379,valkey.durability={mode}"
            )),
            words,
        );
    }
    // Tools that skip the schema meet the template's own check.
    refused(
        &[
            "--set",
            "store.url=etcd://e0:2379,valkey.durability=aof",
            "--skip-schema-validation",
        ],
        "valkey.durability is for Valkey and must stay none with an etcd URL",
    );
    // The Valkey default renders with etcd: durability none is not passed at all.
    accepted(&set("store.url=etcd://e0:2379,valkey.durability=none"));
    refused(
        &set("store.url=etcd://e0:2379,valkey.sentinelAuth.existingSecret=s"),
        "valkey.sentinelAuth needs a Sentinel URL",
    );
}

#[test]
fn etcd_tls_settings_need_an_etcds_url_and_credentials_stay_out_of_it() {
    refused(
        &set("store.url=etcd://e0:2379,store.tls.enabled=true,store.tls.existingSecret=t"),
        "at '/store/url': value must be 'a TLS URL",
    );
    refused(
        &[
            "--set",
            "store.url=etcd://e0:2379,store.tls.enabled=true,store.tls.existingSecret=t",
            "--skip-schema-validation",
        ],
        "store.tls.enabled needs a TLS URL",
    );
    refused(
        &set("store.url=etcds://e0:2379,store.tls.enabled=true"),
        "store.tls.enabled needs store.tls.existingSecret",
    );
    refused(
        &set(
            "store.url=etcds://e0:2379,store.tls.enabled=true,store.tls.existingSecret=t,store.tls.certKey=tls.crt",
        ),
        "store.tls.certKey and store.tls.keyKey go together",
    );
    let out = helm(&[
        "template",
        "t",
        &chart(),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "store.url=etcd://app:etcd-pw-Kq2@e0:2379",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("at '/store/url'") && err.contains("or an etcd:// or etcds:// URL"),
        "{err}"
    );
    assert!(
        !err.contains("etcd-pw-Kq2"),
        "the password is not echoed: {err}"
    );
}

/// The store's URL was `valkey.url` before it served etcd too; nothing was
/// released under that name, so it is refused, not silently ignored.
#[test]
fn the_former_valkey_url_value_is_refused() {
    refused(
        &set("valkey.url=etcd://e0:2379"),
        "at '/valkey': additional properties 'url' not allowed",
    );
}

#[test]
fn egress_to_etcd_goes_to_the_named_members_and_port() {
    let r = accepted(&[
        "--set",
        "store.url=etcd://etcd.data.svc:2379,networkPolicy.restrictEgress=true",
        "--set-json",
        r#"networkPolicy.apiServer.to=[{"ipBlock":{"cidr":"10.0.0.1/32"}}]"#,
        "--set-json",
        r#"networkPolicy.store.to=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"data"}},"podSelector":{"matchLabels":{"app":"etcd"}}}]"#,
        "--set-json",
        r#"networkPolicy.store.ports=[{"port":2379,"protocol":"TCP"}]"#,
    ]);
    let egress = &r.get("NetworkPolicy")["spec"]["egress"];
    assert_eq!(
        egress[2]["to"][0]["podSelector"]["matchLabels"]["app"],
        "etcd"
    );
    assert_eq!(
        egress[2]["ports"],
        json!([{ "port": 2379, "protocol": "TCP" }])
    );
    refused(
        &set("store.url=etcd://e0:2379,networkPolicy.restrictEgress=true"),
        "networkPolicy.restrictEgress needs networkPolicy.apiServer.to",
    );
}
