//! Reconcile slots shared fairly among namespaces (no client required).
//!
//! `--concurrency` reconciles run at once. The controller's own queue hands
//! out work by due time, so one namespace with many TargetLeases (or a
//! burst of spec edits) puts everything due before another namespace's
//! renewal ahead of it: that renewal waits for the whole backlog, and its
//! published expiry can pass meanwhile. Here a reconcile that finds every
//! slot taken waits in its namespace's line, and a freed slot goes to the
//! next namespace in turn (round robin over the namespaces that wait). A
//! namespace alone uses every slot; with others waiting it gets its turn
//! like each of them, so a renewal waits for about one reconcile per waiting
//! namespace, whatever the backlog of the others.
//!
//! Within a namespace's line, the reconcile with the earliest deadline goes
//! first (first come, first served among equal deadlines). Anything that
//! may change what is published — a new TargetLease, an edit, a pod, a
//! release — must run now (its deadline is when it came); a renewal on its
//! schedule has slack before its lease needs it ([`super::plan::timing::slot_deadline`]),
//! so new acquisitions do not wait behind renewals that can still wait, and
//! a renewal whose slack has run out goes before whatever came after.
//!
//! A reconcile does not wait in its future: it leaves its TargetLease's key
//! in the line and returns ([`FairSlots::take_or_queue`]), so a burst of
//! thousands costs a key each, not a parked reconcile each. When the key's
//! turn comes a slot is set aside for it and the key is sent to the
//! controller ([`FairSlots::with_wakes`]); the reconcile that follows takes
//! that slot. A slot set aside for a TargetLease that went away meanwhile
//! is handed on as soon as the controller says so ([`FairSlots::not_coming`]);
//! one not taken for another reason, after [`RESERVED_FOR`]. The key reaches
//! the controller through its triggers, which are never paused (a watch
//! that fails backs off on its own): [`RESERVED_FOR`] only has to outlast
//! the controller's own scheduling, with a wide margin.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::runtime::reflector::ObjectRef;

use super::name::NsName;
use crate::operator::crd::TargetLease;

/// How long a slot set aside for a key waits for its reconcile: far longer
/// than the controller takes to start it (its triggers are never paused; a
/// watch that fails backs off on its own, up to 3 s doubled at most by
/// jitter, and would not hold a reservation back even if they were).
pub const RESERVED_FOR: Duration = Duration::from_secs(10);

type Key = ObjectRef<TargetLease>;

/// The slots and the lines waiting for them.
pub struct FairSlots {
    state: Mutex<State>,
    /// Where a key whose turn came is sent (the controller's triggers).
    wake: UnboundedSender<Key>,
}

#[derive(Default)]
struct State {
    /// Slots neither held nor set aside. Never positive while a key waits.
    free: usize,
    /// Namespaces with a key waiting, in the order they get the next slot.
    turns: VecDeque<String>,
    /// The keys waiting, per namespace, earliest deadline first.
    lines: HashMap<String, BinaryHeap<Reverse<Waiter>>>,
    /// Arrivals so far (ties between equal deadlines go by arrival).
    arrivals: u64,
    /// The keys in a line: the arrival of each one's live entry (an entry
    /// of another arrival was overtaken by an earlier deadline), that
    /// deadline, and since when it waits. The line's entries share the key
    /// ([`NsName`]: one string, however many entries).
    queued: HashMap<NsName, (u64, Instant, Instant)>,
    /// Slots set aside for keys sent to the controller: since when each
    /// waited, and when the slot was set aside (the runtime's clock).
    reserved: HashMap<NsName, (Instant, tokio::time::Instant)>,
}

/// A key waiting for a slot.
struct Waiter {
    deadline: Instant,
    arrival: u64,
    key: NsName,
}

impl Waiter {
    fn order(&self) -> (Instant, u64) {
        (self.deadline, self.arrival)
    }
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.order() == other.order()
    }
}

impl Eq for Waiter {}

impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order().cmp(&other.order())
    }
}

impl State {
    /// The next key in turn, taken out of its line; its namespace goes to
    /// the back of the turns while it has more waiting. Entries that were
    /// overtaken by an earlier deadline of their own key are dropped on the
    /// way, without costing their namespace its turn.
    fn next_key(&mut self) -> Option<NsName> {
        loop {
            let ns = self.turns.pop_front()?;
            let Some(line) = self.lines.get_mut(&ns) else {
                continue;
            };
            let mut live = None;
            while let Some(Reverse(w)) = line.pop() {
                if self.queued.get(&w.key).is_some_and(|q| q.0 == w.arrival) {
                    live = Some(w.key);
                    break;
                }
            }
            if line.is_empty() {
                self.lines.remove(&ns);
            } else {
                self.turns.push_back(ns);
            }
            let Some(key) = live else { continue };
            let since = self.queued.remove(&key).map_or_else(Instant::now, |q| q.2);
            self.reserved
                .insert(key.clone(), (since, tokio::time::Instant::now()));
            return Some(key);
        }
    }

