//! The fault matrix: every scenario (a deployment, a durability mode, a
//! fault) and every positive control (a broken component the checker must
//! catch). Properties a mode cannot promise are listed as measured: their
//! violations are counted and published, not failed on.

use targetlease::store::valkey::Durability;

use crate::check::{Property, Scope};
use crate::controls::Control;
use crate::valkey::Setup;

/// What is injected, over and over, while the workload runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing (baseline and most controls).
    None,
    /// SIGKILL the primary; Sentinel promotes the replica; the old primary rejoins.
    SentinelFailover,
    /// SIGKILL the server and restart it from its own files.
    Restart,
    /// Move Valkey's clock forward past every lease (libfaketime).
    ClockJump,
    /// `SCRIPT FLUSH` on the server.
    ScriptFlush,
    /// A script that keeps the server busy past `busy-reply-threshold`.
    Busy,
    /// `maxmemory` below what is used: every write is refused (OOM).
    Oom,
    /// The proxy forwards the next EVALSHA and resets the connection before
    /// its reply, every 300 ms.
    ProxyCut,
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
}

/// Where the workload runs.
#[derive(Clone, Debug)]
pub enum Backend {
    /// Lease clients against a Valkey deployment.
    Valkey(Setup),
    /// The operator (this many replicas) on a kube-apiserver, with its own
    /// standalone Valkey; lease clients share that Valkey.
    Operator { replicas: usize },
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
    /// A broken component; the run passes only if `expect` is violated.
    pub control: Option<Control>,
    pub expect: Option<(Property, Scope)>,
}

/// What an unsafe Valkey mode can lose: tokens and client leases of writes
/// that had not reached the survivor, and the last fenced commits.
const LOSSY: &[(Property, Scope)] = &[
    (Property::Tokens, Scope::Lease),
    (Property::Exclusion, Scope::Lease),
    (Property::Downstream, Scope::Commit),
];

fn args(a: &[&str]) -> Setup {
    Setup::Standalone(a.iter().map(|s| s.to_string()).collect())
}

fn scenario(name: &'static str, about: &'static str, backend: Backend, fault: Fault) -> Scenario {
    Scenario {
        name,
        about,
        backend,
        durability: Durability::None,
        fault,
        measured: &[],
        control: None,
        expect: None,
    }
}

fn control(
    name: &'static str,
    about: &'static str,
    backend: Backend,
    fault: Fault,
    c: Control,
    expect: (Property, Scope),
) -> Scenario {
    Scenario {
        control: Some(c),
        expect: Some(expect),
        ..scenario(name, about, backend, fault)
    }
}

