//! `targetlease run … -- CMD`: hold a lease exactly as long as CMD runs.
//!
//! Acquire (waiting up to `--wait`), start CMD with the fencing token in its
//! environment, renew in the background, stop CMD when the lease is lost,
//! release when CMD exits, exit with CMD's code. stdout belongs to CMD:
//! `run` itself writes only to stderr, ending with one JSON summary line.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::Rng;
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::connection::ConnectionArgs;
use super::lease::{TargetArgs, parse_metadata};
use super::logging::{self, LogArgs};
use super::output::{self, EXIT_REFUSED, Envelope, Report, Status};
use crate::store::valkey::ValkeyStore;
use crate::store::{
    AcquireRequest, Holder, Lease, LeaseStore, Outcome, ReleaseRequest, RenewRequest, Reply,
    StoreError, Target,
};

/// First pause between acquire attempts while the target is held.
const POLL_MIN: Duration = Duration::from_millis(100);
/// Longest pause between acquire attempts.
const POLL_MAX: Duration = Duration::from_secs(1);

/// Flags of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Who holds the lease while CMD runs (1 to 256 bytes).
    #[arg(long, env = "TARGETLEASE_OWNER")]
    owner: String,
    /// Lease duration; renewed every third of it while CMD runs, e.g. 10s.
    #[arg(long, env = "TARGETLEASE_TTL", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// How long to wait for a held target to become free (0s: try once).
    #[arg(long, env = "TARGETLEASE_WAIT", default_value = "0s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Hard limit on the lease's life; CMD is stopped when it is reached.
    #[arg(long, env = "TARGETLEASE_MAX_LIFETIME", value_parser = humantime::parse_duration)]
    max_lifetime: Option<Duration>,
    /// A JSON object (at most 4 KiB) stored with the lease.
    #[arg(long, env = "TARGETLEASE_METADATA", hide_env_values = true)]
    metadata: Option<String>,
    /// After the lease is lost, how long CMD gets between SIGTERM and SIGKILL.
    #[arg(long, env = "TARGETLEASE_KILL_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    kill_grace: Duration,
    #[command(flatten)]
    conn: ConnectionArgs,
    #[command(flatten)]
    log: LogArgs,
    /// The command to run and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// The last line `run` prints (on stderr): the lease envelope plus how it ended.
#[derive(Serialize)]
struct Summary {
    #[serde(flatten)]
    envelope: Envelope,
    /// The exit code of `run` itself.
    exit_code: u8,
    /// True when the lease ended (or could not be confirmed) while CMD ran.
    lease_lost: bool,
}

fn finish(mut envelope: Envelope, exit_code: u8, lease_lost: bool) -> ExitCode {
    // stderr is usually collected as logs: never the capability nor the metadata there.
    envelope.lease = envelope.lease.map(|l| Lease {
        lease_id: None,
        metadata: None,
        ..l
    });
    let summary = Summary {
        envelope,
        exit_code,
        lease_lost,
    };
    match serde_json::to_string(&summary) {
        Ok(line) => eprintln!("{line}"),
        Err(_) => eprintln!("{}", summary.envelope.to_json()),
    }
    ExitCode::from(exit_code)
}

/// SIGINT, SIGTERM and SIGHUP, caught so they reach CMD instead of killing `run`.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// Calls the store with a backstop deadline in case a reply never comes.
async fn bounded(
    backstop: Duration,
    call: impl std::future::Future<Output = Result<Reply, StoreError>>,
) -> Result<Reply, StoreError> {
    tokio::time::timeout(backstop, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::OutcomeUnknown(
                "no reply from valkey in time".into(),
            ))
        })
}

/// How an attempt to get the lease ended without one.
enum NotAcquired {
    Refused(Envelope),
    Usage(String),
    Interrupted(Envelope, Signal),
}

/// The lease as granted, with when it ends by the local monotonic clock.
struct Granted {
    lease: Lease,
    holder: Holder,
    expires: Instant,
}

