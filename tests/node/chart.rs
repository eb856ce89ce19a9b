//! The chart as it ships, running as pods: Ready through its own probes
//! under Pod Security `restricted`, scraped through its Service, and its
//! leader pod killed without a lease moving.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fixture::{OPERATOR_IMAGE, OPERATOR_NS, RELEASE, eventually, is_ready, name, node};

const SELECTOR: &str = "app.kubernetes.io/instance=targetlease";

#[test]
fn chart_runs_two_ready_replicas_under_restricted_pod_security_and_serves_metrics() {
    let (node, _turn) = node();

    let ns = node.json(&["get", "namespace", OPERATOR_NS]);
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
        "the operator's namespace enforces Pod Security restricted"
    );
    // Enforced, not just labelled: a privileged pod is refused there.
    let refused = node.try_kubectl(
        &["apply", "-n", OPERATOR_NS, "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: privileged}}\nspec:\n  containers:\n  \
             - {{name: c, image: {OPERATOR_IMAGE}, securityContext: {{privileged: true}}}}\n"
        )),
    );
    let err = refused.expect_err("a privileged pod must be refused in the restricted namespace");
    assert!(
        err.contains("violates PodSecurity"),
        "refused for another reason: {err}"
    );

    let deploy = node.json(&["-n", OPERATOR_NS, "get", "deployment", RELEASE]);
    assert_eq!(
        deploy["spec"]["replicas"], 2,
        "the chart ships two replicas"
    );
    // Both Ready (the kill test, if it ran first, restarted one: wait).
    let pods = eventually(
        "both operator replicas Ready",
        Duration::from_secs(120),
        || {
            let d = node.json(&["-n", OPERATOR_NS, "get", "deployment", RELEASE]);
            let pods = node.pods(OPERATOR_NS, SELECTOR);
            (d["status"]["readyReplicas"] == 2 && pods.len() == 2 && pods.iter().all(is_ready))
                .then_some(pods)
        },
        || node.describe(OPERATOR_NS),
    );
    for pod in &pods {
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["image"], OPERATOR_IMAGE);
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(pod["spec"]["securityContext"]["runAsUser"], 65532);
    }
    // Ready without a restart: checked on the pods as the install left them
    // (the kill test restarts a container, and may run first).
    assert_eq!(node.operator_pods_at_install.len(), 2);
    for pod in &node.operator_pods_at_install {
        assert!(
            is_ready(pod),
            "pod {} was not Ready after install",
            name(pod)
        );
        assert_eq!(
            pod["status"]["containerStatuses"][0]["restartCount"], 0,
            "{pod:#}"
        );
    }

    // One of them leads (the coordination.k8s.io Lease names it).
    let leader = operator_leader(node);
    assert!(
        pods.iter()
            .any(|p| leader.starts_with(&format!("{}_", name(p)))),
        "the operator Lease names {leader}, not one of the pods"
    );

    // /metrics through the Service: the API server's service proxy picks an
    // endpoint from the Service's EndpointSlices and dials the pod on the
    // bridge (no kube-proxy here, so ClusterIPs are not routed).
    let path = format!(
        "/api/v1/namespaces/{OPERATOR_NS}/services/http:{RELEASE}-metrics:metrics/proxy/metrics"
    );
    let metrics = node.kubectl(&["get", "--raw", &path]);
    assert!(
        metrics.contains("targetlease_build_info{"),
        "no targetlease_build_info in the scrape:\n{metrics}"
    );
}

