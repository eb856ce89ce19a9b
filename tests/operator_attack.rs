//! Attacks on the operator's documented promises (docs/operator.md, DESIGN.md
//! "Invariants of what the operator publishes") after the issue 10 rewrite,
//! on a real kube-apiserver and a real Valkey. Each test is named after the
//! promise it tries to break; a failing test is a broken promise.
//!
//! Faults between the operator and Valkey go through `support::link_proxy`
//! (lost replies, partitions, refused connections) while outside holders talk
//! to Valkey directly, as they would in production. Publish-order checks
//! replay pods and TargetLeases in the API server's revision order
//! (`support::timeline`).

mod support {
    pub mod kube_env;
    pub mod link_proxy;
    pub mod operator_env;
    pub mod resp;
    pub mod timeline;
    pub mod valkey_server;
}

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use support::kube_env::eventually;
use support::link_proxy::{BLACKHOLE, DROP_REPLIES, TcpProxy};
use support::operator_env::{OperatorEnv, summary};
use support::timeline::Timeline;
use targetlease::crd::{Phase, TargetLease};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, ReleaseRequest, Reply, Target};

const SOON: Duration = Duration::from_secs(20);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn ms(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<i64> {
    t.as_ref().map(|t| t.0.as_millisecond())
}

fn status_line(tl: &TargetLease) -> String {
    let s = tl.status.clone().unwrap_or_default();
    let held = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Held")
        .map(|c| c.reason.clone());
    format!(
        "phase={:?} holder={:?} token={:?} expiresAt={:?} observedGeneration={:?} reason={held:?}",
        s.phase,
        s.holder,
        s.fencing_token,
        ms(&s.expires_at),
        s.observed_generation
    )
}

/// Sleeps until the wall clock reaches `at_ms` (Unix ms).
async fn sleep_until_ms(at_ms: i64) {
    let left = at_ms - now_ms();
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left as u64)).await;
    }
}

/// The last `n` lines of a log, for failure messages.
fn tail(log: &str, n: usize) -> String {
    let lines: Vec<_> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// An operator process talking to Valkey through `valkey_url` (e.g. a proxy),
/// otherwise configured exactly like `OperatorEnv::start_operator`.
struct Op {
    child: Child,
    log: PathBuf,
}

impl Op {
    fn start(env: &OperatorEnv, valkey_url: &str, dir: &Path, tag: &str) -> Op {
        let log = dir.join(format!("{tag}.log"));
        let admin_port = support::valkey_server::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_targetlease"))
            .arg("operator")
            .args(["--admin-addr", &format!("127.0.0.1:{admin_port}")])
            .env("POD_NAME", tag)
            .args(["--valkey-url", valkey_url])
            .arg("--lease-id-key-file")
            .arg(env.key_file())
            .args(["--floor-namespace", &env.ns, "--watch-namespace", &env.ns])
            .env("KUBECONFIG", env.cp.kubeconfig_path())
            .env("RUST_LOG", "targetlease=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start targetlease operator");
        Op { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Acquires `target` for an outside holder as soon as Valkey lets it go.
async fn outside_acquire(
    store: &impl LeaseStore,
    target: &Target,
    owner: &str,
    within: Duration,
) -> Option<Reply> {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        let req = AcquireRequest::new(target.clone(), owner, Duration::from_secs(30));
        if let Ok(r) = store.acquire(&req).await
            && r.outcome == Outcome::Acquired
        {
            return Some(r);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

// ---------------------------------------------------------------------------
// maxLifetime
// ---------------------------------------------------------------------------

/// Promise (docs/operator.md "maxLifetime", "observedGeneration"): "A lease
/// never outlives `maxLifetime` from its acquisition" and `observedGeneration`
/// is "the generation whose spec the lease carries".
///
/// Scenario: a Held lease without maxLifetime; `maxLifetime: 6s` is added.
/// The edit is reported applied (observedGeneration moves) by a renewal, but
/// a renewal cannot carry a max lifetime (RenewRequest has none), so the lease
/// lives on with no hard end and is never rotated.
#[tokio::test]
async fn max_lifetime_added_to_a_held_lease_is_enforced() {
    let env = OperatorEnv::start("maxedit").await;
    env.create(
        "m",
        json!({ "target": "t", "holder": { "identity": "m" },
                "leaseDuration": "4s", "renewInterval": "2s" }),
    )
    .await;
    let held = env.wait_phase("m", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1));
    let acquired = ms(&held.status.clone().unwrap().acquired_at).unwrap();
    env.api()
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "maxLifetime": "6s" } })),
        )
        .await
        .unwrap();
    let applied = env
        .wait_for("m", "observedGeneration 2", SOON, |tl| {
            tl.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
        })
        .await;
    // Give the operator the whole lifetime plus two renew intervals.
    sleep_until_ms(acquired + 6_000 + 4_000).await;
    let now = env.api().get("m").await.unwrap();
    let store = env.store().await;
    let lease = store
        .get(&Target::new(&env.ns, "t"))
        .await
        .unwrap()
        .lease
        .expect("a lease");
    let age = now_ms() - lease.acquired_at_ms as i64;
    assert!(
        lease.fencing_token > 1 || lease.max_expires_at_ms.is_some(),
        "observedGeneration=2 was reported ({}) but the lease (token {}, acquired at {}) is \
         still live {age} ms after its acquisition with no hard end (max_expires_at_ms={:?}); \
         maxLifetime 6s is not enforced. now: {}\nlog tail:\n{}",
        status_line(&applied),
        lease.fencing_token,
        lease.acquired_at_ms,
        lease.max_expires_at_ms,
        status_line(&now),
        tail(&env.operator_log(0), 8)
    );
}

