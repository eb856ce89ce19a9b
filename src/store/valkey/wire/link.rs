//! One open connection, shared by many callers: requests are pipelined in
//! order, replies matched in order.
//!
//! The rule that makes outcomes honest: a request is written at most once,
//! on this connection only, and a reply is only ever its own request's.
//!
//! A deadline costs one request, not the connection. A caller whose deadline
//! passes is answered at once: [`Kind::Late`] if its request was written
//! (it may have run), [`Kind::Busy`] if it was still queued (it is taken
//! back and never written). Its reply, when it comes, is read and
//! dropped in its place in the stream. Behind a written request that went
//! late, the connection writes a marker (`PING <nonce>`) and holds back new
//! requests until the marker's echo comes back in the marker's own place:
//! proof that no reply went missing and the stream is still in step. The
//! connection is closed only when it is really unhealthy: the marker is not
//! back within a grace period (the late request's own budget, at least 1s,
//! past its deadline), or a reply comes back out of step. Then every request
//! already written is [`Kind::Lost`] (it may have run) and every request
//! still queued [`Kind::Closed`] (it cannot have run, and may go on another
//! connection). Nothing written is ever re-sent.
//!
//! At most `max_in_flight` requests are queued or awaiting a reply at once
//! (a request abandoned by its caller counts until its reply is read); one
//! more is refused at once, never sent ([`Kind::Busy`]).

mod serve;
#[cfg(test)]
pub(super) mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::dial::{Conn, Probe};
use super::error::{Error, Kind};
use super::resp::{Cmd, Value};
use serve::Task;

/// What a request whose deadline passed after it was written is told.
pub const LATE: &str = "no reply in time";

/// Requests are gathered into one write up to about this many bytes.
const MAX_BATCH: usize = 256 * 1024;

/// The least time a marker gets to come back after a missed deadline.
const MIN_GRACE: Duration = Duration::from_secs(1);

/// What a marker's echo starts with.
const FENCE_PREFIX: &[u8] = b"targetlease-fence-";

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const ABANDONED: u8 = 2;

/// One request in flight (queued or awaiting its reply); counted while it lives.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Job {
    bytes: Vec<u8>,
    replies: usize,
    /// QUEUED until the writer takes it (TAKEN) or its caller gives up first (ABANDONED).
    state: Arc<AtomicU8>,
    done: oneshot::Sender<Result<Vec<Value>, Error>>,
    counted: InFlight,
}

/// What the connection task is asked to do, in order.
enum Msg {
    /// Write a request.
    Job(Job),
    /// A written request's deadline passed: check the stream is still in step.
    Late {
        /// How long past now the marker may take to come back.
        grace: Duration,
    },
    /// Take no more requests; close once every written one is answered.
    Retire,
}

impl Job {
    fn take(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, TAKEN, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    fn abandoned(&self) -> bool {
        self.state.load(Ordering::SeqCst) == ABANDONED
    }

    fn refuse(self, why: Error) {
        let Job { done, counted, .. } = self;
        drop(counted);
        let _ = done.send(Err(why));
    }
}

/// A handle to one connection; clones share it. It never reconnects.
#[derive(Clone)]
pub struct Link {
    jobs: mpsc::UnboundedSender<Msg>,
    close: Arc<watch::Sender<bool>>,
    alive: Arc<AtomicBool>,
    /// True while new requests are held back until a marker proves the stream in step.
    suspect: Arc<AtomicBool>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: usize,
    probe: Arc<Probe>,
}

impl Link {
    /// Starts serving `conn` (already connected and authenticated), with at
    /// most `max_in_flight` requests queued or awaiting a reply.
    pub fn start(conn: Conn, max_in_flight: usize) -> Link {
        let (jobs, rx) = mpsc::unbounded_channel();
        let (close, closed) = watch::channel(false);
        let alive = Arc::new(AtomicBool::new(true));
        let suspect = Arc::new(AtomicBool::new(false));
        let probe = Arc::new(conn.probe);
        let task = Task {
            probe: probe.clone(),
            alive: alive.clone(),
            suspect: suspect.clone(),
        };
        tokio::spawn(task.serve(conn.stream, rx, closed));
        Link {
            jobs,
            close: Arc::new(close),
            alive,
            suspect,
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight: max_in_flight.max(1),
            probe,
        }
    }

