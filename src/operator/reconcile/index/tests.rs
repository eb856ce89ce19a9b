use super::*;
use crate::operator::crd::{Phase, TargetLeaseSpec, TargetLeaseStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::store::Writer;
use std::cell::Cell;

fn tl(name: &str, target: &str, created_s: i64) -> TargetLease {
    let spec: TargetLeaseSpec =
        serde_json::from_value(serde_json::json!({"target": target, "holder": {"identity": name}}))
            .unwrap();
    let mut t = TargetLease::new(name, spec);
    t.metadata.namespace = Some("ns".into());
    t.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created_s).unwrap()));
    t
}

/// A cache and its index, fed the same events in the operator's order.
struct Cache {
    store: Store<TargetLease>,
    writer: Writer<TargetLease>,
    index: LeaseIndex,
}

impl Cache {
    fn new() -> Self {
        let (store, writer) = kube::runtime::reflector::store();
        Cache {
            store,
            writer,
            index: LeaseIndex::default(),
        }
    }

    fn send(&mut self, event: Event<TargetLease>) -> Vec<Withdrawn> {
        self.writer.apply_watcher_event(&event);
        self.index.apply(&event)
    }

    /// Sends `event` the way the controller does; the names it woke.
    fn wake(&mut self, event: Event<TargetLease>) -> Vec<String> {
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        self.writer.apply_watcher_event(&event);
        self.index.wake_others(&self.store, &event, &tx);
        drop(tx);
        let mut woken = Vec::new();
        while let Ok(key) = rx.try_recv() {
            woken.push(key.name);
        }
        woken
    }

    fn get(&self, name: &str) -> Arc<TargetLease> {
        self.store.get(&ObjectRef::new(name).within("ns")).unwrap()
    }

    fn behind(&self, me: &str, pods: u64, wants: impl Fn(&TargetLease) -> bool) -> Option<String> {
        self.index
            .queued_behind(&self.store, &self.get(me), pods, wants)
    }
}

#[test]
fn the_oldest_lease_that_wants_the_target_goes_first() {
    let mut c = Cache::new();
    let mut error = tl("broken", "t", 5);
    error.status = Some(TargetLeaseStatus {
        phase: Some(Phase::Error),
        ..Default::default()
    });
    let mut deleting = tl("deleting", "t", 6);
    deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
    for l in [
        tl("older", "t", 20),
        tl("oldest", "t", 10),
        tl("other-target", "u", 1),
        tl("newer", "t", 40),
        error,
        deleting,
        tl("me", "t", 30),
    ] {
        c.send(Event::Apply(l));
    }
    assert_eq!(c.behind("me", 1, |_| true).as_deref(), Some("oldest"));
    assert_eq!(c.behind("oldest", 1, |_| true), None, "first in line");
    // The oldest stops wanting the lease (its pod is not Ready; the pods' epoch moved).
    let wants = |o: &TargetLease| o.name_any() != "oldest";
    assert_eq!(c.behind("me", 2, wants).as_deref(), Some("older"));
    assert_eq!(c.behind("older", 2, wants), None);
    assert_eq!(c.behind("me", 3, |_| false), None);
    // Same second: ties go by name.
    c.send(Event::Apply(tl("a", "t", 30)));
    assert_eq!(
        c.behind("me", 4, |o| o.name_any() == "a").as_deref(),
        Some("a")
    );
    // Moving to another target leaves this queue.
    c.send(Event::Apply(tl("a", "v", 30)));
    assert_eq!(c.behind("me", 4, |o| o.name_any() == "a"), None);
    // Gone: out of the queue.
    c.send(Event::Delete(tl("oldest", "t", 10)));
    assert_eq!(c.behind("me", 5, |_| true).as_deref(), Some("older"));
}

