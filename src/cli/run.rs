//! `targetlease run … -- CMD`: hold a lease exactly as long as CMD runs.
//!
//! Acquire (waiting up to `--wait`, as `flock` and `consul lock` wait), start
//! CMD in a process group of its own with the fencing token in its
//! environment, renew in the background, stop CMD's group when the lease is
//! lost, release when CMD exits, exit with CMD's code. If `run` itself is
//! killed, CMD's group is killed with it ([`supervise`]). stdout belongs to
//! CMD: `run` writes only to stderr, ending with one summary.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;
use tokio::time::Instant;

mod child;
mod holding;
mod report;
pub mod supervise;
mod wake;

use child::ChildEnv;
use holding::{Granted, NotAcquired, acquire_within, release, renew_until_lost};
use report::{EXIT_FAILED, Reporter, ending, not_acquired};

use super::connection::ConnectionArgs;
use super::lease::{AcquireFlags, ClientArgs, DEFAULT_WAIT};
use super::logging;
use super::output::{self, Answer, Envelope, Format, Report};
use crate::store::{LeaseStore, Reply, StoreError, Target};

pub use report::{EXIT_BUSY, EXIT_LOST};

/// Flags of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    acquire: AcquireFlags,
    /// How long to wait while the target is held (or the store unreachable)
    /// before giving up without starting CMD; `0s`: try once.
    #[arg(long, env = "TARGETLEASE_WAIT", default_value = DEFAULT_WAIT, value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Do not wait: when the target is held, exit at once with the busy
    /// code (75). Wins over --wait.
    #[arg(short = 'n', long, env = "TARGETLEASE_NONBLOCK")]
    nonblock: bool,
    /// After the lease is lost, how long CMD gets between SIGTERM and SIGKILL.
    #[arg(long, env = "TARGETLEASE_KILL_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    kill_grace: Duration,
    /// Also give CMD the lease id (TARGETLEASE_LEASE_ID): the capability to
    /// renew or release this lease, which CMD does not need to use its token.
    #[arg(long, env = "TARGETLEASE_EXPORT_LEASE_ID")]
    export_lease_id: bool,
    /// Also give CMD the connection settings (TARGETLEASE_STORE_URL, the
    /// paths of the password and TLS files, …), so it can run
    /// `targetlease lease commit` itself.
    #[arg(long, env = "TARGETLEASE_EXPORT_CONNECTION")]
    export_connection: bool,
    #[command(flatten)]
    client: ClientArgs,
    /// The command to run and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
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

/// What CMD is given besides the token, target and expiry.
struct Exports {
    lease_id: bool,
    connection: Option<ConnectionArgs>,
}

/// CMD's environment: the lease it runs under, and what was asked for.
fn child_env(target: &Target, granted: &Granted, exports: &Exports) -> ChildEnv {
    let lease = &granted.lease;
    let mut env = ChildEnv::default();
    env.set(
        "TARGETLEASE_FENCING_TOKEN",
        granted.handle.token.to_string(),
    );
    env.set("TARGETLEASE_TARGET", &target.name);
    env.set("TARGETLEASE_NAMESPACE", &target.namespace);
    env.set("TARGETLEASE_OWNER", &granted.handle.owner);
    env.set("TARGETLEASE_EXPIRES_AT", rfc3339(lease.expires_at_ms));
    if let Some(max) = lease.max_expires_at_ms {
        env.set("TARGETLEASE_MAX_EXPIRES_AT", rfc3339(max));
    }
    if exports.lease_id {
        env.set("TARGETLEASE_LEASE_ID", &granted.handle.lease_id);
    }
    if let Some(conn) = &exports.connection {
        for (name, value) in conn.exported() {
            env.set(name, value);
        }
    }
    env
}

fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Runs `targetlease run` and returns CMD's exit code (or `run`'s own when
/// CMD never started, or the lease was lost).
pub async fn main(args: RunArgs) -> ExitCode {
    let RunArgs {
        acquire,
        wait,
        nonblock,
        kill_grace,
        export_lease_id,
        export_connection,
        client: ClientArgs { conn, out, log },
        command,
    } = args;
    logging::init(&log);
    let report = Reporter {
        format: out.or(if std::io::stderr().is_terminal() {
            Format::Text
        } else {
            Format::Json
        }),
    };
    let wait = if nonblock { Duration::ZERO } else { wait };
    // (no client required) refuse bad arguments before connecting.
    let req = match acquire.request() {
        Ok(req) => req,
        Err(msg) => return output::usage_error(&msg),
    };
    let (target, ttl) = (req.target.clone(), req.ttl);
    let config = match conn.to_store_config() {
        Ok(c) => c,
        Err(msg) => return output::usage_error(&msg),
    };
    let exports = Exports {
        lease_id: export_lease_id,
        connection: export_connection.then_some(conn),
    };
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return output::usage_error(format!("cannot handle signals: {}", e.kind())),
    };
    let backstop = config.timeout() + Duration::from_secs(1);

    // (client required) connecting counts as part of the wait.
    let connect = move || -> BoxFuture<'static, Result<Arc<dyn LeaseStore>, StoreError>> {
        let config = config.clone();
        Box::pin(async move { config.connect().await })
    };
    let mut waiting = report.waiting(wait);
    let acquired = acquire_within(&connect, &req, wait, backstop, &mut signals, &mut waiting).await;
    let (store, granted) = match acquired {
        Ok(g) => g,
        Err(NotAcquired::Refused(mut env)) => {
            let code = not_acquired(&env);
            if wait > Duration::ZERO {
                env.message = format!(
                    "{}; gave up after waiting {}",
                    env.message,
                    humantime::format_duration(wait)
                );
            }
            return report.finish(env, code, None, false);
        }
        Err(NotAcquired::Usage(msg)) => return output::usage_error(&msg),
        Err(NotAcquired::Interrupted(env, sig)) => {
            return report.finish(env, 128 + sig as i32 as u8, None, false);
        }
    };
    let handle = granted.handle.clone();
    let acquired = granted.lease.clone();
    tracing::info!(target = %target.name, token = handle.token, "lease acquired");

    let mut child = match child::spawn(&command, &child_env(&target, &granted, &exports)) {
        Ok(c) => c,
        Err(e) => {
            let released = release(&*store, &target, &handle, backstop, &mut signals).await;
            let mut env = envelope_of(released);
            env.message = format!(
                "cannot start the command: {}; {}",
                output::io_reason(&e),
                env.message
            );
            return report.finish(env, EXIT_FAILED, None, false);
        }
    };

    let (lost_tx, mut lost_rx) = oneshot::channel();
    let renewer = tokio::spawn(renew_until_lost(
        store.clone(),
        target.clone(),
        granted,
        ttl,
        lost_tx,
    ));
    let mut lost: Option<Envelope> = None;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            loss = &mut lost_rx, if lost.is_none() => {
                let env = loss.unwrap_or_else(|_| Envelope::from_backend_error(
                    Answer::BackendUnavailable,
                    "lease renewal stopped unexpectedly".into(),
                ));
                tracing::warn!(
                    target = %target.name,
                    grace = %humantime::format_duration(kill_grace),
                    "lease lost; sending SIGTERM to the command's process group"
                );
                child.signal(Signal::SIGTERM);
                kill_at = Some(Instant::now() + kill_grace);
                lost = Some(env);
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                tracing::warn!(target = %target.name, "grace period over; sending SIGKILL to the command's process group");
                child.signal(Signal::SIGKILL);
                kill_at = None;
            }
            sig = signals.recv() => {
                tracing::info!(%sig, "forwarding signal to the command's process group");
                child.signal(sig);
            }
        }
    };
    let (child_code, child_desc) = child::describe_exit(&status);
    // Nothing of the job may outlive the lease: what CMD left in its group
    // is stopped before the release (while renewals go on).
    let grace = match kill_at {
        Some(at) => at.saturating_duration_since(Instant::now()),
        None if lost.is_some() => Duration::ZERO,
        None => kill_grace,
    };
    let leftovers = child.stop_leftovers(grace).await;
    renewer.abort();
    if lost.is_none()
        && let Ok(env) = lost_rx.try_recv()
    {
        lost = Some(env);
    }
    let lost_while_running = lost.is_some();

    // Release even after a presumed loss: if only the backend was unreachable,
    // the lease may still be ours, and giving it back frees the target early.
    let released = release(&*store, &target, &handle, backstop, &mut signals).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), store.close()).await;
    let mut env = match lost {
        Some(mut env) => {
            env.message = format!("lease lost: {}", env.message);
            env
        }
        None => envelope_of(released),
    };
    let (code, lease_lost) = ending(child_code, env.answer(), lost_while_running);
    if lease_lost {
        env.lease = env.lease.or(Some(acquired));
    }
    let leftover_note = if leftovers {
        "; processes it left in its group were stopped"
    } else {
        ""
    };
    env.message = format!("{child_desc}{leftover_note}; {}", env.message);
    report.finish(env, code, Some(child_code), lease_lost)
}

fn envelope_of(result: Result<Reply, StoreError>) -> Envelope {
    match Report::from(result) {
        Report::Envelope(env) => env,
        Report::Usage(msg) => Envelope::from_backend_error(Answer::BackendUnavailable, msg),
    }
}
