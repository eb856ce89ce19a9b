//! The link's state machine with no network: the server is the other end
//! of an in-memory duplex stream, played by the test, which sees exactly
//! what was written and answers (or not) as it likes.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::Instant;

use super::super::dial::{Conn, Probe};
use super::super::error::{Error, Kind};
use super::super::resp::{Cmd, Decoder, Value};
use super::Link;

/// The server's end of a link: reads commands, writes raw replies.
pub(in super::super) struct Server {
    io: DuplexStream,
    decoder: Decoder,
}

impl Server {
    /// The next command written to the server, as text (`["GET", "k"]`);
    /// `None` when the client closed the connection.
    pub(in super::super) async fn command(&mut self) -> Option<Vec<String>> {
        loop {
            match self.decoder.next().expect("the client writes RESP") {
                Some(Value::Array(parts)) => {
                    return Some(parts.iter().map(|p| p.text().unwrap_or_default()).collect());
                }
                Some(other) => panic!("a command is an array, not {other:?}"),
                None => {}
            }
            let n = self.io.read_buf(self.decoder.buffer()).await.ok()?;
            if n == 0 {
                return None;
            }
        }
    }

    /// The next command, which must come within a second.
    pub(in super::super) async fn expect(&mut self) -> Vec<String> {
        tokio::time::timeout(Duration::from_secs(1), self.command())
            .await
            .expect("a command within 1s")
            .expect("the connection is open")
    }

    /// True when nothing is written to the server for `d`.
    pub(in super::super) async fn quiet_for(&mut self, d: Duration) -> bool {
        matches!(
            tokio::time::timeout(d, self.command()).await,
            Err(_) | Ok(None)
        )
    }

    /// Writes `bytes` as the server's reply.
    pub(in super::super) async fn reply(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.expect("the client reads");
    }
}

/// A connection over an in-memory stream, and the server's end of it.
pub(in super::super) fn conn() -> (Conn, Server) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let conn = Conn {
        stream: Box::new(client),
        probe: Probe::none(),
    };
    let server = Server {
        io: server,
        decoder: Decoder::new(),
    };
    (conn, server)
}

fn start(max_in_flight: usize) -> (Link, Server) {
    let (conn, server) = conn();
    (Link::start(conn, max_in_flight), server)
}

fn get(key: &str) -> Vec<Cmd> {
    vec![Cmd::new("GET").arg(key)]
}

fn in_secs(s: u64) -> Instant {
    Instant::now() + Duration::from_secs(s)
}

/// Spawns `link.request(get(key))` with `deadline`.
fn ask(
    link: &Link,
    key: &str,
    deadline: Instant,
) -> tokio::task::JoinHandle<Result<Vec<Value>, Error>> {
    let (link, cmds) = (link.clone(), get(key));
    tokio::spawn(async move { link.request(&cmds, deadline).await })
}

fn bulk(s: &str) -> Value {
    Value::Bulk(s.as_bytes().to_vec())
}

#[tokio::test]
async fn pipelined_replies_go_to_their_own_requests_in_order() {
    let (link, mut server) = start(16);
    let mut asked = Vec::new();
    for key in ["a", "b", "c"] {
        asked.push(ask(&link, key, in_secs(5)));
        assert_eq!(server.expect().await, ["GET", key]);
    }
    // All three replies in one write, in request order.
    server.reply(b"$1\r\nA\r\n$1\r\nB\r\n$1\r\nC\r\n").await;
    for (handle, want) in asked.into_iter().zip(["A", "B", "C"]) {
        assert_eq!(handle.await.unwrap().unwrap(), [bulk(want)]);
    }
    // A request of several commands gets all its replies, and only its own.
    let two = {
        let link = link.clone();
        tokio::spawn(async move {
            let cmds = [Cmd::new("GET").arg("x"), Cmd::new("GET").arg("y")];
            link.request(&cmds, in_secs(5)).await
        })
    };
    assert_eq!(server.expect().await, ["GET", "x"]);
    assert_eq!(server.expect().await, ["GET", "y"]);
    let after = ask(&link, "z", in_secs(5));
    assert_eq!(server.expect().await, ["GET", "z"]);
    server.reply(b":1\r\n:2\r\n:3\r\n").await;
    assert_eq!(two.await.unwrap().unwrap(), [Value::Int(1), Value::Int(2)]);
    assert_eq!(after.await.unwrap().unwrap(), [Value::Int(3)]);
    assert_eq!(link.load(), 0);
}

#[tokio::test]
async fn a_reply_lost_after_the_request_was_written_may_have_run() {
    let (link, mut server) = start(16);
    let asked = ask(&link, "a", in_secs(5));
    assert_eq!(server.expect().await, ["GET", "a"]);
    drop(server); // the connection ends before any reply
    let e = asked.await.unwrap().unwrap_err();
    assert_eq!(e.kind, Kind::Lost, "{e:?}");
    assert!(e.kind.may_have_run());
    assert!(!link.is_alive());
    // A request after the close is never written: it cannot have run.
    let e = link.request(&get("b"), in_secs(5)).await.unwrap_err();
    assert_eq!(e.kind, Kind::Closed, "{e:?}");
    assert!(!e.kind.may_have_run());
}

