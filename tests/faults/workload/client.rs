//! A lease client loop, the same for the library and the CLI (both are a
//! [`LeaseStore`]): acquire → fenced writes (PostgreSQL and `lease commit`)
//! → renew → release over a small set of targets. An `outcome_unknown` is
//! retried with the same request id; every attempt is recorded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use targetlease::store::{
    AcquireRequest, CommitRequest, LeaseHandle, LeaseStore, ReleaseRequest, RenewRequest, Reply,
    StoreError, Target, new_request_id,
};

use super::{HANG, Stop, answer_of, op_record};
use crate::history::{OpKind, Recorder, Sink, WriteRecord, now_ms};
use crate::sink::PgWriter;

/// How many times an `outcome_unknown` is retried with the same request id.
const RETRIES: usize = 5;
/// Writes per lease (each to PostgreSQL and to `lease commit`).
const WRITES: usize = 4;
/// The fenced-commit key every client writes under its target.
pub const COMMIT_KEY: &str = "k";

/// One client of the workload.
pub struct Client {
    pub name: String,
    pub store: Arc<dyn LeaseStore>,
    pub targets: Vec<Target>,
    pub ttl: Duration,
    pub pg: Option<PgWriter>,
    pub rec: Recorder,
    pub stop: Stop,
}

/// A lease this client believes it holds, until `deadline` (local clock).
pub(super) struct Held {
    pub target: Target,
    handle: LeaseHandle,
    /// The acquire's request id.
    issue: String,
    pub deadline: Instant,
}

impl Client {
    pub async fn run(mut self) {
        let mut writes = 0_u64;
        while !self.stop.is_set() {
            let target = {
                let mut rng = rand::rng();
                self.targets[rng.random_range(0..self.targets.len())].clone()
            };
            match self.acquire(&target).await {
                Some(held) => self.hold(held, &mut writes).await,
                None => {
                    let pause = rand::rng().random_range(20..80);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }
        }
    }

    /// Sends one request and, while its outcome is unknown, retries it with
    /// the same request id (`send` must reuse it); `record` sees every attempt.
    async fn retrying<F, Fut>(
        &self,
        send: F,
        mut record: impl FnMut(u64, &Result<Reply, StoreError>),
    ) -> Result<Reply, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Reply, StoreError>>,
    {
        let mut attempt = 0;
        loop {
            let invoke_ms = now_ms();
            let result = match tokio::time::timeout(HANG, send()).await {
                Ok(r) => r,
                Err(_) => {
                    self.rec.hang(format!(
                        "{}: a store call invoked at {invoke_ms} had no answer after {HANG:?}",
                        self.name
                    ));
                    Err(StoreError::OutcomeUnknown("harness: no answer".into()))
                }
            };
            record(invoke_ms, &result);
            attempt += 1;
            match result {
                Err(StoreError::OutcomeUnknown(_)) if attempt <= RETRIES && !self.stop.is_set() => {
                    tokio::time::sleep(Duration::from_millis(100 * attempt as u64)).await;
                }
                other => return other,
            }
        }
    }

    /// A store operation, every attempt recorded as an [`OpRecord`].
    async fn call<F, Fut>(
        &self,
        kind: OpKind,
        target: &Target,
        request_id: &str,
        held: Option<&Held>,
        send: F,
    ) -> Result<Reply, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Reply, StoreError>>,
    {
        let token = held.map(|h| h.handle.token);
        let issue = held.map(|h| h.issue.as_str());
        self.retrying(send, |invoke_ms, result| {
            self.rec.op(op_record(
                &self.name, kind, target, request_id, token, issue, invoke_ms, result,
            ));
        })
        .await
    }

    pub(super) async fn acquire(&self, target: &Target) -> Option<Held> {
        let mut req = AcquireRequest::new(target.clone(), &self.name, self.ttl);
        req.request_id = new_request_id();
        let mut meta = serde_json::Map::new();
        meta.insert("req".into(), req.request_id.clone().into());
        req.metadata = Some(meta);
        let started = Instant::now();
        let reply = self
            .call(OpKind::Acquire, target, &req.request_id, None, || {
                self.store.acquire(&req)
            })
            .await
            .ok()?;
        let handle = reply.lease.as_ref()?.handle()?;
        (reply.outcome == targetlease::store::Outcome::Acquired).then(|| Held {
            target: target.clone(),
            handle,
            issue: req.request_id.clone(),
            deadline: started + self.ttl,
        })
    }

    async fn hold(&mut self, mut held: Held, writes: &mut u64) {
        for i in 0..WRITES {
            // A careful client stops before its lease may have run out.
            if Instant::now() + self.ttl / 5 >= held.deadline || self.stop.is_set() {
                break;
            }
            *writes += 1;
            let id = format!("{}-{}", self.name, writes);
            self.write(&held, &id).await;
            if i == WRITES / 2 {
                match self.renew(&held).await {
                    Some(deadline) => held.deadline = deadline,
                    None => return, // lost, or unknown: stop acting on it
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.release(&held).await;
    }

    pub(super) async fn write(&mut self, held: &Held, id: &str) {
        let token = held.handle.token;
        if let Some(pg) = &mut self.pg {
            match tokio::time::timeout(HANG, pg.write(&held.target.name, token, id)).await {
                Ok(w) => self.rec.write(w),
                Err(_) => self
                    .rec
                    .hang(format!("{}: PostgreSQL write {id} hung", self.name)),
            }
        }
        let mut req = CommitRequest::new(held.target.clone(), token, COMMIT_KEY, id);
        req.request_id = format!("commit-{id}");
        let _ = self
            .retrying(
                || self.store.commit(&req),
                |invoke_ms, result| {
                    let (answer, _, server_ms) = answer_of(result);
                    self.rec.write(WriteRecord {
                        client: self.name.clone(),
                        sink: Sink::Commit,
                        resource: held.target.name.clone(),
                        token,
                        write_id: id.to_string(),
                        invoke_ms,
                        complete_ms: now_ms(),
                        answer,
                        server_ms,
                    });
                },
            )
            .await;
    }

    /// The new local deadline, or None when the lease is lost or unknown.
    pub(super) async fn renew(&self, held: &Held) -> Option<Instant> {
        let req = RenewRequest::new(held.target.clone(), held.handle.clone(), self.ttl);
        let started = Instant::now();
        let reply = self
            .call(
                OpKind::Renew,
                &held.target,
                &req.request_id,
                Some(held),
                || self.store.renew(&req),
            )
            .await
            .ok()?;
        (reply.outcome == targetlease::store::Outcome::Renewed).then_some(started + self.ttl)
    }

    pub(super) async fn release(&self, held: &Held) {
        let req = ReleaseRequest::new(held.target.clone(), held.handle.clone());
        let _ = self
            .call(
                OpKind::Release,
                &held.target,
                &req.request_id,
                Some(held),
                || self.store.release(&req),
            )
            .await;
    }
}
