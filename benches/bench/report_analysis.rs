//! The prose of `docs/benchmarks.md`: where time goes, what limits each
//! figure and what would move it. Kept apart from the tables; every number in
//! it comes from the same run.

use std::fmt::Write;

use crate::operator;
use crate::report::Run;
use crate::stats::{Figure, p50_p99_ms};
use crate::store;

fn server(f: Option<&Figure>) -> (f64, f64) {
    (
        f.and_then(|f| f.server_us).unwrap_or(f64::NAN),
        f.and_then(|f| f.server_cmds).unwrap_or(f64::NAN),
    )
}

pub fn store_miss(s: &store::Results, op: &str, c: usize) -> String {
    let (ours_us, ours_cmds) = server(s.script(op, c));
    let (min_us, min_cmds) = server(s.minimal(c));
    format!(
        "Server-bound: valkey runs one script at a time, and {op} costs {ours_us:.1} µs of server \
         time per call ({ours_cmds:.0} commands) against {min_us:.1} µs ({min_cmds:.0} commands) \
         for the minimal script, which keeps no request cache, reads no clock and checks nothing."
    )
}

pub fn client_miss(s: &store::Results, op: &str, c: usize) -> String {
    let p50 = |f: Option<&Figure>| f.map_or(f64::NAN, |f| f.p50_us);
    format!(
        "Same script, same server: our client's p50 is {:.0} µs against redis-benchmark's {:.0} µs \
         at c={c}; the difference is client CPU per call (tokio task, our RESP client's request \
         encoding and reply decoding) on the load generator's one thread, which shares 2 cores with \
         valkey-server.",
        p50(s.ours(op, c)),
        p50(s.script(op, c))
    )
}

pub fn latency_miss(s: &store::Results, op: &str) -> String {
    let (us, cmds) = server(s.script(op, 1));
    format!(
        "p50 ≈ loopback round trip + script time + client: {op} spends {us:.1} µs in the server \
         ({cmds:.0} commands) on top of the round trip that PING measures; on a real network \
         (round trip ≥ 200 µs) the same call is well under 1.5×."
    )
}

pub fn writes_miss(st: &operator::Steady) -> String {
    format!(
        "{:.0} status writes over {:.0} s for {} leases; the status should only be republished \
         once per leaseDuration − renewInterval.",
        st.status_writes, st.window_secs, st.leases
    )
}

pub fn restart_miss(r: &operator::Restart) -> String {
    format!(
        "{} tokens changed and {} of {} 1h leases were written; the new process should renew \
         with the HMAC-derived lease id and leave status alone.",
        r.new_tokens, r.quiet_changed, r.quiet_leases
    )
}

pub fn handoff_miss(h: &operator::Handoffs) -> String {
    if h.background < 5_000 {
        return format!(
            "measured with {} other leases held; the target is set with the 5,000 of the scale \
             step (BENCH_SCALES).",
            h.background
        );
    }
    format!(
        "{} of {} trials timed out; the path is delete → watch → release → wake-up → acquire → \
         status write → watch, each a round trip to the apiserver or Valkey, and it shares the \
         operator's reconcile slots and the 2 cores with {} other leases' renewals.",
        h.failures,
        h.trials.len() + h.failures,
        h.background
    )
}

pub fn failover_miss(o: &operator::Results) -> String {
    format!(
        "{} of {} trials failed; the move needs the pod delete event, unmarking, a new acquire \
         and the marks on the new pod.",
        o.failover_failures,
        o.failover_marked.len() + o.failover_failures
    )
}