#[tokio::test]
async fn bytes_that_are_not_resp_close_the_link_and_lose_what_was_written() {
    let (link, mut server) = start(16);
    let asked = ask(&link, "a", in_secs(5));
    server.expect().await;
    server.reply(b"?what\r\n").await;
    let e = asked.await.unwrap().unwrap_err();
    assert_eq!(e.kind, Kind::Lost, "{e:?}");
    assert!(e.detail.contains("unexpected reply type"), "{e:?}");
    assert!(!link.is_alive());
}

#[tokio::test]
async fn a_late_request_may_have_run_and_holds_back_the_next_until_the_marker_returns() {
    let (link, mut server) = start(16);
    let late = ask(&link, "slow", Instant::now() + Duration::from_millis(100));
    assert_eq!(server.expect().await, ["GET", "slow"]);
    let e = late.await.unwrap().unwrap_err();
    assert_eq!(e.kind, Kind::Late, "{e:?}");
    assert!(e.kind.may_have_run());
    // Behind it, a marker; the link is suspect until its echo comes back.
    let marker = server.expect().await;
    assert_eq!(marker[0], "PING");
    assert!(link.is_suspect());
    // A request now is held back, not written.
    let held = ask(&link, "next", in_secs(5));
    assert!(server.quiet_for(Duration::from_millis(100)).await);
    // The late reply comes, then the echo: the held request goes out, and
    // gets its own reply, not the late one's.
    let echo = format!("${}\r\n{}\r\n", marker[1].len(), marker[1]);
    server
        .reply(format!("$4\r\nSLOW\r\n{echo}").as_bytes())
        .await;
    assert_eq!(server.expect().await, ["GET", "next"]);
    assert!(!link.is_suspect());
    server.reply(b"$4\r\nNEXT\r\n").await;
    assert_eq!(held.await.unwrap().unwrap(), [bulk("NEXT")]);
    assert!(link.is_alive());
}

#[tokio::test]
async fn a_request_held_back_until_its_deadline_was_never_sent() {
    let (link, mut server) = start(16);
    let late = ask(&link, "slow", Instant::now() + Duration::from_millis(50));
    server.expect().await;
    assert_eq!(late.await.unwrap().unwrap_err().kind, Kind::Late);
    assert_eq!(server.expect().await[0], "PING");
    // Held behind the marker until its own deadline: taken back, unwritten.
    let held = ask(&link, "next", Instant::now() + Duration::from_millis(100));
    let e = held.await.unwrap().unwrap_err();
    assert_eq!(e.kind, Kind::Busy, "{e:?}");
    assert!(!e.kind.may_have_run());
    assert!(server.quiet_for(Duration::from_millis(100)).await);
}

#[tokio::test]
async fn a_request_held_back_when_the_link_closes_may_go_elsewhere() {
    let (link, mut server) = start(16);
    let late = ask(&link, "slow", Instant::now() + Duration::from_millis(50));
    server.expect().await;
    assert_eq!(late.await.unwrap().unwrap_err().kind, Kind::Late);
    assert_eq!(server.expect().await[0], "PING");
    let held = ask(&link, "next", in_secs(5));
    assert!(server.quiet_for(Duration::from_millis(50)).await);
    drop(server);
    let e = held.await.unwrap().unwrap_err();
    assert_eq!(e.kind, Kind::Closed, "{e:?}");
}

#[tokio::test]
async fn one_request_past_the_in_flight_limit_is_refused_unsent() {
    let (link, mut server) = start(1);
    let first = ask(&link, "a", in_secs(5));
    server.expect().await;
    let e = link.request(&get("b"), in_secs(5)).await.unwrap_err();
    assert_eq!(e.kind, Kind::Busy, "{e:?}");
    assert!(e.detail.contains("--max-in-flight"), "{e:?}");
    server.reply(b"+OK\r\n").await;
    assert_eq!(first.await.unwrap().unwrap(), [Value::Simple("OK".into())]);
    // Room again once the first is answered; "b" was never written.
    let third = ask(&link, "c", in_secs(5));
    assert_eq!(server.expect().await, ["GET", "c"]);
    server.reply(b"+OK\r\n").await;
    assert!(third.await.unwrap().is_ok());
}

#[tokio::test]
async fn a_retired_link_answers_what_it_wrote_then_closes() {
    let (link, mut server) = start(16);
    let asked = ask(&link, "a", in_secs(5));
    server.expect().await;
    link.retire();
    assert!(!link.is_alive());
    let e = link.request(&get("b"), in_secs(5)).await.unwrap_err();
    assert_eq!(e.kind, Kind::Closed, "{e:?}");
    // The connection task takes the retirement in before the reply comes.
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.reply(b"+OK\r\n").await;
    assert_eq!(asked.await.unwrap().unwrap(), [Value::Simple("OK".into())]);
    let closed = tokio::time::timeout(Duration::from_secs(1), server.command()).await;
    assert_eq!(closed, Ok(None), "closed once answered");
}
