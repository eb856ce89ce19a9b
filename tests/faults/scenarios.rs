//! The fault matrix: every scenario (a deployment, a durability mode, a
//! fault) and every positive control (a broken component the checker must
//! catch). Properties a mode cannot promise are listed as measured: their
//! violations are counted and published, not failed on.

mod controls;
pub(crate) mod etcd;
mod rows;

use std::time::Duration;

use targetlease::store::valkey::Durability;

use crate::check::{Property, Scope};
use crate::controls::Control;
use crate::valkey::Setup;
use crate::valkey::powerloss::Disk;

/// What is injected, over and over, while the workload runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing (baseline and most controls).
    None,
    /// SIGKILL the primary; Sentinel promotes the replica; the old primary rejoins.
    SentinelFailover,
    /// SIGKILL the server and restart it from its own files.
    Restart,
    /// SIGKILL the server at a moment `appendfsync everysec` holds executed
    /// writes in its AOF buffer (it postpones the write while a slow
    /// background fsync runs, and replies anyway), restart it.
    KillUnwritten,
    /// The power goes: SIGKILL the server, cut its append-only files back to
    /// what it had fsynced (the power-loss shim's record), restart it.
    PowerCut,
    /// Move Valkey's clock forward past every lease (libfaketime).
    ClockJump,
    /// `FUNCTION FLUSH` on the server: the lease library is lost.
    FunctionFlush,
    /// A script that keeps the server busy past `busy-reply-threshold`.
    Busy,
    /// `maxmemory` below what is used: every write is refused (OOM).
    Oom,
    /// The proxy forwards the next FCALL and resets the connection before
    /// its reply, every 300 ms.
    ProxyCut,
    /// The proxy loses the next renew, release or commit call in turn (its
    /// FCALL is never forwarded: it does not run; its connection goes
    /// silent), every 200 ms.
    ProxyLoseWrites,
    /// The proxy holds every reply 900 ms (past the 500 ms deadline) for 1.5 s.
    ProxyDelay,
    /// The proxy forwards requests but drops every reply for 1.5 s.
    ProxyDropReplies,
    /// The proxy passes nothing, either way, for 1.5 s (blackhole).
    ProxyBlackhole,
    /// SIGSTOP a holder process past its lease, then SIGCONT.
    PauseHolder,
    /// SIGKILL the operator during handoffs, start a new one.
    OperatorKill,
    /// SIGSTOP the leading operator replica past its leadership, then SIGCONT.
    OperatorPause,
    /// Restart kube-apiserver.
    ApiserverRestart,
    /// Stop kube-apiserver, compact etcd past every revision a watch saw,
    /// start it again: every watch resumes from a compacted revision and relists.
    EtcdCompaction,
    /// SIGKILL the etcd cluster's leader; the others elect a new one (seen);
    /// start it again from its data directory 1 s later.
    EtcdLeaderKill,
    /// SIGKILL one follower, let the lag-window holder renew and take a
    /// target, then SIGKILL the leader and start the follower again at once,
    /// behind; the old leader is started again 1 s later.
    EtcdLeaderKillBehind,
    /// SIGSTOP the etcd cluster's leader for 1.5 s (past the 500 ms election
    /// timeout; a new leader seen meanwhile), then SIGCONT: a stale leader.
    EtcdLeaderPause,
    /// Cut the etcd cluster's leader off from the other members for 1.5 s
    /// (network namespaces: its peer link down; a new leader seen
    /// meanwhile) while clients still reach it, then join it again.
    EtcdPartitionLeader,
    /// SIGKILL the operator; while it is down, the Held TargetLease is
    /// deleted and Valkey loses everything (`FLUSHALL`); start it again.
    ValkeyLossOperatorDown,
}

