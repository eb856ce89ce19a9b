//! One run of an etcd scenario: the cluster, the same workload as on Valkey
//! (library and CLI clients with `etcd://` URLs, the administrator, the
//! observer straight to the members, the paused holder), and the etcd
//! faults, each verified: a new leader seen after every kill and during
//! every pause or partition, the proxies' cuts counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Etcd, Setup};
use crate::history::Recorder;
use crate::inject::{Pace, Targets};
use crate::report::{
    AFTER_BEHIND_LED, BEHIND_KILLS, BEHIND_LED, HELD_BEHIND_LED, HOLDS_WITHOUT_LEADER, KILLS_BEHIND,
};
use crate::run::{self, Finals, RunResult, Urls};
use crate::scenarios::{Fault, Scenario};
use crate::sink::PgSink;
use crate::workload::Stop;
use crate::workload::lag::{Cue, TAKE_AHEAD};
use tokio::sync::watch;

/// A killed leader stays down this long (its successor serves meanwhile).
const DOWN: Duration = Duration::from_secs(1);
/// A stopped leader stays stopped this long: past the 500 ms election
/// timeout and a new leader's first heartbeats.
const PAUSE: Duration = Duration::from_millis(1500);
/// A partitioned leader stays cut off this long: past the 500 ms election
/// timeout (the others elect a new leader, it steps down on losing its
/// quorum).
const CUT: Duration = Duration::from_millis(1500);
/// The proxies' blackhole.
const BLACKHOLE: Duration = Duration::from_millis(1500);
/// How long a follower is held behind before the leader's kill: the
/// lag-window holder is told to renew and take a target at its start, and
/// what it is answered before its end came before the kill.
const HELD_BEHIND: Duration = Duration::from_secs(1);

/// What tells the lag-window holder when to take and when to renew.
type Lag = watch::Sender<Option<Cue>>;

async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    tokio::task::spawn_blocking(f)
        .await
        .expect("etcd fault task panicked")
}

/// What a fault on the leader records: the fault, its count, and the count
/// of new leaders seen while it lasted.
struct Turn {
    what: &'static str,
    done: &'static str,
    new_leader: &'static str,
}

