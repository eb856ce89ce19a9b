//! The recorded history of one fault-matrix run: every store operation with
//! its invoke/complete times and outcome, every downstream write with the
//! token it carried and whether it was accepted, every lease seen by an
//! observer, every TargetLease status and pod mark seen by a watch, every
//! fault injected, and the downstream state read at the end.
//!
//! Plain data: the checker (`check/`) is a pure function of it. Local times
//! are wall-clock Unix milliseconds (worker processes report in the same
//! clock); lease times are the store's milliseconds as it reports them:
//! Valkey's own clock, or for a store without one (etcd) the client's clock
//! sampled before the call was sent ([`Dating`]).

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// Wall-clock Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A store operation a client can invoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OpKind {
    Acquire,
    Renew,
    Release,
    /// An administrator's revoke (with the token of the lease it ends).
    Revoke,
}

/// How a store operation (or a downstream write) ended, as its caller was told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// A store outcome by name (`acquired`, `held`, …) or, for downstream
    /// writes, `accepted` / `refused`.
    Said(String),
    /// `backend_unavailable`: reported as "nothing happened".
    Unavailable,
    /// `outcome_unknown`: may or may not have happened.
    Unknown,
}

impl Answer {
    /// True for an answer that promises the operation had no effect.
    pub fn promises_no_effect(&self) -> bool {
        match self {
            Answer::Unavailable => true,
            Answer::Said(s) => !matches!(
                s.as_str(),
                "acquired" | "renewed" | "released" | "revoked" | "committed" | "accepted"
            ),
            Answer::Unknown => false,
        }
    }

    /// True for a success.
    pub fn is(&self, what: &str) -> bool {
        matches!(self, Answer::Said(s) if s == what)
    }
}

/// A lease as a reply (or an observer) showed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    pub owner: String,
    pub token: u64,
    /// Who asked for it: the acquire's request id (clients put it in the
    /// metadata as `req`; the operator's acquisition id), else the lease id.
    pub issue: String,
    pub acquired_at_ms: u64,
    pub expires_at_ms: u64,
}

/// One store operation attempt (a retry with the same request id is another record).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpRecord {
    pub client: String,
    pub kind: OpKind,
    pub target: String,
    pub request_id: String,
    pub invoke_ms: u64,
    pub complete_ms: u64,
    pub answer: Answer,
    /// The lease the reply carried (for acquire: the granted or current one).
    pub lease: Option<LeaseView>,
    /// For renew/release/revoke: the token of the lease named in the request.
    pub token: Option<u64>,
    /// The time the store reported (0 when no server answered): as
    /// [`History::dating`] says, when it decided or when the client sent it.
    pub server_ms: u64,
    /// For renew/release: the acquire request id of the lease acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issue: Option<String>,
    /// The first words of the error a failed attempt reported (`BUSY`, `OOM`, …).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// Where a fenced write went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Sink {
    /// The PostgreSQL recipe (`examples/fencing/postgresql.sql`).
    Postgres,
    /// Valkey's fenced commit (`lease commit`).
    Commit,
}

/// One downstream write attempt.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WriteRecord {
    pub client: String,
    pub sink: Sink,
    pub resource: String,
    pub token: u64,
    /// Unique per attempt; it is the value written.
    pub write_id: String,
    pub invoke_ms: u64,
    pub complete_ms: u64,
    /// `accepted` / `refused` (as `Said`), `Unavailable` or `Unknown`.
    pub answer: Answer,
    /// The time the store reported for commits that got a reply (0
    /// otherwise), read as [`History::dating`] says.
    pub server_ms: u64,
}

/// What an observer's `get` of a target showed: its live lease, or none.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sighting {
    pub target: String,
    /// When the reply came (local clock).
    pub at_ms: u64,
    /// The live lease; `None`: the target was free.
    pub lease: Option<LeaseView>,
    /// When the `get` was sent (local clock; 0 in records before it was kept).
    #[serde(default)]
    pub invoke_ms: u64,
    /// The time the store reported (0 when unknown), read as
    /// [`History::dating`] says.
    #[serde(default)]
    pub server_ms: u64,
}

