//! The pool's state machine with no network: a connector that hands out
//! in-memory duplex streams (or fails, when told to), their server ends
//! played by the test.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::super::dial::Conn;
use super::super::error::{Error, Kind};
use super::super::link::tests::{Server, conn};
use super::super::resp::{Cmd, Value};
use super::{Connector, Pool, Sizes};

/// Hands out in-memory duplex streams; the server end of each one opened goes to `servers`.
#[derive(Default)]
struct DuplexConnector {
    servers: Mutex<Vec<Server>>,
    opens: AtomicUsize,
    refuse: AtomicBool,
}

impl Connector for Arc<DuplexConnector> {
    fn open(&self, _deadline: Instant) -> BoxFuture<'_, Result<Conn, Error>> {
        Box::pin(async move {
            self.opens.fetch_add(1, Ordering::SeqCst);
            if self.refuse.load(Ordering::SeqCst) {
                return Err(Error::new(Kind::Dial, "cannot connect: refused"));
            }
            let (conn, server) = conn();
            self.servers.lock().unwrap().push(server);
            Ok(conn)
        })
    }
}

impl DuplexConnector {
    /// The server end of the `n`th connection opened (taken out).
    fn server(&self, n: usize) -> Server {
        let mut all = self.servers.lock().unwrap();
        assert!(all.len() > n, "connection {n} was opened");
        all.remove(n)
    }
}

fn pool(sizes: Sizes) -> (Arc<Pool>, Arc<DuplexConnector>, Counter) {
    let connector = Arc::new(DuplexConnector::default());
    let opened = Counter::default();
    let pool = Pool::with_connector(
        Box::new(connector.clone()),
        sizes,
        Duration::from_secs(1),
        opened.clone(),
    );
    (Arc::new(pool), connector, opened)
}

fn sizes(shared: usize, durable: usize) -> Sizes {
    Sizes {
        shared,
        durable,
        max_in_flight: 16,
    }
}

