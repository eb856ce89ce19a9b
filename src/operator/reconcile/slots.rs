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
//! that slot. A slot set aside and not taken within [`RESERVED_FOR`] (the
//! TargetLease went away meanwhile) is handed on.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::oneshot;

use crate::operator::crd::TargetLease;

/// How long a slot set aside for a key waits for its reconcile.
pub const RESERVED_FOR: Duration = Duration::from_secs(5);

type Key = ObjectRef<TargetLease>;

/// The slots and the lines waiting for them.
pub struct FairSlots {
    state: Mutex<State>,
    /// Where a key whose turn came is sent (the controller's triggers).
    wake: UnboundedSender<Key>,
}

#[derive(Default)]
struct State {
    /// Slots not handed out. Never positive while anyone waits.
    free: usize,
    /// Namespaces with someone waiting, in the order they get the next slot.
    turns: VecDeque<String>,
    /// Who waits, per namespace, earliest deadline first.
    lines: HashMap<String, BinaryHeap<Reverse<Waiter>>>,
    /// Arrivals so far (ties between equal deadlines go by arrival).
    arrivals: u64,
    /// The keys in a line: the arrival of each one's live entry (an entry
    /// of another arrival was overtaken by an earlier deadline), that
    /// deadline, and since when it waits. The line's entries share the key.
    queued: HashMap<Arc<Key>, (u64, Instant, Instant)>,
    /// Slots set aside for keys sent to the controller: since when each
    /// waited, and when the slot was set aside (the runtime's clock).
    reserved: HashMap<Key, (Instant, tokio::time::Instant)>,
}

/// Who waits for a slot: a task, or a key whose reconcile returned.
enum Who {
    Task(oneshot::Sender<Slot>),
    Key(Arc<Key>),
}

/// Whom a freed slot goes to: a task, or a key to send to the controller.
enum Next {
    Task(oneshot::Sender<Slot>),
    Key(Key),
}

/// A reconcile waiting for a slot.
struct Waiter {
    deadline: Instant,
    arrival: u64,
    who: Who,
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
    /// The next waiter in turn; its namespace goes to the back of the turns
    /// while it has more waiting. Entries of keys that were overtaken by an
    /// earlier deadline of their own are dropped on the way.
    fn next_waiter(&mut self) -> Option<Who> {
        loop {
            let ns = self.turns.pop_front()?;
            let line = self.lines.get_mut(&ns)?;
            let waiter = line.pop().map(|Reverse(w)| w);
            if line.is_empty() {
                self.lines.remove(&ns);
            } else {
                self.turns.push_back(ns);
            }
            let Some(w) = waiter else { continue };
            if let Who::Key(key) = &w.who {
                match self.queued.get(&**key) {
                    Some((arrival, ..)) if *arrival == w.arrival => {}
                    _ => continue,
                }
            }
            return Some(w.who);
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
    slots: Option<Arc<FairSlots>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.hand_on();
        }
    }
}

impl FairSlots {
    /// `n` slots (at least one), for reconciles that wait in their futures
    /// ([`FairSlots::acquire`]): nobody is woken, so a key left in a line
    /// by [`FairSlots::take_or_queue`] is dropped when its turn comes.
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
            slots: Some(self.clone()),
        }
    }

    /// A slot for a reconcile in `namespace` that should start by
    /// `deadline`: at once when one is free, otherwise when its namespace's
    /// turn comes and no earlier deadline waits in its line.
    pub async fn acquire(self: &Arc<Self>, namespace: &str, deadline: Instant) -> Slot {
        let rx = {
            let mut state = self.lock();
            if state.free > 0 {
                state.free -= 1;
                return self.slot();
            }
            let (tx, rx) = oneshot::channel();
            state.arrivals += 1;
            let arrival = state.arrivals;
            state.push(
                namespace,
                Waiter {
                    deadline,
                    arrival,
                    who: Who::Task(tx),
                },
            );
            rx
        };
        // The sender is only ever dropped by sending (the slots outlive
        // every waiter: each waiter holds them).
        rx.await.unwrap_or(Slot { slots: None })
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
        let mut state = self.lock();
        if let Some((since, _)) = state.reserved.remove(key) {
            return Some((self.slot(), since));
        }
        // A free slot means nobody waits (a freed slot goes to a waiter).
        if state.free > 0 {
            state.free -= 1;
            return Some((self.slot(), now));
        }
        let (shared, since) = match state.queued.get_key_value(key) {
            Some((_, &(_, by, _))) if by <= deadline => return None,
            Some((shared, &(.., since))) => (shared.clone(), since),
            None => (Arc::new(key.clone()), now),
        };
        state.arrivals += 1;
        let arrival = state.arrivals;
        state
            .queued
            .insert(shared.clone(), (arrival, deadline, since));
        state.push(
            namespace,
            Waiter {
                deadline,
                arrival,
                who: Who::Key(shared),
            },
        );
        None
    }

    /// The slot set aside for `key` goes on: its reconcile will not come
    /// (the controller found no such TargetLease).
    pub fn not_coming(self: &Arc<Self>, key: &Key) {
        let gone = self.lock().reserved.remove(key).is_some();
        if gone {
            self.clone().hand_on();
        }
    }

    /// Takes back, every second until dropped, the slots set aside for
    /// longer than [`RESERVED_FOR`] (whatever their reconciles became).
    pub async fn take_back_unused(self: Arc<Self>) {
        loop {
            tokio::time::sleep(RESERVED_FOR / 5).await;
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

    /// A slot came free: to the next waiter in turn, or back to the free ones.
    fn hand_on(self: Arc<Self>) {
        loop {
            let next = {
                let mut state = self.lock();
                match state.next_waiter() {
                    Some(Who::Key(key)) => {
                        let since = state
                            .queued
                            .remove(&*key)
                            .map_or_else(Instant::now, |(.., s)| s);
                        // The line's last hold on it (overtaken entries
                        // were dropped on the way): no copy.
                        let key = Arc::unwrap_or_clone(key);
                        let at = tokio::time::Instant::now();
                        state.reserved.insert(key.clone(), (since, at));
                        Next::Key(key)
                    }
                    Some(Who::Task(tx)) => Next::Task(tx),
                    None => {
                        state.free += 1;
                        return;
                    }
                }
            };
            match next {
                Next::Task(tx) => match tx.send(self.slot()) {
                    Ok(()) => return,
                    // That waiter gave up (its reconcile was dropped): the next one.
                    Err(mut unwanted) => unwanted.slots = None,
                },
                Next::Key(key) => match self.wake.unbounded_send(key) {
                    Ok(()) => return,
                    // Nobody to wake any more (the controller stopped).
                    Err(e) => {
                        self.lock().reserved.remove(&e.into_inner());
                    }
                },
            }
        }
    }

    /// Reconciles waiting for a slot, per namespace (for tests and metrics).
    pub fn waiting(&self) -> usize {
        let state = self.lock();
        let tasks = state
            .lines
            .values()
            .flat_map(BinaryHeap::iter)
            .filter(|Reverse(w)| matches!(w.who, Who::Task(_)))
            .count();
        tasks + state.queued.len()
    }
}

#[cfg(test)]
mod tests;
