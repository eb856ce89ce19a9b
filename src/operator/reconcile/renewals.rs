//! When each published lease's next renewal pass is due (no client required).
//!
//! A pass that only has to renew again later asks to be looked at then. The
//! controller's own scheduler would keep that request twice (in a map and in
//! its timer wheel), each copy a full [`ObjectRef`] with its strings: about
//! 400 bytes per TargetLease, 4 MB at 10,000. Here each is a shared
//! [`NsName`] and an instant, kept once by name and once by time, and the
//! keys that come due are sent to the controller then, which schedules them
//! at once (it never holds them long).
//!
//! As in the controller's scheduler, a key asked for twice is due at the
//! earlier time, and it is forgotten once it came due or once any reconcile
//! of it starts, whatever triggered it: each pass asks again when it ends.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;

use super::name::NsName;
use crate::operator::crd::TargetLease;

/// The renewals due later, by name and by time.
#[derive(Default)]
pub struct Renewals {
    due: Mutex<Due>,
    /// A key became due earlier than every other (or the first one).
    sooner: Notify,
}

#[derive(Default)]
struct Due {
    at: HashMap<NsName, Instant>,
    order: BTreeSet<(Instant, NsName)>,
}

impl Renewals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Due> {
        self.due.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `key` is due at `at`, or at the earlier time it was already due.
    pub fn schedule(&self, key: &ObjectRef<TargetLease>, at: Instant) {
        let mut due = self.lock();
        let Due { at: by_name, order } = &mut *due;
        let name = match by_name.get_key_value(&NsName::of(key)) {
            Some((_, was)) if *was <= at => return,
            Some((name, was)) => {
                let name = name.clone();
                order.remove(&(*was, name.clone()));
                name
            }
            None => NsName::shared_of(key),
        };
        by_name.insert(name.clone(), at);
        order.insert((at, name));
        let first = order.first().is_some_and(|(t, _)| *t == at);
        drop(due);
        if first {
            self.sooner.notify_one();
        }
    }

    /// Nothing is due for `key`: it is gone, or a reconcile of it started
    /// (its pass asks again when it ends).
    pub fn forget(&self, key: &ObjectRef<TargetLease>) {
        let mut due = self.lock();
        if let Some((name, at)) = due.at.remove_entry(&NsName::of(key)) {
            due.order.remove(&(at, name));
        }
    }

    /// Keeps only the keys `keep` says still exist.
    pub fn retain(&self, keep: impl Fn(&NsName) -> bool) {
        let mut due = self.lock();
        due.at.retain(|name, _| keep(name));
        due.order.retain(|(_, name)| keep(name));
        if due.at.capacity() > 64 && due.at.len() * 4 < due.at.capacity() {
            due.at.shrink_to_fit();
        }
    }

    /// How many keys are due later.
    pub fn len(&self) -> usize {
        self.lock().at.len()
    }

    /// Whether nothing is due later.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every key due by `now`; when the next one is due.
    fn take_due(&self, now: Instant) -> (Vec<NsName>, Option<Instant>) {
        let mut due = self.lock();
        let mut taken = Vec::new();
        while let Some((at, _)) = due.order.first() {
            if *at > now {
                break;
            }
            if let Some((_, name)) = due.order.pop_first() {
                due.at.remove(&name);
                taken.push(name);
            }
        }
        (taken, due.order.first().map(|(at, _)| *at))
    }

    /// Every key as it comes due, for the controller to reconcile.
    pub fn come_due(self: Arc<Self>) -> impl Stream<Item = ObjectRef<TargetLease>> + Send {
        use futures::StreamExt;
        futures::stream::unfold(self, |renewals| async move {
            loop {
                let (taken, next) = renewals.take_due(Instant::now());
                if !taken.is_empty() {
                    let keys = taken.iter().map(NsName::to_ref).collect::<Vec<_>>();
                    return Some((futures::stream::iter(keys), renewals));
                }
                let sooner = renewals.sooner.notified();
                match next {
                    Some(at) => {
                        let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(at));
                        tokio::select! {
                            () = sleep => {}
                            () = sooner => {}
                        }
                    }
                    None => sooner.await,
                }
            }
        })
        .flatten()
    }
}

#[cfg(test)]
mod tests;
