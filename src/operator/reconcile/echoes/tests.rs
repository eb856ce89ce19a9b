use futures::channel::mpsc;

use super::*;

fn at(version: &str) -> TargetLease {
    let spec =
        serde_json::from_value(serde_json::json!({"target": "t", "holder": {"identity": "j"}}));
    let mut tl = TargetLease::new("job", spec.unwrap());
    tl.metadata.namespace = Some("team".into());
    tl.metadata.resource_version = Some(version.into());
    tl
}

fn echoes() -> (Arc<Echoes>, mpsc::UnboundedReceiver<ObjectRef<TargetLease>>) {
    let (tx, rx) = mpsc::unbounded();
    (Echoes::new(tx), rx)
}

fn woken(rx: &mut mpsc::UnboundedReceiver<ObjectRef<TargetLease>>) -> Vec<String> {
    let mut names = Vec::new();
    while let Ok(r) = rx.try_recv() {
        names.push(format!("{}/{}", r.namespace.unwrap_or_default(), r.name));
    }
    names
}

#[test]
fn the_event_of_an_own_write_triggers_nothing_and_anyone_elses_does() {
    let (echoes, mut rx) = echoes();
    let key = ObjectRef::from_obj(&at("1"));
    // Nothing written yet: every event triggers.
    assert!(echoes.triggers(&at("1")));
    echoes.writing(&key).wrote(Some("2".into()));
    assert!(!echoes.triggers(&at("2")), "the echo of the status write");
    assert!(echoes.triggers(&at("3")), "someone else's change");
    // A second write: only its own version is an echo.
    echoes.writing(&key).wrote(Some("4".into()));
    assert!(!echoes.triggers(&at("4")));
    assert!(echoes.triggers(&at("5")));
    assert!(woken(&mut rx).is_empty());
    // Forgotten (the TargetLease is gone): every event triggers again.
    echoes.forget(&key);
    assert!(echoes.triggers(&at("4")));
}

/// A loaded watch delivers the finalizer's event after the status write
/// that followed it was acknowledged: still an echo. Only the recent writes
/// are remembered.
#[test]
fn a_late_echo_of_an_earlier_own_write_triggers_nothing() {
    let (echoes, mut rx) = echoes();
    let key = ObjectRef::from_obj(&at("1"));
    echoes.writing(&key).wrote(Some("2".into())); // the finalizer
    echoes.writing(&key).wrote(Some("3".into())); // the status
    assert!(!echoes.triggers(&at("2")), "the finalizer's late echo");
    assert!(!echoes.triggers(&at("3")));
    assert!(echoes.triggers(&at("4")), "someone else's change");
    for v in 10..10 + RECENT {
        echoes.writing(&key).wrote(Some(v.to_string()));
    }
    assert!(echoes.triggers(&at("3")), "older than the recent writes");
    assert!(!echoes.triggers(&at("10")));
    assert!(woken(&mut rx).is_empty());
}

#[test]
fn an_event_before_the_reply_waits_for_it() {
    let (echoes, mut rx) = echoes();
    let key = ObjectRef::from_obj(&at("1"));
    // The echo comes before the reply: held, then dropped.
    let w = echoes.writing(&key);
    assert!(!echoes.triggers(&at("2")));
    w.wrote(Some("2".into()));
    assert!(woken(&mut rx).is_empty(), "the held event was the echo");
    // Another change comes while a write is in flight: sent once it ends.
    let w = echoes.writing(&key);
    assert!(!echoes.triggers(&at("3")));
    w.wrote(Some("4".into()));
    assert_eq!(woken(&mut rx), ["team/job"]);
    // A write that fails (its guard dropped) sends what it held.
    let w = echoes.writing(&key);
    assert!(!echoes.triggers(&at("5")));
    drop(w);
    assert_eq!(woken(&mut rx), ["team/job"]);
    // Nothing held: a failed write sends nothing.
    drop(echoes.writing(&key));
    assert!(woken(&mut rx).is_empty());
}

