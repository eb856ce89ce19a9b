//! Injects one scenario's fault over and over until the run stops; every
//! injection is recorded in the history (the "faults injected" figure).
//! Injections come in bursts with fault-free gaps between them ([`Pace`]),
//! so that recovery can be judged against its bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::history::Recorder;
use crate::scenarios::Fault;
use crate::support::fault_proxy::Fault as ProxyFault;
use crate::support::resp::Resp;
use crate::valkey::Valkey;
use crate::workload::Stop;
use crate::workload::holder::Holder;
use crate::workload::lag::{Cue, TAKE_AHEAD};

/// How long the replica misses the primary's writes before the primary dies.
const REPLICA_LAG: Duration = Duration::from_millis(500);

/// A script that keeps the server busy for 1.5 s of its own clock.
const BUSY_SCRIPT: &str = "local t = redis.call('TIME') local s = t[1] * 1000 + t[2] / 1000 \
     while true do local n = redis.call('TIME') \
     if n[1] * 1000 + n[2] / 1000 - s > 1500 then break end end return 1";

/// What a fault can act on.
pub struct Targets {
    pub valkey: Option<Arc<Valkey>>,
    /// An etcd cluster: the faults with an etcd form act on it.
    pub etcd: Option<Arc<crate::etcd::Etcd>>,
    pub holder: Option<Holder>,
    /// Lease time-to-live of the workload (pauses and clock jumps exceed it).
    pub ttl: Duration,
    /// Tells the failover's lag-window holder when to take a target and
    /// when to renew it (`workload/lag.rs`).
    pub lag: Option<tokio::sync::watch::Sender<Option<Cue>>>,
}

/// The schedule of a fault: an injection every so often, and after every
/// burst of them a fault-free gap of `quiet` (longer than the recovery
/// bound), so that the bound judges the fault before each gap
/// (`check/recovery.rs`); a fault followed sooner by the next is only
/// counted as not recovered before it.
pub struct Pace {
    stop: Stop,
    quiet: Duration,
    burst: Duration,
    since: tokio::time::Instant,
}

impl Pace {
    /// Bursts of three times `quiet`, each followed by `quiet` without a fault.
    pub fn new(stop: Stop, quiet: Duration) -> Self {
        Self {
            stop,
            quiet,
            burst: quiet * 3,
            since: tokio::time::Instant::now(),
        }
    }

    /// Waits before the next injection: `every`, or the quiet gap once the
    /// burst is over. True when the run is stopping (inject no more).
    pub async fn wait(&mut self, every: Duration) -> bool {
        if self.since.elapsed() >= self.burst {
            let stopped = self.stop.sleep(self.quiet).await;
            self.since = tokio::time::Instant::now();
            return stopped;
        }
        self.stop.sleep(every).await
    }
}

async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    tokio::task::spawn_blocking(f)
        .await
        .expect("fault task panicked")
}

