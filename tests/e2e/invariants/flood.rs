//! Forged wake-ups: a flood of release notices on `<prefix>:events`, for a
//! watched target and for targets no TargetLease names, costs a bounded
//! number of reconciles, and a real release among them still wakes the
//! waiter promptly.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;
use support::operator_env::http_get;
use targetlease::store::valkey::keys::parse_base;

/// One sample of operator `i`'s metrics (0 when absent).
fn sample(env: &OperatorEnv, name: &str) -> f64 {
    let (_, text) = http_get(env.admin_port(0), "/metrics").expect("/metrics answers");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn reconciles(env: &OperatorEnv) -> f64 {
    sample(env, "targetlease_reconcile_duration_seconds_count")
}

fn notices(env: &OperatorEnv, result: &str) -> f64 {
    sample(
        env,
        &format!("targetlease_release_notices_total{{result=\"{result}\"}}"),
    )
}

/// RESP for `PUBLISH channel message`.
fn publish(channel: &str, message: &str) -> String {
    format!(
        "*3\r\n$7\r\nPUBLISH\r\n${}\r\n{channel}\r\n${}\r\n{message}\r\n",
        channel.len(),
        message.len()
    )
}

/// Publishes about `per_second` notices a second until `stop`: half name
/// `watched`, half a new unknown target each. Returns how many it sent.
fn flood(
    valkey: String,
    watched: String,
    unknown_ns: String,
    per_second: u64,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut conn = std::net::TcpStream::connect(&valkey).unwrap();
        // Replies are read and thrown away beside the writes.
        let mut replies = conn.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while matches!(replies.read(&mut buf), Ok(n) if n > 0) {}
        });
        let batch = per_second / 10;
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let mut out = String::new();
            for _ in 0..batch {
                i += 1;
                let message = if i.is_multiple_of(2) {
                    watched.clone()
                } else {
                    format!("targetlease:{{{unknown_ns}:ghost-{i}}}")
                };
                out.push_str(&publish("targetlease:events", &message));
            }
            conn.write_all(out.as_bytes()).unwrap();
            sent.fetch_add(batch, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// How long after `release` TargetLease `name` is published as Held.
async fn held_after(env: &OperatorEnv, name: &str, release: impl AsyncFnOnce()) -> i64 {
    release().await;
    let start = now_ms();
    while now_ms() - start < 20_000 {
        let tl = env.api().get(name).await.unwrap();
        if summary(&tl).0 == Some(Phase::Held) {
            return now_ms() - start;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{name} was not Held within 20s of the release");
}

/// Promise (docs/operator.md, "Queues and wake-ups"): a flood of notices costs
/// at most one wake per target per 500 ms (a reconcile of the TargetLeases
/// on it) and nothing for targets no TargetLease names; a real release
/// during the flood is seen within that time.
///
/// Scenario: two TargetLeases wait behind outside holders. The first
/// holder releases in calm: the wake-up delay without a flood. Then about
/// 5,000 notices a second for six seconds, half for the second waiter's
/// target, half each for a new unknown target (in its namespace and
/// another); three seconds in, the second holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_notices_costs_bounded_reconciles_and_a_real_release_still_wakes_at_once()
{
    let env = OperatorEnv::start("flood").await;
    let store = env.store().await;
    let mut waiting = Vec::new();
    for name in ["calm", "storm"] {
        let target = Target::new(&env.ns, name);
        let outside = env
            .hold_outside(&store, &target, "cron", Duration::from_secs(60))
            .await;
        env.create(name, lease_for(name).identity(name)).await;
        env.wait_reason(name, "TargetHeld", SOON).await;
        waiting.push((target, outside.lease.unwrap().handle().unwrap()));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let release = |i: usize| {
        let (target, holder) = waiting[i].clone();
        let store = &store;
        async move || {
            let r = store
                .release(&ReleaseRequest::new(target, holder))
                .await
                .unwrap();
            assert_eq!(r.outcome, Outcome::Released);
        }
    };
    let calm = held_after(&env, "calm", release(0)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // What the scripts publish: the target's key.
    let storm_base = store.keys().target(&waiting[1].0);
    assert_eq!(
        parse_base("targetlease", &storm_base).as_ref(),
        Some(&waiting[1].0),
        "the flood names the waiter's target as the scripts do"
    );
    let (before, woke_before) = (reconciles(&env), notices(&env, "woke"));
    let cpu_before = sample(&env, "targetlease_process_cpu_seconds_total");
    let (stop, sent) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let flooding = std::time::Instant::now();
    let flooder = flood(
        env.valkey.addr(),
        storm_base,
        env.ns.clone(),
        5_000,
        stop.clone(),
        sent.clone(),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let storm = held_after(&env, "storm", release(1)).await;
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(flooding.elapsed())).await;
    stop.store(true, Ordering::SeqCst);
    flooder.join().unwrap();
    let seconds = flooding.elapsed().as_secs_f64();
    // Let the last notices arrive before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = reconciles(&env) - before;
    let cpu = sample(&env, "targetlease_process_cpu_seconds_total") - cpu_before;
    let (woke, folded, unknown) = (
        notices(&env, "woke") - woke_before,
        notices(&env, "folded"),
        notices(&env, "unknown_target"),
    );
    let sent = sent.load(Ordering::SeqCst);
    eprintln!(
        "flood: {sent} notices in {seconds:.1}s; the operator counted woke {woke}, folded \
         {folded}, unknown_target {unknown}; {during} reconciles and {cpu:.2}s of operator CPU \
         meanwhile; wake-up after a release: {calm} ms calm, {storm} ms in the flood"
    );
    // One wake per 500 ms of the flood's target (its one TargetLease), the
    // real acquisition's own passes, and slack for the sweep and renewals.
    let bound = (seconds / 0.5).ceil() + 20.0;
    assert!(
        during <= bound,
        "{during} reconciles during {seconds:.1}s of flood, more than {bound}"
    );
    assert!(
        woke <= (seconds / 0.5).ceil() + 2.0,
        "{woke} wakes from notices in {seconds:.1}s"
    );
    assert!(
        storm <= calm + 1_500,
        "a real release during the flood woke the waiter after {storm} ms (calm: {calm} ms)"
    );
    assert!(
        unknown >= sent as f64 / 4.0 && folded >= sent as f64 / 4.0,
        "the operator did not see the flood (sent {sent}): this test would prove nothing"
    );
}
