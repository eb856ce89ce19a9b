//! The operator end to end: the real `targetlease operator` binary against a
//! real kube-apiserver + etcd and a real valkey-server.

mod admin_tls;
mod admission;
mod etcd;
mod events;
mod leases;
mod opt_in;
mod pods;
mod reconciles;
mod token;
mod why_nobody;

pub(crate) use crate::support;
pub(crate) use crate::support::spec::lease_for;

pub(crate) use std::time::Duration;

pub(crate) use kube::api::{Patch, PatchParams};
pub(crate) use serde_json::json;
pub(crate) use support::operator_env::{OperatorEnv, apply_example, condition, summary};
pub(crate) use targetlease::operator::crd::Phase;
pub(crate) use targetlease::store::{LeaseStore, Outcome, ReleaseRequest, Target};

pub(crate) const SOON: Duration = Duration::from_secs(20);

/// The label by which a pod opts in to TargetLease `web-leader` (the
/// examples' election).
pub(crate) const WEB_LEADER_CANDIDATE: (&str, &str) =
    ("web-leader.targetlease.dev/candidate", "true");
