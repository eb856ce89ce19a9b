//! Contract cases: each asserts one promise of the lease protocol.

mod grants;
mod replays;
mod state;

pub use grants::*;
pub use replays::*;
use state::assert_invalid;
pub use state::*;

pub(crate) use std::collections::HashSet;
pub(crate) use std::sync::Arc;
pub(crate) use std::time::Duration;

pub(crate) use targetlease::store::{
    AcquireRequest, CommitRequest, Lease, LeaseHandle, LeaseStore, Outcome, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

pub(crate) use crate::{Corruption, Harness};

pub(crate) const LONG: Duration = Duration::from_secs(30);

pub(crate) const SHORT: Duration = Duration::from_millis(400);

/// Sleep long enough for a `SHORT` lease to be gone on any machine.
pub(crate) const PAST_SHORT: Duration = Duration::from_millis(700);

pub(crate) fn target(name: &str) -> Target {
    Target::new("contract", name)
}

pub(crate) async fn acquire(s: &dyn LeaseStore, t: &Target, owner: &str, ttl: Duration) -> Reply {
    s.acquire(&AcquireRequest::new(t.clone(), owner, ttl))
        .await
        .expect("acquire")
}

pub(crate) async fn held(s: &dyn LeaseStore, t: &Target, owner: &str, ttl: Duration) -> Lease {
    let r = acquire(s, t, owner, ttl).await;
    assert_eq!(r.outcome, Outcome::Acquired, "{r:?}");
    r.lease.expect("acquired reply carries the lease")
}

pub(crate) fn holder(l: &Lease) -> LeaseHandle {
    l.handle().expect("the holder's copy carries the lease id")
}
