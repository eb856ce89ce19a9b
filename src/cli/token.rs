//! `targetlease token`: hand a workload its fencing token from a TargetLease's
//! status, as an init container (wait until Held, print, exit) or a sidecar
//! (`--follow`: keep a file up to date, empty whenever the lease is not held
//! for this pod). Needs only `get`/`list`/`watch` on targetleases, no kubectl.
//!
//! Answers (exit code): `held` (0); `not_held` (1): the TargetLease exists
//! but is not held for you when the wait ends; `not_found` or `forbidden`
//! (4): there is no such TargetLease, or you may not read it; 3: the API
//! server could not be reached; 2: bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::watcher;
use serde::Serialize;

mod file;

use super::lease::{DEFAULT_WAIT, default_namespace};
use super::output::{
    EXIT_BACKEND, EXIT_REFUSED, EXIT_USAGE, Format, OutputArgs, print_out, to_yaml,
};
use crate::operator::crd::{Phase, TargetLease};

/// Exit code when the TargetLease does not exist or cannot be read.
pub const EXIT_NOT_VISIBLE: u8 = 4;

/// How long one read of the TargetLease may take before the API server
/// counts as unreachable.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Flags of `token`.
#[derive(Args, Debug)]
pub struct TokenArgs {
    /// The TargetLease to read.
    #[arg(long, env = "TARGETLEASE_LEASE")]
    lease: String,
    /// Its namespace. Default, as for every command: in a pod, its namespace
    /// ($POD_NAMESPACE or its service account's); else the kubeconfig's; else `default`.
    #[arg(long, env = "TARGETLEASE_NAMESPACE", default_value_t = default_namespace(), hide_default_value = true)]
    namespace: String,
    /// The lease counts as held when it is tied to this pod (`status.holderPod`;
    /// default: $POD_NAME, then $HOSTNAME).
    #[arg(long, env = "POD_NAME")]
    pod: Option<String>,
    /// This pod's UID (downward API: `fieldRef: {fieldPath: metadata.uid}`).
    /// With it, the lease counts only when status ties it to this very pod
    /// (`status.holderPodUID`): a pod recreated under the same name (a
    /// StatefulSet pod force-deleted) never reads its predecessor's token.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    /// Or when this identity holds it (`status.holder`), e.g. for a Job named
    /// by `holder.identity` (wins over --pod).
    #[arg(long, env = "TARGETLEASE_IDENTITY")]
    identity: Option<String>,
    /// Give up after this long: exit 1 (not held for you) or 4 (no such
    /// TargetLease, or not readable). `0s`: read once and answer.
    #[arg(long, env = "TARGETLEASE_WAIT", default_value = DEFAULT_WAIT, value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Read once and answer (the same as `--wait 0s`; wins over --wait).
    #[arg(short = 'n', long, env = "TARGETLEASE_NONBLOCK")]
    nonblock: bool,
    /// Write the token to this file (replaced in one rename; empty while not held).
    #[arg(long, env = "TARGETLEASE_TOKEN_FILE")]
    file: Option<PathBuf>,
    /// Permissions of --file, in octal.
    #[arg(long, env = "TARGETLEASE_TOKEN_FILE_MODE", default_value = "0644", value_parser = file::parse_mode)]
    file_mode: u32,
    /// Keep running and keep `--file` up to date (a sidecar); never exits on its own.
    #[arg(long, requires = "file")]
    follow: bool,
    /// How the answer is printed.
    #[command(flatten)]
    out: OutputArgs,
}

/// Whose lease counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Who {
    /// Tied to this pod: by name, and by UID when it is known.
    Pod {
        /// The pod's name.
        name: String,
        /// The pod's UID.
        uid: Option<String>,
    },
    /// Held by this identity.
    Identity(String),
}

/// Status ties the lease to a pod of this name but another incarnation
/// (another UID, or none recorded) than `who`: not ours, however Held.
pub fn names_another_incarnation(tl: &TargetLease, who: &Who) -> bool {
    let (
        Some(s),
        Who::Pod {
            name,
            uid: Some(uid),
        },
    ) = (tl.status.as_ref(), who)
    else {
        return false;
    };
    s.holder_pod.as_deref() == Some(name.as_str()) && s.holder_pod_uid.as_deref() != Some(uid)
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
        Who::Pod { name, .. } => {
            s.holder_pod.as_deref() == Some(name.as_str()) && !names_another_incarnation(tl, who)
        }
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

/// What the last read of the TargetLease found.
#[derive(Clone, Debug)]
enum Seen {
    /// The object.
    Object(Box<TargetLease>),
    /// It does not exist.
    Missing,
    /// The API server refused to show it (401/403).
    Forbidden(String),
    /// The API server could not be asked.
    Unreachable(String),
}

impl Seen {
    fn of_error(e: &kube::Error) -> Seen {
        match e {
            kube::Error::Api(status) => Seen::of_status(status.code, &status.message),
            other => Seen::Unreachable(other.to_string()),
        }
    }

    fn of_status(code: u16, message: &str) -> Seen {
        match code {
            404 => Seen::Missing,
            401 | 403 => Seen::Forbidden(message.to_owned()),
            _ => Seen::Unreachable(format!("{code}: {message}")),
        }
    }

    fn of_watch_error(e: &watcher::Error) -> Seen {
        match e {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => Seen::of_error(e),
            watcher::Error::WatchError(status) => Seen::of_status(status.code, &status.message),
            other => Seen::Unreachable(other.to_string()),
        }
    }
}

/// What `token` prints when the lease is not (or cannot be seen) held.
#[derive(Serialize)]
struct Absent<'a> {
    outcome: &'static str,
    namespace: &'a str,
    lease: &'a str,
    message: String,
}

