//! The fault matrix: every scenario (a deployment, a durability mode, a
//! fault) and every positive control (a broken component the checker must
//! catch). Properties a mode cannot promise are listed as measured: their
//! violations are counted and published, not failed on.

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
    /// The power goes: SIGKILL the server, cut its append-only files back to
    /// what it had fsynced (the power-loss shim's record), restart it.
    PowerCut,
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
    /// Lease time-to-live of the workload's clients.
    pub ttl: Duration,
    /// Product fail points (`src/failpoints.rs`) of this run's CLI and
    /// operator processes: `(name, action)`.
    pub failpoints: &'static [(&'static str, &'static str)],
    /// The fail points also hold in this process (the library clients):
    /// the run has the harness to itself.
    pub failpoints_here: bool,
    /// A control is caught only by an `expect` violation naming one of
    /// these operations (none: any).
    pub expect_words: &'static [&'static str],
    /// Effects this scenario's fault must show beyond those of every run of
    /// its fault (`report::required_effect`).
    pub effects: &'static [&'static str],
}

impl Scenario {
    /// How many of the report's violations catch this control.
    pub fn caught(&self, report: &crate::check::Report) -> usize {
        let Some((p, sc)) = self.expect else { return 0 };
        report
            .violations
            .iter()
            .filter(|v| v.property == p && v.scope == sc)
            .filter(|v| {
                self.expect_words.is_empty()
                    || self
                        .expect_words
                        .iter()
                        .any(|w| v.detail.starts_with(w) || v.detail.contains(&format!(" {w} ")))
            })
            .count()
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

/// Valkey losing everything under the operator: the clients' losses. Not
/// the operator's: a TargetLease deleted while the operator was down still
/// shows Held until its cleanup withdraws it, and the next one on the target
/// is not granted (though Valkey, having lost the lease, would) before that.
const LOSSY_UNDER_THE_OPERATOR: &[(Property, Scope)] = LOSSY;

/// The power-loss effect of a mode that acknowledges before it fsyncs:
/// a cut that removed nothing would have tested nothing.
pub const UNSYNCED_CUT: &str = "unsynced AOF bytes cut";

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
        ttl: TTL,
        failpoints: &[],
        failpoints_here: false,
        expect_words: &[],
        effects: &[],
    }
}