fn granted(reply: Reply, sent: Instant) -> Option<Granted> {
    let lease = reply.lease?;
    let holder = lease.holder()?;
    // Measured from before the request left: the server decided later, so this
    // local estimate can only be early, never late.
    let remaining = lease.expires_at_ms.saturating_sub(reply.server_time_ms);
    Some(Granted {
        expires: sent + Duration::from_millis(remaining),
        lease,
        holder,
    })
}

fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.8..1.2))
}

/// Acquires, retrying with backoff while the target is held or the backend
/// is unreachable, until `wait` has passed. One request id for the whole
/// loop: a grant whose reply was lost is returned again, and refusals are
/// not cached.
async fn acquire_within(
    store: &ValkeyStore,
    req: &AcquireRequest,
    wait: Duration,
    backstop: Duration,
    signals: &mut Signals,
) -> Result<Granted, NotAcquired> {
    let deadline = Instant::now() + wait;
    let mut delay = POLL_MIN;
    let mut unknown_retries = 0;
    loop {
        let sent = Instant::now();
        let last = match bounded(backstop, store.acquire(req)).await {
            Ok(reply) if reply.outcome == Outcome::Acquired => {
                let envelope_if_bad = Envelope::from_reply(reply.clone());
                return granted(reply, sent).ok_or_else(|| {
                    let mut e = envelope_if_bad;
                    e.message = "acquired reply carried no lease id".into();
                    NotAcquired::Refused(e)
                });
            }
            Ok(reply) if reply.outcome == Outcome::Held => Envelope::from_reply(reply),
            Ok(reply) => return Err(NotAcquired::Refused(Envelope::from_reply(reply))),
            Err(e) => match Report::from(e) {
                Report::Usage(msg) => return Err(NotAcquired::Usage(msg)),
                Report::Envelope(env) => env,
            },
        };
        let now = Instant::now();
        // A lost reply may have granted us the lease: resolve it with the same
        // request id a couple of times even past the deadline.
        let resolve = last.status() == Status::OutcomeUnknown && unknown_retries < 2;
        if now >= deadline && !resolve {
            return Err(NotAcquired::Refused(last));
        }
        if resolve {
            unknown_retries += 1;
        }
        tracing::debug!(outcome = last.outcome, "target not acquired yet; waiting");
        let pause = if now >= deadline {
            POLL_MIN
        } else {
            jittered(delay).min(deadline - now)
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            sig = signals.recv() => {
                let mut env = last;
                env.message = format!("interrupted by {sig} while waiting for the lease");
                return Err(NotAcquired::Interrupted(env, sig));
            }
        }
        delay = (delay * 2).min(POLL_MAX);
    }
}

/// Keeps the lease alive until it is lost; then reports why and returns.
///
/// A renew whose outcome is unknown, or which cannot reach the backend, is
/// retried with the same request id until the lease's local expiry estimate
/// passes; only then is the lease presumed lost.
async fn renew_until_lost(
    store: Arc<ValkeyStore>,
    target: Target,
    granted: Granted,
    ttl: Duration,
    lost: oneshot::Sender<Envelope>,
) {
    let holder = granted.holder;
    let mut expires = granted.expires;
    let mut period = ttl / 3;
    let mut next =
        Instant::now() + period.min(expires.saturating_duration_since(Instant::now()) / 3);
    let retry = (ttl / 10).clamp(Duration::from_millis(20), POLL_MAX);
    loop {
        tokio::time::sleep_until(next).await;
        let req = RenewRequest::new(target.clone(), holder.clone(), ttl);
        loop {
            let sent = Instant::now();
            let result = match tokio::time::timeout_at(expires, store.renew(&req)).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::OutcomeUnknown(
                    "no renewal confirmed before the lease expired".into(),
                )),
            };
            match result {
                Ok(reply) if reply.outcome == Outcome::Renewed => {
                    if let Some(g) = granted_after_renew(reply, sent, &holder) {
                        expires = g;
                    }
                    let remaining = expires.saturating_duration_since(Instant::now());
                    period = (ttl / 3).min(remaining / 3).max(Duration::from_millis(10));
                    next = sent + period;
                    tracing::debug!(target = %target.name, "lease renewed");
                    break;
                }
                Ok(reply) => {
                    tracing::warn!(target = %target.name, outcome = %reply.outcome, "lease lost");
                    let _ = lost.send(Envelope::from_reply(reply));
                    return;
                }
                Err(e) => {
                    let now = Instant::now();
                    if now >= expires {
                        tracing::warn!(target = %target.name, error = e.category(), "lease lost: renewal not confirmed before expiry");
                        let env = match Report::from(e) {
                            Report::Envelope(mut env) => {
                                env.message = format!(
                                    "lease presumed lost: no renewal confirmed before it expired ({})",
                                    env.message
                                );
                                env
                            }
                            Report::Usage(msg) => {
                                Envelope::from_backend_error(Status::BackendUnavailable, msg)
                            }
                        };
                        let _ = lost.send(env);
                        return;
                    }
                    tracing::warn!(target = %target.name, error = e.category(), "renewal failed; retrying");
                    tokio::time::sleep(retry.min(expires - now)).await;
                }
            }
        }
    }
}

