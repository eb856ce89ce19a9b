//! One open connection, shared by many callers: requests are pipelined in
//! order, replies matched in order.
//!
//! The rule that makes outcomes honest: a request is written at most once,
//! on this connection only. When the connection breaks, or a caller's
//! deadline passes, the connection is closed and never reused; every request
//! already written is reported [`LinkError::Lost`] (it may have run), every
//! request still queued [`LinkError::NotSent`] (it cannot have run). Nothing
//! is ever re-sent on another connection behind the caller's back, and a late
//! reply can never be taken for the answer to a later request.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::dial::{Conn, Probe};
use super::resp::{self, Cmd, Value};
use super::tls::describe_io;

/// Why a request has no reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkError {
    /// It was never written: it cannot have run.
    NotSent(String),
    /// It was written (or partly) and no complete reply came: it may have run.
    Lost(String),
    /// It was written and its deadline passed without a reply: it may have run.
    Late,
}

/// Requests are gathered into one write up to about this many bytes.
const MAX_BATCH: usize = 256 * 1024;

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const ABANDONED: u8 = 2;

struct Job {
    bytes: Vec<u8>,
    replies: usize,
    /// QUEUED until the writer takes it (TAKEN) or its caller gives up first (ABANDONED).
    state: Arc<AtomicU8>,
    done: oneshot::Sender<Result<Vec<Value>, LinkError>>,
}

/// What the connection task is asked to do, in order.
enum Msg {
    /// Write a request.
    Job(Job),
    /// Take no more requests; close once every written one is answered.
    Retire,
}

