//! The GC-pause case: a lease holder in its own process (this test binary
//! re-executed as `worker-holder`), which the harness stops with SIGSTOP
//! right after a renewal and resumes with SIGCONT once its lease has run out
//! and someone else holds the target. Like a real paused process, it does
//! not look at the clock before its next write: that write carries its old
//! token and the downstream must refuse it.
//!
//! The worker prints every operation and write as one JSON [`Event`] per
//! line; the harness appends them to the history.

use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use targetlease::store::valkey::Durability;
use targetlease::store::{AcquireRequest, Outcome, ReleaseRequest, RenewRequest, Target};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::op_record;
use crate::history::{Event, OpKind, Recorder, now_ms};

/// What the worker needs, passed as one JSON argument.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HolderConfig {
    pub name: String,
    /// Valkey or etcd.
    pub store_url: String,
    pub pg: String,
    pub namespace: String,
    pub targets: Vec<String>,
    pub ttl_ms: u64,
}

fn emit(e: Event) {
    println!("{}", serde_json::to_string(&e).expect("event as JSON"));
}

/// The lease an operation acts on: (token, acquire request id).
type Acting<'a> = Option<(u64, &'a str)>;

fn op(
    cfg: &HolderConfig,
    kind: OpKind,
    target: &Target,
    request_id: &str,
    acting: Acting<'_>,
    invoke_ms: u64,
    result: &Result<targetlease::store::Reply, targetlease::store::StoreError>,
) {
    emit(Event::Op(op_record(
        &cfg.name,
        kind,
        target,
        request_id,
        acting.map(|a| a.0),
        acting.map(|a| a.1),
        invoke_ms,
        result,
    )));
}

/// The worker process: acquire, then write every 100ms and renew every
/// fifth write, release after a while; never checks its own clock.
pub async fn worker_main(cfg: HolderConfig) {
    let ttl = Duration::from_millis(cfg.ttl_ms);
    let store = crate::run::try_connect(&cfg.store_url, Durability::None)
        .await
        .expect("worker: connect to the store");
    let (db, conn) = tokio_postgres::connect(&cfg.pg, tokio_postgres::NoTls)
        .await
        .expect("worker: connect to PostgreSQL");
    tokio::spawn(conn);
    let mut pg = crate::sink::PgWriter::from_client(db, &cfg.name);
    let mut n = 0_u64;
    loop {
        for name in &cfg.targets {
            let target = Target::new(&cfg.namespace, name);
            let mut req = AcquireRequest::new(target.clone(), &cfg.name, ttl);
            let mut meta = serde_json::Map::new();
            meta.insert("req".into(), req.request_id.clone().into());
            req.metadata = Some(meta);
            let t0 = now_ms();
            let r = store.acquire(&req).await;
            op(
                &cfg,
                OpKind::Acquire,
                &target,
                &req.request_id,
                None,
                t0,
                &r,
            );
            let issue = req.request_id.clone();
            let Some(handle) = r
                .ok()
                .filter(|r| r.outcome == Outcome::Acquired)
                .and_then(|r| r.lease?.handle())
            else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            for i in 1..=20 {
                n += 1;
                let w = pg
                    .write(&target.name, handle.token, &format!("{}-{n}", cfg.name))
                    .await;
                emit(Event::Write(w));
                if i % 5 == 0 {
                    let req = RenewRequest::new(target.clone(), handle.clone(), ttl);
                    let t0 = now_ms();
                    let r = store.renew(&req).await;
                    op(
                        &cfg,
                        OpKind::Renew,
                        &target,
                        &req.request_id,
                        Some((handle.token, &issue)),
                        t0,
                        &r,
                    );
                    if !r.is_ok_and(|r| r.outcome == Outcome::Renewed) {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let req = ReleaseRequest::new(target.clone(), handle.clone());
            let t0 = now_ms();
            let r = store.release(&req).await;
            op(
                &cfg,
                OpKind::Release,
                &target,
                &req.request_id,
                Some((handle.token, &issue)),
                t0,
                &r,
            );
        }
    }
}

/// The harness side: the worker process, its events piped into the history.
pub struct Holder {
    child: tokio::process::Child,
    pid: i32,
    renewed: tokio::sync::mpsc::UnboundedReceiver<()>,
}

impl Holder {
    pub fn spawn(cfg: &HolderConfig, rec: Recorder) -> Self {
        let mut child = tokio::process::Command::new(std::env::current_exe().expect("own path"))
            .arg("worker-holder")
            .arg(serde_json::to_string(cfg).expect("config as JSON"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the holder worker");
        let pid = child.id().expect("worker pid") as i32;
        let (tx, renewed) = tokio::sync::mpsc::unbounded_channel();
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(e) = serde_json::from_str::<Event>(&line) else {
                    continue;
                };
                if let Event::Op(o) = &e
                    && o.kind == OpKind::Renew
                    && o.answer.is("renewed")
                {
                    let _ = tx.send(());
                }
                rec.event(e);
            }
        });
        Self {
            child,
            pid,
            renewed,
        }
    }

    /// Waits for the worker's next successful renewal (up to `within`), then
    /// stops it at once; false when it did not renew in time.
    pub async fn pause_after_renewal(&mut self, within: Duration) -> bool {
        while self.renewed.try_recv().is_ok() {}
        match tokio::time::timeout(within, self.renewed.recv()).await {
            Ok(Some(())) => {
                self.signal(nix::sys::signal::Signal::SIGSTOP);
                true
            }
            _ => false,
        }
    }

    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), sig);
    }

    pub async fn stop(mut self) {
        self.resume();
        let _ = self.child.kill().await;
    }
}
