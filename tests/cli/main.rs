//! The `targetlease` binary as users run it: `lease …`, `run -- CMD`, and the
//! committed CRD and docs it must match.

use targetlease_test_support as support;

mod crd;
mod etcd;
mod etcd_auth;
mod etcd_tls;
mod habits;
mod index;
mod install;
mod layers;
mod lease;
mod run;
mod url_password;