    fn push(&mut self, namespace: &str, waiter: Waiter) {
        let waiter = Reverse(waiter);
        match self.lines.get_mut(namespace) {
            Some(line) => line.push(waiter),
            None => {
                self.lines
                    .insert(namespace.to_owned(), BinaryHeap::from([waiter]));
                self.turns.push_back(namespace.to_owned());
            }
        }
    }

    /// Slots set aside longer than [`RESERVED_FOR`] ago: taken back.
    fn expired(&mut self, now: tokio::time::Instant) -> usize {
        let before = self.reserved.len();
        self.reserved
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < RESERVED_FOR);
        before - self.reserved.len()
    }
}

/// One slot, held while a reconcile runs; dropping it hands it on.
pub struct Slot {
    slots: Arc<FairSlots>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.clone().hand_on();
    }
}

impl FairSlots {
    /// `n` slots (at least one), with nobody to wake: a key left in a line
    /// is dropped when its turn comes (for callers that never contend).
    pub fn new(n: usize) -> Arc<Self> {
        Self::with_wakes(n).0
    }

    /// `n` slots (at least one), and the keys whose turn came, to be
    /// reconciled (they each have a slot set aside).
    pub fn with_wakes(n: usize) -> (Arc<Self>, UnboundedReceiver<Key>) {
        let (wake, woken) = unbounded();
        let slots = Arc::new(Self {
            state: Mutex::new(State {
                free: n.max(1),
                ..State::default()
            }),
            wake,
        });
        (slots, woken)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn slot(self: &Arc<Self>) -> Slot {
        Slot {
            slots: self.clone(),
        }
    }

    /// A slot for `key`'s reconcile, in `namespace`, that should start by
    /// `deadline`, and since when it waited for it: the slot set aside for
    /// it, or a free one; otherwise `None`, and the key waits in its
    /// namespace's line (once, by its earliest deadline) until a slot is set
    /// aside for it and it is sent to be reconciled.
    pub fn take_or_queue(
        self: &Arc<Self>,
        key: &Key,
        namespace: &str,
        deadline: Instant,
    ) -> Option<(Slot, Instant)> {
        let now = Instant::now();
        let key = NsName::shared_of(key);
        let mut state = self.lock();
        if let Some((since, _)) = state.reserved.remove(&key) {
            return Some((self.slot(), since));
        }
        // A free slot means nobody waits (a freed slot goes to a waiter).
        if state.free > 0 {
            state.free -= 1;
            return Some((self.slot(), now));
        }
        let since = match state.queued.get(&key) {
            Some(&(_, by, _)) if by <= deadline => return None,
            Some(&(.., since)) => since,
            None => now,
        };
        state.arrivals += 1;
        let arrival = state.arrivals;
        state.queued.insert(key.clone(), (arrival, deadline, since));
        state.push(
            namespace,
            Waiter {
                deadline,
                arrival,
                key,
            },
        );
        None
    }

    /// The slot set aside for `key` goes on: its reconcile will not come
    /// (the controller found no such TargetLease).
    pub fn not_coming(self: &Arc<Self>, key: &Key) {
        let gone = self.lock().reserved.remove(&NsName::of(key)).is_some();
        if gone {
            self.clone().hand_on();
        }
    }

    /// Takes back, twice every [`RESERVED_FOR`] until dropped, the slots
    /// set aside for longer than that (whatever their reconciles became).
    pub async fn take_back_unused(self: Arc<Self>) {
        loop {
            tokio::time::sleep(RESERVED_FOR / 2).await;
            let expired = self.lock().expired(tokio::time::Instant::now());
            if expired > 0 {
                tracing::debug!(
                    expired,
                    "reconcile slots set aside and not taken: handed on"
                );
            }
            for _ in 0..expired {
                self.clone().hand_on();
            }
        }
    }

    /// A slot came free: set aside for the next key in turn, which is sent
    /// to the controller, or back to the free ones.
    fn hand_on(self: Arc<Self>) {
        loop {
            let key = {
                let mut state = self.lock();
                match state.next_key() {
                    Some(key) => key,
                    None => {
                        // Under the same lock: a key queued meanwhile
                        // would find it free.
                        state.free += 1;
                        return;
                    }
                }
            };
            if self.wake.unbounded_send(key.to_ref()).is_ok() {
                return;
            }
            // Nobody to wake any more (the controller stopped): the slot
            // goes on, unless something took it meanwhile.
            if self.lock().reserved.remove(&key).is_none() {
                return;
            }
        }
    }

    /// Keys waiting for a slot (for tests and metrics).
    pub fn waiting(&self) -> usize {
        self.lock().queued.len()
    }
}

#[cfg(test)]
mod tests;