/// Runs until the pace's stop; returns what it acted on (so the caller can
/// clean up).
pub async fn run(fault: Fault, mut t: Targets, rec: Recorder, mut pace: Pace) -> Targets {
    if let Some(etcd) = t.etcd.clone()
        && !matches!(fault, Fault::None | Fault::PauseHolder)
    {
        crate::etcd::run::inject(fault, etcd, &rec, &mut pace, t.lag.clone()).await;
        return t;
    }
    let valkey = || {
        t.valkey
            .clone()
            .expect("a Valkey fault needs a Valkey deployment")
    };
    match fault {
        Fault::None => while !pace.wait(Duration::from_secs(1)).await {},
        Fault::SentinelFailover => {
            let v = valkey();
            let start = v.epoch();
            let mut planned = 0;
            while !pace.wait(Duration::from_secs(1)).await {
                // The lag-window holder takes a target ahead of the lag.
                if let Some(lag) = &t.lag {
                    let _ = lag.send(Some(Cue::Take(Instant::now() + TAKE_AHEAD)));
                    tokio::time::sleep(TAKE_AHEAD).await;
                }
                rec.lossy_fault("replica 500 ms behind, primary SIGKILL + Sentinel failover");
                planned += 1;
                let (v, lag) = (v.clone(), t.lag.clone());
                blocking(move || {
                    v.failover(REPLICA_LAG, || {
                        if let Some(lag) = lag {
                            let _ = lag.send(Some(Cue::Renew(Instant::now() + REPLICA_LAG)));
                        }
                    })
                })
                .await;
                rec.healed();
            }
            // Promotions nobody asked for (a primary wrongly judged down) are faults too.
            let promotions = v.epoch().saturating_sub(start);
            for _ in planned..promotions {
                rec.lossy_fault("unplanned Sentinel failover");
            }
            rec.effect("Sentinel promotions", promotions);
        }
        Fault::Restart => {
            let v = valkey();
            while !pace.wait(Duration::from_millis(2500)).await {
                rec.lossy_fault("SIGKILL + restart");
                let before = v.pids();
                let v2 = v.clone();
                blocking(move || v2.restart()).await;
                rec.healed();
                if v.pids() != before {
                    rec.effect("restarts (a new server process)", 1);
                }
            }
        }
        Fault::KillUnwritten => {
            let v = valkey();
            while !pace.wait(Duration::from_millis(2500)).await {
                let before = v.pids();
                let (v2, r) = (v.clone(), rec.clone());
                let buffered = blocking(move || {
                    v2.kill_unwritten(|| {
                        r.lossy_fault("SIGKILL with the AOF write postponed, restart")
                    })
                })
                .await;
                rec.healed();
                if v.pids() != before {
                    rec.effect("restarts (a new server process)", 1);
                }
                if buffered > 0 {
                    rec.effect(crate::scenarios::POSTPONED_KILLS, 1);
                }
                rec.effect(crate::scenarios::UNWRITTEN, buffered);
            }
        }
        Fault::PowerCut => {
            let v = valkey();
            while !pace.wait(Duration::from_millis(2500)).await {
                rec.lossy_fault("power cut: SIGKILL, AOF cut back to its last fsync, restart");
                let before = v.pids();
                let v2 = v.clone();
                let cut = blocking(move || v2.power_cut()).await;
                rec.healed();
                // The shim knew the AOF's files, and a new server started from them.
                if v.pids() != before && cut.tracked > 0 {
                    rec.effect("power cuts (restarted from the fsynced AOF)", 1);
                }
                rec.effect(crate::scenarios::UNSYNCED_CUT, cut.bytes);
            }
        }
        Fault::ClockJump => {
            let v = valkey();
            let by = t.ttl + Duration::from_secs(3);
            while !pace.wait(Duration::from_secs(3)).await {
                rec.fault("clock jump");
                let before = v.clock_offset_ms();
                v.jump_clock(by);
                let v2 = v.clone();
                // Read until the jump shows (a loaded machine may answer late).
                let moved = blocking(move || {
                    let want = by.as_millis() as i64 - 1000;
                    (0..20).find_map(|_| {
                        let seen = before.zip(v2.clock_offset_ms()).map(|(b, a)| a - b);
                        match seen {
                            Some(d) if d >= want => Some(d),
                            _ => {
                                std::thread::sleep(Duration::from_millis(50));
                                None
                            }
                        }
                    })
                })
                .await;
                rec.healed();
                if let Some(d) = moved {
                    rec.effect("Valkey TIME moved forward (ms)", d as u64);
                }
            }
        }
        Fault::FunctionFlush => {
            let v = valkey();
            while !pace.wait(Duration::from_millis(500)).await {
                rec.fault("FUNCTION FLUSH");
                let v = v.clone();
                let ok = blocking(move || v.on_primary(&["FUNCTION", "FLUSH"])).await;
                rec.healed();
                if ok == Some(Resp::Simple("OK".into())) {
                    rec.effect("FUNCTION FLUSH done", 1);
                }
            }
        }
        Fault::Busy => {
            let v = valkey();
            while !pace.wait(Duration::from_secs(2)).await {
                rec.fault("BUSY script");
                let v = v.clone();
                let ran = blocking(move || v.on_primary(&["EVAL", BUSY_SCRIPT, "0"])).await;
                rec.healed();
                if ran == Some(Resp::Int(1)) {
                    rec.effect("1.5 s scripts run", 1);
                }
            }
        }
        Fault::Oom => {
            let v = valkey();
            while !pace.wait(Duration::from_secs(2)).await {
                rec.fault("OOM");
                let v2 = v.clone();
                let set =
                    blocking(move || v2.on_primary(&["CONFIG", "SET", "maxmemory", "1"])).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                let v2 = v.clone();
                let reset =
                    blocking(move || v2.on_primary(&["CONFIG", "SET", "maxmemory", "0"])).await;
                rec.healed();
                let ok = Some(Resp::Simple("OK".into()));
                if set == ok && reset == ok {
                    rec.effect("maxmemory 1 set and reset", 1);
                }
            }
        }
        Fault::ProxyCut => {
            let v = valkey();
            let proxy = v.proxy.as_ref().expect("a proxied deployment");
            while !pace.wait(Duration::from_millis(300)).await {
                rec.fault("reset after forwarding FCALL");
                proxy.cut_before_reply("FCALL");
                rec.healed();
            }
        }
        Fault::ProxyLoseWrites => {
            let v = valkey();
            let proxy = v.proxy.as_ref().expect("a proxied deployment");
            let scripts = &targetlease::store::valkey::scripts::SCRIPTS;
            let lost = [&scripts.renew, &scripts.release, &scripts.commit];
            let mut next = lost.iter().cycle();
            while !pace.wait(Duration::from_millis(200)).await {
                let script = next.next().expect("a cycle");
                rec.fault(&format!(
                    "the next {} call lost before it runs",
                    script.name
                ));
                proxy.silence_from(&format!("FCALL {}", script.function));
                rec.healed();
            }
        }
        Fault::ProxyDelay | Fault::ProxyDropReplies | Fault::ProxyBlackhole => {
            let v = valkey();
            let proxy = v.proxy.as_ref().expect("a proxied deployment");
            let (name, standing) = match fault {
                Fault::ProxyDelay => (
                    "replies delayed 900 ms",
                    ProxyFault::Delay(Duration::from_millis(900)),
                ),
                Fault::ProxyDropReplies => (
                    "replies dropped",
                    ProxyFault::DropReplies(Duration::from_millis(1500)),
                ),
                _ => ("blackhole", ProxyFault::Silent),
            };
            while !pace.wait(Duration::from_millis(500)).await {
                rec.fault(name);
                proxy.set(standing);
                tokio::time::sleep(Duration::from_millis(1500)).await;
                proxy.set(ProxyFault::Pass);
                rec.healed();
            }
        }
        Fault::PauseHolder => {
            let pause = t.ttl + Duration::from_millis(1500);
            let holder = t.holder.as_mut().expect("a holder to pause");
            while !pace.wait(Duration::from_millis(500)).await {
                if holder.pause_after_renewal(Duration::from_secs(5)).await {
                    rec.fault("holder SIGSTOP past its lease");
                    tokio::time::sleep(pause).await;
                    holder.resume();
                    rec.healed();
                }
            }
        }
        other => panic!("fault {other:?} needs the operator backend"),
    }
    t
}
