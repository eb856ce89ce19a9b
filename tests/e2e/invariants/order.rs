//! Publish order at every instant: marks and tokens through churn and crashes, cleanup, pod ties changing.

use super::*;

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

/// The churned election's pods: candidates of both `el` and `el2`.
const CH: &[(&str, &str)] = &[
    ("app", "ch"),
    ("el.targetlease.dev/candidate", "true"),
    ("el2.targetlease.dev/candidate", "true"),
];

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
        env.create_pod(p, CH, true).await;
    }
    env.create_pod(
        "solo",
        &[
            ("app", "solo"),
            ("tied.targetlease.dev/candidate", "true"),
            ("el2.targetlease.dev/candidate", "true"),
        ],
        true,
    )
    .await;
    let timeline = Timeline::record(&env.client, &env.ns);
    let timing = json!({ "leaseDuration": "4s", "renewInterval": "1s" });
    let with = |mut spec: serde_json::Value| {
        spec.as_object_mut()
            .unwrap()
            .extend(timing.as_object().unwrap().clone());
        spec
    };
    env.create("el", with(lease_for("el").elect("ch").into()))
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
        with(lease_for("tied").identity("solo").pod("solo").into()),
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
                    env.create_pod(&leader, CH, true).await;
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
                    with(lease_for("tied").identity("solo").pod("solo").into()),
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
    let proxy = TcpProxy::start(env.valkey.addr());
    let op = Op::start(&env, &proxy.url(), "op");
    eventually("operator connected", SOON, || async {
        op.log().contains("operator starting").then_some(())
    })
    .await;
    proxy.set_mode(Mode::Blackhole);
    env.create(
        "job",
        lease_for("t")
            .identity("job")
            .set("leaseDuration", json!("1h")),
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
    let req = env.operator_acquire("job", "t", "attempt-w", Duration::from_secs(3600));
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
    proxy.set_mode(Mode::Pass);
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
/// edited to tie it to pod "worker". Were the pod adopted into the existing
/// lease and marked leader with token 1, a new holder would inherit a token
/// that was already handed to someone else.
#[tokio::test]
async fn a_holder_newly_tied_to_a_pod_gets_a_new_token() {
    let env = OperatorEnv::start("tie").await;
    env.create_pod(
        "worker",
        &[("app", "worker"), ("job.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    env.create(
        "job",
        lease_for("t").identity("worker").durations("6s", "2s"),
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
    held_for_pod_w(&env, "job", "6s", "2s").await;
    wait_w_marked(&env, "job").await;
    env.patch_spec(
        "job",
        json!({ "holder": { "identity": "w", "podName": null } }),
    )
    .await;
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