/// The error of a call expected to fail.
fn err<T>(r: Result<T, Error>) -> Error {
    match r {
        Err(e) => e,
        Ok(_) => panic!("expected an error"),
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(2)
}

/// `GET key` on `link`, answered `+OK` by `server`.
async fn round_trip(link: &super::Link, server: &mut Server) {
    let request = {
        let link = link.clone();
        tokio::spawn(async move { link.request(&[Cmd::new("GET").arg("k")], soon()).await })
    };
    assert_eq!(server.expect().await, ["GET", "k"]);
    server.reply(b"+OK\r\n").await;
    assert_eq!(
        request.await.unwrap().unwrap(),
        [Value::Simple("OK".into())]
    );
}

#[tokio::test]
async fn a_closed_connection_is_replaced_by_a_new_one() {
    let (pool, connector, opened) = pool(sizes(1, 1));
    let first = pool.link(soon()).await.unwrap();
    let mut server = connector.server(0);
    round_trip(&first, &mut server).await;
    // The same connection again while it is healthy.
    let again = pool.link(soon()).await.unwrap();
    round_trip(&again, &mut server).await;
    assert_eq!(opened.get(), 1);
    // The server goes away: the next caller gets a new connection.
    drop(server);
    while first.is_alive() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = pool.link(soon()).await.unwrap();
    assert!(second.is_alive());
    round_trip(&second, &mut connector.server(0)).await;
    assert_eq!(opened.get(), 2);
}

#[tokio::test]
async fn after_a_failed_connect_callers_fail_at_once_until_the_backoff_ends() {
    let (pool, connector, _) = pool(sizes(1, 1));
    connector.refuse.store(true, Ordering::SeqCst);
    let e = err(pool.link(soon()).await);
    assert_eq!(e.kind, Kind::Dial, "{e:?}");
    // Within the backoff: the last cause at once, no new attempt.
    let e = err(pool.link(soon()).await);
    assert_eq!(e.kind, Kind::Dial, "{e:?}");
    assert!(
        e.detail.contains("refused") && e.detail.contains("next attempt in"),
        "{e:?}"
    );
    assert_eq!(connector.opens.load(Ordering::SeqCst), 1);
    // Once it ends (100ms at most +20%), the server is asked again.
    connector.refuse.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(pool.link(soon()).await.is_ok());
    assert_eq!(connector.opens.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_busy_shared_connection_gets_a_sibling_up_to_the_pool_size() {
    let (pool, connector, opened) = pool(sizes(2, 1));
    let first = pool.link(soon()).await.unwrap();
    let mut server = connector.server(0);
    // One request in flight on the first: the next caller gets a new one.
    let busy = {
        let first = first.clone();
        tokio::spawn(async move { first.request(&[Cmd::new("GET").arg("k")], soon()).await })
    };
    server.expect().await;
    let second = pool.link(soon()).await.unwrap();
    assert_eq!(opened.get(), 2);
    let mut server2 = connector.server(0);
    let busy2 = {
        let second = second.clone();
        tokio::spawn(async move { second.request(&[Cmd::new("GET").arg("k")], soon()).await })
    };
    server2.expect().await;
    // Both busy and the pool full: the least loaded is shared, none opened.
    let third = pool.link(soon()).await.unwrap();
    assert_eq!(opened.get(), 2);
    assert_eq!(third.load(), 1);
    server.reply(b"+OK\r\n").await;
    server2.reply(b"+OK\r\n").await;
    assert!(busy.await.unwrap().is_ok() && busy2.await.unwrap().is_ok());
}

#[tokio::test]
async fn an_exclusive_connection_given_back_is_reused_and_one_dropped_is_closed() {
    let (pool, connector, opened) = pool(sizes(1, 2));
    let held = pool.exclusive(soon()).await.unwrap();
    let mut server = connector.server(0);
    round_trip(held.link(), &mut server).await;
    held.give_back();
    // Kept warm: the next durable caller opens nothing.
    let held = pool.exclusive(soon()).await.unwrap();
    assert_eq!(opened.get(), 1);
    round_trip(held.link(), &mut server).await;
    // Dropped without being given back (its caller went away mid-call):
    // something may still run on it, so it is closed, never reused.
    let link = held.link().clone();
    drop(held);
    assert!(!link.is_alive());
    let held = pool.exclusive(soon()).await.unwrap();
    assert_eq!(opened.get(), 2);
    assert!(held.link().is_alive());
}

#[tokio::test]
async fn exclusive_callers_past_the_durable_pool_size_wait_then_give_up_unsent() {
    let (pool, _memory, _) = pool(sizes(1, 1));
    let taken = pool.exclusive(soon()).await.unwrap();
    let e = err(pool
        .exclusive(Instant::now() + Duration::from_millis(50))
        .await);
    assert_eq!(e.kind, Kind::Busy, "{e:?}");
    assert!(!e.kind.may_have_run());
    taken.give_back();
    assert!(pool.exclusive(soon()).await.is_ok());
}

#[tokio::test]
async fn a_closed_pool_hands_out_nothing() {
    let (pool, connector, _) = pool(sizes(1, 1));
    let link = pool.link(soon()).await.unwrap();
    let _server = connector.server(0);
    pool.close().await;
    assert!(!link.is_alive());
    let e = err(pool.exclusive(soon()).await);
    assert_eq!(e.kind, Kind::Closed, "{e:?}");
}

#[tokio::test]
async fn a_request_its_connection_closed_before_writing_goes_once_more_on_a_new_one() {
    use super::super::client::{Use, exchange};
    let (pool, connector, opened) = pool(sizes(1, 1));
    let link = pool.link(soon()).await.unwrap();
    let mut server = connector.server(0);
    // A request goes late: the link writes a marker and holds back the next.
    let late = {
        let link = link.clone();
        let by = Instant::now() + Duration::from_millis(50);
        tokio::spawn(async move { link.request(&[Cmd::new("GET").arg("slow")], by).await })
    };
    server.expect().await;
    assert_eq!(late.await.unwrap().unwrap_err().kind, Kind::Late);
    assert_eq!(server.expect().await[0], "PING");
    // The pool is full, so the next request queues on that link, unwritten.
    let pool2 = pool.clone();
    let sent = tokio::spawn(async move {
        exchange(&pool2, Use::Shared, &[Cmd::new("GET").arg("k")], soon()).await
    });
    assert!(server.quiet_for(Duration::from_millis(50)).await);
    // The connection closes before writing it: it cannot have run, so it
    // goes once more, on a new connection.
    drop(server);
    let reopened = async {
        loop {
            if let Some(s) = connector.servers.lock().unwrap().pop() {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let mut server = tokio::time::timeout(Duration::from_secs(1), reopened)
        .await
        .expect("a new connection within 1s");
    assert_eq!(server.expect().await, ["GET", "k"]);
    server.reply(b"+OK\r\n").await;
    let (_, replies) = sent.await.unwrap().unwrap();
    assert_eq!(replies, [Value::Simple("OK".into())]);
    assert_eq!(opened.get(), 2);
}