/// A fault on the leader: the leader seen while it lasted, and any further
/// effect to count.
type LeaderFault = fn(&Etcd, usize) -> (Option<usize>, Option<&'static str>);

/// Every 2.5 s until the pace stops it, `act` on the member that leads (a
/// turn without one is skipped), recorded as `turn` says. `act` answers the
/// leader it saw meanwhile and any further effect to count.
async fn at_the_leader(
    etcd: &Arc<Etcd>,
    rec: &Recorder,
    pace: &mut Pace,
    turn: Turn,
    act: LeaderFault,
) {
    while !pace.wait(Duration::from_millis(2500)).await {
        let e = etcd.clone();
        let Some(old) = blocking(move || e.leader()).await else {
            continue;
        };
        rec.fault(turn.what);
        let e = etcd.clone();
        let (new, more) = blocking(move || act(&e, old)).await;
        rec.healed();
        rec.effect(turn.done, 1);
        if new.is_some_and(|n| n != old) {
            rec.effect(turn.new_leader, 1);
        }
        if let Some(more) = more {
            rec.effect(more, 1);
        }
    }
}

/// The member held behind by the held-behind kill. No client calls it
/// (their URLs leave it out), as no Valkey client calls a replica.
pub const BEHIND: usize = 2;

/// Member [`BEHIND`] killed (SIGKILL) while the lag-window holder renews
/// its lease and takes a target (`workload/lag.rs`), then the leader killed
/// and that member started again at once, until the pace stops it. What
/// was acknowledged during the hold is on the third member only, as a
/// Valkey primary's writes in the lag window are on no replica; Raft
/// elects the third member (the held one needs its vote, refused to an
/// older log), so what was acknowledged must survive the kill, and the
/// held member must never be the new leader.
/// When [`BEHIND`] leads, it is first killed alone (no holder cued), so
/// that the lead moves to a member the clients call.
async fn kill_with_one_behind(etcd: &Arc<Etcd>, rec: &Recorder, pace: &mut Pace, lag: &Lag) {
    while !pace.wait(Duration::from_secs(1)).await {
        let e = etcd.clone();
        let Some(old) = blocking(move || e.leader()).await else {
            continue;
        };
        if old == BEHIND {
            rec.fault("etcd leader SIGKILL, restart (the member held behind led)");
            let e = etcd.clone();
            let new = blocking(move || e.kill_and_restart(old, DOWN)).await;
            rec.healed();
            rec.effect(BEHIND_LED, 1);
            if new.is_none() {
                continue;
            }
            rec.effect(AFTER_BEHIND_LED, 1);
        }
        let _ = lag.send(Some(Cue::Take(Instant::now() + TAKE_AHEAD)));
        tokio::time::sleep(TAKE_AHEAD).await;
        let e = etcd.clone();
        let before = blocking(move || {
            e.hold_behind(BEHIND);
            e.committed_without(BEHIND)
        })
        .await;
        rec.fault("etcd follower held behind (SIGKILL), leader SIGKILL, restart");
        // What the holder is answered before `held_until` counts as
        // acknowledged during the hold (workload/lag.rs): the leader's kill
        // comes after it.
        let held_until = Instant::now() + HELD_BEHIND;
        let _ = lag.send(Some(Cue::Renew(held_until)));
        tokio::time::sleep(HELD_BEHIND).await;
        let e = etcd.clone();
        // The leader now (it may have changed in the 3 s); none seen: the
        // turn ends without a kill.
        let Some(now) = blocking(move || e.leader()).await else {
            let e = etcd.clone();
            blocking(move || e.release_behind(BEHIND)).await;
            rec.healed();
            rec.effect(HOLDS_WITHOUT_LEADER, 1);
            continue;
        };
        let e = etcd.clone();
        let after = blocking(move || e.committed_without(BEHIND)).await;
        let e = etcd.clone();
        let new = blocking(move || e.kill_with_one_behind(now, BEHIND, DOWN)).await;
        rec.healed();
        rec.effect(BEHIND_KILLS, 1);
        // Behind for real: entries committed without it during the hold.
        let behind = matches!((before, after), (Some(b), Some(a)) if a > b);
        if behind {
            rec.effect(KILLS_BEHIND, 1);
        }
        if let Some(new) = new.filter(|&n| n != now) {
            rec.effect("new etcd leaders elected", 1);
            if new == BEHIND && behind {
                rec.effect(HELD_BEHIND_LED, 1);
            }
        }
    }
}

/// Injects `fault` on the cluster until the pace stops it; `lag` cues the
/// lag-window holder (the held-behind kill's).
pub async fn inject(
    fault: Fault,
    etcd: Arc<Etcd>,
    rec: &Recorder,
    pace: &mut Pace,
    lag: Option<Lag>,
) {
    match fault {
        Fault::None | Fault::PauseHolder => unreachable!("handled by inject::run"),
        Fault::EtcdLeaderKillBehind => {
            let lag = lag.expect("a lag-window holder to cue");
            kill_with_one_behind(&etcd, rec, pace, &lag).await;
        }
        Fault::EtcdLeaderKill => {
            let turn = Turn {
                what: "etcd leader SIGKILL, restart",
                done: "etcd leaders killed and started again",
                new_leader: "new etcd leaders elected",
            };
            at_the_leader(&etcd, rec, pace, turn, |e, old| {
                (e.kill_and_restart(old, DOWN), None)
            })
            .await;
        }
        Fault::EtcdLeaderPause => {
            let turn = Turn {
                what: "etcd leader SIGSTOP past the election timeout, SIGCONT",
                done: "etcd leaders stopped past the election timeout",
                new_leader: "new etcd leaders elected while the old one was stopped",
            };
            at_the_leader(&etcd, rec, pace, turn, |e, old| (e.pause(old, PAUSE), None)).await;
        }
        Fault::EtcdPartitionLeader => {
            let turn = Turn {
                what: "etcd leader cut off from its peers, clients still reach it",
                done: "etcd leaders cut off from their peers",
                new_leader: "new etcd leaders elected while the old one was cut off",
            };
            at_the_leader(&etcd, rec, pace, turn, |e, old| {
                let cut = e.partition(old, CUT);
                let answered = cut.answered_as_leader;
                (cut.new, answered.then_some(super::CUT_LEADERS_ANSWERING))
            })
            .await;
        }
        Fault::ProxyCut => {
            while !pace.wait(Duration::from_millis(300)).await {
                rec.fault("reset after forwarding a write transaction");
                for p in &etcd.proxies {
                    p.cut_next_write();
                }
                rec.healed();
            }
        }
        Fault::ProxyLoseWrites => {
            while !pace.wait(Duration::from_millis(200)).await {
                rec.fault("the next write lost before it runs");
                for p in &etcd.proxies {
                    p.lose_next_write();
                }
                rec.healed();
            }
        }
        Fault::ProxyBlackhole => {
            while !pace.wait(Duration::from_millis(500)).await {
                rec.fault("blackhole");
                etcd.proxies.iter().for_each(|p| p.blackhole(true));
                tokio::time::sleep(BLACKHOLE).await;
                etcd.proxies.iter().for_each(|p| p.blackhole(false));
                rec.healed();
            }
        }
        other => panic!("fault {other:?} has no etcd form"),
    }
}

/// Runs `s` on an etcd cluster of `setup` for `secs` seconds.
pub async fn run(
    s: &Scenario,
    setup: Setup,
    secs: u64,
    sink: PgSink,
    started: Instant,
) -> RunResult {
    let etcd = Arc::new(blocking(move || Etcd::start(setup)).await);
    let urls = if s.fault == Fault::EtcdLeaderKillBehind {
        let url = etcd.url_without(BEHIND);
        Urls {
            clients: url.clone(),
            observer: url,
        }
    } else {
        Urls {
            clients: etcd.url(),
            observer: etcd.direct_url(),
        }
    };
    let rec = Recorder::dated(s.backend.dating());
    let stop = Stop::default();
    let (lag, cue) = if s.lag_window_holder() {
        let (tx, rx) = watch::channel(None);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let tasks = run::clients(&urls, s, &sink, &rec, &stop, &[], cue).await;
    let holder = run::paused_holder(s, &urls, &sink, &rec);
    let targets = Targets {
        valkey: None,
        etcd: Some(etcd.clone()),
        holder,
        ttl: s.ttl,
        lag,
    };
    run::inject_then_stop(s, secs, targets, &rec, &stop).await;
    for (what, n) in etcd.effects() {
        rec.effect(&what, n);
    }
    let result = run::finish(tasks, &sink, Finals::Store(urls.observer), &rec, started).await;
    drop(etcd);
    result
}
