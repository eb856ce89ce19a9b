//! The connection task behind a [`super::Link`]: writes requests in order,
//! hands replies back in order, checks the stream after a missed deadline.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::super::dial::{Probe, Stream};
use super::super::error::{Error, Kind};
use super::super::resp::{self, Cmd, Value};
use super::super::tls::describe_io;
use super::{FENCE_PREFIX, InFlight, Job, MAX_BATCH, Msg};

/// Who a reply belongs to.
enum Owner {
    /// A caller (who may have stopped waiting: then the reply is dropped).
    Caller(oneshot::Sender<Result<Vec<Value>, Error>>, InFlight),
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
pub(super) struct Task {
    pub(super) probe: Arc<Probe>,
    pub(super) alive: Arc<AtomicBool>,
    pub(super) suspect: Arc<AtomicBool>,
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
                job.refuse(Error::new(Kind::Closed, why.clone()));
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
    pub(super) async fn serve(
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
                            Err(e) => break 'conn e.detail,
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
                                    job.refuse(Error::new(Kind::Closed, "the connection was retired"));
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
                                job.refuse(Error::new(Kind::Closed, "the connection was retired"));
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
                let _ = done.send(Err(Error::new(Kind::Lost, why.clone())));
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
                job.refuse(Error::new(Kind::Closed, why.clone()));
            }
        }
    }
}
