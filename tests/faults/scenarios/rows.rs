//! The matrix's scenarios: each a deployment, a durability mode and a
//! fault, with what the mode cannot promise (measured) and, for the lossy
//! modes, the cost each must show.

use targetlease::store::valkey::Durability;

use super::{
    Backend, FAILOVER_TTL, Fault, LAG_GRANTED, LAG_RENEWED, LOSSY, Scenario, UNSYNCED_CUT, args,
    power_loss, scenario, standalone,
};
use crate::check::{Property, Scope};
use crate::valkey::Setup;
use crate::valkey::powerloss::Disk;

/// Valkey losing everything under the operator: the clients' losses. Not
/// the operator's: a TargetLease deleted while the operator was down still
/// shows Held until its cleanup withdraws it, and the next one on the target
/// is not granted (though Valkey, having lost the lease, would) before that.
const LOSSY_UNDER_THE_OPERATOR: &[(Property, Scope)] = LOSSY;

/// Every scenario (not the controls), in the order they run.
pub fn all() -> Vec<Scenario> {
    vec![
        scenario("baseline", "no fault", standalone(), Fault::None),
        Scenario {
            measured: LOSSY,
            // The overlap `none` permits: a holder whose renewal the
            // promotion lost still claims the target when it is granted again.
            must_show: &[(Property::Exclusion, Scope::Lease)],
            effects: &[LAG_RENEWED, LAG_GRANTED],
            ttl: FAILOVER_TTL,
            ..scenario(
                "failover-durability-none",
                "replica 500 ms behind, primary SIGKILL, Sentinel failover to it (lease ttl 10 s; a holder renews and takes a target inside the lag window), `--durability none`",
                Backend::Valkey(Setup::Sentinel),
                Fault::SentinelFailover,
            )
        },
        Scenario {
            durability: Durability::Replicas(1),
            ttl: FAILOVER_TTL,
            ..scenario(
                "failover-replicas-1",
                "replica 500 ms behind, primary SIGKILL, Sentinel failover to it (lease ttl 10 s; a holder renews and takes a target inside the lag window), `--durability replicas:1`",
                Backend::Valkey(Setup::Sentinel),
                Fault::SentinelFailover,
            )
        },
        Scenario {
            measured: LOSSY,
            wipes_counters: true,
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
            // Acknowledged grants the kill took away: tokens issued again.
            must_show: &[(Property::Tokens, Scope::Lease)],
            ..scenario(
                "restart-slow-fsync-everysec",
                "SIGKILL while `appendfsync everysec` has postponed writing acknowledged replies to the AOF (a slow disk: each AOF fsync takes 250 ms), restart, `--durability none`",
                Backend::Valkey(power_loss("everysec", Disk::SlowFsync)),
                Fault::KillUnwritten,
            )
        },
        Scenario {
            durability: Durability::Aof,
            effects: &["WAITAOF calls"],
            ..scenario(
                "restart-slow-fsync-everysec-durability-aof",
                "SIGKILL while `appendfsync everysec` has postponed writing executed writes to the AOF (a slow disk: each AOF fsync takes 250 ms), restart, `--durability aof`",
                Backend::Valkey(power_loss("everysec", Disk::SlowFsync)),
                Fault::KillUnwritten,
            )
        },
        Scenario {
            measured: LOSSY,
            // What `always` buys: acknowledged grants lost at the cut.
            must_show: &[(Property::Tokens, Scope::Lease)],
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
            "the connection is reset after an FCALL is forwarded, before its reply (every 300 ms)",
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
            "function-flush",
            "`FUNCTION FLUSH` every 500 ms (the lease library is lost and loaded again)",
            standalone(),
            Fault::FunctionFlush,
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
            "apiserver-compaction",
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
    ]
}