impl Absent<'_> {
    fn exit_code(&self) -> u8 {
        match self.outcome {
            "not_held" => EXIT_REFUSED,
            "not_found" | "forbidden" => EXIT_NOT_VISIBLE,
            _ => EXIT_BACKEND,
        }
    }
}

fn absent<'a>(seen: &Seen, namespace: &'a str, lease: &'a str, who: &Who) -> Absent<'a> {
    let whom = match who {
        Who::Pod { name, .. } => format!("pod {name}"),
        Who::Identity(i) => format!("identity {i}"),
    };
    let (outcome, message) = match seen {
        Seen::Object(_) => (
            "not_held",
            format!("the TargetLease is not held for {whom}"),
        ),
        Seen::Missing => ("not_found", "no such TargetLease".to_owned()),
        Seen::Forbidden(why) => ("forbidden", format!("not allowed to read it: {why}")),
        Seen::Unreachable(why) => (
            "unreachable",
            format!("the API server did not answer: {why}"),
        ),
    };
    Absent {
        outcome,
        namespace,
        lease,
        message,
    }
}

fn print<T: Serialize>(format: Format, value: &T, text: String) {
    match format {
        Format::Json => print_out(&format!(
            "{}\n",
            serde_json::to_string(value).unwrap_or_default()
        )),
        Format::Yaml => print_out(&to_yaml(value)),
        Format::Text => print_out(&format!("{text}\n")),
    }
}

/// Reads the TargetLease once, within [`READ_TIMEOUT`].
async fn read_once(api: &Api<TargetLease>, name: &str) -> Seen {
    match tokio::time::timeout(READ_TIMEOUT, api.get_opt(name)).await {
        Ok(Ok(Some(tl))) => Seen::Object(Box::new(tl)),
        Ok(Ok(None)) => Seen::Missing,
        Ok(Err(e)) => Seen::of_error(&e),
        Err(_) => Seen::Unreachable(format!("no answer within {READ_TIMEOUT:?}")),
    }
}

