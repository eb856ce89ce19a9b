//! `targetlease token`: hand a workload its fencing token from a TargetLease's
//! status, as an init container (wait until Held, print, exit) or a sidecar
//! (`--follow`: keep a file up to date, empty whenever the lease is not held
//! for this pod). Needs only `get`/`list`/`watch` on targetleases, no kubectl.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::watcher;
use serde::Serialize;

use super::output::{EXIT_BACKEND, EXIT_REFUSED, EXIT_USAGE};
use crate::crd::{Phase, TargetLease};

/// Flags of `token`.
#[derive(Args, Debug)]
pub struct TokenArgs {
    /// The TargetLease to read.
    #[arg(long, env = "TARGETLEASE_LEASE")]
    lease: String,
    /// Its namespace (default: this pod's, from the service account, or the kubeconfig's).
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: Option<String>,
    /// The lease counts as held when it is tied to this pod (`status.holderPod`;
    /// default: $POD_NAME, then $HOSTNAME).
    #[arg(long, env = "POD_NAME")]
    pod: Option<String>,
    /// Or when this identity holds it (`status.holder`), e.g. for a Job named
    /// by `holder.identity` (wins over --pod).
    #[arg(long, env = "TARGETLEASE_IDENTITY")]
    identity: Option<String>,
    /// Give up after this long (exit 1); absent: wait as long as it takes; `0s`: look once.
    #[arg(long, env = "TARGETLEASE_WAIT", value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
    /// Write the token to this file (atomically; empty while not held).
    #[arg(long, env = "TARGETLEASE_TOKEN_FILE")]
    file: Option<PathBuf>,
    /// Keep running and keep `--file` up to date (a sidecar); never exits on its own.
    #[arg(long, requires = "file")]
    follow: bool,
}

/// Whose lease counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Who {
    /// Tied to this pod.
    Pod(String),
    /// Held by this identity.
    Identity(String),
}

/// A lease held for `Who`, as status publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Claim {
    /// Always `held`.
    pub outcome: &'static str,
    /// Namespace of the TargetLease.
    pub namespace: String,
    /// Name of the TargetLease.
    pub lease: String,
    /// The holder identity.
    pub holder: String,
    /// The fencing token: send it with every write.
    pub fencing_token: u64,
    /// The published lower bound of the lease's expiry (RFC 3339).
    pub expires_at: String,
}

/// The claim `tl` publishes for `who` at `now`: Held, for them, and its
/// published expiry not passed. No client required.
pub fn claim(tl: &TargetLease, who: &Who, now: Timestamp) -> Option<Claim> {
    let s = tl.status.as_ref()?;
    if s.phase != Some(Phase::Held) {
        return None;
    }
    let mine = match who {
        Who::Pod(p) => s.holder_pod.as_deref() == Some(p.as_str()),
        Who::Identity(i) => s.holder.as_deref() == Some(i.as_str()),
    };
    let expires = s.expires_at.as_ref()?.0;
    (mine && expires > now).then(|| Claim {
        outcome: "held",
        namespace: tl.metadata.namespace.clone().unwrap_or_default(),
        lease: tl.metadata.name.clone().unwrap_or_default(),
        holder: s.holder.clone().unwrap_or_default(),
        fencing_token: s.fencing_token.unwrap_or_default(),
        expires_at: expires.to_string(),
    })
}

/// Replaces `path` with `text` in one rename, so a reader never sees half a token.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Runs `token`.
pub async fn main(args: TokenArgs) -> ExitCode {
    let TokenArgs {
        lease,
        namespace,
        pod,
        identity,
        wait,
        file,
        follow,
    } = args;
    let who = match (identity, pod.or_else(|| std::env::var("HOSTNAME").ok())) {
        (Some(i), _) => Who::Identity(i),
        (None, Some(p)) => Who::Pod(p),
        (None, None) => {
            eprintln!("targetlease token: give --pod (or set POD_NAME) or --identity");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("targetlease token: kubernetes client: {e}");
            return ExitCode::from(EXIT_BACKEND);
        }
    };
    let ns = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
    let api: Api<TargetLease> = Api::namespaced(client, &ns);
    let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
    let mut events = watcher::watcher(api, config).boxed();
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    let mut current: Option<Claim> = None;
    let mut latest: Option<TargetLease> = None;
    let mut written = false;
    loop {
        let now = Timestamp::now();
        let found = latest.as_ref().and_then(|tl| claim(tl, &who, now));
        if found != current || !written {
            written = true;
            if let Some(path) = &file {
                let text = found
                    .as_ref()
                    .map(|c| c.fencing_token.to_string())
                    .unwrap_or_default();
                if let Err(e) = write_atomically(path, &text) {
                    eprintln!("targetlease token: cannot write {}: {e}", path.display());
                    return ExitCode::from(EXIT_BACKEND);
                }
            }
            current = found;
        }
        if let (Some(c), false) = (&current, follow) {
            println!("{}", serde_json::to_string(c).unwrap_or_default());
            return ExitCode::SUCCESS;
        }
        // Wake at the next event, at the published expiry, or at the deadline.
        let expiry = current
            .as_ref()
            .and_then(|c| c.expires_at.parse::<Timestamp>().ok());
        let until_expiry = expiry
            .map(|e| Duration::from_millis(e.duration_since(now).as_millis().max(0) as u64))
            .unwrap_or(Duration::from_secs(3600));
        let until_deadline =
            deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
        if !follow && until_deadline == Some(Duration::ZERO) {
            let out = serde_json::json!({ "outcome": "not_held", "namespace": ns, "lease": lease });
            println!("{out}");
            return ExitCode::from(EXIT_REFUSED);
        }
        let sleep = until_deadline.map_or(until_expiry, |d| d.min(until_expiry));
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(tl) | watcher::Event::InitApply(tl))) => latest = Some(tl),
                Some(Ok(watcher::Event::Delete(_))) => latest = None,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "watch failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                None => return ExitCode::from(EXIT_BACKEND),
            },
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::TargetLeaseStatus;
    use crate::reconcile::transition::time_ms;

    fn tl(phase: Phase, expires_ms: u64) -> TargetLease {
        let spec = serde_json::from_value(
            serde_json::json!({"target": "t", "holder": {"identity": "job", "podName": "job-pod"}}),
        )
        .unwrap();
        let mut t = TargetLease::new("l", spec);
        t.status = Some(TargetLeaseStatus {
            phase: Some(phase),
            holder: Some("job".into()),
            holder_pod: Some("job-pod".into()),
            fencing_token: Some(9_007_199_254_740_993),
            expires_at: time_ms(expires_ms),
            ..Default::default()
        });
        t
    }

    #[test]
    fn a_claim_needs_held_for_this_holder_and_an_unexpired_lease() {
        let now = Timestamp::from_second(1_000).unwrap();
        let held = tl(Phase::Held, 2_000_000);
        let c = claim(&held, &Who::Pod("job-pod".into()), now).unwrap();
        assert_eq!(c.fencing_token, 9_007_199_254_740_993);
        assert!(claim(&held, &Who::Identity("job".into()), now).is_some());
        assert!(claim(&held, &Who::Pod("other".into()), now).is_none());
        assert!(
            claim(
                &tl(Phase::Unknown, 2_000_000),
                &Who::Pod("job-pod".into()),
                now
            )
            .is_none()
        );
        assert!(claim(&tl(Phase::Held, 999_000), &Who::Pod("job-pod".into()), now).is_none());
    }
}
