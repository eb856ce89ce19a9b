//! The store's peer: etcd's own lock (`go.etcd.io/etcd/client/v3/concurrency`
//! Mutex, driven by `etcd-lock` from tests/controlplane/etcdlock) against the
//! control plane's etcd, beside acquire+release cycles of our etcd store on
//! the same etcd and of our Valkey store against the bench's valkey-server,
//! at the same concurrencies in the same run; then each operation of both
//! stores on its own (`etcd_store`).
//!
//! Both sides run closed-loop workers, each on its own lock (no waiting for
//! another holder), on one load-generator thread (`GOMAXPROCS=1`; our
//! workers share one task). A cycle is two round trips on both: Lock (one
//! Txn) and Unlock (one Delete) in etcd, acquire and release (one FCALL
//! each) in Valkey. etcd runs as the tests start it (`--unsafe-no-fsync`),
//! Valkey without persistence.

use std::process::Command;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use targetlease::store::{AcquireRequest, LeaseStore, Outcome, ReleaseRequest, Target};

use super::{Bench, PeerCell, PeerOp, Results, etcd_store};
use crate::stats::Figure;
use crate::store::{connect, drive};
use crate::support::tools::tools_dir;

const TTL: Duration = Duration::from_secs(90);

pub(super) async fn etcd_peer(b: &Bench<'_>, results: &mut Results) {
    let etcd_port = std::fs::read_to_string(b.cp.dir().join("etcd.port"))
        .expect("the control plane's etcd.port");
    let bin = tools_dir().join("etcd-lock");
    assert!(
        bin.exists(),
        "{} is missing: scripts/bench.sh builds it (scripts/build-controlplane.sh etcdlock)",
        bin.display()
    );
    let store = connect(&b.valkey, b.p.peer_pool_size).await;
    let etcd_store = etcd_store::connect(etcd_port.trim()).await;
    let failures = AtomicUsize::new(0);
    let etcd_failures = AtomicUsize::new(0);
    for &c in &b.p.peer_concurrencies {
        let cycles = if c == 1 {
            b.p.peer_cycles_single
        } else {
            b.p.peer_cycles
        };
        eprintln!("bench: etcd lock vs ours at concurrency {c} ({cycles} cycles)");
        let lock = etcd_lock(&bin, etcd_port.trim(), c, cycles);
        let etcd = lock.cycle;
        let targets: Vec<Target> = (0..c)
            .map(|k| Target::new("peer", format!("c{c}-w{k}")))
            .collect();
        let ours = drive(c, cycles, &failures, |k, _| {
            let (store, target) = (&store, &targets[k]);
            async move { cycle(store, target).await }
        })
        .await;
        let etcd_targets: Vec<Target> = (0..c)
            .map(|k| Target::new("peer-etcd", format!("c{c}-w{k}")))
            .collect();
        let ours_etcd = drive(c, cycles, &etcd_failures, |k, _| {
            let (store, target) = (&etcd_store, &etcd_targets[k]);
            async move { cycle(store, target).await }
        })
        .await;
        eprintln!(
            "bench: c={c}: etcd lock {:.0} cycles/s (p50 {:.0} µs), our etcd store {:.0} \
             (p50 {:.0} µs), our valkey store {:.0} (p50 {:.0} µs)",
            etcd.ops_per_sec,
            etcd.p50_us,
            ours_etcd.ops_per_sec,
            ours_etcd.p50_us,
            ours.ops_per_sec,
            ours.p50_us
        );
        results.peer.push(PeerCell {
            concurrency: c,
            etcd,
            etcd_errors: lock.errors,
            etcd_lock_us: lock.lock_us,
            etcd_unlock_us: lock.unlock_us,
            ours,
            ours_etcd,
        });
        let tag = format!("c{c}");
        let on_etcd = etcd_store::per_op(&etcd_store, &tag, c, cycles, &etcd_failures).await;
        let on_valkey = etcd_store::per_op(&store, &tag, c, cycles, &failures).await;
        for ((op, etcd), (_, valkey)) in on_etcd.into_iter().zip(on_valkey) {
            eprintln!(
                "bench: c={c} {op}: etcd store {:.0}/s (p50 {:.0} µs), valkey store {:.0}/s (p50 {:.0} µs)",
                etcd.ops_per_sec, etcd.p50_us, valkey.ops_per_sec, valkey.p50_us
            );
            results.peer_ops.push(PeerOp {
                concurrency: c,
                op,
                etcd,
                valkey,
            });
        }
    }
    results.peer_failures = failures.into_inner();
    results.peer_etcd_failures = etcd_failures.into_inner();
}

/// One acquire+release of our lease; true when both did their work.
async fn cycle(store: &impl LeaseStore, target: &Target) -> bool {
    let req = AcquireRequest::new(target.clone(), "bench-peer", TTL);
    let Ok(reply) = store.acquire(&req).await else {
        return false;
    };
    let Some(handle) = reply.lease.and_then(|l| l.handle()) else {
        return false;
    };
    let release = ReleaseRequest::new(target.clone(), handle);
    reply.outcome == Outcome::Acquired
        && matches!(store.release(&release).await, Ok(r) if r.outcome == Outcome::Released)
}

/// What `etcd-lock` measured at one concurrency.
struct LockRun {
    /// Whole Lock+Unlock cycles.
    cycle: Figure,
    errors: u64,
    /// (p50, p99) µs of Lock alone, and of Unlock alone.
    lock_us: (f64, f64),
    unlock_us: (f64, f64),
}

/// Runs `etcd-lock` for one concurrency.
fn etcd_lock(bin: &std::path::Path, port: &str, c: usize, cycles: usize) -> LockRun {
    let out = Command::new(bin)
        .args(["-endpoints", &format!("127.0.0.1:{port}")])
        .args(["-concurrency", &c.to_string()])
        .args(["-cycles", &cycles.to_string()])
        .args(["-cycles-single", &cycles.to_string()])
        .env("GOMAXPROCS", "1")
        .output()
        .expect("run etcd-lock");
    assert!(
        out.status.success(),
        "etcd-lock failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).expect("etcd-lock's JSON");
    let num = |k: &str| line[k].as_f64().unwrap_or(f64::NAN);
    let figure = Figure {
        ops: num("cycles") as usize,
        ops_per_sec: num("cycles_per_sec"),
        p50_us: num("p50_us"),
        p99_us: num("p99_us"),
        server_us: None,
        server_cmds: None,
    };
    LockRun {
        cycle: figure,
        errors: num("errors") as u64,
        lock_us: (num("lock_p50_us"), num("lock_p99_us")),
        unlock_us: (num("unlock_p50_us"), num("unlock_p99_us")),
    }
}