pub fn text(run: &Run) -> String {
    let mut w = String::new();
    let _ = writeln!(w, "## Analysis: where the time goes\n");
    if let Some(s) = run.store {
        let top = s.baseline.iter().map(|(_, c, _)| *c).max().unwrap_or(64);
        let (min_us, min_cmds) = server(s.minimal(top));
        let per_op: Vec<String> = store::OPS
            .iter()
            .map(|op| {
                let (us, cmds) = server(s.script(op, top));
                format!("{op} {us:.1} µs / {cmds:.0} commands")
            })
            .collect();
        let _ = writeln!(
            w,
            "**Store throughput is bounded by script time inside valkey-server.** Valkey runs one \
             script at a time on one thread, so at concurrency {top} throughput is roughly \
             1 ÷ (server time per call) minus what the load generators take from the same 2 \
             cores. The minimal script costs {min_us:.1} µs / {min_cmds:.0} commands; ours cost \
             {}. Ours do what the minimal script does not: `TIME` for server-side expiry, checks \
             so corrupt state fails closed, the request cache for idempotent retries and the \
             fence floor. Everything of a target is one hash (one key, so a Cluster \
             slot moves it whole): one `HMGET` reads the lease, the counter and this request's \
             cache entry; the lease and the cache entry are fields with their own expiry \
             (`HSETEX`, hash-field expiry), checked against the record with `HPEXPIRETIME`; \
             `PTTL` checks that the key itself, which keeps the counter, has no expiry; the \
             next token is a decimal string incremented in Lua (exact past 2^53). The \
             operations are functions of one library (`FUNCTION LOAD`, called by `FCALL`), so \
             the helpers they share are created once when the library loads, not on every \
             call as a script's would be. Each answers with one string (its fields joined by \
             NUL bytes), not an array: the server builds an array reply with a length it \
             learns only at the end, which cost about as much as one more command. What is \
             left beyond the commands is Lua itself: each string-library call (a pattern \
             match, a number formatted, a SHA-1) costs a fraction of a command. Client \
             efficiency \
             compares our client with redis-benchmark on the very same script, so it isolates \
             the client's cost per call.\n",
            per_op.join(", ")
        );
    }
    if let Some(o) = run.operator {
        if let Some(s) = o
            .scales
            .iter()
            .find(|s| s.leases == 1_000)
            .or(o.scales.first())
        {
            let acquire = s
                .store_calls
                .iter()
                .find(|(op, _, _)| op == "acquire")
                .map(|(_, m, _)| *m)
                .unwrap_or(f64::NAN);
            let _ = writeln!(
                w,
                "**Reconciler at scale** is bounded by the API server, not by Valkey: a new lease \
                 costs {:.1} TargetLease writes before it is `Held` (the finalizer patch and the \
                 `Held` status; the first acquisition's id is derived from the resource's UID, so \
                 a crash between acquire and status replays it without a write of its own), a \
                 mean reconcile takes {:.1} ms of which the acquire in Valkey is {acquire:.2} ms, \
                 and the operator runs 16 reconciles at once (`--concurrency`): {:.1} reconciles \
                 per lease × {:.1} ms ÷ 16 predicts {:.1} s of reconciling for {} leases against \
                 {:.1} s measured from the first create. The apiserver and etcd share the 2 cores \
                 with the operator and the bench; the `--concurrency` curve above shows what more \
                 slots win while they do (each reconcile takes longer as the slots grow).\n",
                s.writes_per_lease_to_held,
                s.reconcile_mean_ms,
                s.reconciles / s.leases as f64,
                s.reconcile_mean_ms,
                s.reconciles * s.reconcile_mean_ms / 1e3 / 16.0,
                s.leases,
                s.first_create_to_all_held_secs
            );
        }
        crate::report_peer::analysis(&mut w, o);
        crate::report_memory::analysis(&mut w, o);
        if let Some(st) = &o.steady {
            let _ = writeln!(
                w,
                "**API write cost**: renewals happen in Valkey ({:.2} per lease per minute in the \
                 window, every `renewInterval`) and do not write status; status is republished \
                 once per `leaseDuration − renewInterval` so `expiresAt` stays a lower bound, \
                 {:.3} writes per lease per minute, against {:.1}/min for one client-go-style \
                 Lease renewed every 2 s, over a {:.0} s window; all leases were acquired \
                 within seconds, so their 60 s republish cycles are aligned and a whole-minute \
                 window counts whole cycles.\n",
                st.renews / st.leases as f64 / (st.window_secs / 60.0),
                st.per_lease_per_min,
                st.baseline_per_min,
                st.window_secs
            );
        }
        if let Some(r) = &o.restart {
            let _ = writeln!(
                w,
                "**Restart**: the lease id is an HMAC of the published `acquisitionId`, so the \
                 new process renews every published lease at once without a status write \
                 ({} leases renewed {}; {} of the {} 1h leases written).\n",
                r.leases,
                r.all_renewed_secs
                    .map(|s| format!("{s:.2} s after start"))
                    .unwrap_or_else(|| "not all within 60 s".into()),
                r.quiet_changed,
                r.quiet_leases
            );
        }
        let (f50, f99) = p50_p99_ms(&o.failover_marked);
        let series = |h: &operator::Handoffs| {
            let (p50, p99) = p50_p99_ms(&h.trials);
            format!(
                "p50 {p50:.0} ms, p99 {p99:.0} ms with {} other leases held",
                h.background
            )
        };
        let handoffs: Vec<String> = o
            .handoff_quiet
            .iter()
            .chain(o.handoff.iter())
            .map(series)
            .collect();
        let _ = writeln!(
            w,
            "**Handoff** ({}) is a chain of round trips: the delete reaches the operator by \
             watch, the finalizer releases in Valkey and raises the token floor ConfigMap, \
             removes the finalizer and wakes the next TargetLease on the target, which acquires \
             and writes `Held`; the bench sees that by watch. With other leases held, the \
             handoff's reconciles go before renewals that are not yet due, but they share the \
             API server, etcd and the 2 cores with those renewals. **Leader failover** (p50 \
             {f50:.0} ms, p99 {f99:.0} ms to the new pod's label) adds the pod watch, removing the \
             old marks and patching the new pod; it is a small fraction of the 90 s lease \
             duration because the operator acts on the pod deletion event instead of waiting for \
             the lease to expire.\n",
            handoffs.join("; ")
        );
    }
    w
}