impl Job {
    fn take(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, TAKEN, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// A handle to one connection; clones share it. It never reconnects.
#[derive(Clone)]
pub struct Link {
    jobs: mpsc::UnboundedSender<Msg>,
    close: Arc<watch::Sender<bool>>,
    alive: Arc<AtomicBool>,
    probe: Arc<Probe>,
}

impl Link {
    /// Starts serving `conn` (already connected and authenticated).
    pub fn start(conn: Conn) -> Link {
        let (jobs, rx) = mpsc::unbounded_channel();
        let (close, closed) = watch::channel(false);
        let alive = Arc::new(AtomicBool::new(true));
        let probe = Arc::new(conn.probe);
        tokio::spawn(serve(conn.stream, probe.clone(), rx, closed, alive.clone()));
        Link {
            jobs,
            close: Arc::new(close),
            alive,
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

    /// Stops handing out this connection and closes it once the requests
    /// already written are answered (their answers still count).
    pub fn retire(&self) {
        self.alive.store(false, Ordering::SeqCst);
        let _ = self.jobs.send(Msg::Retire);
    }

    /// Closes the connection: written requests are `Lost`, queued ones `NotSent`.
    pub fn close(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.close.send_replace(true);
    }

    /// Writes `cmds` in one go and waits for one reply per command until
    /// `deadline`. Passing the deadline closes the connection (the reply may
    /// still come, and must not be read as the answer to anything else).
    pub async fn request(&self, cmds: &[Cmd], deadline: Instant) -> Result<Vec<Value>, LinkError> {
        if Instant::now() >= deadline {
            // No time to wait for a reply: do not start what cannot finish.
            return Err(LinkError::NotSent("no time left".into()));
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
        };
        // (The server-closed probe runs in the connection task, right before writing.)
        if !self.alive.load(Ordering::SeqCst) || self.jobs.send(Msg::Job(job)).is_err() {
            return Err(LinkError::NotSent("the connection is closed".into()));
        }
        match tokio::time::timeout_at(deadline, reply).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(LinkError::Lost("the connection task ended".into())),
            Err(_) => {
                let never_written = state
                    .compare_exchange(QUEUED, ABANDONED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
                self.close();
                if never_written {
                    Err(LinkError::NotSent(
                        "no turn on the connection in time".into(),
                    ))
                } else {
                    Err(LinkError::Late)
                }
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

struct Pending {
    want: usize,
    got: Vec<Value>,
    done: oneshot::Sender<Result<Vec<Value>, LinkError>>,
}

/// Resolves once the link is closed (or every handle is gone).
async fn closing(rx: &mut watch::Receiver<bool>) {
    // The borrow guard is dropped here, before anything else awaits.
    let _ = rx.wait_for(|c| *c).await;
}

/// The connection task: writes jobs in order, hands replies back in order.
async fn serve(
    stream: super::dial::Stream,
    probe: Arc<Probe>,
    mut jobs: mpsc::UnboundedReceiver<Msg>,
    mut closed: watch::Receiver<bool>,
    alive: Arc<AtomicBool>,
) {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut decoder = resp::Decoder::new();
    // A second view of the close signal, for use while writing.
    let mut closed_while_writing = closed.clone();
    let mut retiring = false;
    let why: String = 'conn: loop {
        tokio::select! {
            biased;
            _ = closing(&mut closed) => break 'conn "closed by the client".into(),
            read = rd.read_buf(decoder.buffer()) => {
                match read {
                    Ok(0) => break 'conn "connection closed by the server".into(),
                    Err(e) => break 'conn describe_io(&e, None),
                    Ok(_) => {}
                }
                loop {
                    let value = match decoder.next() {
                        Ok(Some(value)) => value,
                        Ok(None) => break,
                        Err(e) => break 'conn e.0,
                    };
                    let Some(p) = pending.front_mut() else {
                        break 'conn "a reply nobody asked for".into();
                    };
                    p.got.push(value);
                    if p.got.len() == p.want
                        && let Some(p) = pending.pop_front()
                    {
                        let _ = p.done.send(Ok(p.got));
                    }
                }
                if retiring && pending.is_empty() {
                    break 'conn "retired".into();
                }
            }
            msg = jobs.recv() => {
                // Take every request already queued, so one write carries them all.
                let mut batch: Vec<Job> = Vec::new();
                let mut next = msg;
                loop {
                    match next {
                        None => break 'conn "no more users".into(),
                        Some(Msg::Retire) => retiring = true,
                        Some(Msg::Job(job)) if !job.take() => {}
                        Some(Msg::Job(job)) if retiring => {
                            let _ = job.done.send(Err(LinkError::NotSent("the connection was retired".into())));
                        }
                        Some(Msg::Job(job)) => batch.push(job),
                    }
                    if batch.iter().map(|j| j.bytes.len()).sum::<usize>() >= MAX_BATCH {
                        break;
                    }
                    match jobs.try_recv() {
                        Ok(m) => next = Some(m),
                        Err(_) => break,
                    }
                }
                if batch.is_empty() {
                    if retiring && pending.is_empty() {
                        break 'conn "retired".into();
                    }
                    continue;
                }
                // Written into a connection the server already closed, they
                // could not run: say so rather than "may have run".
                if let Some(why) = probe.closed() {
                    for job in batch {
                        let _ = job.done.send(Err(LinkError::NotSent(why.clone())));
                    }
                    break 'conn why;
                }
                let mut bytes = Vec::with_capacity(batch.iter().map(|j| j.bytes.len()).sum());
                for job in batch {
                    bytes.extend_from_slice(&job.bytes);
                    pending.push_back(Pending { want: job.replies, got: Vec::new(), done: job.done });
                }
                let write = async {
                    wr.write_all(&bytes).await?;
                    wr.flush().await
                };
                tokio::select! {
                    biased;
                    _ = closing(&mut closed_while_writing) => break 'conn "closed by the client".into(),
                    w = write => if let Err(e) = w { break 'conn describe_io(&e, None) },
                }
            }
        }
    };
    alive.store(false, Ordering::SeqCst);
    // Really closed: the probe's duplicate of the socket would otherwise keep
    // the connection (and whatever the server still has queued on it) open.
    drop((rd, wr));
    probe.shut();
    tracing::debug!(why = %why, "valkey connection closed");
    for p in pending {
        let _ = p.done.send(Err(LinkError::Lost(why.clone())));
    }
    jobs.close();
    while let Ok(msg) = jobs.try_recv() {
        if let Msg::Job(job) = msg
            && job.take()
        {
            let _ = job.done.send(Err(LinkError::NotSent(why.clone())));
        }
    }
}