/// Where the workload runs.
#[derive(Clone, Debug)]
pub enum Backend {
    /// Lease clients against a Valkey deployment.
    Valkey(Setup),
    /// The operator (this many replicas) on a kube-apiserver, with its own
    /// standalone Valkey; lease clients share that Valkey.
    Operator { replicas: usize },
    /// Lease clients against a 3-member etcd cluster (`crate::etcd`).
    Etcd(crate::etcd::Setup),
    /// The operator (this many replicas) on a kube-apiserver, with a
    /// 3-member etcd cluster as its store; lease clients share that cluster.
    EtcdOperator { replicas: usize },
}

impl Backend {
    /// The operator runs (TargetLeases, statuses, pod marks).
    pub fn operator(&self) -> Option<usize> {
        match self {
            Backend::Operator { replicas } | Backend::EtcdOperator { replicas } => Some(*replicas),
            Backend::Valkey(_) | Backend::Etcd(_) => None,
        }
    }

    /// What the store's reported times are read from: etcd has no clock.
    pub fn dating(&self) -> crate::history::Dating {
        match self {
            Backend::Valkey(_) | Backend::Operator { .. } => crate::history::Dating::Store,
            Backend::Etcd(_) | Backend::EtcdOperator { .. } => {
                crate::history::Dating::ClientBeforeSend
            }
        }
    }
}

/// One violation a positive control must make the checker report.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    pub property: Property,
    pub scope: Scope,
    /// Caught only by a violation naming one of these operations (none: any).
    pub words: &'static [&'static str],
}

impl Expect {
    pub const fn of(property: Property, scope: Scope) -> Expect {
        Expect {
            property,
            scope,
            words: &[],
        }
    }

    /// How many of the report's violations are this one.
    pub fn count(&self, report: &crate::check::Report) -> usize {
        report
            .violations
            .iter()
            .filter(|v| v.property == self.property && v.scope == self.scope)
            .filter(|v| {
                self.words.is_empty()
                    || self
                        .words
                        .iter()
                        .any(|w| v.detail.starts_with(w) || v.detail.contains(&format!(" {w} ")))
            })
            .count()
    }

    /// `(c) in lease commit`, `(c) in client leases (a renew or release)`.
    pub fn describe(&self) -> String {
        let mut out = format!("({}) in {}", self.property.letter(), self.scope.name());
        if !self.words.is_empty() {
            out += &format!(" (a {})", self.words.join(" or "));
        }
        out
    }
}

/// One row of the matrix.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    /// One line for docs/faults.md.
    pub about: &'static str,
    pub backend: Backend,
    pub durability: Durability,
    pub fault: Fault,
    /// Properties this mode cannot promise: measured, published, not failed on.
    pub measured: &'static [(Property, Scope)],
    /// Measured properties whose count must not be 0: the cost a lossy mode
    /// exists to show (a run that shows none would have tested nothing).
    pub must_show: &'static [(Property, Scope)],
    /// A broken component; the run passes only if every `expect` is reported.
    pub control: Option<Control>,
    /// What a positive control must make the checker report, all of it
    /// (empty: not a control).
    pub expect: &'static [Expect],
    /// Lease time-to-live of the workload's clients.
    pub ttl: Duration,
    /// Product fail points (`src/store/failpoints.rs`) of this run's CLI and
    /// operator processes: `(name, action)`.
    pub failpoints: &'static [(&'static str, &'static str)],
    /// The fail points also hold in this process (the library clients):
    /// the run has the harness to itself.
    pub failpoints_here: bool,
    /// Effects this scenario's fault must show beyond those of every run of
    /// its fault (`report::required_effect`).
    pub effects: &'static [&'static str],
    /// The fault wipes every fence counter (a server without persistence
    /// restarted): PostgreSQL rightly refuses the tokens issued again until
    /// the counter passes the highest it accepted, so its recovery is shown,
    /// not held to the bound.
    pub wipes_counters: bool,
}

impl Scenario {
    /// A positive control (it must be caught), not a scenario.
    pub fn is_control(&self) -> bool {
        !self.expect.is_empty()
    }

