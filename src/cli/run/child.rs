//! CMD as `run` starts, signals and stops it: in a process group of its own
//! under the supervisor ([`super::supervise`]), with only the environment it
//! needs.

use std::io::IsTerminal;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::time::Instant;

use super::supervise::MARKER;

/// How often the group is checked for leftovers while they are being stopped.
const LEFTOVER_POLL: Duration = Duration::from_millis(20);

/// The environment CMD runs with: every inherited `TARGETLEASE_*` variable
/// removed (they configure `run`, and may name the store and its
/// credentials), then exactly these set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ChildEnv {
    pub(super) vars: Vec<(String, String)>,
}

impl ChildEnv {
    pub(super) fn set(&mut self, name: &str, value: impl Into<String>) {
        self.vars.push((name.to_owned(), value.into()));
    }
}

/// Whether a variable of `run`'s environment is withheld from CMD.
pub(super) fn withheld(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with("TARGETLEASE_")
}

/// CMD running in its own process group (led by the supervisor).
pub(super) struct Child {
    process: tokio::process::Child,
    group: Pid,
    /// `run`'s own group, when it had the terminal before CMD started.
    terminal_owner: Option<Pid>,
    /// The supervisor's report of how CMD ended ([`super::supervise`]),
    /// until it is read whole.
    report: Option<pipe::Receiver>,
    reported: Vec<u8>,
    /// The supervisor said CMD left processes behind it.
    left: Option<bool>,
}

/// Starts CMD under the supervisor, in a new process group.
pub(super) fn spawn(command: &[String], env: &ChildEnv) -> std::io::Result<Child> {
    let stdin = std::io::stdin();
    let terminal_owner =
        (stdin.is_terminal() && tcgetpgrp(&stdin).ok() == Some(getpgrp())).then(getpgrp);
    // The report pipe: its write end (not close-on-exec) is inherited by
    // the supervisor alone, which closes it before CMD starts.
    let (read, write) = nix::unistd::pipe()?;
    fcntl(&read, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    let report = pipe::Receiver::from_owned_fd(read)?;
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg0("targetlease")
        .arg(MARKER)
        .arg(std::process::id().to_string())
        .arg(write.as_raw_fd().to_string())
        .arg("--")
        .args(command)
        .process_group(0);
    for (name, _) in std::env::vars_os() {
        if withheld(&name) {
            cmd.env_remove(name);
        }
    }
    for (name, value) in &env.vars {
        cmd.env(name, value);
    }
    let process = cmd.spawn();
    drop(write);
    let process = process?;
    let id = process
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| std::io::Error::other("the command exited before it was seen"))?;
    Ok(Child {
        process,
        group: Pid::from_raw(id),
        terminal_owner,
        report: Some(report),
        reported: Vec::new(),
        left: None,
    })
}

impl Child {
    /// Sends `sig` to CMD and everything in its group; a group that is gone
    /// is not an error.
    pub(super) fn signal(&self, sig: Signal) {
        if let Err(e) = killpg(self.group, sig) {
            tracing::debug!(%sig, error = %e, "could not signal the command's process group");
        }
    }

    /// Waits until CMD ended: as the supervisor reports it, or, when the
    /// supervisor ends without a report (killed), as the supervisor ended.
    /// Cancel-safe (a `select!` branch).
    pub(super) async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        while let Some(report) = self.report.as_mut() {
            let mut chunk = [0u8; 64];
            match report.read(&mut chunk).await {
                Ok(0) | Err(_) => self.report = None,
                Ok(n) => self.reported.extend_from_slice(&chunk[..n]),
            }
            let line = String::from_utf8_lossy(&self.reported).into_owned();
            if let Some((raw, left)) = line
                .strip_suffix('\n')
                .and_then(|l| l.split_once(' '))
                .and_then(|(raw, left)| Some((raw.parse::<i32>().ok()?, left == "1")))
            {
                self.report = None;
                self.left = Some(left);
                return Ok(std::process::ExitStatus::from_raw(raw));
            }
        }
        self.process.wait().await
    }

    /// After CMD ended: takes the terminal back, then stops whatever CMD left
    /// running (SIGTERM to its group, SIGKILL after `grace`), so nothing of
    /// the job outlives the lease. The supervisor stays until all of it is
    /// gone, so a SIGKILL of `run` meanwhile still stops it at once; when
    /// the supervisor itself was killed, the group gets SIGKILL at once.
    /// Returns whether anything was left.
    pub(super) async fn stop_leftovers(&mut self, grace: Duration) -> bool {
        self.take_terminal_back();
        let deadline = Instant::now() + grace;
        let left = match self.left {
            Some(true) => {
                self.stopping();
                if tokio::time::timeout_at(deadline, self.process.wait())
                    .await
                    .is_err()
                {
                    self.signal(Signal::SIGKILL);
                }
                true
            }
            _ => false,
        };
        let _ = self.process.wait().await;
        // Anything still in the group (without a report, or what made
        // itself a subreaper): the same, from here.
        if !self.group_alive() {
            return left;
        }
        if self.left.is_none() {
            // The supervisor ended without its report: it was killed (by
            // CMD, say), and nothing would stop the group if `run` died
            // during a grace period now. So no grace.
            tracing::warn!(
                "the command's supervisor was killed; stopping what is left of its group at once"
            );
            self.signal(Signal::SIGKILL);
            return true;
        }
        if !left {
            self.stopping();
        }
        while self.group_alive() && Instant::now() < deadline {
            tokio::time::sleep(LEFTOVER_POLL).await;
        }
        if self.group_alive() {
            self.signal(Signal::SIGKILL);
        }
        true
    }

    fn stopping(&self) {
        tracing::warn!("the command left processes in its group; stopping them");
        self.signal(Signal::SIGTERM);
    }

    fn group_alive(&self) -> bool {
        killpg(self.group, None).is_ok()
    }

    fn take_terminal_back(&mut self) {
        let Some(owner) = self.terminal_owner.take() else {
            return;
        };
        // `run` is in the background now: SIGTTOU must not stop it.
        let mut ttou = SigSet::empty();
        ttou.add(Signal::SIGTTOU);
        if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), None).is_ok() {
            let _ = tcsetpgrp(std::io::stdin(), owner);
            let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&ttou), None);
        }
    }
}

/// How CMD ended, as `run`'s exit code would carry it and in words.
pub(super) fn describe_exit(status: &std::io::Result<std::process::ExitStatus>) -> (u8, String) {
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
