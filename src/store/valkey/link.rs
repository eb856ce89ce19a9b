//! One open connection, shared by many callers: requests are pipelined in
//! order, replies matched in order.
//!
//! The rule that makes outcomes honest: a request is written at most once,
//! on this connection only, and a reply is only ever its own request's.
//!
//! A deadline costs one request, not the connection. A caller whose deadline
//! passes is answered at once: [`LinkError::Late`] if its request was written
//! (it may have run), [`LinkError::NotSent`] if it was still queued (it is
//! taken back and never written). Its reply, when it comes, is read and
//! dropped in its place in the stream. Behind a written request that went
//! late, the connection writes a marker (`PING <nonce>`) and holds back new
//! requests until the marker's echo comes back in the marker's own place:
//! proof that no reply went missing and the stream is still in step. The
//! connection is closed only when it is really unhealthy: the marker is not
//! back within a grace period (the late request's own budget, at least 1s,
//! past its deadline), or a reply comes back out of step. Then every request
//! already written is [`LinkError::Lost`] (it may have run) and every request
//! still queued [`LinkError::Requeue`] (it cannot have run, and may go on
//! another connection). Nothing written is ever re-sent.
//!
//! At most `max_in_flight` requests are queued or awaiting a reply at once
//! (a request abandoned by its caller counts until its reply is read); one
//! more is refused at once, never sent.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::dial::{Conn, Probe, Stream};
use super::resp::{self, Cmd, Value};
use super::tls::describe_io;

