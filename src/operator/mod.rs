//! The operator: everything only `targetlease operator` uses, on top of the
//! lease store.
//!
//! Where one TargetLease goes: [`controller`] watches it and hands it to
//! [`reconcile`] (pure [`reconcile::plan`] and [`reconcile::transition`], one
//! executor for the I/O), whose writes pass the write gate
//! ([`leadership`]) that [`leading`] opens while this replica is elected
//! ([`election`]). [`readiness`] says when the controller may act; [`sweep`]
//! and [`retention`] clean up behind it.

pub mod admin;
pub mod api_timeout;
pub mod cache;
pub mod conditions;
pub mod config_error;
pub mod controller;
pub mod crd;
pub mod election;
pub mod events;
pub mod floor;
pub mod leadership;
pub mod leading;
pub mod lease_id;
pub mod metrics;
pub mod readiness;
pub mod reconcile;
pub mod retention;
pub mod subscribe;
pub mod sweep;
pub mod wakeups;

pub use controller::{OperatorConfig, control};
pub use leading::{Election, control_while_leading};
