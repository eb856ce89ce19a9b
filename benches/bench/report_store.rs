//! The store part of `docs/benchmarks.md`: per operation and concurrency,
//! the script's cost (our script vs the minimal one, both under
//! redis-benchmark), the client's efficiency (our client vs redis-benchmark on
//! the same script) and the overall ratio (our client vs the minimal script).

use std::fmt::Write;

use crate::report::Target;
use crate::stats::Figure;
use crate::store::{self, OPS};
use crate::store_script::DESCRIBE;

fn div(a: Option<&Figure>, b: Option<&Figure>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b.ops_per_sec > 0.0 => Some(a.ops_per_sec / b.ops_per_sec),
        _ => None,
    }
}

fn x(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}×")).unwrap_or_else(|| "–".into())
}

fn us(f: Option<&Figure>) -> String {
    match f.and_then(|f| f.server_us.map(|u| (u, f.server_cmds))) {
        Some((u, Some(n))) => format!("{u:.1} µs ({n:.0})"),
        Some((u, None)) => format!("{u:.1} µs"),
        None => "–".into(),
    }
}

fn concurrencies(s: &store::Results) -> Vec<usize> {
    let mut cs: Vec<usize> = s.baseline.iter().map(|(_, c, _)| *c).collect();
    cs.dedup();
    cs
}

fn top(s: &store::Results) -> usize {
    concurrencies(s).into_iter().max().unwrap_or(64)
}

pub fn section(w: &mut String, s: &store::Results) {
    let _ = writeln!(
        w,
        "## 1. Store: script cost, client efficiency, overall\n\n\
         Closed loop on every side: N clients, each waits for its reply before sending the next \
         request. redis-benchmark runs `-c N -P 1` (one connection per client, no pipelining); \
         ours runs N tokio tasks on one thread sharing our client's pool of {} connections \
         (src/store/valkey/: our own RESP client; calls of several tasks share a connection, \
         pipelined). Both load \
         generators are single-threaded and share the 2 cores with valkey-server. Three \
         baselines per concurrency, same server, same run: PING; the **minimal script** \
         (`EXISTS lease; INCR fence; SET lease owner PX ttl`, by EVALSHA, fresh keys); and \
         **our own script** of each operation (a function of the lease library) run by redis-benchmark by FCALL with the keys \
         and arguments our client sends. {DESCRIBE}\n\n\
         - **script cost** = minimal-script ops/s ÷ our-script ops/s, both under redis-benchmark, \
         and the server time per call of each (`INFO commandstats`, reset before every cell; \
         commands run inside the script in brackets)\n\
         - **client efficiency** = our client's ops/s ÷ redis-benchmark's on the same script\n\
         - **overall** = our client's ops/s ÷ the minimal script's\n",
        s.pool_size
    );
    let _ = writeln!(
        w,
        "| c | operation | ours ops/s | our script, redis-benchmark ops/s | minimal script ops/s | \
         script cost | server µs: our script | server µs: minimal | client efficiency | overall | \
         p50 ours (our script / PING) | calls that did the work |"
    );
    let _ = writeln!(
        w,
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for c in concurrencies(s) {
        let min = s.minimal(c);
        let ping = s.baseline("PING", c);
        for op in OPS {
            let (ours, script) = (s.ours(op, c), s.script(op, c));
            let work = s
                .script_work
                .iter()
                .find(|(o, cc, _)| o == op && *cc == c)
                .map(|w| format!("{:.0}%", w.2 * 100.0))
                .unwrap_or_else(|| "–".into());
            let _ = writeln!(
                w,
                "| {c} | **{op}** | {:.0} | {:.0} | {:.0} | {} | {} | {} | **{}** | **{}** | {:.0} µs ({:.0} / {:.0}) | {work} |",
                ours.map_or(f64::NAN, |f| f.ops_per_sec),
                script.map_or(f64::NAN, |f| f.ops_per_sec),
                min.map_or(f64::NAN, |f| f.ops_per_sec),
                x(div(min, script)),
                us(script),
                us(min),
                x(div(ours, script)),
                x(div(ours, min)),
                ours.map_or(f64::NAN, |f| f.p50_us),
                script.map_or(f64::NAN, |f| f.p50_us),
                ping.map_or(f64::NAN, |f| f.p50_us),
            );
        }
    }
    let _ = writeln!(
        w,
        "\nThe raw baselines (redis-benchmark; p50 has 1 µs resolution):\n\n\
         | c | command | calls | ops/s | p50 | p99 | server time per call (commands) |\n\
         | ---: | --- | ---: | ---: | ---: | ---: | ---: |"
    );
    for (name, c, f) in &s.baseline {
        let _ = writeln!(
            w,
            "| {c} | `{name}` | {} | {:.0} | {:.0} µs | {:.0} µs | {} |",
            f.ops,
            f.ops_per_sec,
            f.p50_us,
            f.p99_us,
            us(Some(f))
        );
    }
    if s.failures > 0 {
        let _ = writeln!(
            w,
            "\n**{} operations of our client returned an unexpected outcome** (see the harness output).",
            s.failures
        );
    }
    if !s.pool_sweep.is_empty() {
        let top = top(s);
        let _ = writeln!(
            w,
            "\nPool size at concurrency {top} (same server, same run):\n\n\
             | pool size | operation | ops/s | vs pool size 1 | p50 | p99 | client efficiency | overall |\n\
             | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for (pool, op, f) in &s.pool_sweep {
            let one = s
                .pool_sweep
                .iter()
                .find(|(p, o, _)| *p == 1 && o == op)
                .map(|(_, _, f)| f);
            let _ = writeln!(
                w,
                "| {pool} | {op} | {:.0} | {} | {:.0} µs | {:.0} µs | {} | {} |",
                f.ops_per_sec,
                x(div(Some(f), one)),
                f.p50_us,
                f.p99_us,
                x(div(Some(f), s.script(op, top))),
                x(div(Some(f), s.minimal(top)))
            );
        }
    }
    if !s.durable.is_empty() {
        let _ = writeln!(
            w,
            "\nDurable writes (`--durability replicas:1`, a primary and one replica on the same \
             machine, no persistence): acquires of fresh targets, each its script then `WAIT 1` \
             on a connection of its own taken from the durable pool (`--durable-pool-size`), \
             after a warm-up of 1,000 acquires; connections opened counted by the client \
             (`ValkeyStore::connections_opened`):\n\n\
             | durable pool size | c | acquires | ops/s | p50 | p99 | connections opened: warm-up | connections opened per 10k durable acquires |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for d in &s.durable {
            let per_10k = d.opened as f64 * 10_000.0 / d.ops.max(1) as f64;
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.0} | {:.0} µs | {:.0} µs | {} | {per_10k:.0} |",
                d.pool,
                d.concurrency,
                d.ops,
                d.fig.ops_per_sec,
                d.fig.p50_us,
                d.fig.p99_us,
                d.warm_opened
            );
        }
    }
    let _ = writeln!(w);
}

