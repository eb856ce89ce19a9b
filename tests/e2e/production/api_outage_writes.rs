//! The operator's own writes at the edge of an API-server outage: a status
//! write that took effect while its reply was lost, a withdrawal of Held
//! that cannot be sent, and an outage that ends just after the published
//! expiry. In each, the lease status (or a pod mark) may publish is kept
//! alive in Valkey, and when the API server returns nothing is Lost, no
//! token changes and nothing flaps.

use super::api_outage::{held_as_before, lease_stays_live};
use super::*;
use support::operator_env::http_get;
use support::tcp_proxy::TcpProxy;
use support::timeline::{Change, Timeline};

/// leaseDuration of the leases under test; the outages last 2.5 times as long.
const LEASE: Duration = Duration::from_secs(8);

/// An env whose one operator reaches kube-apiserver through a proxy the test
/// controls (the test's own client goes to the API server directly).
async fn behind_a_proxy(prefix: &str, flags: &[&str]) -> (OperatorEnv, TcpProxy) {
    let mut env = OperatorEnv::start_without_operator(prefix).await;
    let upstream: std::net::SocketAddr = env
        .cp
        .server_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let proxy = TcpProxy::start(upstream);
    env.run_operators_as(env.kubeconfig_via(proxy.port));
    env.start_operator_with(flags);
    eventually("the operator to be ready", SOON, || async {
        http_get(env.admin_port(0), "/readyz").filter(|(code, _)| *code == 200)
    })
    .await;
    (env, proxy)
}

/// Promise: a lease whose status write took effect is kept alive even when
/// the write's reply never came. The operator acquires a lease (Valkey
/// stands still for a moment, so the test can set the trap in between); its
/// status write to Held reaches kube-apiserver and is applied, and from that
/// request on nothing passes between the operator and the API server (the
/// reply is lost, every later request hangs) for 2.5 × leaseDuration. Valkey
/// keeps the lease with its expiry moving, and afterwards it is Held with
/// the same token, never Lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_whose_reply_is_lost_still_keeps_its_lease() {
    let (env, proxy) =
        behind_a_proxy("lost-reply", &["--api-timeout", "2s", "--timeout", "30s"]).await;
    let history = History::record(&env);
    env.valkey.freeze(true);
    env.create("job", lease_for("t").identity("job").durations("8s", "2s"))
        .await;
    env.wait_for("job", "its finalizer", SOON, |tl| {
        !tl.finalizers().is_empty()
    })
    .await;
    // The acquire is on its way to the frozen Valkey; the next request the
    // operator sends is the status write that publishes it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.trap(true);
    env.valkey.freeze(false);
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    assert!(
        proxy.sprung(),
        "the status write went through the trap\nlog:\n{}",
        env.operator_log(0)
    );
    let token = summary(&held).2.unwrap();

    let moved = lease_stays_live(&env, "t", token, LEASE * 5 / 2).await;
    proxy.restore();
    assert!(moved >= 4, "the expiry moved only {moved} times");
    held_as_before(&env, &history, "job", token).await;
}