/// What an observer's read of a fenced-commit key showed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReadRecord {
    pub resource: String,
    pub invoke_ms: u64,
    pub complete_ms: u64,
    pub server_ms: u64,
    /// The committed token and value (write id); `None`: nothing committed yet.
    pub committed: Option<(u64, String)>,
}

/// One version of a TargetLease, as a watch delivered it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Publication {
    pub name: String,
    pub target: String,
    /// etcd revision of this version (shared by every object in the cluster).
    pub rv: u64,
    pub seen_ms: u64,
    /// `Held`, `Pending`, … or `Deleted` for the deletion event.
    pub phase: String,
    /// Delivered by a relist: the versions since the one seen before are unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_gap: bool,
    pub token: Option<u64>,
    pub acquisition_id: Option<String>,
    /// The pod the status names (elections).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_pod: Option<String>,
    pub acquired_at_ms: Option<u64>,
    pub expires_at_ms: Option<u64>,
}

/// The marks one TargetLease put on a pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub lease: String,
    pub token: Option<u64>,
    pub expires_at_ms: Option<u64>,
}

/// One version of a pod, as a watch delivered it: the leader marks it carries.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PodVersion {
    pub pod: String,
    pub rv: u64,
    pub seen_ms: u64,
    pub marks: Vec<Mark>,
    /// Delivered by a relist: the versions since the one seen before are unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_gap: bool,
}

/// A fault the harness injected.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaultRecord {
    pub name: String,
    pub at_ms: u64,
    /// The fault can lose acknowledged state (a restart, a failover, a power
    /// cut): what was seen after it says nothing about operations before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loses_data: bool,
    /// When the system was whole again (local clock; 0: not measured).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub healed_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One row of the PostgreSQL data table at the end, in commit order per resource.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub resource: String,
    pub seq: i64,
    pub token: u64,
    pub write_id: String,
}

/// A fenced-commit key's value in Valkey at the end.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommitState {
    pub resource: String,
    pub token: u64,
    pub write_id: String,
}

/// What a store's reported times (`server_ms`, a lease's expiry) are read
/// from, which decides what a look proves about time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dating {
    /// The store's clock when it applied the call (Valkey's `TIME` inside
    /// the script): the call took effect at `server_ms`.
    #[default]
    Store,
    /// The client's clock sampled before the call was sent (etcd has no
    /// clock in its replies): the call took effect somewhere between
    /// `server_ms` and its reply, so it is known to have happened by the
    /// reply, not by `server_ms`.
    ClientBeforeSend,
}

impl Dating {
    /// The latest moment, on the clock lease times are read from, at which
    /// a call dated `server_ms` and answered at `complete_ms` (local clock)
    /// can have taken effect.
    pub fn latest(self, server_ms: u64, complete_ms: u64) -> u64 {
        match self {
            Dating::Store => server_ms,
            Dating::ClientBeforeSend => server_ms.max(complete_ms),
        }
    }
}

/// Everything recorded, in arrival order.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct History {
    /// What the store's times are read from (histories kept before it was
    /// recorded are dated by their scenario when re-judged).
    #[serde(default)]
    pub dating: Dating,
    pub ops: Vec<OpRecord>,
    pub writes: Vec<WriteRecord>,
    pub sightings: Vec<Sighting>,
    /// Reads of the fenced-commit keys by the observer.
    #[serde(default)]
    pub reads: Vec<ReadRecord>,
    pub publications: Vec<Publication>,
    pub pods: Vec<PodVersion>,
    pub faults: Vec<FaultRecord>,
    /// PostgreSQL rows at the end (None: not read, e.g. no PostgreSQL in the run).
    pub rows: Option<Vec<Row>>,
    /// Fenced-commit values at the end, one per resource that has one.
    pub commits: Option<Vec<CommitState>>,
    /// How often the recording watches had to relist (expired revisions).
    #[serde(default)]
    pub relists: u64,
    /// Calls that never answered (far past their deadline).
    #[serde(default)]
    pub hangs: Vec<String>,
    /// What the fault did, as the servers and the harness counted it
    /// (`failed FCALLs`, `proxy cuts`, …): a fault must show its effect.
    #[serde(default)]
    pub effects: std::collections::BTreeMap<String, u64>,
    /// When the workload was told to stop (local ms; 0 in histories from
    /// before it was kept): the end of the last fault-free gap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stopped_ms: u64,
}

