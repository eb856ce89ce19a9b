//! The peer in `docs/benchmarks.md`: acquire+release cycles of our lease in
//! etcd and in Valkey beside etcd's own lock, and each operation of our etcd
//! store beside our Valkey store; same concurrencies, same run.

use std::fmt::Write;

use crate::operator::{PeerCell, PeerOp, Results};
use crate::report::Target;
use crate::stats::Figure;

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

/// `a` against `b` as a factor: "1.30×" (a faster) or "0.77×".
fn ratio(a: &Figure, b: &Figure) -> String {
    format!("{:.2}×", a.ops_per_sec / b.ops_per_sec)
}

/// "1234 | 567 / 890 µs": ops/s, then p50 / p99.
fn cells(f: &Figure) -> String {
    format!(
        "{:.0} | {:.0} / {:.0} µs",
        f.ops_per_sec, f.p50_us, f.p99_us
    )
}

fn op<'a>(o: &'a Results, c: usize, name: &str) -> Option<&'a PeerOp> {
    o.peer_ops
        .iter()
        .find(|p| p.concurrency == c && p.op == name)
}

pub fn section(w: &mut String, o: &Results) {
    if o.peer.is_empty() {
        return;
    }
    let _ = writeln!(w, "## 2. Peer: etcd's own lock, and our store in etcd\n");
    let _ = writeln!(
        w,
        "Acquire+release cycles per second and latency per cycle. **etcd lock**: the \
         `go.etcd.io/etcd/client/v3/concurrency` Mutex (`etcd-lock`, built from \
         tests/controlplane/etcdlock) against the etcd of the bench's control plane (as the tests \
         start it: one member, `--unsafe-no-fsync`); each worker holds its own session (one etcd \
         lease kept alive) and locks its own key: Lock is one Txn, Unlock one Delete. **Our etcd \
         store**: `acquire` then `release` through `--store-url etcd://` against the same etcd, \
         each worker on its own target: each call is one consistent read of the target's keys \
         and one transaction guarded by their revisions; an acquire also grants the record's \
         etcd lease first, and a release revokes it afterwards, off the caller's path. **Our \
         Valkey store**: the same calls through our client (pool of {} connections) against the \
         bench's valkey-server (no persistence): two FCALL calls, each with the request cache, \
         the token counter and the lease record. All are closed-loop with N workers on one \
         load-generator thread (`GOMAXPROCS=1` for the Go program), run one after the other \
         while the control plane is idle, on the same 2 cores. All give a fencing token per \
         acquisition (etcd's lock: the key's revision, cluster-wide and not per lock; ours: a \
         per-target counter). Calls that did not do their work: {} through our etcd store, {} \
         through our Valkey store, {} of etcd's lock cycles.\n",
        o.peer_pool_size,
        o.peer_etcd_failures,
        o.peer_failures,
        o.peer.iter().map(|c| c.etcd_errors).sum::<u64>()
    );
    let _ = writeln!(
        w,
        "| concurrency | etcd lock cycles/s | p50 / p99 | our etcd store cycles/s | p50 / p99 | \
         our Valkey store cycles/s | p50 / p99 | etcd store ÷ etcd lock | Valkey store vs etcd lock |"
    );
    let _ = writeln!(
        w,
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for c in &o.peer {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} |",
            c.concurrency,
            cells(&c.etcd),
            cells(&c.ours_etcd),
            cells(&c.ours),
            ratio(&c.ours_etcd, &c.etcd),
            ahead(c)
        );
    }
    let _ = writeln!(w);
    if o.peer_ops.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "Each operation on its own, the same workload through both of our stores (the store \
         part's, without server statistics): `acquire` on targets never used before, `renew` \
         and `commit` on one live lease per worker, `release` of the leases the acquire cell \
         granted. Beside them, etcd's lock: its Lock beside our acquire and its Unlock beside \
         our release, each timed on its own within the cycles above (so no ops/s of its own). \
         etcd's lock has no renew (its session's keep-alive renews every lock of the session at \
         once) and no fenced commit.\n"
    );
    let _ = writeln!(
        w,
        "| concurrency | operation | etcd store ops/s | p50 / p99 | Valkey store ops/s | p50 / p99 | etcd ÷ Valkey | etcd's lock p50 / p99 | etcd store p50 ÷ etcd's lock p50 |"
    );
    let _ = writeln!(
        w,
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for p in &o.peer_ops {
        let cell = o.peer.iter().find(|c| c.concurrency == p.concurrency);
        let lock = cell.and_then(|c| match p.op.as_str() {
            "acquire" => Some(("Lock", c.etcd_lock_us)),
            "release" => Some(("Unlock", c.etcd_unlock_us)),
            _ => None,
        });
        let measured = |v: f64| v.is_finite() && v > 0.0;
        let (theirs, versus) = match lock {
            Some((name, (p50, p99))) if measured(p50) && measured(p99) => (
                format!("{name} {p50:.0} / {p99:.0} µs"),
                format!("{:.2}×", p.etcd.p50_us / p50),
            ),
            _ => ("–".to_owned(), "–".to_owned()),
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {theirs} | {versus} |",
            p.concurrency,
            p.op,
            cells(&p.etcd),
            cells(&p.valkey),
            ratio(&p.etcd, &p.valkey)
        );
    }
    let _ = writeln!(w);
}

