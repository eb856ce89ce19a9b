//! The Helm chart (`charts/targetlease`): lint, render with default and with
//! non-default values, install and upgrade it on a real API server, and run
//! the operator *as the chart's ServiceAccount* with only the rendered RBAC
//! (proves the RBAC is sufficient) while the rendered ValidatingAdmissionPolicy
//! refuses status writes from anyone else.
//!
//! `helm` comes from the tools directory (`scripts/build-controlplane.sh`); a
//! missing binary fails the tests, it never skips them.

use targetlease_test_support as support;

mod alert_rules;
mod argocd;
mod cluster;
mod etcd;
mod floors;
mod gitops;
mod helm;
mod lease_id_key;
mod observability;
mod operator;
mod policies;
mod release;
mod render;
mod render_etcd;
mod render_ha;
mod render_rbac;
mod render_security;
mod render_values;
mod schema;
mod scoped;
