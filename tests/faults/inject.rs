//! Injects one scenario's fault over and over until the run stops; every
//! injection is recorded in the history (the "faults injected" figure).

use std::sync::Arc;
use std::time::Duration;

use crate::history::Recorder;
use crate::scenarios::Fault;
use crate::support::fault_proxy::Fault as ProxyFault;
use crate::valkey::Valkey;
use crate::workload::Stop;
use crate::workload::holder::Holder;

/// How long the replica misses the primary's writes before the primary dies.
const REPLICA_LAG: Duration = Duration::from_millis(500);

/// A script that keeps the server busy for 1.5 s of its own clock.
const BUSY_SCRIPT: &str = "local t = redis.call('TIME') local s = t[1] * 1000 + t[2] / 1000 \
     while true do local n = redis.call('TIME') \
     if n[1] * 1000 + n[2] / 1000 - s > 1500 then break end end return 1";

/// What a fault can act on.
pub struct Targets {
    pub valkey: Option<Arc<Valkey>>,
    pub holder: Option<Holder>,
    /// Lease time-to-live of the workload (pauses and clock jumps exceed it).
    pub ttl: Duration,
}

async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    tokio::task::spawn_blocking(f)
        .await
        .expect("fault task panicked")
}

/// Runs until `stop`; returns what it acted on (so the caller can clean up).
pub async fn run(fault: Fault, mut t: Targets, rec: Recorder, stop: Stop) -> Targets {
    let valkey = || {
        t.valkey
            .clone()
            .expect("a Valkey fault needs a Valkey deployment")
    };
    match fault {
        Fault::None => while !stop.sleep(Duration::from_secs(1)).await {},
        Fault::SentinelFailover => {
            let v = valkey();
            let start = v.epoch();
            let mut planned = 0;
            while !stop.sleep(Duration::from_secs(1)).await {
                rec.fault("replica 500 ms behind, primary SIGKILL + Sentinel failover");
                planned += 1;
                let v = v.clone();
                blocking(move || v.failover(REPLICA_LAG)).await;
            }
            // Promotions nobody asked for (a primary wrongly judged down) are faults too.
            for _ in planned..v.epoch().saturating_sub(start) {
                rec.fault("unplanned Sentinel failover");
            }
        }
        Fault::Restart => {
            let v = valkey();
            while !stop.sleep(Duration::from_millis(2500)).await {
                rec.fault("SIGKILL + restart");
                let v = v.clone();
                blocking(move || v.restart()).await;
            }
        }
        Fault::ClockJump => {
            let v = valkey();
            let by = t.ttl + Duration::from_secs(3);
            while !stop.sleep(Duration::from_secs(3)).await {
                rec.fault("clock jump");
                v.jump_clock(by);
            }
        }
        Fault::ScriptFlush => {
            let v = valkey();
            while !stop.sleep(Duration::from_millis(500)).await {
                rec.fault("SCRIPT FLUSH");
                let v = v.clone();
                blocking(move || v.on_primary(&["SCRIPT", "FLUSH"])).await;
            }
        }
        Fault::Busy => {
            let v = valkey();
            while !stop.sleep(Duration::from_secs(2)).await {
                rec.fault("BUSY script");
                let v = v.clone();
                blocking(move || v.on_primary(&["EVAL", BUSY_SCRIPT, "0"])).await;
            }
        }
        Fault::Oom => {
            let v = valkey();
            while !stop.sleep(Duration::from_secs(2)).await {
                rec.fault("OOM");
                let v2 = v.clone();
                blocking(move || v2.on_primary(&["CONFIG", "SET", "maxmemory", "1"])).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                let v2 = v.clone();
                blocking(move || v2.on_primary(&["CONFIG", "SET", "maxmemory", "0"])).await;
            }
        }
        Fault::ProxyCut => {
            let v = valkey();
            let proxy = v.proxy.as_ref().expect("a proxied deployment");
            while !stop.sleep(Duration::from_millis(300)).await {
                rec.fault("reset after forwarding EVALSHA");
                proxy.cut_before_reply("EVALSHA");
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
            while !stop.sleep(Duration::from_millis(500)).await {
                rec.fault(name);
                proxy.set(standing);
                tokio::time::sleep(Duration::from_millis(1500)).await;
                proxy.set(ProxyFault::Pass);
            }
        }
        Fault::PauseHolder => {
            let pause = t.ttl + Duration::from_millis(1500);
            let holder = t.holder.as_mut().expect("a holder to pause");
            while !stop.sleep(Duration::from_millis(500)).await {
                if holder.pause_after_renewal(Duration::from_secs(5)).await {
                    rec.fault("holder SIGSTOP past its lease");
                    tokio::time::sleep(pause).await;
                    holder.resume();
                }
            }
        }
        other => panic!("fault {other:?} needs the operator backend"),
    }
    t
}