/// Promise (docs/operator.md "maxLifetime"): "when its hard end is within one
/// `renewInterval`, the operator unpublishes it, releases it and acquires a new
/// one ... (reason `MaxLifetimeReached`, not `LeaseLost`), so status never
/// shows `Held` past the end Valkey enforces".
///
/// Scenario: leaseDuration 12s, renewInterval 5s, maxLifetime 15s. The
/// operator is killed at 6s and restarted at 12s (before the hard end, but
/// within one renewInterval of it). The restarted operator does not remember
/// the hard end before its first renewal (`Memory::confirmed` is empty, so
/// `rotation_due` is false and it plans a plain Renew followed by a
/// full-interval sleep). Holds today only because that renewal always
/// republishes expiresAt and the operator's own status write triggers another
/// pass, which then sees the hard end and rotates.
#[tokio::test]
async fn a_restarted_operator_never_shows_held_past_max_lifetime() {
    let mut env = OperatorEnv::start("maxrestart").await;
    env.create_pod("w", &[("app", "w")], true).await;
    env.create(
        "rot",
        json!({ "target": "t", "holder": { "identity": "w", "podName": "w" },
                "leaseDuration": "12s", "renewInterval": "5s", "maxLifetime": "15s" }),
    )
    .await;
    let held = env.wait_phase("rot", Phase::Held, SOON).await;
    let acquired = ms(&held.status.clone().unwrap().acquired_at).unwrap();
    let hard_end = acquired + 15_000;
    sleep_until_ms(acquired + 6_000).await;
    env.kill_operator(0);
    sleep_until_ms(acquired + 12_000).await;
    env.start_operator();
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    let mut renewed_before_end = None;
    let mut violations = Vec::new();
    let mut samples = Vec::new();
    while now_ms() < hard_end + 6_000 {
        let tl = env.api().get("rot").await.unwrap();
        let st = tl.status.clone().unwrap_or_default();
        let t = now_ms();
        samples.push(format!("+{} {}", t - acquired, status_line(&tl)));
        if renewed_before_end.is_none() && ms(&st.expires_at) == Some(hard_end) && t < hard_end {
            renewed_before_end = Some(t - acquired);
        }
        if t > hard_end + 1_000 && st.phase == Some(Phase::Held) && st.fencing_token == Some(1) {
            let in_valkey = store.get(&target).await.map(|r| r.outcome);
            let label = env.marks("w", "rot").await.0;
            violations.push(format!(
                "+{} ms after acquisition ({} ms past the hard end): {} | valkey: {in_valkey:?} | leader label {label:?}",
                t - acquired,
                t - hard_end,
                status_line(&tl)
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    let lost: Vec<_> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("LeaseLost"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        violations.is_empty() && lost.is_empty(),
        "restarted operator's first republish at +{renewed_before_end:?} ms (hard end at +15000 ms); \
         status stayed Held past the hard end:\n{}\nLeaseLost events: {lost:?}\nsamples:\n{}\nlog tail:\n{}",
        violations.join("\n"),
        samples.join("\n"),
        tail(&env.operator_log(1), 25)
    );
}

// ---------------------------------------------------------------------------
// expiresAt and Held vs Valkey's expiry
// ---------------------------------------------------------------------------

/// Promise: published `expiresAt` (status and pod annotation) is "a lower
/// bound on the lease's expiry in Valkey, never later than it", "a renewal
/// that moves Valkey's expiry earlier republishes it".
///
/// Scenario: Held with leaseDuration 60s. The reply path from Valkey to the
/// operator drops (the request path still works), then the spec is edited to
/// 6s. The renewal carrying 6s reaches Valkey and takes effect; its reply is
/// lost (outcome unknown); then the link is cut. The operator keeps
/// publishing the 60s expiry: once Valkey lets the lease go (6s later) an
/// outside holder takes the target while status still says Held, token 1,
/// valid for another ~50s, and the pod keeps its leader label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_duration_whose_renewal_reply_is_lost_never_leaves_a_later_expiry_published() {
    let env = OperatorEnv::start_without_operator("lostreply").await;
    let proxy = TcpProxy::start(env.valkey.addr()).await;
    let dir = tempfile::tempdir().unwrap();
    let op = Op::start(&env, &proxy.url(), dir.path(), "op");
    env.create_pod("w", &[("app", "w")], true).await;
    env.create(
        "w",
        json!({ "target": "t", "holder": { "identity": "w", "podName": "w" },
                "leaseDuration": "60s", "renewInterval": "5s" }),
    )
    .await;
    env.wait_phase("w", Phase::Held, SOON).await;
    eventually("w marked", SOON, || async {
        env.marks("w", "w").await.0.map(|_| ())
    })
    .await;

    proxy.set_mode(DROP_REPLIES);
    let before = proxy.forwarded();
    env.api()
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "leaseDuration": "6s", "renewInterval": "2s" } })),
        )
        .await
        .unwrap();
    eventually("the renewal with the new duration sent", SOON, || async {
        (proxy.forwarded() > before).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set_mode(BLACKHOLE);

    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    let outside = outside_acquire(&store, &target, "intruder", Duration::from_secs(20))
        .await
        .expect("Valkey lets the lease go ~6s after the renewal");
    let tl = env.api().get("w").await.unwrap();
    let label = env.marks("w", "w").await;
    let o = outside.lease.unwrap();
    let st = tl.status.clone().unwrap_or_default();
    let published = ms(&st.expires_at);
    let lie =
        st.phase == Some(Phase::Held) && published.is_some_and(|p| p > o.acquired_at_ms as i64);
    assert!(
        !lie && label.0.is_none(),
        "an outside holder got token {} at {} (Valkey time), but the operator still publishes {} \
         ({} ms later than the moment Valkey gave the target away); pod marks {label:?}\nlog tail:\n{}",
        o.fencing_token,
        o.acquired_at_ms,
        status_line(&tl),
        published.unwrap_or(0) - o.acquired_at_ms as i64,
        tail(&op.log(), 15)
    );
}

/// Promise: "`Held` is withdrawn (phase `Unknown`) as soon as the published
/// expiry passes without a confirmation from Valkey"; DESIGN: "published
/// `Held` never outlives [Valkey's expiry]".
///
/// Scenario: leaseDuration 10s, renewInterval 2s. Right after a renewal that
/// republished expiresAt (so Valkey's expiry == published expiry), the
/// operator is partitioned from Valkey (an outside holder still reaches it).
/// Each renewal attempt now takes the full store timeout (2s) before the
/// operator judges the published expiry, so Held (status and leader label)
/// outlives Valkey's expiry while the outside holder already has the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_is_withdrawn_when_the_published_expiry_passes_during_a_partition() {
    let env = OperatorEnv::start_without_operator("partition").await;
    let proxy = TcpProxy::start(env.valkey.addr()).await;
    let dir = tempfile::tempdir().unwrap();
    let op = Op::start(&env, &proxy.url(), dir.path(), "op");
    env.create_pod("w", &[("app", "w")], true).await;
    env.create(
        "w",
        json!({ "target": "t", "holder": { "identity": "w", "podName": "w" },
                "leaseDuration": "10s", "renewInterval": "2s" }),
    )
    .await;
    let held = env.wait_phase("w", Phase::Held, SOON).await;
    let first = ms(&held.status.unwrap().expires_at).unwrap();
    // Wait for a renewal that republishes expiresAt, then cut the link at once.
    let republished = loop {
        let tl = env.api().get("w").await.unwrap();
        let e = ms(&tl.status.unwrap().expires_at);
        if let Some(e) = e
            && e != first
        {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    proxy.set_mode(BLACKHOLE);
    let cut = now_ms();

    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    sleep_until_ms(republished - 300).await;
    let outside = outside_acquire(&store, &target, "intruder", Duration::from_secs(20))
        .await
        .expect("Valkey lets the lease go");
    let o = outside.lease.unwrap();
    // What is published while someone else holds the target.
    let mut seen = Vec::new();
    for _ in 0..30 {
        let tl = env.api().get("w").await.unwrap();
        let label = env.marks("w", "w").await.0;
        let st = tl.status.clone().unwrap_or_default();
        if st.phase == Some(Phase::Held) || label.is_some() {
            seen.push(format!(
                "+{} ms after the outside acquisition: {} | leader label {label:?}",
                now_ms() - o.acquired_at_ms as i64,
                status_line(&tl)
            ));
        } else {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen.is_empty(),
        "partitioned at {cut}, published expiry {republished}; an outside holder got token {} at {} \
         (Valkey time); meanwhile the operator kept publishing Held:\n{}\nlog tail:\n{}",
        o.fencing_token,
        o.acquired_at_ms,
        seen.join("\n"),
        tail(&op.log(), 15)
    );
}

/// Promise: "Published `expiresAt` (status and pod annotation) is never later
/// than Valkey's expiry" and "a renewal that moves Valkey's expiry *earlier*
/// ... republishes it, with the pod annotation, before the pass ends".
///
/// Scenario: an elected pod, leaseDuration 60s → 6s. Replays every revision
/// of pods and TargetLeases: the executor writes status first and the pod
/// annotation after it (unmark → status → mark), so there is an instant at
/// which the pod's expires-at is later than its status's (and than Valkey's,
/// which moved earlier at the renewal, before both writes).
#[tokio::test]
async fn a_shorter_duration_never_leaves_the_pod_annotation_later_than_status() {
    let env = OperatorEnv::start("shrinkorder").await;
    env.create_pod("web-0", &[("app", "shrinkorder")], true)
        .await;
    let timeline = Timeline::record(&env.client, &env.ns);
    env.create(
        "web",
        json!({ "target": "t", "candidates": { "podSelector": { "matchLabels": { "app": "shrinkorder" } } },
                "leaseDuration": "60s", "renewInterval": "5s" }),
    )
    .await;
    env.wait_phase("web", Phase::Held, SOON).await;
    eventually("web-0 marked", SOON, || async {
        env.marks("web-0", "web").await.0.map(|_| ())
    })
    .await;
    env.api()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "leaseDuration": "6s", "renewInterval": "2s" } })),
        )
        .await
        .unwrap();
    env.wait_for("web", "observedGeneration 2", SOON, |tl| {
        tl.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = timeline.violations();
    assert!(v.is_empty(), "{}", v.join("\n"));
}

/// Promise (docs/operator.md "Pod marks" and "Status write budget"): the pod
/// carries `expires-at: "<RFC 3339, same lower bound as status>"`, and a
/// republished expiry costs "one annotation update on a pod-tied holder".
///
/// Scenario: a pod-tied lease renewing every second for ~10s. Status times
/// have one-second resolution; an annotation written from an unrounded value
/// would differ from status and be rewritten by the next pass (two pod writes
/// per republish). Status and annotation are two objects, so between their
/// two writes they differ for one revision: the annotation may then be the
/// older (earlier) of the two, never the later, and it must settle on the
/// exact value of status, with one annotation write per status change.
#[tokio::test]
async fn the_expires_at_annotation_is_the_same_lower_bound_as_status() {
    let env = OperatorEnv::start("precision").await;
    env.create_pod("w", &[("app", "w")], true).await;
    env.create(
        "w",
        json!({ "target": "t", "holder": { "identity": "w", "podName": "w" },
                "leaseDuration": "4s", "renewInterval": "1s" }),
    )
    .await;
    env.wait_phase("w", Phase::Held, SOON).await;
    let timeline = Timeline::record(&env.client, &env.ns);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut status_expiry = None;
    let mut status_changes = 0;
    let mut annotation = None;
    let mut annotation_writes = 0;
    let mut differs = Vec::new();
    // Status values the annotation never reached while they were current.
    let mut unmatched = Vec::new();
    let mut matched = false;
    for e in timeline.entries() {
        match e.change {
            support::timeline::Change::Lease(_, Some(tl)) => {
                let x = tl
                    .status
                    .and_then(|s| s.expires_at)
                    .map(|t| t.0.to_string());
                if x != status_expiry && status_expiry.is_some() {
                    status_changes += 1;
                    if !matched {
                        unmatched.push(format!("rv {}: {status_expiry:?}", e.rv));
                    }
                    matched = false;
                }
                status_expiry = x;
            }
            support::timeline::Change::Pod(_, Some(p)) => {
                let a = p.annotations().get("w.targetlease.dev/expires-at").cloned();
                if a != annotation && annotation.is_some() {
                    annotation_writes += 1;
                }
                annotation = a;
            }
            _ => continue,
        }
        matched |= status_expiry.is_some() && status_expiry == annotation;
        if let (Some(s), Some(a)) = (&status_expiry, &annotation)
            && a > s
        {
            differs.push(format!("rv {}: status {s} / annotation {a}", e.rv));
        }
    }
    // The recording ends at an arbitrary instant, possibly between the status
    // write and the annotation write of one republish: every status value but
    // the last must have been reached by the annotation while it was current.
    assert!(
        status_changes > 0 && unmatched.is_empty(),
        "the annotation settles on each value of status ({status_changes} changes); \
         never reached:\n{}",
        unmatched.join("\n")
    );
    assert!(
        differs.is_empty() && annotation_writes <= status_changes + 1,
        "{status_changes} status expiry changes, {annotation_writes} annotation changes; \
         instants where the annotation is later than status:\n{}",
        differs.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Publish order at every instant
// ---------------------------------------------------------------------------

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Promises: "no pod carries marks its TargetLease's status does not name",
/// "at most one pod per election carries that election's marks", "a published
/// token is never lower than one published before for the same target" —
/// checked at every revision (pods and TargetLeases replayed in etcd order)
/// through readiness flips, pod recreation under the same name, overlapping
/// elections, deletion and recreation of a TargetLease on the same target with
/// FLUSHALL in between, and `kill -9` of the operator at random moments
/// (including mid-cleanup). Random (seed printed); ~60s of churn.
#[tokio::test]
async fn marks_and_tokens_hold_at_every_revision_through_churn_and_crashes() {
    let mut env = OperatorEnv::start("everyrev").await;
    let seed = (now_ms() as u64) | 1;
    let mut rng = Rng(seed);
    for p in ["c-0", "c-1", "c-2"] {
        env.create_pod(p, &[("app", "ch")], true).await;
    }
    env.create_pod("solo", &[("app", "solo")], true).await;
    let timeline = Timeline::record(&env.client, &env.ns);
    let timing = json!({ "leaseDuration": "4s", "renewInterval": "1s" });
    let with = |mut spec: serde_json::Value| {
        spec.as_object_mut()
            .unwrap()
            .extend(timing.as_object().unwrap().clone());
        spec
    };
    env.create(
        "el",
        with(json!({ "target": "el", "candidates": { "podSelector": { "matchLabels": { "app": "ch" } } } })),
    )
    .await;
    env.create(
        "el2",
        with(
            json!({ "target": "el2", "candidates": { "podSelector": { "matchExpressions": [
            { "key": "app", "operator": "In", "values": ["ch", "solo"] } ] } } }),
        ),
    )
    .await;
    env.create(
        "tied",
        with(json!({ "target": "tied", "holder": { "identity": "solo", "podName": "solo" } })),
    )
    .await;
    env.wait_phase("el", Phase::Held, SOON).await;
    env.wait_phase("tied", Phase::Held, SOON).await;
    let mut ops = 0usize; // index of the running operator
    let mut log = Vec::new();
    let deadline = now_ms() + 60_000;
    while now_ms() < deadline {
        let action = rng.below(8);
        match action {
            0 | 1 => {
                let tl = env.api().get("el").await.unwrap();
                if let Some(leader) = summary(&tl).1 {
                    env.set_ready(&leader, false).await;
                    tokio::time::sleep(Duration::from_millis(rng.below(600))).await;
                    env.set_ready(&leader, true).await;
                    log.push(format!("flip {leader}"));
                }
            }
            2 => {
                let tl = env.api().get("el").await.unwrap();
                if let Some(leader) = summary(&tl).1 {
                    env.delete_pod(&leader).await;
                    let _ = eventually("pod gone", SOON, || async {
                        env.pods()
                            .get_opt(&leader)
                            .await
                            .ok()?
                            .is_none()
                            .then_some(())
                    })
                    .await;
                    env.create_pod(&leader, &[("app", "ch")], true).await;
                    log.push(format!("recreate {leader}"));
                }
            }
            3 => {
                env.kill_operator(ops);
                tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
                ops = env.start_operator();
                log.push("kill -9 + restart".into());
            }
            4 => {
                env.valkey.conn().cmd(&["FLUSHALL"]);
                log.push("FLUSHALL".into());
            }
            5 => {
                // Delete the pod-tied lease, crash the operator somewhere in its
                // cleanup, flush Valkey, recreate it on the same target.
                env.delete("tied").await;
                tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
                env.kill_operator(ops);
                env.valkey.conn().cmd(&["FLUSHALL"]);
                ops = env.start_operator();
                env.wait_gone("tied", SOON).await;
                env.valkey.conn().cmd(&["FLUSHALL"]);
                env.create(
                    "tied",
                    with(json!({ "target": "tied", "holder": { "identity": "solo", "podName": "solo" } })),
                )
                .await;
                log.push("delete tied, crash mid-cleanup, FLUSHALL, recreate".into());
            }
            6 => {
                env.set_ready("solo", false).await;
                tokio::time::sleep(Duration::from_millis(rng.below(800))).await;
                env.set_ready("solo", true).await;
                log.push("flip solo".into());
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100 + rng.below(700))).await;
    }
    for name in ["el", "el2", "tied"] {
        env.wait_phase(name, Phase::Held, Duration::from_secs(30))
            .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = timeline.violations();
    assert!(
        v.is_empty(),
        "seed {seed}; actions {log:?}\n{} violations:\n{}",
        v.len(),
        v.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Promise (docs/operator.md "Deleting a TargetLease", "Crash safety"): "The
/// finalizer stays until the store has confirmed that nothing of the resource
/// is left: ... and any unpublished attempt is looked up and released"; "An
/// acquisition that reached Valkey but was never published ... never blocks
/// the target".
///
/// Scenario: Valkey holds an unpublished lease of this TargetLease from an
/// earlier attempt W (metadata names the TargetLease and W, lease id derived
/// from W: what an acquire whose reply was lost leaves behind when the spec
/// was then edited, so the next acquire met `idempotency_conflict` and a new
/// attempt X was recorded). Status records X, whose acquire failed (the
/// operator is cut off from Valkey). The TargetLease is deleted during the
/// outage; when Valkey is reachable again, cleanup's Abandon step reads the
/// target, sees a lease of its own under W != X, forgets X and lets the
/// finalizer go: W's lease stays in Valkey for its whole leaseDuration (1h
/// here), blocking the target, with nothing left in Kubernetes that could
/// release it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_releases_every_unpublished_lease_of_its_own_before_the_finalizer_goes() {
    let env = OperatorEnv::start_without_operator("cleanupown").await;
    let proxy = TcpProxy::start(env.valkey.addr()).await;
    let dir = tempfile::tempdir().unwrap();
    let op = Op::start(&env, &proxy.url(), dir.path(), "op");
    eventually("operator connected", SOON, || async {
        op.log().contains("operator starting").then_some(())
    })
    .await;
    proxy.set_mode(BLACKHOLE);
    env.create(
        "job",
        json!({ "target": "t", "holder": { "identity": "job" }, "leaseDuration": "1h" }),
    )
    .await;
    let recorded = env
        .wait_for(
            "job",
            "an attempt made while Valkey is cut off",
            SOON,
            |tl| {
                tl.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "BackendAvailable" && c.status == "False")
                })
            },
        )
        .await;
    // The first attempt's id is implicit (derived from the UID); later ones are recorded.
    let x = recorded
        .status
        .unwrap()
        .acquisition_id
        .unwrap_or_else(|| format!("first-{}", recorded.metadata.uid.clone().unwrap()));
    // The earlier attempt W's lease, as an acquire whose reply was lost left it.
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    let mut req = AcquireRequest::new(target.clone(), "job", Duration::from_secs(3600));
    req.lease_id = Some(env.lease_id_key().derive("attempt-w"));
    let mut meta = serde_json::Map::new();
    meta.insert("targetlease".into(), format!("{}/job", env.ns).into());
    meta.insert("acquisition".into(), "attempt-w".into());
    req.metadata = Some(meta);
    assert_eq!(
        store.acquire(&req).await.unwrap().outcome,
        Outcome::Acquired
    );

    env.delete("job").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        env.api().get_opt("job").await.unwrap().is_some(),
        "kept by the finalizer"
    );
    proxy.reset_connections();
    proxy.set_mode(support::link_proxy::PASS);
    env.wait_gone("job", Duration::from_secs(40)).await;
    let left = store.get(&target).await.unwrap();
    assert!(
        left.lease.is_none(),
        "TargetLease job (attempt {x}) is gone, but its own lease from attempt W is still in \
         Valkey, blocking the target for its whole leaseDuration: {:?}\nlog tail:\n{}",
        left.lease
            .map(|l| (l.owner, l.fencing_token, l.expires_at_ms, l.metadata)),
        tail(&op.log(), 12)
    );
}

/// Promise (docs/operator.md, `holderPod`/`holderPodUID`): "the pod the lease
/// is tied to ... A pod recreated under the same name ... is a new holder: the
/// old lease is given back and a new one, with a larger token, is acquired".
///
/// Scenario: a lease held for the plain identity "worker" (token 1, published
/// in status: a process outside Kubernetes may be acting with it). The spec is
/// edited to tie it to pod "worker". The operator renews, then its `Idle` step
/// adopts the pod into the existing lease (`transition::idle` fills in
/// holderPod/holderPodUID when no UID is recorded, meant for statuses written
/// before UIDs existed) and marks the pod leader with token 1: a new holder
/// inherits a token that was already handed to someone else.
#[tokio::test]
async fn a_holder_newly_tied_to_a_pod_gets_a_new_token() {
    let env = OperatorEnv::start("tie").await;
    env.create_pod("worker", &[("app", "worker")], true).await;
    env.create(
        "job",
        json!({ "target": "t", "holder": { "identity": "worker" },
                "leaseDuration": "6s", "renewInterval": "2s" }),
    )
    .await;
    let untied = env.wait_phase("job", Phase::Held, SOON).await;
    assert_eq!(summary(&untied).2, Some(1));
    env.api()
        .patch(
            "job",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "spec": { "holder": { "identity": "worker", "podName": "worker" } } }),
            ),
        )
        .await
        .unwrap();
    let tied = env
        .wait_for("job", "tied to pod worker", SOON, |tl| {
            tl.status
                .as_ref()
                .is_some_and(|s| s.phase == Some(Phase::Held) && s.holder_pod.is_some())
        })
        .await;
    let marks = eventually("worker marked", SOON, || async {
        let m = env.marks("worker", "job").await;
        m.1.clone().map(|_| m)
    })
    .await;
    assert!(
        summary(&tied).2 > Some(1),
        "the lease published for the untied identity (token 1) now also marks pod worker: {} | marks {marks:?}",
        status_line(&tied)
    );
}