/// One line a worker process prints: an event to append to the history.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Event {
    Op(OpRecord),
    Write(WriteRecord),
    Sighting(Sighting),
    Fault(FaultRecord),
    Read(ReadRecord),
}

/// A shared, append-only recorder handed to every workload task (no
/// default: each run says how its store's times are read).
#[derive(Clone)]
pub struct Recorder(Arc<Mutex<History>>);

impl Recorder {
    /// An empty recorder for a store whose times are read as `dating` says.
    pub fn dated(dating: Dating) -> Recorder {
        Recorder(Arc::new(Mutex::new(History {
            dating,
            ..History::default()
        })))
    }

    fn with<R>(&self, f: impl FnOnce(&mut History) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn op(&self, r: OpRecord) {
        self.with(|h| h.ops.push(r));
    }

    pub fn write(&self, r: WriteRecord) {
        self.with(|h| h.writes.push(r));
    }

    pub fn sighting(&self, s: Sighting) {
        self.with(|h| h.sightings.push(s));
    }

    pub fn publication(&self, p: Publication) {
        self.with(|h| h.publications.push(p));
    }

    pub fn pod(&self, p: PodVersion) {
        self.with(|h| h.pods.push(p));
    }

    pub fn fault(&self, name: &str) {
        self.fault_record(name, false);
    }

    /// A fault that can lose acknowledged state (restart, failover, power cut).
    pub fn lossy_fault(&self, name: &str) {
        self.fault_record(name, true);
    }

    fn fault_record(&self, name: &str, loses_data: bool) {
        let at_ms = now_ms();
        self.with(|h| {
            h.faults.push(FaultRecord {
                name: name.to_string(),
                at_ms,
                loses_data,
                healed_ms: 0,
            })
        });
    }

    /// The last fault recorded is over: the system is whole again now.
    pub fn healed(&self) {
        let at = now_ms();
        self.with(|h| {
            if let Some(f) = h.faults.last_mut() {
                f.healed_ms = at;
            }
        });
    }

    /// Adds `n` to the effect counter `what`.
    pub fn effect(&self, what: &str, n: u64) {
        self.with(|h| *h.effects.entry(what.to_string()).or_default() += n);
    }

    pub fn read(&self, r: ReadRecord) {
        self.with(|h| h.reads.push(r));
    }

    /// Appends an event a worker process reported.
    pub fn event(&self, e: Event) {
        match e {
            Event::Op(r) => self.op(r),
            Event::Write(r) => self.write(r),
            Event::Sighting(s) => self.sighting(s),
            Event::Fault(f) => self.with(|h| h.faults.push(f)),
            Event::Read(r) => self.read(r),
        }
    }

    pub fn set_rows(&self, rows: Vec<Row>) {
        self.with(|h| h.rows = Some(rows));
    }

    pub fn hang(&self, what: String) {
        self.with(|h| h.hangs.push(what));
    }

    pub fn set_relists(&self, n: u64) {
        self.with(|h| h.relists = n);
    }

    /// The workload is told to stop now.
    pub fn stopped(&self) {
        let at = now_ms();
        self.with(|h| h.stopped_ms = at);
    }

    pub fn set_commits(&self, commits: Vec<CommitState>) {
        self.with(|h| h.commits = Some(commits));
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> History {
        self.with(|h| h.clone())
    }
}