#[test]
fn held_events_wait_for_every_write_in_flight() {
    let (echoes, mut rx) = echoes();
    let key = ObjectRef::from_obj(&at("1"));
    let (a, b) = (echoes.writing(&key), echoes.writing(&key));
    assert!(!echoes.triggers(&at("7")));
    a.wrote(Some("6".into()));
    assert!(woken(&mut rx).is_empty(), "one write still in flight");
    b.wrote(Some("7".into()));
    assert!(woken(&mut rx).is_empty(), "it was the second write's echo");
    let kept = |r: &NsName| r.name() != "job";
    echoes.retain(kept);
    assert!(echoes.triggers(&at("7")));
}

#[test]
fn a_change_the_reply_of_a_write_already_shows_still_wakes() {
    let (echoes, mut rx) = echoes();
    let key = ObjectRef::from_obj(&at("100"));
    // Someone edits the spec (101) while the finalizer patch is in flight;
    // the patch applies on top of it and returns 102.
    let w = echoes.writing(&key);
    assert!(!echoes.triggers(&at("101")));
    assert!(!echoes.triggers(&at("102")));
    w.wrote(Some("102".into()));
    assert_eq!(woken(&mut rx), ["team/job"], "the edit at 101 is not ours");
    // Both events were the writes' own: nothing.
    let (a, b) = (echoes.writing(&key), echoes.writing(&key));
    assert!(!echoes.triggers(&at("103")));
    assert!(!echoes.triggers(&at("104")));
    a.wrote(Some("103".into()));
    b.wrote(Some("104".into()));
    assert!(woken(&mut rx).is_empty());
}

/// An echo that came lets go of the versions written before it (their
/// events came first or never will), and keeps its own for a relist that
/// shows it again.
#[test]
fn an_echo_that_came_keeps_only_its_own_version_of_the_writes_before_it() {
    let (echoes, mut rx) = echoes();
    let key = ObjectRef::from_obj(&at("1"));
    for v in ["2", "3", "4"] {
        echoes.writing(&key).wrote(Some(v.into()));
    }
    assert!(!echoes.triggers(&at("3")), "an echo, the one of 2 skipped");
    let kept = |echoes: &Echoes| echoes.lock().get(&key_of(&key)).unwrap().wrote.clone();
    assert_eq!(kept(&echoes), ["3", "4"]);
    assert!(!echoes.triggers(&at("3")), "a relist showing it again");
    // A version older than an echo that came is forgotten: the watch never
    // shows it after the echo; if something did, one more reconcile.
    assert!(echoes.triggers(&at("2")));
    assert!(!echoes.triggers(&at("4")));
    assert_eq!(kept(&echoes), ["4"]);
    // A lease republished for hours keeps one version, not the last eight.
    for v in 10..100 {
        echoes.writing(&key).wrote(Some(v.to_string()));
        assert!(!echoes.triggers(&at(&v.to_string())));
    }
    assert_eq!(kept(&echoes), ["99"]);
    assert!(woken(&mut rx).is_empty());
}

/// The same when each echo comes before its write's reply (held, then
/// explained by the reply): one version kept, not the last eight.
#[test]
fn echoes_that_beat_their_replies_also_keep_only_the_latest_version() {
    let (echoes, mut rx) = echoes();
    let key = ObjectRef::from_obj(&at("1"));
    for v in 10..30 {
        let w = echoes.writing(&key);
        assert!(!echoes.triggers(&at(&v.to_string())), "held");
        w.wrote(Some(v.to_string()));
    }
    let kept = echoes.lock().get(&key_of(&key)).unwrap().wrote.clone();
    assert_eq!(kept, ["29"]);
    assert!(!echoes.triggers(&at("29")), "a relist showing it again");
    assert!(woken(&mut rx).is_empty());
}
