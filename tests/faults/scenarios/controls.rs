//! The positive controls: each breaks one component on purpose — the
//! product through its fail points (`src/store/failpoints.rs`), or a harness part
//! (`crate::controls`) — and passes only if the checker reports what it
//! breaks.

use targetlease::store::valkey::Durability;

use super::{
    Backend, Expect, FAILOVER_TTL, Fault, Scenario, UNSYNCED_CUT, power_loss, scenario, standalone,
};
use crate::check::{Property, Scope};
use crate::controls::Control;
use crate::valkey::Setup;
use crate::valkey::powerloss::Disk;

/// A positive control inside the product: `failpoints` break it (in the
/// CLI and operator processes, and in this one when `here`).
fn product_control(
    name: &'static str,
    about: &'static str,
    backend: Backend,
    fault: Fault,
    failpoints: &'static [(&'static str, &'static str)],
    here: bool,
    expect: &'static [Expect],
) -> Scenario {
    Scenario {
        expect,
        failpoints,
        failpoints_here: here,
        ..scenario(name, about, backend, fault)
    }
}

/// A positive control that breaks a part of the harness.
fn control(
    name: &'static str,
    about: &'static str,
    backend: Backend,
    fault: Fault,
    c: Control,
    expect: &'static [Expect],
) -> Scenario {
    Scenario {
        control: Some(c),
        expect,
        ..scenario(name, about, backend, fault)
    }
}

/// Every control, in the order they run.
pub fn all() -> Vec<Scenario> {
    vec![
        product_control(
            "control-floor-skipped",
            "the operator never raises the token floor (`floor-skip-raise`), with Valkey data loss while it is down",
            Backend::Operator { replicas: 1 },
            Fault::ValkeyLossOperatorDown,
            &[("floor-skip-raise", "return")],
            false,
            const { &[Expect::of(Property::Tokens, Scope::Published)] },
        ),
        product_control(
            "control-mark-before-unmark",
            "the operator keeps a pod's marks until the next leader is marked (`mark-before-unmark`)",
            Backend::Operator { replicas: 1 },
            Fault::None,
            &[("mark-before-unmark", "return")],
            false,
            const { &[Expect::of(Property::Exclusion, Scope::Published)] },
        ),
        product_control(
            "control-held-after-lost",
            "the operator keeps status as it was after the store said the lease ended (`held-after-lost`), with revokes",
            Backend::Operator { replicas: 1 },
            Fault::None,
            &[("held-after-lost", "return")],
            false,
            const { &[Expect::of(Property::Honesty, Scope::Published)] },
        ),
        product_control(
            "control-lost-reply-ok",
            "the store reports a renew, release or commit whose reply was lost as done (`lost-reply-ok`), the proxy losing a renew, release or commit request (it never runs) every 200 ms",
            Backend::Valkey(Setup::Proxied),
            Fault::ProxyLoseWrites,
            &[("lost-reply-ok", "return")],
            true,
            const {
                &[
                    Expect::of(Property::Honesty, Scope::Commit),
                    Expect {
                        words: &["renew", "release"],
                        ..Expect::of(Property::Honesty, Scope::Lease)
                    },
                ]
            },
        ),
        product_control(
            "control-lost-reply-unavailable",
            "the store reports a write whose reply was lost as `backend_unavailable` (`lost-reply-unavailable`), the connection reset after an FCALL is forwarded (every 300 ms)",
            Backend::Valkey(Setup::Proxied),
            Fault::ProxyCut,
            &[("lost-reply-unavailable", "return")],
            true,
            const {
                &[Expect {
                    words: &["renew", "release", "revoke"],
                    ..Expect::of(Property::Honesty, Scope::Lease)
                }]
            },
        ),
        product_control(
            "control-previous-token",
            "the CLI's acquire reports the token before the one granted (`acquire-previous-token`)",
            standalone(),
            Fault::None,
            &[("acquire-previous-token", "return")],
            false,
            const { &[Expect::of(Property::Tokens, Scope::Lease)] },
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
                // (d): the lag-window holder's renewal, acknowledged and lost.
                const {
                    &[
                        Expect::of(Property::Tokens, Scope::Lease),
                        Expect::of(Property::Exclusion, Scope::Lease),
                    ]
                },
            )
        },
        Scenario {
            durability: Durability::Aof,
            ..product_control(
                "control-skipped-waitaof",
                "`--durability aof` without its `WAITAOF` (`skip-durability-wait`), SIGKILLed while `appendfsync everysec` has postponed the AOF write (a slow disk)",
                Backend::Valkey(power_loss("everysec", Disk::SlowFsync)),
                Fault::KillUnwritten,
                &[("skip-durability-wait", "return")],
                true,
                const { &[Expect::of(Property::Tokens, Scope::Lease)] },
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
                const { &[Expect::of(Property::Tokens, Scope::Lease)] },
            )
        },
        control(
            "control-unguarded-table",
            "a PostgreSQL table without the guard, with a paused holder",
            standalone(),
            Fault::PauseHolder,
            Control::Unguarded,
            const { &[Expect::of(Property::Downstream, Scope::Postgres)] },
        ),
        control(
            "control-recipe-broken",
            "the PostgreSQL fencing recipe with its guard's `WHERE f.token <= EXCLUDED.token` removed (any token becomes the floor), with a paused holder",
            standalone(),
            Fault::PauseHolder,
            Control::BrokenRecipe,
            const { &[Expect::of(Property::Downstream, Scope::Postgres)] },
        ),
        control(
            "control-lost-write",
            "a downstream that acknowledges before it commits, then rolls back",
            standalone(),
            Fault::None,
            Control::LoseAckedWrites,
            const { &[Expect::of(Property::Downstream, Scope::Postgres)] },
        ),
        control(
            "control-double-grant",
            "a store that grants a held target to a second client",
            standalone(),
            Fault::None,
            Control::DoubleGrant,
            const { &[Expect::of(Property::Exclusion, Scope::Lease)] },
        ),
        control(
            "control-rogue-publisher",
            "a second writer marks a waiting TargetLease Held",
            Backend::Operator { replicas: 1 },
            Fault::None,
            Control::RoguePublisher,
            const { &[Expect::of(Property::Exclusion, Scope::Published)] },
        ),
    ]
}
