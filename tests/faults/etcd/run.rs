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
use crate::run::{self, Finals, RunResult, Urls};
use crate::scenarios::{Fault, Scenario};
use crate::sink::PgSink;
use crate::workload::Stop;

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

async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    tokio::task::spawn_blocking(f)
        .await
        .expect("etcd fault task panicked")
}

/// Injects `fault` on the cluster until the pace stops it.
pub async fn inject(fault: Fault, etcd: Arc<Etcd>, rec: &Recorder, pace: &mut Pace) {
    match fault {
        Fault::None | Fault::PauseHolder => unreachable!("handled by inject::run"),
        Fault::EtcdLeaderKill => {
            while !pace.wait(Duration::from_millis(2500)).await {
                let e = etcd.clone();
                let Some(old) = blocking(move || e.leader()).await else {
                    continue;
                };
                rec.fault("etcd leader SIGKILL, restart");
                let e = etcd.clone();
                let new = blocking(move || e.kill_and_restart(old, DOWN)).await;
                rec.healed();
                rec.effect("etcd leaders killed and started again", 1);
                if new.is_some_and(|n| n != old) {
                    rec.effect("new etcd leaders elected", 1);
                }
            }
        }
        Fault::EtcdLeaderPause => {
            while !pace.wait(Duration::from_millis(2500)).await {
                let e = etcd.clone();
                let Some(old) = blocking(move || e.leader()).await else {
                    continue;
                };
                rec.fault("etcd leader SIGSTOP past the election timeout, SIGCONT");
                let e = etcd.clone();
                let new = blocking(move || e.pause(old, PAUSE)).await;
                rec.healed();
                rec.effect("etcd leaders stopped past the election timeout", 1);
                if new.is_some_and(|n| n != old) {
                    rec.effect("new etcd leaders elected while the old one was stopped", 1);
                }
            }
        }
        Fault::EtcdPartitionLeader => {
            while !pace.wait(Duration::from_millis(2500)).await {
                let e = etcd.clone();
                let Some(old) = blocking(move || e.leader()).await else {
                    continue;
                };
                rec.fault("etcd leader cut off from its peers, clients still reach it");
                let e = etcd.clone();
                let cut = blocking(move || e.partition(old, CUT)).await;
                rec.healed();
                rec.effect("etcd leaders cut off from their peers", 1);
                if cut.new.is_some_and(|n| n != old) {
                    rec.effect("new etcd leaders elected while the old one was cut off", 1);
                }
                if cut.answered_as_leader {
                    rec.effect(super::CUT_LEADERS_ANSWERING, 1);
                }
            }
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
    let urls = Urls {
        clients: etcd.url(),
        observer: etcd.direct_url(),
    };
    let rec = Recorder::default();
    let stop = Stop::default();
    let tasks = run::clients(&urls, s, &sink, &rec, &stop, &[], None).await;
    let holder = run::paused_holder(s, &urls, &sink, &rec);
    let targets = Targets {
        valkey: None,
        etcd: Some(etcd.clone()),
        holder,
        ttl: s.ttl,
        lag: None,
    };
    run::inject_then_stop(s, secs, targets, &rec, &stop).await;
    for (what, n) in etcd.effects() {
        rec.effect(&what, n);
    }
    let result = run::finish(tasks, &sink, Finals::Store(urls.observer), &rec, started).await;
    drop(etcd);
    result
}
