//! targetlease: leases with fencing tokens for Kubernetes workloads, stored in Valkey.
//!
//! Three parts, each only talking to the ones below it:
//! - [`store`], the library: the backend-neutral lease protocol
//!   ([`store::LeaseStore`]) and its Valkey, etcd and in-memory backends; no
//!   Kubernetes types.
//! - [`operator`]: everything only the operator uses — the TargetLease CRD,
//!   the reconciler, leader election, the token floor, metrics, the admin
//!   server.
//! - [`cli`]: the `targetlease` binary's subcommands, one of which runs the
//!   operator.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cli;
pub mod operator;
pub mod store;