/// Every scenario and control, in the order they run.
pub fn all() -> Vec<Scenario> {
    let standalone = || Backend::Valkey(args(&[]));
    vec![
        scenario("baseline", "no fault", standalone(), Fault::None),
        Scenario {
            measured: LOSSY,
            ..scenario(
                "failover-durability-none",
                "replica 500 ms behind, primary SIGKILL, Sentinel failover to it, `--durability none`",
                Backend::Valkey(Setup::Sentinel),
                Fault::SentinelFailover,
            )
        },
        Scenario {
            durability: Durability::Replicas(1),
            ..scenario(
                "failover-replicas-1",
                "replica 500 ms behind, primary SIGKILL, Sentinel failover to it, `--durability replicas:1`",
                Backend::Valkey(Setup::Sentinel),
                Fault::SentinelFailover,
            )
        },
        Scenario {
            measured: LOSSY,
            ..scenario(
                "restart-no-persistence",
                "SIGKILL + restart, no persistence, `--durability none`",
                standalone(),
                Fault::Restart,
            )
        },
        scenario(
            "restart-aof-always",
            "SIGKILL + restart, `appendfsync always`, `--durability none`",
            Backend::Valkey(args(&["--appendonly", "yes", "--appendfsync", "always"])),
            Fault::Restart,
        ),
        Scenario {
            measured: LOSSY,
            ..scenario(
                "restart-aof-everysec",
                "SIGKILL + restart, `appendfsync everysec`, `--durability none`",
                Backend::Valkey(args(&["--appendonly", "yes", "--appendfsync", "everysec"])),
                Fault::Restart,
            )
        },
        Scenario {
            durability: Durability::Aof,
            ..scenario(
                "restart-aof-everysec-durability-aof",
                "SIGKILL + restart, `appendfsync everysec`, `--durability aof`",
                Backend::Valkey(args(&["--appendonly", "yes", "--appendfsync", "everysec"])),
                Fault::Restart,
            )
        },
        scenario(
            "proxy-cut-after-forward",
            "the connection is reset after an EVALSHA is forwarded, before its reply (every 300 ms)",
            Backend::Valkey(Setup::Proxied),
            Fault::ProxyCut,
        ),
        scenario(
            "proxy-delay",
            "every reply held 900 ms, past the 500 ms deadline, for 1.5 s every 2 s",
            Backend::Valkey(Setup::Proxied),
            Fault::ProxyDelay,
        ),
        scenario(
            "proxy-drop-replies",
            "requests reach Valkey, every reply is dropped, for 1.5 s every 2 s",
            Backend::Valkey(Setup::Proxied),
            Fault::ProxyDropReplies,
        ),
        scenario(
            "proxy-blackhole",
            "nothing passes either way (connections accepted, never answered) for 1.5 s every 2 s",
            Backend::Valkey(Setup::Proxied),
            Fault::ProxyBlackhole,
        ),
        scenario(
            "holder-pause",
            "a holder SIGSTOPped past its lease, then SIGCONT (its writes must be refused)",
            standalone(),
            Fault::PauseHolder,
        ),
        scenario(
            "clock-jump",
            "Valkey's clock jumps forward past every lease (libfaketime)",
            Backend::Valkey(Setup::Faketime),
            Fault::ClockJump,
        ),
        scenario(
            "script-flush",
            "`SCRIPT FLUSH` every 500 ms",
            standalone(),
            Fault::ScriptFlush,
        ),
        scenario(
            "busy",
            "a 1.5 s script blocks the server (`BUSY` after 100 ms)",
            Backend::Valkey(args(&["--busy-reply-threshold", "100"])),
            Fault::Busy,
        ),
        scenario(
            "oom",
            "`maxmemory` 1 byte for 1 s (OOM on every write)",
            standalone(),
            Fault::Oom,
        ),
        scenario(
            "operator-kill",
            "operator SIGKILL every 2 s during handoffs and leader moves, a new one started",
            Backend::Operator { replicas: 1 },
            Fault::OperatorKill,
        ),
        scenario(
            "operator-pause",
            "the leading operator replica SIGSTOPped past its leadership (stale leader), then SIGCONT",
            Backend::Operator { replicas: 2 },
            Fault::OperatorPause,
        ),
        scenario(
            "apiserver-restart",
            "kube-apiserver restarted again 2 s after it answers (a restart takes several seconds: about 2 per 30 s)",
            Backend::Operator { replicas: 1 },
            Fault::ApiserverRestart,
        ),
        scenario(
            "etcd-compaction",
            "kube-apiserver stopped, etcd written and compacted past every watch, restarted (every watch relists)",
            Backend::Operator { replicas: 1 },
            Fault::EtcdCompaction,
        ),
        control(
            "control-reissued-token",
            "a store that reissues a target's first token",
            standalone(),
            Fault::None,
            Control::ReissueTokens,
            (Property::Tokens, Scope::Lease),
        ),
        control(
            "control-unguarded-table",
            "a PostgreSQL table without the guard, with a paused holder",
            standalone(),
            Fault::PauseHolder,
            Control::Unguarded,
            (Property::Downstream, Scope::Postgres),
        ),
        control(
            "control-lost-write",
            "a downstream that acknowledges before it commits, then rolls back",
            standalone(),
            Fault::None,
            Control::LoseAckedWrites,
            (Property::Downstream, Scope::Postgres),
        ),
        control(
            "control-lying-store",
            "a store that runs an acquire and reports `backend_unavailable`",
            standalone(),
            Fault::None,
            Control::LyingStore,
            (Property::Honesty, Scope::Lease),
        ),
        control(
            "control-double-grant",
            "a store that grants a held target to a second client",
            standalone(),
            Fault::None,
            Control::DoubleGrant,
            (Property::Exclusion, Scope::Lease),
        ),
        control(
            "control-rogue-publisher",
            "a second writer marks a waiting TargetLease Held",
            Backend::Operator { replicas: 1 },
            Fault::None,
            Control::RoguePublisher,
            (Property::Exclusion, Scope::Published),
        ),
    ]
}