/// One row per concurrency: who is ahead, by how much; then our etcd store
/// against etcd's lock.
pub fn targets(o: &Results) -> Vec<Target> {
    let mut rows = valkey_targets(o);
    rows.extend(o.peer.iter().map(|c| {
        let measured = o.peer_etcd_failures == 0 && c.etcd_errors == 0;
        Target {
            what: format!(
                "peer: our etcd store's acquire+release cycles/s vs etcd's lock (c={})",
                c.concurrency
            ),
            target: "say how it compares, on the same etcd".into(),
            measured: format!(
                "etcd store {:.0}/s (p50 {:.0} µs): **{} the lock's rate**",
                c.ours_etcd.ops_per_sec,
                c.ours_etcd.p50_us,
                ratio(&c.ours_etcd, &c.etcd)
            ),
            baseline: format!(
                "etcd lock {:.0}/s (p50 {:.0} µs)",
                c.etcd.ops_per_sec, c.etcd.p50_us
            ),
            met: measured,
            why: if measured {
                String::new()
            } else {
                "some calls failed on one side (see the peer section)".into()
            },
        }
    }));
    rows
}

fn valkey_targets(o: &Results) -> Vec<Target> {
    o.peer
        .iter()
        .map(|c| {
            let measured = o.peer_failures == 0 && c.etcd_errors == 0;
            Target {
                what: format!(
                    "peer: our Valkey store's acquire+release cycles/s vs etcd's lock (c={})",
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
    let renew = |c: usize| op(o, c, "renew");
    let (Some(r1), Some(rn)) = (renew(first.concurrency), renew(last.concurrency)) else {
        return;
    };
    let _ = writeln!(
        w,
        "**Our store in etcd** runs the same promises (dense per-target tokens, floors, \
         idempotent retries, fenced commits) on etcd's own replication. Its acquire+release cycle \
         runs at {} the bare lock's rate at concurrency {} ({:.0} against {:.0} cycles/s) and {} \
         at {} ({:.0} against {:.0}). A cycle of the lock is two writes through raft (Lock's Txn, \
         Unlock's Delete; the session's etcd lease is granted once per worker, not per lock). \
         Ours is four: the acquire grants the record's own etcd lease and writes in one guarded \
         transaction, the release writes in one and then revokes that lease (off the caller's \
         path, but on the same etcd); each call also reads the target's keys first. The etcd \
         lease per acquisition is what lets etcd itself end a lease whose holder is gone, one \
         lease at a time. A renew through etcd runs at {} the Valkey store's rate at concurrency \
         {} ({:.0} against {:.0}/s) and {} at {} ({:.0} against {:.0}/s): it grants a fresh etcd \
         lease, moves the record onto it in a guarded transaction and revokes the old one (three \
         writes every member applies), where Valkey's script rewrites an expiry in one \
         process's memory.\n",
        ratio(&first.ours_etcd, &first.etcd),
        first.concurrency,
        first.ours_etcd.ops_per_sec,
        first.etcd.ops_per_sec,
        ratio(&last.ours_etcd, &last.etcd),
        last.concurrency,
        last.ours_etcd.ops_per_sec,
        last.etcd.ops_per_sec,
        ratio(&r1.etcd, &r1.valkey),
        r1.concurrency,
        r1.etcd.ops_per_sec,
        r1.valkey.ops_per_sec,
        ratio(&rn.etcd, &rn.valkey),
        rn.concurrency,
        rn.etcd.ops_per_sec,
        rn.valkey.ops_per_sec,
    );
}
