//! The watch events of the operator's own writes, kept from triggering
//! reconciles (no client required).
//!
//! The controller reconciles a TargetLease on every change its watch shows,
//! and most changes are the operator's own: the finalizer it adds and every
//! status it writes. Such an event shows the object exactly as the pass that
//! wrote it already holds it (the reply to a write is the object the pass
//! plans from next, and it said when to look again from there), so another
//! pass learns nothing from it; it only takes a slot that new TargetLeases
//! wait for, and with thousands of them that is most of the work. An event
//! whose resourceVersion is one this process's recent writes of the object
//! returned triggers nothing: the last one's, or an earlier one's whose event
//! comes late (a loaded watch delivers the finalizer's event after the
//! status write that followed it was acknowledged). A version is one change,
//! so anyone else's change shows another. The cache and the index still
//! take it.
//!
//! An event can arrive before the reply to the write that made it. While a
//! write of a TargetLease is in flight, an event of that TargetLease is held
//! back; when the write ends it is dropped if it shows the version the write
//! returned, and sent as a wake-up otherwise (any held event is sent when the
//! write fails). So a change made by anyone else always triggers a
//! reconcile: at once, or when this process's write of the same object ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc::UnboundedSender;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::name::NsName;
use crate::operator::crd::TargetLease;

type Key = NsName;

fn key_of(r: &ObjectRef<TargetLease>) -> Key {
    NsName::of(r)
}

/// The versions this process wrote, and the events held back meanwhile.
pub struct Echoes {
    /// Boxed: a map's room for 10,000 TargetLeases is 16,384 slots, each as
    /// large as its value; a box puts the rest where there is an entry.
    all: Mutex<HashMap<Key, Box<Entry>>>,
    wake: UnboundedSender<ObjectRef<TargetLease>>,
}

#[derive(Default)]
struct Entry {
    /// Writes of the object in flight.
    writing: u32,
    /// The resourceVersions acknowledged writes returned, in the order their
    /// replies came, from the latest one whose event came on (at most
    /// [`RECENT`], the latest last).
    wrote: Vec<String>,
    /// The versions of the events held back while writes were in flight.
    held: Vec<String>,
    /// The versions the writes that ended while others were in flight
    /// returned (the held events those writes explain).
    ours: Vec<String>,
}

impl Entry {
    /// The event of `wrote[at]` came. The watch shows one object's versions
    /// in order, so the events of the writes before it came before it or
    /// never will (a relist shows only the latest): only that version is
    /// kept of them, for a relist that shows it again. Without this, each
    /// TargetLease kept its last [`RECENT`] versions for good, one more with
    /// every republish of its status.
    ///
    /// `wrote` is in the order the replies came. One object's writes are
    /// sent one after another (a pass awaits each, and the controller runs
    /// one reconcile of an object at a time), so that is the order of their
    /// versions. Were two in flight at once and answered out of order, the
    /// drain could drop the later one's version before its event came: one
    /// more reconcile, never a change of someone else's missed (that is
    /// decided by `held` and `ours`, which this leaves alone).
    fn seen(&mut self, at: usize) {
        self.wrote.drain(..at);
        // Most TargetLeases keep one version between writes: its room only.
        if self.wrote.capacity() > self.wrote.len() {
            self.wrote.shrink_to_fit();
        }
    }
}

/// How many of an object's own write versions are recognised when their
/// events come late (a reconcile writes a finalizer, a status and at
/// deletion a withdrawal: a few writes, never many, before their events).
const RECENT: usize = 8;

impl Echoes {
    /// Held-back events that turn out not to be echoes are sent to `wake`.
    pub fn new(wake: UnboundedSender<ObjectRef<TargetLease>>) -> Arc<Self> {
        Arc::new(Self {
            all: Mutex::default(),
            wake,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Box<Entry>>> {
        self.all.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the watch event showing `tl` triggers a reconcile now: not
    /// when it is a version this process's recent writes returned, nor (yet)
    /// while a write of it is in flight.
    pub fn triggers(&self, tl: &TargetLease) -> bool {
        let mut all = self.lock();
        let Some(e) = all.get_mut(&key_of(&ObjectRef::from_obj(tl))) else {
            return true;
        };
        let version = tl.resource_version().unwrap_or_default();
        if let Some(at) = e.wrote.iter().position(|v| *v == version) {
            e.seen(at);
            return false;
        }
        if e.writing > 0 {
            e.held.push(version);
            return false;
        }
        true
    }

    /// A write of `key` is about to be sent; say what it returned with
    /// [`Writing::wrote`] (dropping the guard unsaid: it failed).
    pub fn writing(self: &Arc<Self>, key: &ObjectRef<TargetLease>) -> Writing {
        let key = NsName::shared_of(key);
        self.lock().entry(key.clone()).or_default().writing += 1;
        Writing {
            echoes: self.clone(),
            key: Some(key),
        }
    }

    fn ended(&self, key: Key, wrote: Option<String>) {
        let wake = {
            let mut all = self.lock();
            let Some(e) = all.get_mut(&key) else {
                return;
            };
            e.writing = e.writing.saturating_sub(1);
            if let Some(v) = wrote {
                e.ours.push(v.clone());
                if e.wrote.len() == RECENT {
                    e.wrote.remove(0);
                }
                e.wrote.push(v);
            }
            if e.writing > 0 {
                return;
            }
            // Held events of these writes' own came too (before their replies).
            if let Some(at) = e
                .held
                .iter()
                .filter_map(|v| e.wrote.iter().position(|w| w == v))
                .max()
            {
                e.seen(at);
            }
            // Every held event must be one of these writes' own: a reply can
            // show someone else's change made meanwhile (a patch that is not
            // conditional on the version), whose own event is held too.
            let ours = std::mem::take(&mut e.ours);
            std::mem::take(&mut e.held)
                .iter()
                .any(|v| !ours.contains(v))
        };
        if wake {
            let _ = self.wake.unbounded_send(key.to_ref());
        }
    }

    /// Forgets `key` (its TargetLease is gone).
    pub fn forget(&self, key: &ObjectRef<TargetLease>) {
        self.lock().remove(&key_of(key));
    }

    /// Keeps only the TargetLeases `exists` says are there.
    pub fn retain(&self, exists: impl Fn(&NsName) -> bool) {
        self.lock().retain(|k, _| exists(k));
    }
}

/// A write in flight ([`Echoes::writing`]).
pub struct Writing {
    echoes: Arc<Echoes>,
    key: Option<Key>,
}

impl Writing {
    /// The write was acknowledged with the object at `version`.
    pub fn wrote(mut self, version: Option<String>) {
        if let Some(key) = self.key.take() {
            self.echoes.ended(key, version);
        }
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.echoes.ended(key, None);
        }
    }
}

#[cfg(test)]
mod tests;