/// A full resync of `n` TargetLeases on one target asks each member whether
/// it wants the lease once, not once per pass: the work grows with `n`, not
/// `n²`. A change of the target (or of the namespace's opted-in pods) asks
/// again, once.
#[test]
fn a_resync_of_one_target_costs_work_linear_in_its_members() {
    let n = 2000;
    let mut c = Cache::new();
    for i in 0..n {
        c.send(Event::Apply(tl(&format!("l{i:05}"), "t", i)));
    }
    let asked = Cell::new(0u64);
    // The first 100 do not want the lease (their pods are not Ready).
    let wants = |o: &TargetLease| {
        asked.set(asked.get() + 1);
        o.name_any().as_str() >= "l00100"
    };
    let reads = c.index.reads();
    let mut heads = 0;
    let me_of = |c: &Cache, i: i64| c.get(&format!("l{i:05}"));
    for i in 0..n {
        let me = me_of(&c, i);
        heads += c
            .index
            .queued_behind(&c.store, &me, 7, wants)
            .is_some_and(|h| h == "l00100") as usize;
        let _ = c.index.published(&c.store, "ns", "t");
    }
    assert_eq!(
        heads,
        (n - 101) as usize,
        "everyone after l00100 waits behind it"
    );
    assert_eq!(
        asked.get(),
        101,
        "each member asked at most once in the resync"
    );
    assert!(
        c.index.reads() - reads <= 2 * 101 + n as u64,
        "cache reads: {} for {n} passes",
        c.index.reads() - reads
    );

    // A status write of one member: the target changed, asked again once.
    let mut held = (*c.get("l00150")).clone();
    held.status = Some(TargetLeaseStatus {
        fencing_token: Some(9),
        ..Default::default()
    });
    c.send(Event::Apply(held));
    asked.set(0);
    for i in 0..n {
        let _ = c.index.queued_behind(&c.store, &me_of(&c, i), 7, wants);
    }
    assert_eq!(asked.get(), 101);
    assert_eq!(c.index.published(&c.store, "ns", "t").max_token, 9);
    // The namespace's opted-in pods changed: asked again once.
    asked.set(0);
    for i in 0..n {
        let _ = c.index.queued_behind(&c.store, &me_of(&c, i), 8, wants);
    }
    assert_eq!(asked.get(), 101);
}

#[test]
fn held_members_and_the_highest_token_are_read_from_the_target_only() {
    let mut c = Cache::new();
    c.send(Event::Apply(held("a", "t", 3, 100)));
    c.send(Event::Apply(held("b", "u", 12, 100)));
    c.send(Event::Apply(tl("c", "t", 2)));
    let p = c.index.published(&c.store, "ns", "t");
    assert_eq!(p.max_token, 3);
    assert_eq!(p.held, [(Arc::from("a"), 100_000)]);
    // A relist in which `a` is gone (deleted while the watch was down).
    c.send(Event::Init);
    c.send(Event::InitApply(tl("c", "t", 2)));
    assert_eq!(
        c.index.published(&c.store, "ns", "t").max_token,
        3,
        "until the relist completes"
    );
    c.send(Event::InitDone);
    assert_eq!(
        *c.index.published(&c.store, "ns", "t"),
        Published::default()
    );
    assert_eq!(c.index.on_target(&c.store, "ns", "u").len(), 0);
    assert_eq!(c.index.in_namespace(&c.store, "ns").len(), 1);
}

/// `name` on `target`, its status publishing Held with `token`.
fn held(name: &str, target: &str, token: u64, expires_s: i64) -> TargetLease {
    let mut l = tl(name, target, 1);
    l.status = Some(TargetLeaseStatus {
        phase: Some(Phase::Held),
        fencing_token: Some(token),
        holder: Some(name.into()),
        acquisition_id: Some("a".into()),
        expires_at: Some(Time(Timestamp::from_second(expires_s).unwrap())),
        ..Default::default()
    });
    l
}