    /// Whether the report catches this control: every expected violation
    /// was reported at least once.
    pub fn caught(&self, report: &crate::check::Report) -> bool {
        self.is_control() && self.expect.iter().all(|e| e.count(report) > 0)
    }

    /// Whether a lag-window holder runs (`workload/lag.rs`): across every
    /// Sentinel failover, and every etcd leader kill with a follower held
    /// behind.
    pub fn lag_window_holder(&self) -> bool {
        matches!(
            self.fault,
            Fault::SentinelFailover | Fault::EtcdLeaderKillBehind
        )
    }

    /// How long every part may take to succeed again after a fault heals.
    pub fn recovery_bound(&self) -> Duration {
        self.ttl + Duration::from_secs(4)
    }

    /// How long the workload goes on after the last fault, and how long each
    /// fault-free gap of the schedule lasts: longer than the recovery bound,
    /// so that the bound judges the faults before them.
    pub fn quiet(&self) -> Duration {
        self.recovery_bound() + Duration::from_secs(1)
    }
}

/// Lease time-to-live of the workload (most scenarios).
pub const TTL: Duration = Duration::from_millis(2000);
/// Lease time-to-live across a failover: longer than Sentinel's 3 s
/// down-after, so a grant made in the replica's lag window is still claimed
/// when the replica is promoted without it.
pub const FAILOVER_TTL: Duration = Duration::from_secs(10);

/// What an unsafe Valkey mode can lose: tokens and client leases of writes
/// that had not reached the survivor, and the last fenced commits.
const LOSSY: &[(Property, Scope)] = &[
    (Property::Tokens, Scope::Lease),
    (Property::Exclusion, Scope::Lease),
    (Property::Downstream, Scope::Commit),
];

/// The power-loss effect of a mode that acknowledges before it fsyncs:
/// a cut that removed nothing would have tested nothing.
pub const UNSYNCED_CUT: &str = "unsynced AOF bytes cut";

/// Kills that came while the AOF write was postponed (bytes in the buffer).
pub const POSTPONED_KILLS: &str = "kills with the AOF write postponed";

/// What those kills found in the AOF buffer: executed, not yet written.
pub const UNWRITTEN: &str = "AOF buffer bytes unwritten at the kills";

/// Renewals the failover's lag-window holder sent inside the lag window.
pub const LAG_RENEWALS: &str = "lag-window renewals sent";

/// Those acknowledged before the primary died (lost with it under
/// `--durability none`; none under `replicas:1`).
pub const LAG_RENEWED: &str = "lag-window renewals acknowledged";

/// Grants of the lag-window holder's own target acknowledged before the
/// primary died (lost with it under `--durability none`, their tokens
/// issued again; none under `replicas:1`).
pub const LAG_GRANTED: &str = "lag-window grants acknowledged";

/// A server under the power-loss shim with its AOF on, fsynced `fsync`.
fn power_loss(fsync: &str, disk: Disk) -> Setup {
    Setup::PowerLoss(
        ["--appendonly", "yes", "--appendfsync", fsync]
            .map(String::from)
            .to_vec(),
        disk,
    )
}

fn args(a: &[&str]) -> Setup {
    Setup::Standalone(a.iter().map(|s| s.to_string()).collect())
}

fn standalone() -> Backend {
    Backend::Valkey(args(&[]))
}

fn scenario(name: &'static str, about: &'static str, backend: Backend, fault: Fault) -> Scenario {
    Scenario {
        name,
        about,
        backend,
        durability: Durability::None,
        fault,
        measured: &[],
        must_show: &[],
        control: None,
        expect: &[],
        ttl: TTL,
        failpoints: &[],
        failpoints_here: false,
        effects: &[],
        wipes_counters: false,
    }
}

/// Every scenario, then every control, in the order they run.
pub fn all() -> Vec<Scenario> {
    let mut all = rows::all();
    all.extend(etcd::rows());
    all.extend(controls::all());
    all.extend(etcd::controls());
    all
}
