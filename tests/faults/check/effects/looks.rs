//! What a check of reported outcomes compares them with: every look at a
//! target, each placed in time as its store's dating allows.

use std::collections::BTreeMap;

use crate::history::{History, LeaseView, OpKind};

/// One look at a target: its live lease (or none) at a server time.
pub(crate) struct Look<'a> {
    pub invoke_ms: u64,
    pub complete_ms: u64,
    /// The latest moment on the store's clock the look can describe
    /// ([`crate::history::Dating::latest`]): a look proves that something
    /// happened before a deadline only when this is before it.
    pub latest_ms: u64,
    pub lease: Option<&'a LeaseView>,
}

/// Every look at each target: observer sightings and other clients'
/// `held` and `acquired` replies (those carry the current lease).
pub(crate) fn looks(h: &History) -> BTreeMap<&str, Vec<Look<'_>>> {
    let mut out: BTreeMap<&str, Vec<Look>> = BTreeMap::new();
    for s in h.sightings.iter().filter(|s| s.invoke_ms > 0) {
        out.entry(&s.target).or_default().push(Look {
            invoke_ms: s.invoke_ms,
            complete_ms: s.at_ms,
            latest_ms: h.dating.latest(s.server_ms, s.at_ms),
            lease: s.lease.as_ref(),
        });
    }
    for o in &h.ops {
        if o.kind == OpKind::Acquire
            && (o.answer.is("held") || o.answer.is("acquired"))
            && let Some(l) = &o.lease
        {
            out.entry(&o.target).or_default().push(Look {
                invoke_ms: o.invoke_ms,
                complete_ms: o.complete_ms,
                latest_ms: h.dating.latest(o.server_ms, o.complete_ms),
                lease: Some(l),
            });
        }
    }
    out
}