fn granted_after_renew(reply: Reply, sent: Instant, holder: &Holder) -> Option<Instant> {
    let lease = reply.lease?;
    if lease.fencing_token != holder.token {
        return None;
    }
    let remaining = lease.expires_at_ms.saturating_sub(reply.server_time_ms);
    Some(sent + Duration::from_millis(remaining))
}

/// Releases the lease, retrying an unknown outcome with the same request id.
async fn release(
    store: &ValkeyStore,
    target: &Target,
    holder: &Holder,
    backstop: Duration,
) -> Result<Reply, StoreError> {
    let req = ReleaseRequest::new(target.clone(), holder.clone());
    let mut result = bounded(backstop, store.release(&req)).await;
    for _ in 0..2 {
        match &result {
            Err(StoreError::OutcomeUnknown(_)) | Err(StoreError::BackendUnavailable(_)) => {
                tokio::time::sleep(POLL_MIN).await;
                result = bounded(backstop, store.release(&req)).await;
            }
            _ => break,
        }
    }
    result
}

fn send_signal(child: &tokio::process::Child, sig: Signal) {
    let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
        return;
    };
    if let Err(e) = kill(Pid::from_raw(pid), sig) {
        tracing::debug!(%sig, error = %e, "could not signal the child");
    }
}

fn describe_exit(status: &std::io::Result<std::process::ExitStatus>) -> (u8, String) {
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => (
                code.clamp(0, 255) as u8,
                format!("command exited with {code}"),
            ),
            (None, Some(sig)) => {
                let name = Signal::try_from(sig)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|_| sig.to_string());
                (
                    (128 + sig).clamp(0, 255) as u8,
                    format!("command killed by {name}"),
                )
            }
            (None, None) => (1, "command ended without an exit code".into()),
        },
        Err(e) => (1, format!("could not wait for the command: {}", e.kind())),
    }
}