/// Promise: only the pod the lease is tied to carries its marks ("The
/// `holder.podName` pod is marked the same way as an elected pod").
///
/// Scenario: a pod-tied lease (podName "w"); the spec is edited to drop
/// podName (the lease is no longer tied to any pod). Nothing clears
/// holderPod: the plan's UID check needs a desired pod, `idle` only fills
/// holderPod in, so the pod keeps the leader label and token annotation and
/// status keeps naming it, even once the pod is NotReady.
#[tokio::test]
async fn a_holder_no_longer_tied_to_a_pod_stops_marking_it() {
    let env = OperatorEnv::start("untie").await;
    env.create_pod("w", &[("app", "w")], true).await;
    env.create(
        "job",
        json!({ "target": "t", "holder": { "identity": "w", "podName": "w" },
                "leaseDuration": "6s", "renewInterval": "2s" }),
    )
    .await;
    env.wait_phase("job", Phase::Held, SOON).await;
    eventually("w marked", SOON, || async {
        env.marks("w", "job").await.0.map(|_| ())
    })
    .await;
    env.api()
        .patch(
            "job",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "holder": { "identity": "w", "podName": null } } })),
        )
        .await
        .unwrap();
    env.wait_for("job", "observedGeneration 2", SOON, |tl| {
        tl.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
    })
    .await;
    env.set_ready("w", false).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let tl = env.api().get("job").await.unwrap();
    let marks = env.marks("w", "job").await;
    assert!(
        marks == (None, None, None) && tl.status.clone().unwrap().holder_pod.is_none(),
        "spec no longer ties the lease to pod w (and w is NotReady), yet status names holderPod {:?} \
         and w carries {marks:?}; {}",
        tl.status.unwrap().holder_pod,
        status_line(&env.api().get("job").await.unwrap())
    );
}