/// Writes of `kind` operator `i` has sent (counted as they are sent, so a
/// write into a black hole counts).
fn writes_sent(env: &OperatorEnv, i: usize, kind: &str) -> f64 {
    let (_, metrics) = http_get(env.admin_port(i), "/metrics").expect("the operator's /metrics");
    let line = format!("targetlease_api_writes_total{{kind=\"{kind}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str())?.parse().ok())
        .unwrap_or(0.0)
}

/// Promise: a lease whose release has begun is kept alive until Held is
/// withdrawn. The holder pod stops being Ready, and the first write of the
/// release (the pod's unmark, before status) goes into a black hole, as does
/// every request after it, for 2.5 × leaseDuration — the operator's own
/// count shows that the request the trap caught is that unmark, and that no
/// status write was sent: the release began, and Held was never withdrawn.
/// Held stays published all that time, and Valkey keeps the lease with its
/// expiry moving. When the API server answers again the release completes:
/// marks removed, status Pending, and the lease released in Valkey (not
/// expired before that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_keeps_its_lease_alive_until_held_is_withdrawn() {
    let (env, proxy) = behind_a_proxy("release-hung", &["--api-timeout", "2s"]).await;
    env.create_pod(
        "w",
        &[("app", "w"), ("job.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    env.create(
        "job",
        lease_for("t").identity("w").pod("w").durations("8s", "2s"),
    )
    .await;
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    let token = summary(&held).2.unwrap();
    env.wait_led_by("job", "w", token, SOON).await;

    // A renewal rewrites status, then the pod's marks, about every
    // leaseDuration - renewInterval (6 s). The trap catches whatever request
    // comes next, so it is armed just after such a pair: the next request is
    // then the release's unmark, not a renewal's write that would also cut
    // off the pod watch telling the operator the pod is not Ready. A write
    // is counted as it starts, so the mark is given half a second to finish.
    let marks = writes_sent(&env, 0, "pod_mark");
    eventually(
        "a renewal's marks written",
        Duration::from_secs(20),
        || async { (writes_sent(&env, 0, "pod_mark") > marks).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (unmarks, statuses) = (
        writes_sent(&env, 0, "pod_unmark"),
        writes_sent(&env, 0, "status"),
    );
    proxy.trap(false);
    env.set_ready("w", false).await;
    eventually("the release's first write to hang", SOON, || async {
        proxy.sprung().then_some(())
    })
    .await;
    eventually("the release's unmark sent into the trap", SOON, || async {
        (writes_sent(&env, 0, "pod_unmark") > unmarks).then_some(())
    })
    .await;
    let moved = lease_stays_live(&env, "t", token, LEASE * 5 / 2).await;
    assert_eq!(
        writes_sent(&env, 0, "status"),
        statuses,
        "no status write was sent: the release hung at its first write\nlog:\n{}",
        env.operator_log(0)
    );
    let still = env.api().get("job").await.unwrap();
    assert_eq!(
        summary(&still).0,
        Some(Phase::Held),
        "Held could not be withdrawn"
    );
    proxy.restore();
    assert!(moved >= 4, "the expiry moved only {moved} times");

    let released = env
        .wait_phase("job", Phase::Pending, Duration::from_secs(60))
        .await;
    assert_eq!(
        reason(&released).as_deref(),
        Some("PodNotReady"),
        "{:?}",
        released.status
    );
    eventually("the pod unmarked", SOON, || async {
        (env.marks("w", "job").await == (None, None, None)).then_some(())
    })
    .await;
    // Events are written after the release, once the API server answers.
    let reasons = eventually("the release's Event", SOON, || async {
        let events: kube::Api<k8s_openapi::api::events::v1::Event> =
            kube::Api::namespaced(env.client.clone(), &env.ns);
        let reasons: Vec<_> = events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        reasons.iter().any(|r| r == "Released").then_some(reasons)
    })
    .await;
    assert!(
        !reasons.iter().any(|r| r == "LeaseLost"),
        "the lease never ended before its release: {reasons:?}"
    );
    let store = env.store().await;
    let r = store.get(&Target::new(&env.ns, "t")).await.unwrap();
    assert_eq!(r.outcome, Outcome::NotFound, "released");
}

/// Promise: an API-server outage that ends just after the published expiry
/// costs no flap. kube-apiserver hangs (SIGSTOP) until one second past the
/// expiry status publishes (leaseDuration 20 s renewed every 2 s, so the
/// keeper's own schedule would renew only every 6.5 s), with leader
/// election: the keeper renews the lease as soon as that expiry passes, so
/// when the API server answers the reconcile finds a confirmation sent after
/// it. Every version of the TargetLease is Held with the same token, every
/// version of the holder pod carries its marks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_ending_just_after_the_published_expiry_costs_no_flap() {
    let mut env = OperatorEnv::start_on_own_control_plane("api-past-expiry").await;
    let ns = env.ns.clone();
    env.start_operator_with(&[
        "--api-timeout",
        "2s",
        "--leader-election",
        "--leader-election-namespace",
        &ns,
        "--leader-election-duration",
        "6s",
        "--leader-election-renew-deadline",
        "4s",
        "--leader-election-retry-period",
        "1s",
    ]);
    let timeline = Timeline::record(&env.client, &ns);
    env.create_pod(
        "w",
        &[("app", "w"), ("job.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    env.create(
        "job",
        lease_for("t").identity("w").pod("w").durations("20s", "2s"),
    )
    .await;
    let held = env
        .wait_phase("job", Phase::Held, Duration::from_secs(40))
        .await;
    let token = summary(&held).2.unwrap();
    env.wait_led_by("job", "w", token, SOON).await;

    let status = env.api().get("job").await.unwrap().status.unwrap();
    let expiry = ms(&status.expires_at).expect("a published expiry");
    env.pause_apiserver(true);
    let until = expiry + 1_000;
    tokio::time::sleep(Duration::from_millis(until.saturating_sub(now_ms()))).await;
    env.pause_apiserver(false);
    env.wait_for(
        "job",
        "Held with a fresh expiry",
        Duration::from_secs(40),
        |tl| {
            let s = tl.status.clone().unwrap_or_default();
            s.phase == Some(Phase::Held) && ms(&s.expires_at).is_some_and(|e| e > until)
        },
    )
    .await;
    env.wait_led_by("job", "w", token, SOON).await;
    let (flaps, unmarked) = held_and_marked_throughout(&timeline, "job", "w", token);
    assert!(
        flaps.is_empty() && unmarked.is_empty(),
        "job was not Held throughout: {flaps:?}\nthe pod lost its marks: {unmarked:?}\nlog:\n{}",
        env.operator_log(0)
    );
    let violations = timeline.violations();
    assert!(violations.is_empty(), "{violations:#?}");
}

/// The versions of TargetLease `tl` after its first Held that are not Held
/// with `token`, and the versions of pod `pod` after it was first marked that
/// do not carry `tl`'s marks with `token`.
fn held_and_marked_throughout(
    timeline: &Timeline,
    tl: &str,
    pod: &str,
    token: u64,
) -> (Vec<String>, Vec<String>) {
    let versions = timeline.lease_versions(tl);
    let first_held = versions
        .iter()
        .position(|(_, _, v)| {
            v.as_ref()
                .is_some_and(|t| summary(t).0 == Some(Phase::Held))
        })
        .expect("a Held version");
    let flaps = versions[first_held..]
        .iter()
        .filter_map(|(rv, _, v)| {
            let v = v.as_ref()?;
            let (phase, _, t) = summary(v);
            (phase != Some(Phase::Held) || t != Some(token))
                .then(|| format!("rv {rv}: {:?} {:?}", summary(v), reason(v)))
        })
        .collect();
    let leader_label = format!("{tl}.targetlease.dev/leader");
    let token_annotation = format!("{tl}.targetlease.dev/fencing-token");
    let pod_versions: Vec<_> = timeline
        .entries()
        .into_iter()
        .filter_map(|e| match e.change {
            Change::Pod(name, p) if name == pod => Some((e.rv, p)),
            _ => None,
        })
        .collect();
    let first_marked = pod_versions
        .iter()
        .position(|(_, p)| {
            p.as_ref()
                .is_some_and(|p| p.labels().contains_key(&leader_label))
        })
        .expect("a marked version of the pod");
    let unmarked = pod_versions[first_marked..]
        .iter()
        .filter(|(_, p)| {
            !p.as_ref().is_some_and(|p| {
                p.labels().get(&leader_label).map(String::as_str) == Some("true")
                    && p.annotations().get(&token_annotation) == Some(&token.to_string())
            })
        })
        .map(|(rv, p)| format!("rv {rv}: {:?}", p.as_ref().map(|p| p.labels())))
        .collect();
    (flaps, unmarked)
}
