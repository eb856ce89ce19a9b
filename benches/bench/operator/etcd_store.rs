//! Our etcd store in the peer step: acquire+release cycles through
//! [`EtcdStore`] against the same etcd as etcd's own lock, and acquire,
//! renew, release and commit one at a time through it and through the
//! Valkey store, at the same concurrencies in the same run.
//!
//! The per-operation cells are the same workload on both stores (the store
//! part's, without Valkey's server statistics): acquire on targets never
//! used before, renew and commit on one live lease per worker, release of
//! the leases the acquire cell granted.

use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use targetlease::store::etcd::{EtcdConfig, EtcdStore};
use targetlease::store::{
    AcquireRequest, CommitRequest, LeaseHandle, LeaseStore, Outcome, ReleaseRequest, RenewRequest,
    Target,
};

use crate::stats::Figure;
use crate::store::drive;

/// The operations of the per-operation table, in its order.
pub const OPS: [&str; 4] = ["acquire", "renew", "release", "commit"];

const TTL: Duration = Duration::from_secs(90);
const OWNER: &str = "bench-peer";

/// Our store on the etcd serving clients on 127.0.0.1:`port`.
pub(super) async fn connect(port: &str) -> EtcdStore {
    EtcdStore::connect(&EtcdConfig {
        url: format!("etcd://127.0.0.1:{port}"),
        key_prefix: "targetlease-bench".into(),
        ..EtcdConfig::default()
    })
    .await
    .expect("connect the etcd store to the control plane's etcd")
}

/// Acquires one lease per target, one after the other.
async fn hold(store: &impl LeaseStore, targets: &[Target]) -> Vec<LeaseHandle> {
    let mut holders = Vec::with_capacity(targets.len());
    for t in targets {
        let reply = store
            .acquire(&AcquireRequest::new(t.clone(), OWNER, TTL))
            .await
            .expect("setup acquire");
        holders.push(
            reply
                .lease
                .and_then(|l| l.handle())
                .expect("setup acquire granted"),
        );
    }
    holders
}

/// Acquire (fresh targets), renew, release and commit at concurrency `c`,
/// `ops` calls each; targets are named after `tag` so no cell reuses one.
pub(super) async fn per_op(
    store: &impl LeaseStore,
    tag: &str,
    c: usize,
    ops: usize,
    failures: &AtomicUsize,
) -> Vec<(String, Figure)> {
    let ns = "peer-ops";
    let fresh: Vec<Target> = (0..ops)
        .map(|i| Target::new(ns, format!("acq-{tag}-{c}-{i}")))
        .collect();
    let granted: Mutex<Vec<Option<LeaseHandle>>> = Mutex::new(vec![None; ops]);
    let acquire = drive(c, ops, failures, |_, i| {
        let (fresh, granted) = (&fresh, &granted);
        async move {
            let req = AcquireRequest::new(fresh[i].clone(), OWNER, TTL);
            match store.acquire(&req).await {
                Ok(r) if r.outcome == Outcome::Acquired => {
                    granted.lock().unwrap()[i] = r.lease.and_then(|l| l.handle());
                    true
                }
                _ => false,
            }
        }
    })
    .await;

    let own: Vec<Target> = (0..c)
        .map(|k| Target::new(ns, format!("own-{tag}-{c}-{k}")))
        .collect();
    let held = hold(store, &own).await;
    let renew = drive(c, ops, failures, |k, _| {
        let req = RenewRequest::new(own[k].clone(), held[k].clone(), TTL);
        async move { matches!(store.renew(&req).await, Ok(r) if r.outcome == Outcome::Renewed) }
    })
    .await;

    let granted = granted.into_inner().unwrap();
    let release = drive(c, ops, failures, |_, i| {
        let req = granted[i]
            .clone()
            .map(|h| ReleaseRequest::new(fresh[i].clone(), h));
        async move {
            match req {
                Some(req) => {
                    matches!(store.release(&req).await, Ok(r) if r.outcome == Outcome::Released)
                }
                None => false,
            }
        }
    })
    .await;

    let commit = drive(c, ops, failures, |k, i| {
        let req = CommitRequest::new(own[k].clone(), held[k].token, "offset", format!("v{i}"));
        async move { matches!(store.commit(&req).await, Ok(r) if r.outcome == Outcome::Committed) }
    })
    .await;
    // The workers' own leases go back, so the next cell starts from the same state.
    for (t, h) in own.iter().zip(held) {
        let _ = store.release(&ReleaseRequest::new(t.clone(), h)).await;
    }
    OPS.into_iter()
        .map(String::from)
        .zip([acquire, renew, release, commit])
        .collect()
}