/// Runs `targetlease run` and returns CMD's exit code (or the contract's code
/// when CMD never started).
pub async fn main(args: RunArgs) -> ExitCode {
    logging::init(&args.log);
    // (no client required) refuse bad arguments before connecting.
    let target = args.target.target();
    let mut req = AcquireRequest::new(target.clone(), &args.owner, args.ttl);
    req.max_lifetime = args.max_lifetime;
    req.metadata = match parse_metadata(args.metadata.as_deref()) {
        Ok(m) => m,
        Err(msg) => return output::usage_error(&msg),
    };
    if let Err(e) = req.validate() {
        let msg = match e {
            StoreError::Invalid(msg) => msg,
            other => other.to_string(),
        };
        return output::usage_error(&msg);
    }
    let config = match args.conn.to_config() {
        Ok(c) => c,
        Err(msg) => return output::usage_error(&msg),
    };
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return output::usage_error(&format!("cannot handle signals: {}", e.kind())),
    };
    let backstop = config.timeout + Duration::from_secs(1);

    // (client required)
    let store = match ValkeyStore::connect(&config).await {
        Ok(s) => Arc::new(s),
        Err(e) => {
            return match Report::from(e) {
                Report::Envelope(env) => {
                    let code = env.exit_code();
                    finish(env, code, false)
                }
                Report::Usage(msg) => output::usage_error(&msg),
            };
        }
    };
    let granted = match acquire_within(&store, &req, args.wait, backstop, &mut signals).await {
        Ok(g) => g,
        Err(NotAcquired::Refused(env)) => {
            let code = env.exit_code().max(EXIT_REFUSED);
            return finish(env, code, false);
        }
        Err(NotAcquired::Usage(msg)) => return output::usage_error(&msg),
        Err(NotAcquired::Interrupted(env, sig)) => {
            return finish(env, 128 + sig as i32 as u8, false);
        }
    };
    let holder = granted.holder.clone();
    let acquired = granted.lease.clone();
    tracing::info!(target = %target.name, token = holder.token, "lease acquired");

    let mut cmd = tokio::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("TARGETLEASE_FENCING_TOKEN", holder.token.to_string())
        .env("TARGETLEASE_LEASE_ID", &holder.lease_id)
        .env("TARGETLEASE_TARGET", &target.name)
        .env("TARGETLEASE_NAMESPACE", &target.namespace)
        .env("TARGETLEASE_OWNER", &holder.owner);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            let released = release(&store, &target, &holder, backstop).await;
            let mut env = envelope_of(released);
            env.message = format!(
                "cannot start {:?}: {}; {}",
                args.command[0],
                e.kind(),
                env.message
            );
            return finish(env, code, false);
        }
    };

    let (lost_tx, mut lost_rx) = oneshot::channel();
    let renewer = tokio::spawn(renew_until_lost(
        store.clone(),
        target.clone(),
        granted,
        args.ttl,
        lost_tx,
    ));
    let mut lost: Option<Envelope> = None;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            loss = &mut lost_rx, if lost.is_none() => {
                let env = loss.unwrap_or_else(|_| Envelope::from_backend_error(
                    Status::BackendUnavailable,
                    "lease renewal stopped unexpectedly".into(),
                ));
                tracing::warn!(
                    target = %target.name,
                    grace = %humantime::format_duration(args.kill_grace),
                    "lease lost; sending SIGTERM to the command"
                );
                send_signal(&child, Signal::SIGTERM);
                kill_at = Some(Instant::now() + args.kill_grace);
                lost = Some(env);
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                tracing::warn!(target = %target.name, "grace period over; sending SIGKILL to the command");
                let _ = child.start_kill();
                kill_at = None;
            }
            sig = signals.recv() => {
                tracing::info!(%sig, "forwarding signal to the command");
                send_signal(&child, sig);
            }
        }
    };
    renewer.abort();
    if lost.is_none()
        && let Ok(env) = lost_rx.try_recv()
    {
        lost = Some(env);
    }
    let (child_code, child_desc) = describe_exit(&status);

    // Release even after a presumed loss: if only the backend was unreachable,
    // the lease may still be ours, and giving it back frees the target early.
    let released = release(&store, &target, &holder, backstop).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), store.close()).await;
    match lost {
        Some(mut env) => {
            env.lease = env.lease.or(Some(acquired));
            env.message = format!("{}; lease lost: {}", child_desc, env.message);
            let code = if child_code == 0 { 1 } else { child_code };
            finish(env, code, true)
        }
        None => {
            let mut env = envelope_of(released);
            // A refused release means the lease had ended while CMD ran, before
            // a renewal noticed: that is a loss too.
            let ended = matches!(env.status(), Status::Store(o) if o != Outcome::Released);
            env.message = format!("{}; {}", child_desc, env.message);
            if ended {
                env.lease = env.lease.or(Some(acquired));
                let code = if child_code == 0 { 1 } else { child_code };
                finish(env, code, true)
            } else {
                finish(env, child_code, false)
            }
        }
    }
}

fn envelope_of(result: Result<Reply, StoreError>) -> Envelope {
    match Report::from(result) {
        Report::Envelope(env) => env,
        Report::Usage(msg) => Envelope::from_backend_error(Status::BackendUnavailable, msg),
    }
}
