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
use futures::future::BoxFuture;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;
use tokio::time::Instant;

mod holding;

use holding::{NotAcquired, acquire_within, release, renew_until_lost};

use super::lease::{AcquireFlags, ClientArgs};
use super::logging;
use super::output::{self, Answer, EXIT_REFUSED, Envelope, Report};
use crate::store::valkey::ValkeyStore;
use crate::store::{Lease, LeaseStore, Outcome, Reply, StoreError};

/// Flags of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    acquire: AcquireFlags,
    /// How long to wait for a held target to become free (0s: try once).
    #[arg(long, env = "TARGETLEASE_WAIT", default_value = "0s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// After the lease is lost, how long CMD gets between SIGTERM and SIGKILL.
    #[arg(long, env = "TARGETLEASE_KILL_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    kill_grace: Duration,
    #[command(flatten)]
    client: ClientArgs,
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

/// Sends `sig` to CMD; a child that is already gone is not an error.
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
    let RunArgs {
        acquire,
        wait,
        kill_grace,
        client: ClientArgs { conn, log },
        command,
    } = args;
    logging::init(&log);
    // (no client required) refuse bad arguments before connecting.
    let req = match acquire.request() {
        Ok(req) => req,
        Err(msg) => return output::usage_error(&msg),
    };
    let (target, ttl) = (req.target.clone(), req.ttl);
    let config = match conn.to_config() {
        Ok(c) => c,
        Err(msg) => return output::usage_error(&msg),
    };
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return output::usage_error(format!("cannot handle signals: {}", e.kind())),
    };
    let backstop = config.timeout + Duration::from_secs(1);

    // (client required) connecting counts as part of the wait.
    let connect = move || -> BoxFuture<'static, Result<Arc<dyn LeaseStore>, StoreError>> {
        let config = config.clone();
        Box::pin(async move {
            let store: Arc<dyn LeaseStore> = Arc::new(ValkeyStore::connect(&config).await?);
            Ok(store)
        })
    };
    let (store, granted) = match acquire_within(&connect, &req, wait, backstop, &mut signals).await
    {
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

    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
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
            let released = release(&*store, &target, &holder, backstop, &mut signals).await;
            let mut env = envelope_of(released);
            env.message = format!(
                "cannot start {:?}: {}; {}",
                command[0],
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
                    "lease lost; sending SIGTERM to the command"
                );
                send_signal(&child, Signal::SIGTERM);
                kill_at = Some(Instant::now() + kill_grace);
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
    let lost_while_running = lost.is_some();
    let (child_code, child_desc) = describe_exit(&status);

    // Release even after a presumed loss: if only the backend was unreachable,
    // the lease may still be ours, and giving it back frees the target early.
    let released = release(&*store, &target, &holder, backstop, &mut signals).await;
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
    env.message = format!("{child_desc}; {}", env.message);
    finish(env, code, lease_lost)
}

/// How `run` ends once CMD has exited with `child_code`: its own exit code and
/// whether the lease was lost while CMD ran. `answer` is the renewal's report
/// of the loss (`lost_while_running`) or else the final release's answer: a
/// refused release means the lease had ended before a renewal noticed, which
/// is a loss too. A loss never exits 0. No client required.
pub(crate) fn ending(child_code: u8, answer: Answer, lost_while_running: bool) -> (u8, bool) {
    let refused = matches!(answer, Answer::Store(o) if o != Outcome::Released);
    if lost_while_running || refused {
        (if child_code == 0 { 1 } else { child_code }, true)
    } else {
        (child_code, false)
    }
}

fn envelope_of(result: Result<Reply, StoreError>) -> Envelope {
    match Report::from(result) {
        Report::Envelope(env) => env,
        Report::Usage(msg) => Envelope::from_backend_error(Answer::BackendUnavailable, msg),
    }
}
