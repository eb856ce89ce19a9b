//! The `targetlease` binary as users run it: `lease …`, `run -- CMD`, and the
//! committed CRD and docs it must match.

#[allow(dead_code)] // each binary uses a part of the shared support
#[path = "../support/mod.rs"]
mod support;

mod crd;
mod etcd;
mod etcd_auth;
mod etcd_tls;
mod habits;
mod install;
mod lease;
mod run;
mod url_password;
