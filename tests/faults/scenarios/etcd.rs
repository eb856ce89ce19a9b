//! The etcd rows of the matrix: the same workload and checker on a real
//! 3-member etcd cluster, under etcd's own faults (leader killed, leader
//! stopped past the election timeout, leader partitioned from its peers on
//! a real network) and the client-link faults, with no
//! property measured: etcd promises every one. And the controls that show
//! the checker still catches each lie on etcd, the product broken through
//! the same fail points (`src/store/failpoints.rs`) at their etcd sites.

use super::{Backend, Expect, FAILOVER_TTL, Fault, LAG_GRANTED, LAG_RENEWED, Scenario, scenario};
use crate::check::{Property, Scope};
use crate::controls::Control;
use crate::etcd::Setup;

/// What the proxies count of the transactions they never forwarded: a
/// lost-writes row whose proxies lost none tested nothing.
pub const LOST_WRITES: &str = "writes lost by the proxies";

fn direct() -> Backend {
    Backend::Etcd(Setup::Direct)
}

fn proxied() -> Backend {
    Backend::Etcd(Setup::Proxied)
}

fn partitioned() -> Backend {
    Backend::Etcd(Setup::Partitioned)
}

/// The etcd scenarios (not the controls), in the order they run.
pub fn rows() -> Vec<Scenario> {
    vec![
        scenario("etcd-baseline", "etcd, no fault", direct(), Fault::None),
        scenario(
            "etcd-leader-kill",
            "etcd: the leader SIGKILLed (a new leader seen), restarted from its data 1 s later",
            direct(),
            Fault::EtcdLeaderKill,
        ),
        Scenario {
            // The holder's renewal and grant acknowledged while a follower
            // was down, before the leader's kill.
            effects: &[LAG_RENEWED, LAG_GRANTED],
            ttl: FAILOVER_TTL,
            ..scenario(
                "etcd-leader-kill-one-behind",
                "etcd: a follower SIGKILLed while a holder renews its lease and takes a target (lease ttl 10 s), 1 s later the leader SIGKILLed and the follower started again at once, behind (a new leader seen, never the follower held behind), the leader restarted 1 s later: what was acknowledged while the follower was down survives the leader's kill",
                direct(),
                Fault::EtcdLeaderKillBehind,
            )
        },
        scenario(
            "etcd-leader-pause",
            "etcd: the leader SIGSTOPped 1.5 s, past the 500 ms election timeout (a new leader seen), then SIGCONT: a stale leader",
            direct(),
            Fault::EtcdLeaderPause,
        ),
        Scenario {
            effects: &[crate::etcd::CUT_LEADERS_ANSWERING],
            ..scenario(
                "etcd-partition-leader",
                "etcd: the leader cut off from the other members for 1.5 s (network namespaces, its peer link down; a new leader seen) while every client still reaches it (seen answering as leader), then joined again",
                partitioned(),
                Fault::EtcdPartitionLeader,
            )
        },
        scenario(
            "etcd-proxy-cut-after-forward",
            "etcd: a proxy before every member forwards the next write transaction whole and resets its connection before the reply (every 300 ms)",
            proxied(),
            Fault::ProxyCut,
        ),
        Scenario {
            effects: &[LOST_WRITES],
            ..scenario(
                "etcd-proxy-lose-writes",
                "etcd: a proxy before every member loses the next write transaction (it never runs; its connection goes silent) every 200 ms",
                proxied(),
                Fault::ProxyLoseWrites,
            )
        },
        scenario(
            "etcd-proxy-blackhole",
            "etcd: nothing passes the proxies before the members, either way, for 1.5 s every 2 s",
            proxied(),
            Fault::ProxyBlackhole,
        ),
        scenario(
            "etcd-operator-kill",
            "etcd as the operator's store: operator SIGKILL every 2 s during handoffs and leader moves, a new one started",
            Backend::EtcdOperator { replicas: 1 },
            Fault::OperatorKill,
        ),
        scenario(
            "etcd-holder-pause",
            "etcd: a holder SIGSTOPped past its lease, then SIGCONT (its writes must be refused)",
            direct(),
            Fault::PauseHolder,
        ),
    ]
}

/// The etcd controls, in the order they run.
pub fn controls() -> Vec<Scenario> {
    vec![
        Scenario {
            failpoints: &[("lost-reply-ok", "return")],
            failpoints_here: true,
            effects: &[LOST_WRITES],
            expect: const {
                &[
                    Expect::of(Property::Honesty, Scope::Commit),
                    Expect {
                        words: &["renew", "release"],
                        ..Expect::of(Property::Honesty, Scope::Lease)
                    },
                ]
            },
            ..scenario(
                "etcd-control-lost-reply-ok",
                "etcd: the store reports a renew, release or commit whose reply was lost as done (`lost-reply-ok`), the proxies losing the next write transaction (it never runs; its connection goes silent) every 200 ms",
                proxied(),
                Fault::ProxyLoseWrites,
            )
        },
        Scenario {
            failpoints: &[("lost-reply-unavailable", "return")],
            failpoints_here: true,
            expect: const {
                &[Expect {
                    words: &["renew", "release", "revoke"],
                    ..Expect::of(Property::Honesty, Scope::Lease)
                }]
            },
            ..scenario(
                "etcd-control-lost-reply-unavailable",
                "etcd: the store reports a write whose reply was lost as `backend_unavailable` (`lost-reply-unavailable`), the proxies resetting the connection after forwarding a write transaction (every 300 ms)",
                proxied(),
                Fault::ProxyCut,
            )
        },
        Scenario {
            failpoints: &[("acquire-previous-token", "return")],
            expect: const { &[Expect::of(Property::Tokens, Scope::Lease)] },
            ..scenario(
                "etcd-control-previous-token",
                "etcd: the CLI's acquire reports the token before the one granted (`acquire-previous-token`)",
                direct(),
                Fault::None,
            )
        },
        Scenario {
            control: Some(Control::DoubleGrant),
            expect: const { &[Expect::of(Property::Exclusion, Scope::Lease)] },
            ..scenario(
                "etcd-control-double-grant",
                "etcd: a store that grants a held target to a second client",
                direct(),
                Fault::None,
            )
        },
    ]
}