/// A positive control inside the product: `failpoints` break it (in the
/// CLI and operator processes, and in this one when `here`).
fn product_control(
    name: &'static str,
    about: &'static str,
    backend: Backend,
    fault: Fault,
    failpoints: &'static [(&'static str, &'static str)],
    here: bool,
    expect: (Property, Scope),
) -> Scenario {
    Scenario {
        expect: Some(expect),
        failpoints,
        failpoints_here: here,
        ..scenario(name, about, backend, fault)
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
            ttl: FAILOVER_TTL,
            ..scenario(
                "failover-durability-none",
                "replica 500 ms behind, primary SIGKILL, Sentinel failover to it (lease ttl 10 s), `--durability none`",
                Backend::Valkey(Setup::Sentinel),
                Fault::SentinelFailover,
            )
        },
        Scenario {
            durability: Durability::Replicas(1),
            ttl: FAILOVER_TTL,
            ..scenario(
                "failover-replicas-1",
                "replica 500 ms behind, primary SIGKILL, Sentinel failover to it (lease ttl 10 s), `--durability replicas:1`",
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
        Scenario {
            measured: LOSSY,
            effects: &[UNSYNCED_CUT],
            ..scenario(
                "powerloss-aof-everysec",
                "power cut (SIGKILL, the AOF cut back to its last fsync, restart), `appendfsync everysec`, `--durability none`",
                Backend::Valkey(power_loss("everysec", Disk::Honest)),
                Fault::PowerCut,
            )
        },
        Scenario {
            durability: Durability::Aof,
            measured: LOSSY,
            effects: &[UNSYNCED_CUT, "WAITAOF calls"],
            ..scenario(
                "powerloss-aof-everysec-durability-aof",
                "power cut (SIGKILL, the AOF cut back to its last fsync, restart), `appendfsync everysec`, `--durability aof`",
                Backend::Valkey(power_loss("everysec", Disk::Honest)),
                Fault::PowerCut,
            )
        },
        scenario(
            "powerloss-aof-always",
            "power cut (SIGKILL, the AOF cut back to its last fsync, restart), `appendfsync always`, `--durability none`",
            Backend::Valkey(power_loss("always", Disk::Honest)),
            Fault::PowerCut,
        ),
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
        Scenario {
            // The holder's own deadline outlives a lease the server's clock ended.
            measured: &[(Property::Exclusion, Scope::Lease)],
            ..scenario(
                "clock-jump",
                "Valkey's clock jumps forward past every lease (libfaketime)",
                Backend::Valkey(Setup::Faketime),
                Fault::ClockJump,
            )
        },
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
        Scenario {
            measured: LOSSY_UNDER_THE_OPERATOR,
            ..scenario(
                "operator-valkey-data-loss",
                "operator SIGKILL; while it is down the Held TargetLease is deleted and Valkey loses everything; operator restarted (the token floor is the only barrier)",
                Backend::Operator { replicas: 1 },
                Fault::ValkeyLossOperatorDown,
            )
        },
        product_control(
            "control-floor-skipped",
            "the operator never raises the token floor (`floor-skip-raise`), with Valkey data loss while it is down",
            Backend::Operator { replicas: 1 },
            Fault::ValkeyLossOperatorDown,
            &[("floor-skip-raise", "return")],
            false,
            (Property::Tokens, Scope::Published),
        ),
        product_control(
            "control-mark-before-unmark",
            "the operator keeps a pod's marks until the next leader is marked (`mark-before-unmark`)",
            Backend::Operator { replicas: 1 },
            Fault::None,
            &[("mark-before-unmark", "return")],
            false,
            (Property::Exclusion, Scope::Published),
        ),
        product_control(
            "control-held-after-lost",
            "the operator keeps status as it was after the store said the lease ended (`held-after-lost`), with revokes",
            Backend::Operator { replicas: 1 },
            Fault::None,
            &[("held-after-lost", "return")],
            false,
            (Property::Honesty, Scope::Published),
        ),
        product_control(
            "control-lost-reply-ok",
            "the store reports a renew, release or commit whose reply was lost as done (`lost-reply-ok`), nothing passes for 1.5 s every 2 s",
            Backend::Valkey(Setup::Proxied),
            Fault::ProxyBlackhole,
            &[("lost-reply-ok", "return")],
            true,
            (Property::Honesty, Scope::Commit),
        ),
        Scenario {
            expect_words: &["renew", "release", "revoke"],
            ..product_control(
                "control-lost-reply-unavailable",
                "the store reports a write whose reply was lost as `backend_unavailable` (`lost-reply-unavailable`), the connection reset after an EVALSHA is forwarded (every 300 ms)",
                Backend::Valkey(Setup::Proxied),
                Fault::ProxyCut,
                &[("lost-reply-unavailable", "return")],
                true,
                (Property::Honesty, Scope::Lease),
            )
        },
        product_control(
            "control-previous-token",
            "the CLI's acquire reports the token before the one granted (`acquire-previous-token`)",
            standalone(),
            Fault::None,
            &[("acquire-previous-token", "return")],
            false,
            (Property::Tokens, Scope::Lease),
        ),
        Scenario {
            durability: Durability::Replicas(1),
            ttl: FAILOVER_TTL,
            ..product_control(
                "control-skipped-wait",
                "`--durability replicas:1` without its `WAIT` (`skip-durability-wait`), across failovers with the replica 500 ms behind",
                Backend::Valkey(Setup::Sentinel),
                Fault::SentinelFailover,
                &[("skip-durability-wait", "return")],
                true,
                (Property::Tokens, Scope::Lease),
            )
        },
        Scenario {
            effects: &[UNSYNCED_CUT],
            ..control(
                "control-disk-loses-fsyncs",
                "`appendfsync always` on a disk whose write cache acknowledges fsync and loses its last second at each power cut",
                Backend::Valkey(power_loss("always", Disk::CacheLosesFsyncs)),
                Fault::PowerCut,
                Control::DiskLosesFsyncs,
                (Property::Tokens, Scope::Lease),
            )
        },
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
