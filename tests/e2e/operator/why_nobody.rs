//! Why nobody is elected (`PodNotOptedIn`) is asked of the API server, which
//! filters and sends metadata only, one page per question, and only so often
//! per election.

use std::time::Instant;

use super::*;
use support::audit;

/// However often an election that elects nobody is woken (a pod it matches
/// changes every 200 ms for 21 s), the API server is asked why at most every
/// 10 s — the audit log shows two or three questions, not one per wake — and
/// each question is filtered by the server (the selector and "did not opt
/// in") and is one request for one page of 20: the reason names the first
/// and counts the rest as the server does (all 23 when it gives a
/// `remainingItemCount`, "at least 20" when not — as for a label-selected
/// list).
#[tokio::test]
async fn why_nobody_is_elected_is_asked_at_most_every_ten_seconds() {
    let env = OperatorEnv::start("why-nobody").await;
    for i in 0..23 {
        env.create_pod(&format!("bystander-{i:02}"), &[("app", "web")], true)
            .await;
    }
    // Opted in but not Ready: every change of it wakes the election.
    env.create_pod("waiting", &[("app", "web"), WEB_LEADER_CANDIDATE], false)
        .await;
    env.create(
        "web-leader",
        lease_for("web-leader").elect("web").durations("3s", "1s"),
    )
    .await;
    env.wait_reason("web-leader", "PodNotOptedIn", SOON).await;

    let from = k8s_openapi::jiff::Timestamp::now();
    let window = Duration::from_secs(21);
    let until = Instant::now() + window;
    let mut changes = 0;
    while Instant::now() < until {
        let tick = json!({ "metadata": { "labels": { "tick": changes.to_string() } } });
        env.pods()
            .patch("waiting", &PatchParams::default(), &Patch::Merge(&tick))
            .await
            .expect("change the waiting pod");
        changes += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let to = k8s_openapi::jiff::Timestamp::now();

    let asked = "web-leader.targetlease.dev/candidate!=true";
    let lists = audit::pod_lists_in(env.cp, &env.ns);
    let questions: Vec<_> = lists
        .iter()
        .filter(|l| l.uri.contains(asked) && !l.uri.contains("continue="))
        .filter(|l| l.received >= from && l.received <= to)
        .collect();
    let shown = |ls: &[&audit::Write]| {
        ls.iter()
            .map(|l| format!("{} {}", l.received, l.uri))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        (2..=3).contains(&questions.len()),
        "{} questions in {window:?} of {changes} changes:\n{}",
        questions.len(),
        shown(&questions)
    );
    for q in &questions {
        assert!(
            q.uri.contains("app=web,") && q.uri.contains("limit=20"),
            "filtered by the server, paged: {}",
            q.uri
        );
    }
    let pages: Vec<_> = lists
        .iter()
        .filter(|l| l.uri.contains(asked) && l.uri.contains("continue="))
        .collect();
    assert!(
        pages.is_empty(),
        "one request per question, no second page:\n{}",
        shown(&pages)
    );
    // The operator's own watch of the namespace's pods lists in pages of 20 too.
    let watch_lists: Vec<_> = lists
        .iter()
        .filter(|l| !l.uri.contains("labelSelector"))
        .collect();
    assert!(
        !watch_lists.is_empty() && watch_lists.iter().all(|l| l.uri.contains("limit=20")),
        "the pod watch lists in pages of 20:\n{}",
        shown(&watch_lists)
    );
    // Asked again since every pod was Ready in the cache: the first page's
    // 20 are counted, and the rest as the server counts them.
    let waiting = env.api().get("web-leader").await.unwrap();
    assert_eq!(summary(&waiting).0, Some(Phase::Pending));
    let message = &condition(&waiting, "Held").unwrap().message;
    let counted = message.starts_with("20 Ready pod(s)")
        && message.ends_with("(the first 20 of 23 matching pods checked)");
    let uncounted = message.starts_with("at least 20 Ready pod(s)")
        && message.ends_with("(the first 20 matching pods checked; more match)");
    assert!(
        (counted || uncounted) && message.contains("bystander-00"),
        "one page read, the rest counted by the server or said to be more: {message}"
    );
}
