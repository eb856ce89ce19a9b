//! The Helm chart (`charts/targetlease`): lint, render with default and with
//! non-default values, install and upgrade it on a real API server, and run
//! the operator *as the chart's ServiceAccount* with only the rendered RBAC
//! (proves the RBAC is sufficient) while the rendered ValidatingAdmissionPolicy
//! refuses status writes from anyone else.
//!
//! `helm` comes from the tools directory (`scripts/build-controlplane.sh`); a
//! missing binary fails the tests, it never skips them.

#[path = "../support"]
mod support {
    pub mod chart_identity;
    pub mod kube_env;
    pub mod operator_env;
    pub mod resp;
    pub mod valkey_server;
}

mod cluster;
mod helm;
mod operator;
mod render;
mod render_ha;
