//! The operator process under test, and the metrics read from it and from
//! the API server.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::kube_env::ControlPlane;
use crate::support::operator_env::http_get;
use crate::support::valkey_server::{ValkeyServer, free_port};

/// How an operator process is started.
#[derive(Clone, Copy)]
pub(super) struct How<'a> {
    /// The one namespace it watches; every namespace when `None`.
    pub watch: Option<&'a str>,
    /// A profiler's command line to run it through (none when empty).
    pub wrapper: &'a [&'a std::ffi::OsStr],
    /// Its `--concurrency` (the default when `None`).
    pub concurrency: Option<u16>,
    /// Another binary than the run's operator (`BENCH_OPERATOR_EXE`, else
    /// this build's).
    pub exe: Option<&'a std::path::Path>,
}

/// One operator process with its admin port.
pub(super) struct Operator {
    child: Child,
    admin_port: u16,
}

impl Operator {
    /// An operator watching namespace `ns` only (its token floors in `ns`).
    pub(super) fn start(
        cp: &ControlPlane,
        valkey: &ValkeyServer,
        ns: &str,
        dir: &Path,
        n: usize,
    ) -> Self {
        Self::start_with(cp, valkey, ns, dir, n, None)
    }

    /// The same, with `--concurrency` when given (else the default).
    pub(super) fn start_with(
        cp: &ControlPlane,
        valkey: &ValkeyServer,
        ns: &str,
        dir: &Path,
        n: usize,
        concurrency: Option<u16>,
    ) -> Self {
        let how = How {
            watch: Some(ns),
            wrapper: &[],
            concurrency,
            exe: None,
        };
        Self::start_watching(cp, valkey, ns, dir, n, &how)
    }

    /// An operator started as `how` says, its token floors in `floor_ns`.
    pub(super) fn start_watching(
        cp: &ControlPlane,
        valkey: &ValkeyServer,
        floor_ns: &str,
        dir: &Path,
        n: usize,
        how: &How<'_>,
    ) -> Self {
        let How {
            watch,
            wrapper,
            concurrency,
            exe,
        } = *how;
        let admin_port = free_port();
        let log =
            std::fs::File::create(dir.join(format!("operator-{floor_ns}-{n}.log"))).expect("log");
        // Another build of the operator, to compare two in one run.
        let exe = exe.map(|p| p.as_os_str().to_owned()).unwrap_or_else(|| {
            std::env::var_os("BENCH_OPERATOR_EXE")
                .unwrap_or_else(|| env!("CARGO_BIN_EXE_targetlease").into())
        });
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.arg("operator")
            .args(["--admin-addr", &format!("127.0.0.1:{admin_port}")])
            .args(["--valkey-url", &valkey.url()])
            .arg("--lease-id-key-file")
            .arg(dir.join("lease-id-key"))
            .args(["--floor-namespace", floor_ns]);
        if let Some(ns) = watch {
            cmd.args(["--watch-namespace", ns]);
        }
        if let Some(c) = concurrency {
            cmd.args(["--concurrency", &c.to_string()]);
        }
        let child = cmd
            .env("KUBECONFIG", cp.kubeconfig_path())
            .env("POD_NAME", format!("bench-operator-{n}"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start targetlease operator");
        Operator { child, admin_port }
    }

    pub(super) async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if matches!(http_get(self.admin_port, "/readyz"), Some((200, _))) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// The operator's own process: the child, or under a wrapper the
    /// wrapper's child that runs our binary.
    pub(super) fn pid(&self) -> u32 {
        let me = self.child.id();
        std::fs::read_to_string(format!("/proc/{me}/task/{me}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .find(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "targetlease")
            })
            .unwrap_or(me)
    }

    /// (VmHWM, VmRSS) in kB.
    pub(super) fn rss(&self) -> (u64, u64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmHWM:"), field("VmRSS:"))
    }

    pub(super) fn metrics(&self) -> Metrics {
        Metrics::parse(
            &http_get(self.admin_port, "/metrics")
                .map(|(_, b)| b)
                .unwrap_or_default(),
        )
    }

    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the operator (SIGSTOP): it sends nothing until [`Self::resume`].
    pub(super) fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused operator go on (SIGCONT).
    pub(super) fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let sent = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(sent, "kill {sig} to the operator failed");
    }

    /// SIGTERM to the operator, then waits for the child (and a wrapper's
    /// own work after the operator exits).
    pub(super) fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Prometheus text, as (name, labels) -> value.
pub(super) struct Metrics(Vec<(String, String, f64)>);

impl Metrics {
    pub(super) fn parse(text: &str) -> Metrics {
        Metrics(
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    let value: f64 = value.parse().ok()?;
                    let (name, labels) = match series.split_once('{') {
                        Some((n, rest)) => (n, rest.trim_end_matches('}')),
                        None => (series, ""),
                    };
                    Some((name.to_string(), labels.to_string(), value))
                })
                .collect(),
        )
    }