#[test]
fn a_member_that_stops_publishing_held_or_leaves_is_reported_whoever_wrote_it() {
    let mut c = Cache::new();
    let gone = |name: &str, target: &str| {
        vec![Withdrawn {
            namespace: "ns".into(),
            target: target.into(),
            name: name.into(),
        }]
    };
    assert_eq!(c.send(Event::Apply(tl("x", "t", 1))), []);
    assert_eq!(c.send(Event::Apply(tl("y", "t", 2))), []);
    assert_eq!(c.send(Event::Apply(held("x", "t", 3, 100))), []);
    assert_eq!(
        c.send(Event::Apply(held("x", "t", 3, 160))),
        [],
        "a renewal"
    );
    // Released: Pending, or Held again under another token.
    let mut pending = held("x", "t", 3, 160);
    pending.status.as_mut().unwrap().phase = Some(Phase::Pending);
    assert_eq!(c.send(Event::Apply(pending)), gone("x", "t"));
    assert_eq!(c.send(Event::Apply(held("x", "t", 4, 200))), []);
    assert_eq!(c.send(Event::Apply(held("x", "t", 5, 200))), gone("x", "t"));
    // Seen on another target (the API refuses the edit; a delete and
    // create under the same name between two relists looks the same).
    assert_eq!(c.send(Event::Apply(held("x", "u", 5, 200))), gone("x", "t"));
    assert_eq!(
        c.send(Event::Delete(held("x", "u", 5, 200))),
        gone("x", "u")
    );
    // A member that never published Held leaving: the queue moved.
    assert_eq!(c.send(Event::Delete(tl("y", "t", 2))), gone("y", "t"));
    // A relist that no longer has a member, or has it no longer Held.
    c.send(Event::Apply(held("a", "t", 6, 300)));
    c.send(Event::Apply(held("b", "v", 1, 300)));
    c.send(Event::Apply(held("c", "w", 1, 300)));
    c.send(Event::Apply(tl("d", "w", 2)));
    c.send(Event::Apply(tl("e", "w", 3)));
    assert_eq!(c.send(Event::Init), []);
    assert_eq!(c.send(Event::InitApply(tl("b", "v", 1))), []);
    assert_eq!(c.send(Event::InitApply(held("c", "w", 1, 360))), []);
    assert_eq!(c.send(Event::InitApply(tl("e", "w", 3))), []);
    let mut withdrawn = c.send(Event::InitDone);
    withdrawn.sort_by(|l, r| l.name.cmp(&r.name));
    assert_eq!(
        withdrawn,
        [gone("a", "t"), gone("b", "v"), gone("d", "w")].concat()
    );
}

#[test]
fn the_others_on_the_target_are_woken_when_the_cache_takes_the_change() {
    let mut c = Cache::new();
    let with_phase = |mut l: TargetLease, phase: Phase| {
        l.status.get_or_insert_default().phase = Some(phase);
        l
    };
    for l in [tl("y", "t", 2), tl("z", "t", 3), tl("w", "u", 4)] {
        assert!(c.wake(Event::Apply(l)).is_empty());
    }
    assert!(c.wake(Event::Apply(held("x", "t", 1, 100))).is_empty());
    let pending = with_phase(held("x", "t", 1, 100), Phase::Pending);
    assert_eq!(
        c.wake(Event::Apply(pending)),
        ["y", "z"],
        "never x, never u's w"
    );
    // The head of the queue goes into error (it leaves the queue).
    let error = with_phase(tl("y", "t", 2), Phase::Error);
    assert_eq!(c.wake(Event::Apply(error.clone())), ["x", "z"]);
    assert!(c.wake(Event::Apply(error)).is_empty(), "already out");
    // Being deleted, then gone.
    let mut deleting = tl("z", "t", 3);
    deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
    assert_eq!(c.wake(Event::Apply(deleting.clone())), ["x", "y"]);
    assert_eq!(c.wake(Event::Delete(deleting)), ["x", "y"]);
}

#[test]
fn a_target_is_named_while_a_cached_lease_names_it_and_through_a_relist() {
    let mut c = Cache::new();
    assert!(!c.index.names_target("ns", "t"));
    c.send(Event::Apply(tl("a", "t", 1)));
    c.send(Event::Apply(tl("b", "t", 2)));
    assert!(c.index.names_target("ns", "t"));
    assert!(!c.index.names_target("other-ns", "t"), "per namespace");
    c.send(Event::Delete(tl("a", "t", 1)));
    assert!(c.index.names_target("ns", "t"), "b still names it");
    // b moves to another target.
    c.send(Event::Apply(tl("b", "u", 2)));
    assert!(!c.index.names_target("ns", "t"));
    assert!(c.index.names_target("ns", "u"));
    // A relist without b: named until the relist is complete, then not.
    c.send(Event::Init);
    c.send(Event::InitApply(tl("c", "v", 3)));
    assert!(c.index.names_target("ns", "u"));
    c.send(Event::InitDone);
    assert!(!c.index.names_target("ns", "u"));
    assert!(c.index.names_target("ns", "v"));
}

#[test]
fn a_notice_whose_namespace_holds_a_slash_names_no_target() {
    let mut c = Cache::new();
    // ns "ns", target "a/t": "ns/a/t" as one string.
    c.send(Event::Apply(tl("x", "a/t", 1)));
    assert!(c.index.names_target("ns", "a/t"));
    assert!(
        !c.index.names_target("ns/a", "t"),
        "not another namespace's target"
    );
}