#[test]
fn killing_the_operator_leader_pod_hands_over_without_moving_a_lease() {
    let (node, _turn) = node();
    let ns = node.namespace("operator-kill");
    node.apply(
        &ns,
        "apiVersion: targetlease.dev/v1alpha1\nkind: TargetLease\nmetadata: {name: db}\n\
         spec: {target: db, holder: {identity: batch}, leaseDuration: 60s, renewInterval: 5s}\n",
    );
    let token = eventually(
        "TargetLease db Held",
        Duration::from_secs(60),
        || {
            let tl = node.json(&["-n", &ns, "get", "targetlease", "db"]);
            (tl["status"]["phase"] == "Held").then(|| tl["status"]["fencingToken"].clone())
        },
        || node.describe(&ns),
    );
    let watch = node.watch(&ns, "targetlease", "db");

    let leader = operator_leader(node);
    let leader_pod = leader.split('_').next().unwrap_or_default().to_string();
    // SIGSTOP first: a frozen leader can neither renew nor be restarted in
    // place before its Lease expires, so only the standby can take over (a
    // SIGKILLed container restarts at once and may win the election again).
    let frozen = signal_operator_process(node, &leader_pod, "STOP");
    eprintln!("froze the operator leader {leader_pod} (pid {frozen}) with SIGSTOP");
    let t = Instant::now();
    let next = eventually(
        "the standby to take over the operator Lease",
        Duration::from_secs(90),
        || {
            let now = operator_leader(node);
            (!now.is_empty() && now != leader).then_some(now)
        },
        || node.describe(OPERATOR_NS),
    );
    assert!(
        !next.starts_with(&format!("{leader_pod}_")),
        "the frozen pod {leader_pod} leads again ({next}): the standby did not take over"
    );
    signal(frozen, "KILL");
    eprintln!("killed the frozen leader (pid {frozen}) with SIGKILL");
    eprintln!(
        "the standby {next} leads {:.1}s after the freeze",
        t.elapsed().as_secs_f64()
    );

    // The new leader renews the lease it inherited: its expiry in Valkey
    // moves on (renewals do not rewrite status.expiresAt, docs/operator.md).
    let expiry = || {
        let got = node.cli(&["lease", "get", "--target", "db", "--namespace", &ns]);
        let got: Value = serde_json::from_slice(&got.stdout).expect("lease get prints JSON");
        assert_eq!(
            got["lease"]["fencing_token"], token,
            "Valkey's lease: {got}"
        );
        got["lease"]["expires_at_ms"].as_u64().unwrap_or_default()
    };
    let before = expiry();
    eventually(
        "the new operator leader to renew the lease in Valkey",
        Duration::from_secs(30),
        || (expiry() > before).then_some(()),
        || node.describe(OPERATOR_NS),
    );

    let seen = watch.seen();
    assert!(!seen.is_empty(), "the watch saw nothing");
    for (_, tl) in &seen {
        assert_eq!(tl["status"]["phase"], "Held", "the lease flapped: {tl:#}");
        assert_eq!(
            tl["status"]["fencingToken"], token,
            "the token moved: {tl:#}"
        );
        assert_eq!(tl["status"]["holder"], "batch", "the holder moved: {tl:#}");
    }
    // The killed container restarts; both replicas are Ready again.
    eventually(
        "both operator replicas Ready again",
        Duration::from_secs(120),
        || {
            let pods = node.pods(OPERATOR_NS, SELECTOR);
            (pods.len() == 2 && pods.iter().all(is_ready)).then_some(())
        },
        || node.describe(OPERATOR_NS),
    );
    node.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
}

/// holderIdentity of the operator's coordination.k8s.io Lease (`POD_uuid`).
fn operator_leader(node: &crate::fixture::Node) -> String {
    let lease = node.json(&["-n", OPERATOR_NS, "get", "lease", "targetlease-operator"]);
    lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Sends SIG to the `targetlease operator` process of POD (found by the
/// pod's UID in its cgroup path; no SIGTERM, so no handover); returns its pid.
fn signal_operator_process(node: &crate::fixture::Node, pod: &str, sig: &str) -> u32 {
    let uid = node.kubectl(&[
        "-n",
        OPERATOR_NS,
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let mark = format!("pod{uid}");
    let mut found = HashSet::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if cgroup.contains(&mark)
            && argv.first().is_some_and(|a| a.ends_with(b"/targetlease"))
            && argv.get(1) == Some(&&b"operator"[..])
        {
            found.insert(pid);
        }
    }
    assert_eq!(
        found.len(),
        1,
        "want one operator process in pod {pod}, found {found:?}"
    );
    let pid = *found.iter().next().expect("one pid");
    signal(pid, sig);
    pid
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}
