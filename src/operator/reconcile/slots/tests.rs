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

fn key(ns: &str, name: &str) -> Key {
    let mut key = ObjectRef::new(name);
    key.namespace = Some(ns.to_owned());
    key
}

/// The keys woken so far, by name.
fn woken(rx: &mut UnboundedReceiver<Key>) -> Vec<String> {
    std::iter::from_fn(|| rx.try_recv().ok())
        .map(|k| k.name)
        .collect()
}

#[tokio::test]
async fn a_key_waits_in_line_once_and_its_turn_sets_a_slot_aside_for_it() {
    let (slots, mut turns) = FairSlots::with_wakes(1);
    let now = Instant::now();
    let (held, _) = slots.take_or_queue(&key("ns", "a"), "ns", now).unwrap();
    // No slot: "b" waits in line, once, however often it comes.
    assert!(slots.take_or_queue(&key("ns", "b"), "ns", now).is_none());
    let later = now + Duration::from_secs(9);
    assert!(slots.take_or_queue(&key("ns", "b"), "ns", later).is_none());
    assert!(slots.take_or_queue(&key("ns", "c"), "ns", now).is_none());
    assert_eq!((slots.waiting(), woken(&mut turns).len()), (2, 0));
    drop(held);
    // "b" is woken, and the freed slot is set aside for it: "c" cannot take it.
    assert_eq!(woken(&mut turns), ["b"]);
    assert!(slots.take_or_queue(&key("ns", "c"), "ns", now).is_none());
    let (b, since) = slots.take_or_queue(&key("ns", "b"), "ns", later).unwrap();
    assert!(
        since <= now + Duration::from_millis(100),
        "it waited since it first came"
    );
    assert_eq!(slots.waiting(), 1);
    drop(b);
    assert_eq!(woken(&mut turns), ["c"]);
    let (c, _) = slots.take_or_queue(&key("ns", "c"), "ns", now).unwrap();
    drop(c);
    // All free again.
    assert!(slots.take_or_queue(&key("ns", "d"), "ns", now).is_some());
    assert_eq!((slots.waiting(), woken(&mut turns).len()), (0, 0));
}

#[tokio::test]
async fn keys_of_a_flooding_namespace_wait_their_turn_like_any_other() {
    let (slots, mut turns) = FairSlots::with_wakes(2);
    let now = Instant::now();
    let mut held: Vec<Slot> = ["r0", "r1"]
        .iter()
        .map(|r| {
            slots
                .take_or_queue(&key("noisy", r), "noisy", now)
                .unwrap()
                .0
        })
        .collect();
    for i in 0..50 {
        assert!(
            slots
                .take_or_queue(&key("noisy", &format!("n{i}")), "noisy", now)
                .is_none()
        );
    }
    for q in ["q1", "q2"] {
        assert!(
            slots
                .take_or_queue(&key("quiet", q), "quiet", now)
                .is_none()
        );
    }
    assert_eq!(slots.waiting(), 52);
    // Each freed slot goes to the next namespace in turn; the key woken
    // takes it and holds it.
    let mut got = Vec::new();
    for _ in 0..6 {
        held.remove(0);
        let next = woken(&mut turns);
        assert_eq!(next.len(), 1);
        let ns = if next[0].starts_with('q') {
            "quiet"
        } else {
            "noisy"
        };
        held.push(slots.take_or_queue(&key(ns, &next[0]), ns, now).unwrap().0);
        got.extend(next);
    }
    assert_eq!(got, ["n0", "q1", "n1", "q2", "n2", "n3"]);
}

#[tokio::test]
async fn a_key_that_comes_again_sooner_moves_up_and_is_woken_once() {
    let (slots, mut turns) = FairSlots::with_wakes(1);
    let now = Instant::now();
    let renewal = now + Duration::from_secs(10);
    let held = slots
        .take_or_queue(&key("ns", "busy"), "ns", now)
        .unwrap()
        .0;
    for r in ["renew0", "renew1", "renew2"] {
        assert!(slots.take_or_queue(&key("ns", r), "ns", renewal).is_none());
    }
    // A change to "renew2" (an edit, a pod) must run now.
    assert!(
        slots
            .take_or_queue(&key("ns", "renew2"), "ns", now)
            .is_none()
    );
    assert_eq!(slots.waiting(), 3);
    drop(held);
    let mut order = Vec::new();
    for _ in 0..3 {
        let next = woken(&mut turns);
        assert_eq!(next.len(), 1, "one key at a time: {next:?}");
        let slot = slots.take_or_queue(&key("ns", &next[0]), "ns", now);
        order.extend(next);
        drop(slot);
    }
    assert_eq!(order, ["renew2", "renew0", "renew1"]);
    assert_eq!((slots.waiting(), woken(&mut turns).len()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_slot_set_aside_for_a_key_that_never_comes_goes_on() {
    let (slots, mut turns) = FairSlots::with_wakes(1);
    let now = Instant::now();
    let held = slots.take_or_queue(&key("ns", "a"), "ns", now).unwrap().0;
    for k in ["gone", "deleted", "next"] {
        assert!(slots.take_or_queue(&key("ns", k), "ns", now).is_none());
    }
    drop(held);
    assert_eq!(woken(&mut turns), ["gone"]);
    // The controller found no such TargetLease: the slot goes on at once.
    slots.not_coming(&key("ns", "gone"));
    assert_eq!(woken(&mut turns), ["deleted"]);
    // Nobody says so: it goes on after a while.
    let taking_back = tokio::spawn(slots.clone().take_back_unused());
    tokio::time::sleep(RESERVED_FOR / 2).await;
    assert_eq!(woken(&mut turns).len(), 0);
    tokio::time::sleep(RESERVED_FOR).await;
    assert_eq!(woken(&mut turns), ["next"]);
    // Too late: its slot went on, so it waits in line again.
    assert!(
        slots
            .take_or_queue(&key("ns", "deleted"), "ns", now)
            .is_none()
    );
    taking_back.abort();
}