    /// False once the connection broke or was closed (also when the server
    /// closed it and nobody has read that yet); it will not come back.
    pub fn is_alive(&self) -> bool {
        if !self.alive.load(Ordering::SeqCst) {
            return false;
        }
        if let Some(why) = self.probe.closed() {
            tracing::debug!(why = %why, "valkey connection found closed");
            self.close();
            return false;
        }
        true
    }

    /// Requests queued or awaiting a reply (abandoned ones included until
    /// their reply is read).
    pub fn load(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// True while a missed deadline is being checked: new requests wait.
    pub fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::SeqCst)
    }

    /// Stops handing out this connection and closes it once the requests
    /// already written are answered (their answers still count).
    pub fn retire(&self) {
        self.alive.store(false, Ordering::SeqCst);
        let _ = self.jobs.send(Msg::Retire);
    }

    /// Closes the connection: written requests are [`Kind::Lost`], queued
    /// ones [`Kind::Closed`].
    pub fn close(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.close.send_replace(true);
    }

    /// Writes `cmds` in one go and waits for one reply per command until
    /// `deadline`. Passing the deadline gives up this request only.
    pub async fn request(&self, cmds: &[Cmd], deadline: Instant) -> Result<Vec<Value>, Error> {
        let started = Instant::now();
        if started >= deadline {
            // No time to wait for a reply: do not start what cannot finish.
            return Err(Error::new(Kind::Busy, "no time left"));
        }
        let counted = InFlight(self.in_flight.clone());
        if self.in_flight.fetch_add(1, Ordering::SeqCst) >= self.max_in_flight {
            return Err(Error::new(
                Kind::Busy,
                format!(
                    "{} requests already in flight on the connection (--max-in-flight); never sent",
                    self.max_in_flight
                ),
            ));
        }
        let mut bytes = Vec::new();
        for c in cmds {
            c.encode(&mut bytes);
        }
        let state = Arc::new(AtomicU8::new(QUEUED));
        // A caller that goes away (its future dropped) before the request is
        // written takes it back: nothing runs for a caller nobody answers to.
        let _take_back = TakeBack(state.clone());
        let (done, reply) = oneshot::channel();
        let job = Job {
            bytes,
            replies: cmds.len(),
            state: state.clone(),
            done,
            counted,
        };
        // (The server-closed probe runs in the connection task, right before writing.)
        if !self.alive.load(Ordering::SeqCst) || self.jobs.send(Msg::Job(job)).is_err() {
            return Err(Error::new(Kind::Closed, "the connection is closed"));
        }
        match tokio::time::timeout_at(deadline, reply).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::new(Kind::Lost, "the connection task ended")),
            Err(_) => {
                let never_written = state
                    .compare_exchange(QUEUED, ABANDONED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
                if never_written {
                    return Err(Error::new(
                        Kind::Busy,
                        "no turn on the connection before the deadline; never sent",
                    ));
                }
                let grace = deadline.saturating_duration_since(started).max(MIN_GRACE);
                let _ = self.jobs.send(Msg::Late { grace });
                Err(Error::new(Kind::Late, LATE))
            }
        }
    }
}

/// Marks a still-queued request abandoned when dropped.
struct TakeBack(Arc<AtomicU8>);

impl Drop for TakeBack {
    fn drop(&mut self) {
        let _ = self
            .0
            .compare_exchange(QUEUED, ABANDONED, Ordering::SeqCst, Ordering::SeqCst);
    }
}
