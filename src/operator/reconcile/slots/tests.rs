use super::*;

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

/// `slots.take_or_queue` left the key waiting in its line.
fn waits(slots: &Arc<FairSlots>, ns: &str, name: &str, by: Instant) -> bool {
    slots.take_or_queue(&key(ns, name), ns, by).is_none()
}

/// Serves `n` keys one after another, each woken alone, taking the slot
/// set aside for it and letting it go; their names in that order.
fn serve(slots: &Arc<FairSlots>, turns: &mut UnboundedReceiver<Key>, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let next: Vec<Key> = std::iter::from_fn(|| turns.try_recv().ok()).collect();
            assert_eq!(next.len(), 1, "one key at a time: {next:?}");
            let ns = next[0].namespace.clone().unwrap_or_default();
            let taken = slots.take_or_queue(&next[0], &ns, Instant::now());
            assert!(taken.is_some(), "its slot was set aside for it");
            next[0].name.clone()
        })
        .collect()
}

#[tokio::test]
async fn a_key_waits_in_line_once_and_its_turn_sets_a_slot_aside_for_it() {
    let (slots, mut turns) = FairSlots::with_wakes(1);
    let now = Instant::now();
    let (held, _) = slots.take_or_queue(&key("ns", "a"), "ns", now).unwrap();
    // No slot: "b" waits in line, once, however often it comes.
    assert!(waits(&slots, "ns", "b", now));
    let later = now + Duration::from_secs(9);
    assert!(waits(&slots, "ns", "b", later));
    assert!(waits(&slots, "ns", "c", now));
    assert_eq!((slots.waiting(), woken(&mut turns).len()), (2, 0));
    drop(held);
    // "b" is woken, and the freed slot is set aside for it: "c" cannot take it.
    assert_eq!(woken(&mut turns), ["b"]);
    assert!(waits(&slots, "ns", "c", now));
    std::thread::sleep(Duration::from_millis(50));
    let taken = Instant::now();
    let (b, since) = slots.take_or_queue(&key("ns", "b"), "ns", later).unwrap();
    assert!(
        since < taken,
        "it waited since it first came, not since it took the slot"
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
async fn a_flooding_namespace_waits_its_turn_like_any_other() {
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
        assert!(waits(&slots, "quiet", q, now));
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
        assert!(waits(&slots, "ns", r, renewal));
    }
    // A change to "renew2" (an edit, a pod) must run now.
    assert!(waits(&slots, "ns", "renew2", now));
    assert_eq!(slots.waiting(), 3);
    drop(held);
    assert_eq!(serve(&slots, &mut turns, 3), ["renew2", "renew0", "renew1"]);
    assert_eq!((slots.waiting(), woken(&mut turns).len()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_slot_set_aside_for_a_key_that_never_comes_goes_on() {
    let (slots, mut turns) = FairSlots::with_wakes(1);
    let now = Instant::now();
    let held = slots.take_or_queue(&key("ns", "a"), "ns", now).unwrap().0;
    for k in ["gone", "deleted", "next"] {
        assert!(waits(&slots, "ns", k, now));
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
    assert!(waits(&slots, "ns", "deleted", now));
    taking_back.abort();
}

#[tokio::test]
async fn a_new_lease_goes_before_renewals_that_can_wait_but_not_before_late_ones() {
    let (slots, mut turns) = FairSlots::with_wakes(1);
    let now = Instant::now();
    let busy = slots
        .take_or_queue(&key("ns", "busy"), "ns", now)
        .unwrap()
        .0;
    // Many renewals on their schedule, each with slack left...
    for i in 0..50 {
        let by = now + Duration::from_secs(10);
        assert!(
            slots
                .take_or_queue(&key("ns", &format!("renew{i}")), "ns", by)
                .is_none()
        );
    }
    // ...then a new TargetLease, then a renewal whose slack ran out.
    assert!(waits(&slots, "ns", "new", now));
    let late = now - Duration::from_secs(1);
    assert!(waits(&slots, "ns", "late", late));
    assert_eq!(slots.waiting(), 52);
    drop(busy);
    assert_eq!(
        serve(&slots, &mut turns, 4),
        ["late", "new", "renew0", "renew1"]
    );
}

#[tokio::test]
async fn a_key_that_moved_up_costs_its_namespace_no_turn() {
    let (slots, mut turns) = FairSlots::with_wakes(1);
    let now = Instant::now();
    let later = now + Duration::from_secs(10);
    let mut held = slots.take_or_queue(&key("a", "busy"), "a", now).unwrap().0;
    let queue = |ns: &str, k: &str, by| assert!(waits(&slots, ns, k, by));
    queue("a", "a1", later);
    queue("b", "b1", now);
    queue("a", "a2", later);
    queue("b", "b2", now);
    // "a1" again, sooner: its first entry stays in the line, overtaken.
    queue("a", "a1", now);
    let mut order = Vec::new();
    for _ in 0..4 {
        drop(held);
        let next = woken(&mut turns);
        assert_eq!(next.len(), 1, "one key at a time: {next:?}");
        let ns = &next[0][..1];
        held = slots.take_or_queue(&key(ns, &next[0]), ns, now).unwrap().0;
        order.extend(next);
    }
    assert_eq!(order, ["a1", "b1", "a2", "b2"]);
}

#[tokio::test]
async fn a_slot_taken_is_not_handed_on_again_by_a_late_word_that_its_key_is_gone() {
    let (slots, mut turns) = FairSlots::with_wakes(1);
    let now = Instant::now();
    let held = slots.take_or_queue(&key("ns", "a"), "ns", now).unwrap().0;
    assert!(waits(&slots, "ns", "b", now));
    drop(held);
    assert_eq!(woken(&mut turns), ["b"]);
    let b = slots.take_or_queue(&key("ns", "b"), "ns", now).unwrap().0;
    // Too late to say so: "b" holds its slot, and nobody else gets one.
    slots.not_coming(&key("ns", "b"));
    assert!(waits(&slots, "ns", "c", now));
    assert_eq!(woken(&mut turns).len(), 0);
    drop(b);
    assert_eq!(woken(&mut turns), ["c"]);
}

#[tokio::test]
async fn with_nobody_to_wake_a_freed_slot_is_free_again() {
    let (slots, turns) = FairSlots::with_wakes(1);
    let now = Instant::now();
    let held = slots.take_or_queue(&key("ns", "a"), "ns", now).unwrap().0;
    assert!(waits(&slots, "ns", "b", now));
    // The controller stopped: "b" cannot be sent, and its slot goes on.
    drop(turns);
    drop(held);
    assert_eq!(slots.waiting(), 0);
    assert!(slots.take_or_queue(&key("ns", "c"), "ns", now).is_some());
}
