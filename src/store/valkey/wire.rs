//! A Valkey client of our own, knowing nothing of leases: RESP2 on the wire
//! ([`resp`]), opening and authenticating connections ([`dial`], [`tls`],
//! Sentinel discovery in [`sentinel`]), what a URL names ([`endpoint`]), one
//! pipelined connection ([`link`]), a few of them per server ([`pool`]), and
//! where a request goes for each topology ([`standalone`], [`cluster`])
//! behind one [`Client`].
//!
//! The one rule it keeps for the layer above: a request is written at most
//! once, and every failure says whether it may have run ([`Error`]'s
//! [`Kind`]). The lease mapping (scripts, keys, replies, what a failure means
//! for a lease) sits on top, in the parent module.

mod client;
pub mod cluster;
pub mod dial;
pub mod endpoint;
mod error;
pub mod link;
pub mod pool;
pub mod resp;
pub mod sentinel;
mod standalone;
pub mod tls;

pub(super) use client::forget_if_not_primary;
pub use client::{Client, Route, Use};
pub use error::{Error, Kind};
