//! The integration tests' fixtures, shared rather than copied.

#[path = "../../tests/support/kube_env.rs"]
pub mod kube_env;
#[path = "../../tests/support/operator_env.rs"]
pub mod operator_env;
#[path = "../../tests/support/resp.rs"]
pub mod resp;
#[path = "../../tests/support/valkey_server.rs"]
pub mod valkey_server;