/// The store targets, each against its same-run baseline.
pub fn targets(s: &store::Results) -> Vec<Target> {
    let mut t = Vec::new();
    let top = top(s);
    let min = s.minimal(top);
    for op in ["acquire", "renew"] {
        let (ours_us, min_us) = (
            s.script(op, top).and_then(|f| f.server_us),
            min.and_then(|f| f.server_us),
        );
        if let (Some(a), Some(b)) = (ours_us, min_us) {
            let r = a / b;
            t.push(Target {
                what: format!("{op} server time per call (c={top})"),
                target: "≤ 3× minimal script (moonshot 2×)".into(),
                measured: format!("{a:.1} µs = **{r:.2}×**"),
                baseline: format!("minimal script {b:.1} µs"),
                met: r <= 3.0,
                why: if r <= 3.0 {
                    String::new()
                } else {
                    crate::report_analysis::store_miss(s, op, top)
                },
            });
        }
    }
    for c in [1, top] {
        for op in OPS {
            if let Some(r) = div(s.ours(op, c), s.script(op, c)) {
                t.push(Target {
                    what: format!("{op} client efficiency (c={c})"),
                    target: "≥ 0.8× redis-benchmark, same script".into(),
                    measured: format!(
                        "{:.0} ops/s = **{r:.2}×**",
                        s.ours(op, c).map_or(0.0, |f| f.ops_per_sec)
                    ),
                    baseline: format!(
                        "redis-benchmark {:.0} ops/s",
                        s.script(op, c).map_or(0.0, |f| f.ops_per_sec)
                    ),
                    met: r >= 0.8,
                    why: if r >= 0.8 {
                        String::new()
                    } else {
                        crate::report_analysis::client_miss(s, op, c)
                    },
                });
            }
        }
    }
    if let (Some(a), Some(b)) = (s.ours("acquire", top), min) {
        let r = a.ops_per_sec / b.ops_per_sec;
        t.push(Target {
            what: format!("acquire overall (c={top})"),
            target: "≥ 0.5× minimal script".into(),
            measured: format!("{:.0} ops/s = **{r:.2}×**", a.ops_per_sec),
            baseline: format!("minimal script {:.0} ops/s", b.ops_per_sec),
            met: r >= 0.5,
            why: if r >= 0.5 {
                String::new()
            } else {
                crate::report_analysis::store_miss(s, "acquire", top)
            },
        });
    }
    if let Some(ping) = s.baseline("PING", 1) {
        for op in OPS {
            if let Some(a) = s.ours(op, 1) {
                let r = a.p50_us / ping.p50_us;
                t.push(Target {
                    what: format!("{op} p50, one client"),
                    target: "≤ 1.5× PING p50".into(),
                    measured: format!("{:.0} µs = **{r:.2}×**", a.p50_us),
                    baseline: format!("PING p50 {:.0} µs", ping.p50_us),
                    met: r <= 1.5,
                    why: if r <= 1.5 {
                        String::new()
                    } else {
                        crate::report_analysis::latency_miss(s, op)
                    },
                });
            }
        }
    }
    t
}