// ---------------------------------------------------------------------------
// Wake-ups
// ---------------------------------------------------------------------------

/// Promise (docs/operator.md "Queues and wake-ups"): "a release wakes the
/// others on the target (also releases from outside Kubernetes, through Valkey
/// pub/sub on `<prefix>:events`, resubscribed with backoff when Valkey was
/// down)".
///
/// Scenario: Valkey cannot be reached for a moment right after the operator's
/// store connected (the proxy refuses the next connection: the subscriber's).
/// An outside holder with a 60s lease then releases; the waiting TargetLease
/// should take the target within seconds, not at the holder's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_resume_after_the_subscriber_could_not_connect() {
    let env = OperatorEnv::start_without_operator("resub").await;
    let proxy = TcpProxy::start(env.valkey.addr()).await;
    let dir = tempfile::tempdir().unwrap();
    proxy.refuse_after(1);
    let op = Op::start(&env, &proxy.url(), dir.path(), "op");
    eventually(
        "the subscriber gave up",
        Duration::from_secs(30),
        || async { op.log().contains("no release notifications").then_some(()) },
    )
    .await;
    proxy.refuse_new(false);
    // Valkey is reachable again for everyone from here on.
    let store = env.store().await;
    let target = Target::new(&env.ns, "q");
    let outside = store
        .acquire(&AcquireRequest::new(
            target.clone(),
            "cron",
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(outside.outcome, Outcome::Acquired);
    env.create("q", json!({ "target": "q", "holder": { "identity": "q" } }))
        .await;
    env.wait_reason("q", "TargetHeld", SOON).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let holder = outside.lease.unwrap().handle().unwrap();
    let released = store
        .release(&ReleaseRequest::new(target.clone(), holder))
        .await
        .unwrap();
    assert_eq!(released.outcome, Outcome::Released);
    let start = now_ms();
    let mut held = None;
    while now_ms() - start < 15_000 {
        let tl = env.api().get("q").await.unwrap();
        if summary(&tl).0 == Some(Phase::Held) {
            held = Some(now_ms() - start);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let now = env.api().get("q").await.unwrap();
    assert!(
        held.is_some(),
        "the outside holder released 15s ago, the waiter is still {} (it will retry only at the \
         outside lease's expiry, ~60s); log:\n{}",
        status_line(&now),
        op.log()
            .lines()
            .filter(|l| l.contains("notification") || l.contains("subscri"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Promise: "one whose pod goes NotReady leaves the queue at once and the next
/// one is woken"; a release wakes the others; no preemption; creation order.
///
/// Scenario: four TargetLeases on one target, created a second apart: a (named
/// identity), b (pod-tied), c (named identity), d (pod-tied). Heads leave the
/// queue for each reason in turn — deleted while Held, pod NotReady while Held,
/// pod deleted while Pending at the head — and the next in line must be Held
/// within a few seconds every time (no waiting for the 30s recheck).
#[tokio::test]
async fn the_next_waiter_is_woken_whenever_the_head_leaves_the_queue() {
    let env = OperatorEnv::start("heads").await;
    env.create_pod("b-pod", &[("app", "b")], true).await;
    env.create_pod("d-pod", &[("app", "d")], true).await;
    let specs = [
        ("a", json!({ "target": "q", "holder": { "identity": "a" } })),
        (
            "b",
            json!({ "target": "q", "holder": { "identity": "b", "podName": "b-pod" } }),
        ),
        ("c", json!({ "target": "q", "holder": { "identity": "c" } })),
        (
            "d",
            json!({ "target": "q", "holder": { "identity": "d", "podName": "d-pod" } }),
        ),
    ];
    for (name, spec) in specs {
        env.create(name, spec).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    env.wait_phase("a", Phase::Held, SOON).await;
    for n in ["b", "c", "d"] {
        env.wait_reason(n, "Queued", SOON).await;
    }
    let quick = Duration::from_secs(6);
    // a is deleted while Held: b is next.
    env.delete("a").await;
    let b = env.wait_phase("b", Phase::Held, quick).await;
    // b's pod goes NotReady while Held: c is next.
    env.set_ready("b-pod", false).await;
    let c = env.wait_phase("c", Phase::Held, quick).await;
    assert!(summary(&c).2 > summary(&b).2);
    // b's pod is Ready again: no preemption, c keeps the target.
    env.set_ready("b-pod", true).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        summary(&env.api().get("c").await.unwrap()).0,
        Some(Phase::Held)
    );
    assert_ne!(
        summary(&env.api().get("b").await.unwrap()).0,
        Some(Phase::Held)
    );
    // c is deleted: b (older, Ready again) is next, d stays queued.
    env.delete("c").await;
    env.wait_phase("b", Phase::Held, quick).await;
    env.wait_reason("d", "Queued", quick).await;
    // b's pod is deleted: d is next.
    env.delete_pod("b-pod").await;
    let d = env.wait_phase("d", Phase::Held, quick).await;
    let tokens: Vec<_> = [&b, &c, &d].iter().map(|t| summary(t).2).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// Promises: "Several TargetLeases on one target: exactly one is `Held`";
/// `Lost`: "Valkey ended a lease the operator did not give back"; published
/// Held never outlives the lease in Valkey.
///
/// Scenario: x holds the target (leaseDuration 60s, renewInterval 20s); y, older,
/// waits (TargetHeld) because its pod became Ready after x won. An
/// administrator revokes the target (`targetlease lease revoke`, e.g. to repair
/// it). The revoke publishes a release event: y is woken and acquires at once,
/// but x's pass on the same event plans `Idle` (its renewal is not due), so x
/// keeps publishing Held, token 1, until its next renewal, up to 20s later.
#[tokio::test]
async fn a_revoked_lease_is_not_published_as_held_next_to_its_successor() {
    let env = OperatorEnv::start("revoke").await;
    env.create_pod("y-pod", &[("app", "y")], false).await;
    let timing = json!({ "leaseDuration": "60s", "renewInterval": "20s" });
    let mut y = json!({ "target": "t", "holder": { "identity": "y", "podName": "y-pod" } });
    y.as_object_mut()
        .unwrap()
        .extend(timing.as_object().unwrap().clone());
    env.create("y", y).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut x = json!({ "target": "t", "holder": { "identity": "x" } });
    x.as_object_mut()
        .unwrap()
        .extend(timing.as_object().unwrap().clone());
    env.create("x", x).await;
    env.wait_phase("x", Phase::Held, SOON).await;
    env.set_ready("y-pod", true).await;
    env.wait_reason("y", "TargetHeld", SOON).await;
    let timeline = Timeline::record(&env.client, &env.ns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let store = env.store().await;
    let revoked = store
        .revoke(&targetlease::store::RevokeRequest {
            reason: Some("repair".into()),
            ..targetlease::store::RevokeRequest::new(Target::new(&env.ns, "t"))
        })
        .await
        .unwrap();
    let at = now_ms();
    eprintln!("revoke: {:?}", revoked.outcome);
    let y_held = env
        .wait_phase("y", Phase::Held, Duration::from_secs(25))
        .await;
    let y_after = now_ms() - at;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Replay: instants at which both are published Held.
    let mut current: std::collections::BTreeMap<String, (Option<Phase>, Option<u64>)> =
        Default::default();
    let mut both = Vec::new();
    for e in timeline.entries() {
        if let support::timeline::Change::Lease(n, Some(tl)) = e.change {
            let st = tl.status.unwrap_or_default();
            current.insert(n, (st.phase, st.fencing_token));
            let held: Vec<_> = current
                .iter()
                .filter(|(_, (p, _))| *p == Some(Phase::Held))
                .map(|(n, (_, t))| format!("{n}(token {t:?})"))
                .collect();
            if held.len() > 1 {
                let seen = e.seen.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
                both.push(format!(
                    "rv {} (+{} ms after the revoke): Held: {held:?}",
                    e.rv,
                    seen - at
                ));
            }
        }
    }
    let x_now = env.api().get("x").await.unwrap();
    assert!(
        both.is_empty(),
        "y took the target {y_after} ms after the revoke ({}), while x still published Held:\n{}\nx now: {}",
        status_line(&y_held),
        both.iter().take(3).cloned().collect::<Vec<_>>().join("\n"),
        status_line(&x_now)
    );
}

// ---------------------------------------------------------------------------
// Pauses
// ---------------------------------------------------------------------------

/// Promise: published `Held` never outlives Valkey's expiry; a token is never
/// published below one published before.
///
/// Scenario: the operator is frozen (SIGSTOP) for three lease durations while
/// an outside holder takes the target, then resumed. Anything the resumed
/// operator writes must not claim the lease it lost: every TargetLease version
/// written after the resume that says Held must have an expiry in the future
/// at the time it was written, and the old leader's label must be gone soon.
#[tokio::test]
async fn a_resumed_operator_publishes_nothing_stale() {
    let env = OperatorEnv::start("paused").await;
    env.create_pod("w", &[("app", "w")], true).await;
    env.create(
        "w",
        json!({ "target": "t", "holder": { "identity": "w", "podName": "w" },
                "leaseDuration": "3s", "renewInterval": "1s" }),
    )
    .await;
    env.wait_phase("w", Phase::Held, SOON).await;
    let timeline = Timeline::record(&env.client, &env.ns);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    env.pause_operator(0, true);
    let paused_at = now_ms();
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    let outside = outside_acquire(&store, &target, "intruder", Duration::from_secs(10))
        .await
        .expect("the frozen operator's lease runs out");
    sleep_until_ms(paused_at + 9_000).await;
    let resume_rv: u64 = env
        .api()
        .get("w")
        .await
        .unwrap()
        .resource_version()
        .unwrap()
        .parse()
        .unwrap();
    env.pause_operator(0, false);
    eventually("the old leader unmarked", SOON, || async {
        env.marks("w", "w").await.0.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut stale = Vec::new();
    for (rv, seen, tl) in timeline.lease_versions("w") {
        let Some(tl) = tl else { continue };
        let st = tl.status.clone().unwrap_or_default();
        let seen_ms = seen.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        if rv > resume_rv
            && st.phase == Some(Phase::Held)
            && ms(&st.expires_at).is_some_and(|e| e < seen_ms)
        {
            stale.push(format!("rv {rv}: {}", status_line(&tl)));
        }
    }
    let v = timeline.violations();
    assert!(
        stale.is_empty() && v.is_empty(),
        "outside holder got token {:?}; written after the resume: {stale:?}; \
         revision violations: {v:?}",
        outside.lease.map(|l| l.fencing_token)
    );
}

// ---------------------------------------------------------------------------
// Admission vs operator
// ---------------------------------------------------------------------------

/// Promise: admission and the operator agree: a spec the API server accepts
/// is acted on (never a loop of "backend unavailable"), one it refuses is
/// refused with the documented message. Byte/char limits, C0/C1 controls,
/// non-control Unicode separators, the 237-char name limit.
#[tokio::test]
async fn admission_and_the_operator_agree_on_names_targets_and_identities() {
    let env = OperatorEnv::start("limits").await;
    let two_byte = "é".repeat(128); // 128 chars, 256 bytes
    let accepted = [
        (
            "bytes-256",
            json!({ "target": two_byte, "holder": { "identity": two_byte } }),
        ),
        (
            "separators",
            json!({ "target": "a\u{2028}b\u{200b}c", "holder": { "identity": "x\u{feff}y" } }),
        ),
        (
            "colon",
            json!({ "target": "}:{a%3A}", "holder": { "identity": "i" } }),
        ),
    ];
    for (name, spec) in &accepted {
        env.create(name, spec.clone()).await;
    }
    let long_name = "n".repeat(237);
    env.create(
        &long_name,
        json!({ "target": "long", "holder": { "identity": "l" } }),
    )
    .await;
    for (name, _) in &accepted {
        env.wait_phase(name, Phase::Held, SOON).await;
    }
    env.wait_phase(&long_name, Phase::Held, SOON).await;
    let refused = [
        json!({ "target": format!("{two_byte}x"), "holder": { "identity": "i" } }),
        json!({ "target": "a\u{85}b", "holder": { "identity": "i" } }),
        json!({ "target": "a\u{7f}b", "holder": { "identity": "i" } }),
        json!({ "target": "t", "holder": { "identity": "a\tb" } }),
        json!({ "target": "t", "candidates": { "podSelector": {} } }),
        json!({ "target": "t", "holder": { "identity": "i" }, "leaseDuration": "10s", "renewInterval": "6s" }),
    ];
    for (i, spec) in refused.iter().enumerate() {
        let obj: TargetLease = serde_json::from_value(json!({
            "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
            "metadata": { "name": format!("refused-{i}") }, "spec": spec,
        }))
        .unwrap();
        let r = env.api().create(&Default::default(), &obj).await;
        assert!(r.is_err(), "admitted: {spec}");
    }
    let name_238: TargetLease = serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
        "metadata": { "name": "n".repeat(238) }, "spec": { "target": "t", "holder": { "identity": "i" } },
    }))
    .unwrap();
    assert!(
        env.api()
            .create(&Default::default(), &name_238)
            .await
            .is_err()
    );
}