    /// Sum of a metric over series whose labels contain every `k="v"` given.
    pub(super) fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.split(',').any(|p| p == format!("{k}=\"{v}\"")))
            })
            .map(|(_, _, v)| v)
            .sum()
    }
}

/// The API server's request counters, through the bench's own client:
/// counted within a round trip of the call (a `kubectl` process would first
/// start and shake hands while the operator's writes go on).
pub(super) async fn apiserver_metrics(client: &kube::Client) -> Metrics {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a GET request");
    let text = client.request_text(req).await.expect("GET /metrics");
    let m = Metrics::parse(&text);
    assert!(
        m.0.iter().any(|(n, _, _)| n == "apiserver_request_total"),
        "the API server's metrics have no apiserver_request_total"
    );
    m
}

pub(super) const WRITE_VERBS: [&str; 5] = ["APPLY", "PATCH", "UPDATE", "POST", "DELETE"];

/// TargetLease writes by the operator (all but creates and deletes) between
/// two scrapes, by verb, subresource and response code, the most first:
/// where writes beyond the expected ones went.
pub(super) fn tl_write_kinds(before: &Metrics, after: &Metrics) -> Vec<(String, f64)> {
    let label = |l: &str, k: &str| {
        l.split(',')
            .find_map(|p| p.strip_prefix(&format!("{k}=\"")))
            .map(|v| v.trim_end_matches('"').to_string())
            .unwrap_or_default()
    };
    let mut kinds: std::collections::BTreeMap<String, f64> = Default::default();
    for (m, sign) in [(after, 1.0), (before, -1.0)] {
        for (n, l, v) in &m.0 {
            let verb = label(l, "verb");
            if n != "apiserver_request_total"
                || label(l, "resource") != "targetleases"
                || !WRITE_VERBS.contains(&verb.as_str())
                || verb == "POST"
                || verb == "DELETE"
            {
                continue;
            }
            let sub = label(l, "subresource");
            let what = format!(
                "{verb}{} {}",
                if sub.is_empty() {
                    String::new()
                } else {
                    format!(" {sub}")
                },
                label(l, "code")
            );
            *kinds.entry(what).or_default() += sign * v;
        }
    }
    let mut kinds: Vec<(String, f64)> = kinds.into_iter().filter(|(_, n)| *n > 0.0).collect();
    kinds.sort_by(|a, b| b.1.total_cmp(&a.1));
    kinds
}

/// TargetLease writes by the operator (status subresource, or all but creates).
pub(super) fn tl_writes(m: &Metrics, status_only: bool) -> f64 {
    let mut total = 0.0;
    for verb in WRITE_VERBS {
        if verb == "POST" || verb == "DELETE" {
            continue; // the bench's creates and deletes
        }
        if status_only {
            total += m.sum(
                "apiserver_request_total",
                &[
                    ("resource", "targetleases"),
                    ("subresource", "status"),
                    ("verb", verb),
                ],
            );
        } else {
            total += m.sum(
                "apiserver_request_total",
                &[("resource", "targetleases"), ("verb", verb)],
            );
        }
    }
    total
}

/// The mean time the API server took over the operator's TargetLease
/// writes (all but creates and deletes) between two scrapes, in
/// milliseconds (`apiserver_request_duration_seconds`); `None` with none.
pub(super) fn tl_write_ms(before: &Metrics, after: &Metrics) -> Option<f64> {
    let (mut secs, mut count) = (0.0, 0.0);
    for verb in WRITE_VERBS {
        if verb == "POST" || verb == "DELETE" {
            continue;
        }
        let labels = [("resource", "targetleases"), ("verb", verb)];
        let delta = |name: &str| after.sum(name, &labels) - before.sum(name, &labels);
        secs += delta("apiserver_request_duration_seconds_sum");
        count += delta("apiserver_request_duration_seconds_count");
    }
    (count > 0.0).then(|| secs * 1e3 / count)
}

pub(super) fn store_call_means(m: &Metrics) -> Vec<(String, f64, f64)> {
    let mut ops: Vec<String> =
        m.0.iter()
            .filter(|(n, _, _)| n == "targetlease_store_call_duration_seconds_count")
            .filter_map(|(_, l, _)| {
                l.split(',')
                    .find_map(|p| p.strip_prefix("operation=\""))
                    .map(|v| v.trim_end_matches('"').to_string())
            })
            .collect();
    ops.sort();
    ops.dedup();
    ops.into_iter()
        .map(|op| {
            let count = m.sum(
                "targetlease_store_call_duration_seconds_count",
                &[("operation", &op)],
            );
            let sum = m.sum(
                "targetlease_store_call_duration_seconds_sum",
                &[("operation", &op)],
            );
            (op, if count > 0.0 { sum / count * 1e3 } else { 0.0 }, count)
        })
        .collect()
}

pub(super) fn renews(m: &Metrics) -> f64 {
    m.sum("targetlease_store_calls_total", &[("operation", "renew")])
}
