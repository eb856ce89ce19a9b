//! The admin server over HTTPS (`--admin-tls-cert-file`, `--admin-tls-key-file`):
//! probes and metrics answer over TLS with the configured certificate, plain
//! HTTP gets no answer.

use super::*;
use crate::support::operator_env::http_get;
use crate::support::tls::{TestCa, https_get};

/// Promise (docs/install.md, "Metrics over TLS"): with a certificate the
/// admin server speaks HTTPS only. A Prometheus trusting the CA scrapes
/// `/metrics`, the kubelet's HTTPS probes get `/livez` and `/readyz`; a
/// plain HTTP scrape gets no HTTP answer, and a client trusting another CA
/// refuses the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_certificate_the_admin_server_answers_https_only() {
    let mut env = OperatorEnv::start_without_operator("admintls").await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "metrics");
    let other = TestCa::new(dir.path(), "other");
    let cert = ca.issue("admin", &["127.0.0.1"], false);
    let op = env.start_operator_with(&[
        "--admin-tls-cert-file",
        cert.cert.to_str().unwrap(),
        "--admin-tls-key-file",
        cert.key.to_str().unwrap(),
    ]);
    let port = env.admin_port(op);
    let ca_file = ca.ca_file();
    let start = std::time::Instant::now();
    let ready = loop {
        match https_get(port, "/readyz", &ca_file) {
            Ok((200, _)) => break true,
            _ if start.elapsed() > SOON => break false,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert!(
        ready,
        "/readyz over HTTPS: {:?}\n{}",
        https_get(port, "/readyz", &ca_file),
        env.operator_log(op)
    );
    assert_eq!(https_get(port, "/livez", &ca_file), Ok((200, "ok".into())));
    let (code, metrics) = https_get(port, "/metrics", &ca_file).unwrap();
    assert_eq!(code, 200);
    assert!(metrics.contains("targetlease_leader 1"), "{metrics}");

    let plain = http_get(port, "/metrics");
    assert!(
        plain.is_none(),
        "a plain HTTP scrape was answered: {plain:?}"
    );
    let distrusted = https_get(port, "/metrics", &other.ca_file());
    assert!(
        distrusted
            .as_ref()
            .is_err_and(|e| e.contains("UnknownIssuer")),
        "{distrusted:?}"
    );
    // Still serving after both.
    assert_eq!(https_get(port, "/livez", &ca_file), Ok((200, "ok".into())));
}
