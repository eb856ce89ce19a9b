use std::time::Duration;

use futures::StreamExt;

use super::*;

fn key(name: &str) -> ObjectRef<TargetLease> {
    ObjectRef::new(name).within("ns")
}

fn names(taken: &[NsName]) -> Vec<&str> {
    taken.iter().map(NsName::name).collect()
}

#[test]
fn a_key_asked_for_twice_is_due_at_the_earlier_time() {
    let r = Renewals::default();
    let now = Instant::now();
    r.schedule(&key("a"), now + Duration::from_secs(10));
    r.schedule(&key("a"), now + Duration::from_secs(5));
    r.schedule(&key("b"), now + Duration::from_secs(5));
    r.schedule(&key("b"), now + Duration::from_secs(10));
    assert_eq!(r.len(), 2, "one entry per key");
    let (taken, next) = r.take_due(now + Duration::from_secs(4));
    assert!(taken.is_empty());
    assert_eq!(next, Some(now + Duration::from_secs(5)));
    let (taken, next) = r.take_due(now + Duration::from_secs(5));
    assert_eq!(names(&taken), ["a", "b"], "both are due at 5 s");
    assert_eq!(next, None, "nothing is left: the later asks were not kept");
    assert!(r.is_empty());
}

#[test]
fn keys_come_due_in_time_order_and_are_forgotten_once_due() {
    let r = Renewals::default();
    let now = Instant::now();
    for (name, s) in [("c", 3), ("a", 1), ("b", 2)] {
        r.schedule(&key(name), now + Duration::from_secs(s));
    }
    let (taken, next) = r.take_due(now + Duration::from_secs(2));
    assert_eq!(names(&taken), ["a", "b"]);
    assert_eq!(next, Some(now + Duration::from_secs(3)));
    // A key taken is asked for again by its next pass, at any time.
    r.schedule(&key("a"), now + Duration::from_secs(9));
    let (taken, _) = r.take_due(now + Duration::from_secs(9));
    assert_eq!(names(&taken), ["c", "a"]);
}

#[test]
fn a_forgotten_key_never_comes_due() {
    let r = Renewals::default();
    let now = Instant::now();
    r.schedule(&key("gone"), now);
    r.schedule(&key("vanished"), now);
    r.schedule(&key("kept"), now);
    r.forget(&key("gone"));
    r.retain(|n| n.name() != "vanished");
    let (taken, next) = r.take_due(now);
    assert_eq!(names(&taken), ["kept"]);
    assert_eq!(next, None);
}

#[tokio::test]
async fn the_stream_sends_each_key_when_it_comes_due() {
    let r = Arc::new(Renewals::default());
    let started = Instant::now();
    r.schedule(&key("later"), started + Duration::from_secs(3));
    let mut due = Box::pin(r.clone().come_due());
    // Asked for while the stream sleeps until the later one: it wakes sooner.
    let r2 = r.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        r2.schedule(&key("sooner"), Instant::now() + Duration::from_millis(50));
    });
    let first = tokio::time::timeout(Duration::from_secs(5), due.next()).await;
    let first = first
        .expect("the sooner key comes")
        .expect("the stream goes on");
    let at = started.elapsed();
    assert_eq!(first.name, "sooner");
    assert_eq!(first.namespace.as_deref(), Some("ns"));
    assert!(
        at >= Duration::from_millis(100) && at < Duration::from_secs(3),
        "sent when due, well before the later key: {at:?}"
    );
    let second = tokio::time::timeout(Duration::from_secs(5), due.next()).await;
    let second = second
        .expect("the later key comes")
        .expect("the stream goes on");
    assert_eq!(second.name, "later");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "not before it is due"
    );
    assert!(r.is_empty());
}
