//! The peer in `docs/benchmarks.md`: acquire+release cycles of our lease in
//! Valkey beside etcd's own lock, same concurrencies, same run.

use std::fmt::Write;

use crate::operator::{PeerCell, Results};
use crate::report::Target;

/// Who is ahead in cycles per second, and by what factor.
fn leader(c: &PeerCell) -> (&'static str, f64) {
    let r = c.ours.ops_per_sec / c.etcd.ops_per_sec;
    if r >= 1.0 {
        ("ours", r)
    } else {
        ("etcd", 1.0 / r)
    }
}

/// "ours, 2.10×" or "etcd, 1.30×".
fn ahead(c: &PeerCell) -> String {
    let (who, r) = leader(c);
    format!("{who}, {r:.2}×")
}

/// "ours is ahead by 2.10×".
fn ahead_by(c: &PeerCell) -> String {
    let (who, r) = leader(c);
    format!("{who} is ahead by {r:.2}×")
}

pub fn section(w: &mut String, o: &Results) {
    if o.peer.is_empty() {
        return;
    }
    let _ = writeln!(w, "## 2. Peer: etcd's own lock\n");
    let _ = writeln!(
        w,
        "Acquire+release cycles per second and latency per cycle. **etcd**: the \
         `go.etcd.io/etcd/client/v3/concurrency` Mutex (`etcd-lock`, built from \
         tests/controlplane/etcdlock) against the etcd of the bench's control plane (as the tests \
         start it: one member, `--unsafe-no-fsync`); each worker holds its own session (one etcd \
         lease kept alive) and locks its own key: Lock is one Txn, Unlock one Delete. **Ours**: \
         `acquire` then `release` through our client (pool of {} connections) against the bench's \
         valkey-server (no persistence), each worker on its own target: two EVALSHA calls, each \
         with the request cache, the token counter and the lease record. Both are closed-loop \
         with N workers on one load-generator thread (`GOMAXPROCS=1` for the Go program), run \
         one after the other while the control plane is idle, on the same 2 cores. Both give a \
         fencing token per acquisition (etcd: the key's revision). {} of our cycles and {} of \
         etcd's failed.\n",
        o.peer_pool_size,
        o.peer_failures,
        o.peer.iter().map(|c| c.etcd_errors).sum::<u64>()
    );
    let _ = writeln!(
        w,
        "| concurrency | etcd lock cycles/s | etcd p50 / p99 | ours cycles/s | ours p50 / p99 | ahead, by |"
    );
    let _ = writeln!(w, "| ---: | ---: | ---: | ---: | ---: | --- |");
    for c in &o.peer {
        let _ = writeln!(
            w,
            "| {} | {:.0} | {:.0} / {:.0} µs | {:.0} | {:.0} / {:.0} µs | {} |",
            c.concurrency,
            c.etcd.ops_per_sec,
            c.etcd.p50_us,
            c.etcd.p99_us,
            c.ours.ops_per_sec,
            c.ours.p50_us,
            c.ours.p99_us,
            ahead(c)
        );
    }
    let _ = writeln!(w);
}

/// One row per concurrency: who is ahead, by how much (the issue asks to say so).
pub fn targets(o: &Results) -> Vec<Target> {
    o.peer
        .iter()
        .map(|c| {
            let measured = o.peer_failures == 0 && c.etcd_errors == 0;
            Target {
                what: format!(
                    "peer: acquire+release cycles/s vs etcd's lock (c={})",
                    c.concurrency
                ),
                target: "say which is ahead, by how much".into(),
                measured: format!(
                    "ours {:.0}/s (p50 {:.0} µs): **{} ahead**",
                    c.ours.ops_per_sec,
                    c.ours.p50_us,
                    ahead(c)
                ),
                baseline: format!(
                    "etcd lock {:.0}/s (p50 {:.0} µs)",
                    c.etcd.ops_per_sec, c.etcd.p50_us
                ),
                met: measured,
                why: if measured {
                    String::new()
                } else {
                    "some cycles failed on one side (see the peer section)".into()
                },
            }
        })
        .collect()
}

/// The analysis paragraph: who is ahead and what each side pays per cycle.
pub fn analysis(w: &mut String, o: &Results) {
    let (Some(first), Some(last)) = (o.peer.first(), o.peer.last()) else {
        return;
    };
    let _ = writeln!(
        w,
        "**Peer**: at concurrency {} {} ({:.0} against {:.0} cycles/s), at {} {} ({:.0} \
         against {:.0}). Both sides are bound by their server on the same 2 cores: a \
         Valkey script runs in memory on one thread; an etcd Txn is proposed through raft, \
         applied to its store and appended to its write-ahead log (not synced in this setup) \
         before it answers, and the Unlock is a second such write. Our cycle carries more per \
         call than the bare lock (the request cache for idempotent retries, the token counter, \
         server-side expiry), and still costs less server time than etcd's two writes.\n",
        first.concurrency,
        ahead_by(first),
        first.ours.ops_per_sec,
        first.etcd.ops_per_sec,
        last.concurrency,
        ahead_by(last),
        last.ours.ops_per_sec,
        last.etcd.ops_per_sec,
    );
}
