//! CMD as `run` starts, signals and stops it: in a process group of its own
//! under the supervisor ([`super::supervise`]), with only the environment it
//! needs.

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};
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
}

/// Starts CMD under the supervisor, in a new process group.
pub(super) fn spawn(command: &[String], env: &ChildEnv) -> std::io::Result<Child> {
    let stdin = std::io::stdin();
    let terminal_owner =
        (stdin.is_terminal() && tcgetpgrp(&stdin).ok() == Some(getpgrp())).then(getpgrp);
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg0("targetlease")
        .arg(MARKER)
        .arg(std::process::id().to_string())
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
    let process = cmd.spawn()?;
    let id = process
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| std::io::Error::other("the command exited before it was seen"))?;
    Ok(Child {
        process,
        group: Pid::from_raw(id),
        terminal_owner,
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

    /// Waits for the supervisor, which ends the way CMD ended.
    pub(super) async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.process.wait().await
    }

    /// After CMD ended: takes the terminal back, then stops whatever CMD left
    /// running in its group (SIGTERM, SIGKILL after `grace`), so nothing of
    /// the job outlives the lease. Returns whether anything was left.
    pub(super) async fn stop_leftovers(&mut self, grace: Duration) -> bool {
        self.take_terminal_back();
        if !self.group_alive() {
            return false;
        }
        tracing::warn!("the command left processes in its group; stopping them");
        self.signal(Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while self.group_alive() && Instant::now() < deadline {
            tokio::time::sleep(LEFTOVER_POLL).await;
        }
        if self.group_alive() {
            self.signal(Signal::SIGKILL);
        }
        true
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
