//! What the test targets and the benchmark share: real servers (Valkey,
//! etcd, PostgreSQL, a Kubernetes control plane), fault-injecting proxies,
//! and builders for the objects and commands tests are written in. A
//! dev-dependency of `targetlease`; each target names it once:
//! `use targetlease_test_support as support;`.

pub mod audit;
pub mod chart_identity;
pub mod cli;
pub mod cluster;
pub mod deadline;
pub mod etcd_cluster;
pub mod fault_proxy;
pub mod kube_env;
pub mod nested_cargo;
pub mod operator_env;
pub mod operator_store;
pub mod pods;
pub mod postgres;
pub mod process;
pub mod recording_server;
pub mod resp;
pub mod sentinel;
pub mod spec;
pub mod tcp_proxy;
pub mod timeline;
pub mod tls;
pub mod tools;
pub mod valkey_server;

/// The repository's root (this crate is `tests/support/` in it).
pub fn repo() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(std::path::Path::parent)
        .expect("tests/support/ is two levels below the repository's root")
}