/// Why a request has no reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkError {
    /// It was never written: it cannot have run (no time left, too many in
    /// flight, or its deadline passed while it waited for its turn).
    NotSent(String),
    /// It was never written, and the connection has closed: it cannot have
    /// run, and may be sent on another connection.
    Requeue(String),
    /// It was written (or partly) and no complete reply came: it may have run.
    Lost(String),
    /// It was written and its deadline passed without a reply: it may have run.
    Late,
}

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
    done: oneshot::Sender<Result<Vec<Value>, LinkError>>,
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

    fn refuse(self, why: LinkError) {
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

    /// Closes the connection: written requests are `Lost`, queued ones `Requeue`.
    pub fn close(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.close.send_replace(true);
    }

    /// Writes `cmds` in one go and waits for one reply per command until
    /// `deadline`. Passing the deadline gives up this request only.
    pub async fn request(&self, cmds: &[Cmd], deadline: Instant) -> Result<Vec<Value>, LinkError> {
        let started = Instant::now();
        if started >= deadline {
            // No time to wait for a reply: do not start what cannot finish.
            return Err(LinkError::NotSent("no time left".into()));
        }
        let counted = InFlight(self.in_flight.clone());
        if self.in_flight.fetch_add(1, Ordering::SeqCst) >= self.max_in_flight {
            return Err(LinkError::NotSent(format!(
                "{} requests already in flight on the connection (--max-in-flight); never sent",
                self.max_in_flight
            )));
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
            return Err(LinkError::Requeue("the connection is closed".into()));
        }
        match tokio::time::timeout_at(deadline, reply).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(LinkError::Lost("the connection task ended".into())),
            Err(_) => {
                let never_written = state
                    .compare_exchange(QUEUED, ABANDONED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
                if never_written {
                    return Err(LinkError::NotSent(
                        "no turn on the connection before the deadline; never sent".into(),
                    ));
                }
                let grace = deadline.saturating_duration_since(started).max(MIN_GRACE);
                let _ = self.jobs.send(Msg::Late { grace });
                Err(LinkError::Late)
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

/// Who a reply belongs to.
enum Owner {
    /// A caller (who may have stopped waiting: then the reply is dropped).
    Caller(oneshot::Sender<Result<Vec<Value>, LinkError>>, InFlight),
    /// Our marker, echoing this nonce.
    Fence(Vec<u8>),
}

struct Pending {
    want: usize,
    got: Vec<Value>,
    owner: Owner,
}

/// The marker written after a missed deadline, until its echo comes back.
struct Fence {
    nonce: Vec<u8>,
    overdue_at: Instant,
    grace: Duration,
}

/// Resolves once the link is closed (or every handle is gone).
async fn closing(rx: &mut watch::Receiver<bool>) {
    // The borrow guard is dropped here, before anything else awaits.
    let _ = rx.wait_for(|c| *c).await;
}

/// Writes `bytes`, unless the link is closed first.
async fn put(
    wr: &mut WriteHalf<Stream>,
    closed: &mut watch::Receiver<bool>,
    bytes: &[u8],
) -> Result<(), String> {
    let write = async {
        wr.write_all(bytes).await?;
        wr.flush().await
    };
    tokio::select! {
        biased;
        _ = closing(closed) => Err("closed by the client".into()),
        w = write => w.map_err(|e| describe_io(&e, None)),
    }
}

fn echo(value: &Value) -> Option<&[u8]> {
    match value {
        Value::Bulk(b) => Some(b),
        Value::Simple(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// What the connection task shares with the handles.
struct Task {
    probe: Arc<Probe>,
    alive: Arc<AtomicBool>,
    suspect: Arc<AtomicBool>,
}

impl Task {
    /// Writes the jobs still wanted, in order, and expects their replies.
    async fn write(
        &self,
        batch: Vec<Job>,
        pending: &mut VecDeque<Pending>,
        wr: &mut WriteHalf<Stream>,
        closed: &mut watch::Receiver<bool>,
    ) -> Result<(), String> {
        let batch: Vec<Job> = batch.into_iter().filter(Job::take).collect();
        if batch.is_empty() {
            return Ok(());
        }
        // Written into a connection the server already closed, they
        // could not run: say so rather than "may have run".
        if let Some(why) = self.probe.closed() {
            for job in batch {
                job.refuse(LinkError::Requeue(why.clone()));
            }
            return Err(why);
        }
        let mut bytes = Vec::with_capacity(batch.iter().map(|j| j.bytes.len()).sum());
        for job in batch {
            bytes.extend_from_slice(&job.bytes);
            pending.push_back(Pending {
                want: job.replies,
                got: Vec::new(),
                owner: Owner::Caller(job.done, job.counted),
            });
        }
        put(wr, closed, &bytes).await
    }

    /// The connection task: writes jobs in order, hands replies back in order.
    async fn serve(
        self,
        stream: Stream,
        mut jobs: mpsc::UnboundedReceiver<Msg>,
        mut closed: watch::Receiver<bool>,
    ) {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let mut pending: VecDeque<Pending> = VecDeque::new();
        // Requests that arrived while a marker is out: not taken, not written.
        let mut held: VecDeque<Job> = VecDeque::new();
        let mut fence: Option<Fence> = None;
        let mut decoder = resp::Decoder::new();
        // A second view of the close signal, for use while writing.
        let mut closed_while_writing = closed.clone();
        let mut retiring = false;
        let why: String = 'conn: loop {
            let overdue_at = fence.as_ref().map(|f| f.overdue_at);
            tokio::select! {
                biased;
                _ = closing(&mut closed) => break 'conn "closed by the client".into(),
                read = rd.read_buf(decoder.buffer()) => {
                    match read {
                        Ok(0) => break 'conn "connection closed by the server".into(),
                        Err(e) => break 'conn describe_io(&e, None),
                        Ok(_) => {}
                    }
                    let mut in_step = false;
                    loop {
                        let value = match decoder.next() {
                            Ok(Some(value)) => value,
                            Ok(None) => break,
                            Err(e) => break 'conn e.0,
                        };
                        let Some(p) = pending.front_mut() else {
                            break 'conn "a reply nobody asked for".into();
                        };
                        let marker = fence.as_ref().map(|f| f.nonce.as_slice());
                        match &p.owner {
                            Owner::Fence(nonce) => {
                                if echo(&value) != Some(nonce.as_slice()) {
                                    break 'conn "replies out of step with requests".into();
                                }
                                pending.pop_front();
                                fence = None;
                                in_step = true;
                                continue;
                            }
                            // The marker's echo in a caller's place: a reply went missing.
                            Owner::Caller(..) if marker.is_some() && echo(&value) == marker => {
                                break 'conn "a reply went missing (replies out of step)".into();
                            }
                            Owner::Caller(..) => {}
                        }
                        p.got.push(value);
                        if p.got.len() == p.want
                            && let Some(Pending { got, owner: Owner::Caller(done, counted), .. }) =
                                pending.pop_front()
                        {
                            drop(counted);
                            let _ = done.send(Ok(got));
                        }
                    }
                    if in_step {
                        tracing::debug!("valkey connection back in step after a missed deadline");
                        self.suspect.store(false, Ordering::SeqCst);
                        let batch: Vec<Job> = held.drain(..).collect();
                        if let Err(why) = self.write(batch, &mut pending, &mut wr, &mut closed_while_writing).await {
                            break 'conn why;
                        }
                    }
                    if retiring && pending.is_empty() {
                        break 'conn "retired".into();
                    }
                }
                _ = tokio::time::sleep_until(overdue_at.unwrap_or_else(Instant::now)), if overdue_at.is_some() => {
                    let grace = fence.as_ref().map(|f| f.grace).unwrap_or_default();
                    break 'conn format!(
                        "no reply for {} past a deadline",
                        humantime::format_duration(grace)
                    );
                }
                msg = jobs.recv() => {
                    // Take every request already queued, so one write carries them all.
                    let mut batch: Vec<Job> = Vec::new();
                    let mut late: Option<Duration> = None;
                    let mut next = msg;
                    loop {
                        match next {
                            None => break 'conn "no more users".into(),
                            Some(Msg::Retire) => retiring = true,
                            Some(Msg::Late { grace }) => late = Some(late.unwrap_or_default().max(grace)),
                            Some(Msg::Job(job)) if job.abandoned() => {}
                            Some(Msg::Job(job)) if retiring => {
                                if job.take() {
                                    job.refuse(LinkError::Requeue("the connection was retired".into()));
                                }
                            }
                            Some(Msg::Job(job)) if fence.is_some() || late.is_some() => held.push_back(job),
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
                    if retiring {
                        for job in held.drain(..) {
                            if job.take() {
                                job.refuse(LinkError::Requeue("the connection was retired".into()));
                            }
                        }
                    }
                    // Abandoned requests waiting their turn are let go at once.
                    held.retain(|j| !j.abandoned());
                    if let Err(why) = self.write(batch, &mut pending, &mut wr, &mut closed_while_writing).await {
                        break 'conn why;
                    }
                    // Behind a late request still unanswered, a marker: new
                    // requests wait until its echo shows the stream in step.
                    if let Some(grace) = late
                        && fence.is_none()
                        && !pending.is_empty()
                    {
                        let nonce = [FENCE_PREFIX, rand::random::<u64>().to_string().as_bytes()].concat();
                        let mut bytes = Vec::new();
                        Cmd::new("PING").arg(&nonce).encode(&mut bytes);
                        pending.push_back(Pending { want: 1, got: Vec::new(), owner: Owner::Fence(nonce.clone()) });
                        fence = Some(Fence { nonce, overdue_at: Instant::now() + grace, grace });
                        self.suspect.store(true, Ordering::SeqCst);
                        if let Err(why) = put(&mut wr, &mut closed_while_writing, &bytes).await {
                            break 'conn why;
                        }
                    } else if fence.is_none() && !held.is_empty() {
                        let batch: Vec<Job> = held.drain(..).collect();
                        if let Err(why) = self.write(batch, &mut pending, &mut wr, &mut closed_while_writing).await {
                            break 'conn why;
                        }
                    }
                    if retiring && pending.is_empty() {
                        break 'conn "retired".into();
                    }
                }
            }
        };
        self.alive.store(false, Ordering::SeqCst);
        // Really closed: the probe's duplicate of the socket would otherwise keep
        // the connection (and whatever the server still has queued on it) open.
        drop((rd, wr));
        self.probe.shut();
        tracing::debug!(why = %why, "valkey connection closed");
        for p in pending {
            if let Owner::Caller(done, counted) = p.owner {
                drop(counted);
                let _ = done.send(Err(LinkError::Lost(why.clone())));
            }
        }
        jobs.close();
        let mut queued: Vec<Job> = held.into_iter().collect();
        while let Ok(msg) = jobs.try_recv() {
            if let Msg::Job(job) = msg {
                queued.push(job);
            }
        }
        for job in queued {
            if job.take() {
                job.refuse(LinkError::Requeue(why.clone()));
            }
        }
    }
}
