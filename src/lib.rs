//! targetlease: leases with fencing tokens for Kubernetes workloads, stored in Valkey.
//!
//! The crate is layered: [`store`] is the backend-neutral lease protocol with
//! its Valkey and in-memory backends; the CLI and the operator only talk to
//! the [`store::LeaseStore`] trait.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod admin;
pub mod cache;
pub mod cli;
pub mod conditions;
pub mod config_error;
pub mod crd;
pub mod election;
pub mod failpoints;
pub mod floor;
pub mod leadership;
pub mod lease_id;
pub mod metrics;
pub mod operator;
pub mod reconcile;
pub mod store;
