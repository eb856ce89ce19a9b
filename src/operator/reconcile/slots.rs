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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

/// The slots and the lines waiting for them.
pub struct FairSlots {
    state: Mutex<State>,
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
}

/// A reconcile waiting for a slot.
struct Waiter {
    deadline: Instant,
    arrival: u64,
    tx: oneshot::Sender<Slot>,
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
    /// while it has more waiting.
    fn next_waiter(&mut self) -> Option<oneshot::Sender<Slot>> {
        let ns = self.turns.pop_front()?;
        let line = self.lines.get_mut(&ns)?;
        let waiter = line.pop().map(|Reverse(w)| w.tx);
        if line.is_empty() {
            self.lines.remove(&ns);
        } else {
            self.turns.push_back(ns);
        }
        waiter
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
    /// `n` slots (at least one).
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: n.max(1),
                ..State::default()
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a reconcile in `namespace` that should start by
    /// `deadline`: at once when one is free, otherwise when its namespace's
    /// turn comes and no earlier deadline waits in its line.
    pub async fn acquire(self: &Arc<Self>, namespace: &str, deadline: Instant) -> Slot {
        let rx = {
            let mut state = self.lock();
            if state.free > 0 {
                state.free -= 1;
                return Slot {
                    slots: Some(self.clone()),
                };
            }
            let (tx, rx) = oneshot::channel();
            state.arrivals += 1;
            let waiter = Reverse(Waiter {
                deadline,
                arrival: state.arrivals,
                tx,
            });
            match state.lines.get_mut(namespace) {
                Some(line) => line.push(waiter),
                None => {
                    state
                        .lines
                        .insert(namespace.to_owned(), BinaryHeap::from([waiter]));
                    state.turns.push_back(namespace.to_owned());
                }
            }
            rx
        };
        // The sender is only ever dropped by sending (the slots outlive
        // every waiter: each waiter holds them).
        rx.await.unwrap_or(Slot { slots: None })
    }

    /// A slot came free: to the next waiter in turn, or back to the free ones.
    fn hand_on(self: Arc<Self>) {
        loop {
            let next = {
                let mut state = self.lock();
                match state.next_waiter() {
                    Some(tx) => tx,
                    None => {
                        state.free += 1;
                        return;
                    }
                }
            };
            let slot = Slot {
                slots: Some(self.clone()),
            };
            match next.send(slot) {
                Ok(()) => return,
                // That waiter gave up (its reconcile was dropped): the next one.
                Err(mut unwanted) => {
                    unwanted.slots = None;
                }
            }
        }
    }

    /// Reconciles waiting for a slot, per namespace (for tests and metrics).
    pub fn waiting(&self) -> usize {
        self.lock().lines.values().map(BinaryHeap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    type Order = Arc<Mutex<Vec<String>>>;

    /// Starts a waiter that records `label` when it gets a slot and holds
    /// the slot until told to let go.
    fn waiter(
        slots: &Arc<FairSlots>,
        ns: &'static str,
        label: String,
        order: &Order,
    ) -> oneshot::Sender<()> {
        waiter_by(slots, ns, label, Instant::now(), order)
    }

    /// [`waiter`], to start by `deadline`.
    fn waiter_by(
        slots: &Arc<FairSlots>,
        ns: &'static str,
        label: String,
        deadline: Instant,
        order: &Order,
    ) -> oneshot::Sender<()> {
        let (done_tx, done_rx) = oneshot::channel::<()>();
        let (slots, order) = (slots.clone(), order.clone());
        tokio::spawn(async move {
            let _slot = slots.acquire(ns, deadline).await;
            order.lock().unwrap().push(label);
            let _ = done_rx.await;
        });
        done_tx
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_flooding_namespace_waits_its_turn_like_any_other() {
        let slots = FairSlots::new(2);
        let order: Order = Default::default();
        let mut done = HashMap::new();
        // Both slots taken, then a flood of 50 from "noisy" before "quiet" asks.
        for label in ["r0", "r1"] {
            done.insert(
                label.to_string(),
                waiter(&slots, "noisy", label.into(), &order),
            );
        }
        settle().await;
        for i in 0..50 {
            done.insert(
                format!("n{i}"),
                waiter(&slots, "noisy", format!("n{i}"), &order),
            );
            settle().await;
        }
        for label in ["q1", "q2"] {
            done.insert(
                label.to_string(),
                waiter(&slots, "quiet", label.into(), &order),
            );
            settle().await;
        }
        assert_eq!(slots.waiting(), 52);
        // Slots are let go in the order they were taken; each goes to the
        // next namespace in turn.
        for i in 0..6 {
            let holder = order.lock().unwrap()[i].clone();
            let _ = done.remove(&holder).unwrap().send(());
            settle().await;
        }
        let got: Vec<_> = order
            .lock()
            .unwrap()
            .iter()
            .skip(2)
            .take(6)
            .cloned()
            .collect();
        assert_eq!(got, ["n0", "q1", "n1", "q2", "n2", "n3"]);
    }

    #[tokio::test]
    async fn one_namespace_alone_uses_every_slot_and_dropped_waiters_pass_theirs_on() {
        let slots = FairSlots::new(3);
        let a = slots.acquire("a", Instant::now()).await;
        let b = slots.acquire("a", Instant::now()).await;
        let c = slots.acquire("a", Instant::now()).await;
        // A waiter that gives up (its reconcile dropped) never keeps a slot.
        let gave_up = tokio::time::timeout(
            Duration::from_millis(10),
            slots.acquire("b", Instant::now()),
        )
        .await;
        assert!(gave_up.is_err());
        let next = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire("c", Instant::now()).await })
        };
        settle().await;
        drop(a);
        let _d = tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .expect("the slot skips the waiter that left")
            .unwrap();
        drop((b, c));
        // All free again: three at once, without waiting.
        let all: Vec<_> =
            futures::future::join_all((0..2).map(|_| slots.acquire("z", Instant::now()))).await;
        assert_eq!((all.len(), slots.waiting()), (2, 0));
    }

    #[tokio::test]
    async fn a_new_lease_goes_before_renewals_that_can_wait_but_not_before_late_ones() {
        let slots = FairSlots::new(1);
        let order: Order = Default::default();
        let mut done = HashMap::new();
        let now = Instant::now();
        done.insert(
            "busy".to_string(),
            waiter(&slots, "ns", "busy".into(), &order),
        );
        settle().await;
        // Many renewals on their schedule, each with slack left...
        for i in 0..50 {
            let label = format!("renew{i}");
            let by = now + Duration::from_secs(10);
            done.insert(label.clone(), waiter_by(&slots, "ns", label, by, &order));
            settle().await;
        }
        // ...then a new TargetLease, then a renewal whose slack ran out.
        done.insert("new".into(), waiter(&slots, "ns", "new".into(), &order));
        settle().await;
        let late = now - Duration::from_secs(1);
        done.insert(
            "late".into(),
            waiter_by(&slots, "ns", "late".into(), late, &order),
        );
        settle().await;
        assert_eq!(slots.waiting(), 52);
        for _ in 0..4 {
            let holder = order.lock().unwrap().last().unwrap().clone();
            let _ = done.remove(&holder).unwrap().send(());
            settle().await;
        }
        let got = order.lock().unwrap().clone();
        assert_eq!(got, ["busy", "late", "new", "renew0", "renew1"]);
    }
}
