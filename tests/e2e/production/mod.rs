//! The operator's published promises under the conditions production brings,
//! on a real kube-apiserver and a real Valkey: API-server outages (leases
//! kept renewed, the leader handing over, writes refused mid-step), token
//! floors under failed writes, races between deletions, many tenants and
//! retention, what is published through spec edits, overlapping elections
//! and rapid handoffs, restarts with many pods and crashes between a store
//! call and a status write, and the sweep of stale marks.

mod api_outage;
mod api_outage_handover;
mod api_outage_writes;
mod floor_failure;
mod floor_races;
mod floor_retention;
mod floor_tenants;
mod floors;
mod publish;
mod restarts;
mod sweep;

pub(crate) use crate::support;
pub(crate) use crate::support::spec::lease_for;

pub(crate) use std::time::Duration;

pub(crate) use futures::StreamExt;
pub(crate) use k8s_openapi::api::core::v1::ConfigMap;
pub(crate) use kube::ResourceExt;
pub(crate) use kube::api::{ListParams, Patch, PatchParams};
pub(crate) use serde_json::json;
pub(crate) use support::kube_env::eventually;
pub(crate) use support::operator_env::{History, OperatorEnv, condition, summary};
pub(crate) use targetlease::operator::crd::{Phase, TargetLease};
pub(crate) use targetlease::store::{LeaseStore, Outcome, Target};

pub(crate) const SOON: Duration = Duration::from_secs(20);

pub(crate) fn ms(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<u64> {
    t.as_ref().map(|t| t.0.as_millisecond() as u64)
}

pub(crate) fn reason(tl: &TargetLease) -> Option<String> {
    condition(tl, "Held").map(|c| c.reason)
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
