//! Contract cases: each asserts one promise of the lease protocol.

mod grants;
mod notices;
mod races;
mod replays;
mod state;

pub use grants::*;
pub use notices::*;
pub use races::*;
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

/// A short lease, for backends that take one this short ([`Harness::short`]).
pub(crate) const SHORT: Duration = Duration::from_millis(400);

/// Sleep long enough for a `SHORT` lease to be gone on any machine
/// ([`Harness::past_short`]).
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

pub(crate) fn handle(l: &Lease) -> LeaseHandle {
    l.handle().expect("the owner's copy carries the lease id")
}

/// Gives `l` back (a fresh request id): the reply.
pub(crate) async fn release(s: &dyn LeaseStore, t: &Target, l: &Lease) -> Reply {
    s.release(&ReleaseRequest::new(t.clone(), handle(l)))
        .await
        .expect("release")
}

/// Asserts that the next lease on the free target `t` gets the token right
/// after `l`'s: nothing since `l` allocated one.
pub(crate) async fn assert_next_token_follows(s: &dyn LeaseStore, t: &Target, l: &Lease) {
    assert_eq!(
        held(s, t, "bob", LONG).await.fencing_token,
        l.fencing_token + 1,
        "a token was allocated after {l:?}"
    );
}

/// Commits `value` under key `k` of `t`, fenced by `token`: the outcome.
pub(crate) async fn commit_k(s: &dyn LeaseStore, t: &Target, token: u64, value: &str) -> Outcome {
    s.commit(&CommitRequest::new(t.clone(), token, "k", value))
        .await
        .expect("commit")
        .outcome
}