/// Runs `token`.
pub async fn main(args: TokenArgs) -> ExitCode {
    let TokenArgs {
        lease,
        namespace: ns,
        pod,
        pod_uid,
        identity,
        wait,
        nonblock,
        file,
        file_mode,
        follow,
        out,
    } = args;
    let format = out.or(Format::Json);
    let wait = if nonblock { Duration::ZERO } else { wait };
    let who = match (identity, pod.or_else(|| std::env::var("HOSTNAME").ok())) {
        (Some(i), _) => Who::Identity(i),
        (None, Some(name)) => Who::Pod { name, uid: pod_uid },
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
    let api: Api<TargetLease> = Api::namespaced(client, &ns);
    let deadline = tokio::time::Instant::now() + wait;
    // One read first: `--wait 0s` answers from it, and a lease already held
    // is printed without waiting for a watch to start.
    let mut seen = read_once(&api, &lease).await;
    let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
    let mut events = watcher::watcher(api, config).boxed();
    let mut listing: Option<Option<TargetLease>> = None;
    let mut told: Option<&'static str> = None;
    let mut current: Option<Claim> = None;
    let mut written = false;
    let mut refused_version = None;
    loop {
        let now = Timestamp::now();
        let found = match &seen {
            Seen::Object(tl) => claim(tl, &who, now),
            _ => None,
        };
        if let Seen::Object(tl) = &seen
            && names_another_incarnation(tl, &who)
            && refused_version != tl.metadata.resource_version
        {
            refused_version = tl.metadata.resource_version.clone();
            eprintln!(
                "targetlease token: the lease is tied to another incarnation of pod {} (status.holderPodUID is not this pod's UID); not this pod's token",
                tl.status
                    .as_ref()
                    .and_then(|s| s.holder_pod.as_deref())
                    .unwrap_or_default()
            );
        }
        if found != current || !written {
            written = true;
            if let Some(path) = &file {
                let text = found
                    .as_ref()
                    .map(|c| c.fencing_token.to_string())
                    .unwrap_or_default();
                if let Err(e) = file::replace(path, &text, file_mode) {
                    eprintln!(
                        "targetlease token: cannot write {}: {}",
                        path.display(),
                        super::output::io_reason(&e)
                    );
                    return ExitCode::from(EXIT_BACKEND);
                }
            }
            current = found;
        }
        if let (Some(c), false) = (&current, follow) {
            let text = format!(
                "held: TargetLease {}/{} held by {} with fencing token {} (published expiry {})",
                c.namespace, c.lease, c.holder, c.fencing_token, c.expires_at
            );
            print(format, c, text);
            return ExitCode::SUCCESS;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !follow && left.is_zero() {
            let a = absent(&seen, &ns, &lease, &who);
            let text = format!("{}: TargetLease {ns}/{lease}: {}", a.outcome, a.message);
            print(format, &a, text);
            return ExitCode::from(a.exit_code());
        }
        // Say once, on stderr, what the wait is for when it is not a holder.
        let a = absent(&seen, &ns, &lease, &who);
        if !follow && a.outcome != "not_held" && told != Some(a.outcome) {
            told = Some(a.outcome);
            eprintln!(
                "targetlease token: TargetLease {ns}/{lease}: {}; waiting up to {}",
                a.message,
                // Whole milliseconds: "1s 998ms", not "1s 998ms 642us 633ns".
                humantime::format_duration(Duration::from_millis(left.as_millis() as u64))
            );
        }
        // Wake at the next event, at the published expiry, or at the deadline.
        let expiry = current
            .as_ref()
            .and_then(|c| c.expires_at.parse::<Timestamp>().ok());
        let until_expiry = expiry
            .map(|e| Duration::from_millis(e.duration_since(now).as_millis().max(0) as u64))
            .unwrap_or(Duration::from_secs(3600));
        let sleep = if follow {
            until_expiry
        } else {
            left.min(until_expiry)
        };
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Init)) => listing = Some(None),
                Some(Ok(watcher::Event::InitApply(tl))) => listing = Some(Some(tl)),
                Some(Ok(watcher::Event::InitDone)) => {
                    seen = match listing.take().flatten() {
                        Some(tl) => Seen::Object(Box::new(tl)),
                        None => Seen::Missing,
                    };
                }
                Some(Ok(watcher::Event::Apply(tl))) => seen = Seen::Object(Box::new(tl)),
                Some(Ok(watcher::Event::Delete(_))) => seen = Seen::Missing,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "watch failed; retrying");
                    // A watch that breaks does not unsay what was read.
                    if !matches!(seen, Seen::Object(_)) {
                        seen = Seen::of_watch_error(&e);
                    }
                    tokio::time::sleep(Duration::from_millis(500).min(left.max(Duration::from_millis(1)))).await;
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
    use crate::operator::crd::TargetLeaseStatus;
    use crate::operator::reconcile::transition::time_ms;

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
        let c = claim(&held, &pod("job-pod", None), now).unwrap();
        assert_eq!(c.fencing_token, 9_007_199_254_740_993);
        assert!(claim(&held, &Who::Identity("job".into()), now).is_some());
        assert!(claim(&held, &pod("other", None), now).is_none());
        assert!(claim(&tl(Phase::Unknown, 2_000_000), &pod("job-pod", None), now).is_none());
        assert!(claim(&tl(Phase::Held, 999_000), &pod("job-pod", None), now).is_none());
    }

    fn pod(name: &str, uid: Option<&str>) -> Who {
        Who::Pod {
            name: name.into(),
            uid: uid.map(Into::into),
        }
    }

    /// A pod recreated under the same name reads nothing its predecessor held.
    #[test]
    fn with_a_uid_only_the_incarnation_status_names_gets_the_token() {
        let now = Timestamp::from_second(1_000).unwrap();
        let mut held = tl(Phase::Held, 2_000_000);
        held.status.as_mut().unwrap().holder_pod_uid = Some("uid-1".into());
        assert!(claim(&held, &pod("job-pod", Some("uid-1")), now).is_some());
        assert!(
            claim(&held, &pod("job-pod", None), now).is_some(),
            "no UID given: by name"
        );
        let successor = pod("job-pod", Some("uid-2"));
        assert!(claim(&held, &successor, now).is_none());
        assert!(names_another_incarnation(&held, &successor));
        assert!(!names_another_incarnation(
            &held,
            &pod("job-pod", Some("uid-1"))
        ));
        assert!(!names_another_incarnation(
            &held,
            &pod("other", Some("uid-2"))
        ));
        // A status that records no UID cannot be proved to be this pod's.
        held.status.as_mut().unwrap().holder_pod_uid = None;
        assert!(claim(&held, &pod("job-pod", Some("uid-1")), now).is_none());
    }
}
