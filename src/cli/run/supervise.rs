//! The small process between `run` and CMD, so that CMD cannot outlive `run`.
//!
//! `run` starts its own binary again as `targetlease __run-child <run's pid>
//! <report fd> -- CMD [ARGS…]`, as the leader of a new process group. This
//! process:
//!
//! 1. catches every signal that would end it by default (handlers, not a
//!    blocked mask: a mask would be inherited by CMD, handlers are reset by
//!    `exec`), so nothing but SIGKILL can make it go before CMD does;
//! 2. asks the kernel for SIGTERM when its parent dies (`PR_SET_PDEATHSIG`),
//!    then checks that its parent is still `run` (it may have died already);
//! 3. hands the terminal to its group when `run` had it (so an interactive
//!    CMD can read it), then starts CMD in the same group;
//! 4. waits, as the subreaper of everything CMD starts: when CMD ends, it
//!    tells `run` how CMD ended and whether CMD left anything running
//!    (through the report pipe, which CMD never sees), then stays until
//!    nothing CMD started is left (`run` stops what is left: SIGTERM, and
//!    SIGKILL after `--kill-grace`), and ends with CMD's exit code (`128 + N`
//!    when CMD was killed by signal N; killed itself by SIGKILL when CMD
//!    was). Whenever its parent is no longer `run`, before or after CMD
//!    ended, it SIGKILLs the whole group, itself included, at once: what CMD
//!    left cannot outlive a SIGKILLed `run` either.
//!
//! `run` sends the signals it forwards to the whole group, so CMD and
//! everything it started get them directly; this process ignores them.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;

use futures::future::select_all;
use nix::sys::prctl;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask, raise};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgid, getpgrp, getppid, tcgetpgrp, tcsetpgrp};
use tokio::signal::unix::{SignalKind, signal};

/// The first argument that makes the binary this process instead of the CLI.
pub const MARKER: &str = "__run-child";

/// Exit code when CMD could not be started because it was not found.
const NOT_FOUND: u8 = 127;
/// Exit code when CMD was found but could not be started.
const CANNOT_RUN: u8 = 126;

/// Signals whose default action ends a process (besides SIGKILL, the
/// synchronous faults and SIGPIPE, which Rust's runtime already ignores and
/// the standard library resets for CMD).
const CAUGHT: [Signal; 10] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGTERM,
    Signal::SIGVTALRM,
    Signal::SIGPROF,
    Signal::SIGIO,
];

/// Signals whose default action dumps core: CMD's death by one of them is
/// reported as `128 + N` rather than raised again here (a second core file,
/// this process's, would overwrite CMD's).
const DUMPS_CORE: [Signal; 10] = [
    Signal::SIGQUIT,
    Signal::SIGILL,
    Signal::SIGTRAP,
    Signal::SIGABRT,
    Signal::SIGBUS,
    Signal::SIGFPE,
    Signal::SIGSEGV,
    Signal::SIGSYS,
    Signal::SIGXCPU,
    Signal::SIGXFSZ,
];

/// When the arguments are `__run-child PID -- CMD…`, runs as the supervisor
/// and returns its exit code; `None` for every other invocation.
pub fn from_args() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != MARKER {
        return None;
    }
    let mut number = || {
        args.next()
            .and_then(|p| p.into_string().ok())
            .and_then(|p| p.parse::<i32>().ok())
    };
    let parent = number().map(Pid::from_raw);
    let report = number();
    let separator = args.next();
    let command: Vec<OsString> = args.collect();
    match (parent, report, separator) {
        (Some(parent), Some(report), Some(sep)) if sep == "--" && !command.is_empty() => {
            Some(supervise(parent, report, &command))
        }
        _ => {
            eprintln!("targetlease: {MARKER} is internal to `targetlease run`");
            Some(ExitCode::from(2))
        }
    }
}

fn supervise(parent: Pid, report: i32, command: &[OsString]) -> ExitCode {
    // The pipe to `run`, opened anew (close-on-exec) and its inherited
    // descriptor closed, so that CMD never holds it.
    let report_file = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/self/fd/{report}"));
    let _ = nix::unistd::close(report);
    let report = match report_file {
        Ok(f) => f,
        Err(e) => {
            eprintln!("targetlease run: cannot open the report pipe: {e}");
            return ExitCode::from(CANNOT_RUN);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("targetlease run: cannot start: {e}");
            return ExitCode::from(CANNOT_RUN);
        }
    };
    runtime.block_on(watch(parent, report, command))
}

async fn watch(parent: Pid, report: std::fs::File, command: &[OsString]) -> ExitCode {
    let mut caught = Vec::new();
    for sig in CAUGHT {
        match signal(SignalKind::from_raw(sig as i32)) {
            Ok(s) => caught.push(s),
            Err(e) => {
                eprintln!("targetlease run: cannot catch {sig}: {e}");
                return ExitCode::from(CANNOT_RUN);
            }
        }
    }
    if let Err(e) = prctl::set_child_subreaper(true) {
        eprintln!("targetlease run: cannot become the subreaper of the command: {e}");
        return ExitCode::from(CANNOT_RUN);
    }
    if let Err(e) = prctl::set_pdeathsig(Signal::SIGTERM) {
        eprintln!("targetlease run: cannot ask for the parent-death signal: {e}");
        return ExitCode::from(CANNOT_RUN);
    }
    // `run` may have died before the request above: then nobody holds the lease.
    if getppid() != parent {
        return ExitCode::from(CANNOT_RUN);
    }
    take_terminal(parent);
    let mut child = match tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                NOT_FOUND
            } else {
                CANNOT_RUN
            };
            eprintln!(
                "targetlease run: cannot start {:?}: {}",
                command[0],
                crate::cli::output::io_reason(&e)
            );
            return ExitCode::from(code);
        }
    };
    let status = loop {
        let any_signal = select_all(caught.iter_mut().map(|s| Box::pin(s.recv())));
        tokio::select! {
            status = child.wait() => match status {
                Ok(status) => break status,
                Err(e) => {
                    eprintln!("targetlease run: cannot wait for the command: {e}");
                    kill_group();
                    return ExitCode::from(CANNOT_RUN);
                }
            },
            // A forwarded signal (CMD got it too), or the parent's death.
            _ = any_signal => {
                if getppid() != parent {
                    kill_group();
                }
            }
        }
    };
    // CMD is reaped: what is left in the group is what CMD left behind
    // (orphans come to this subreaper, which reaps those that end).
    let left = others_in_group();
    let mut report = report;
    let _ = writeln!(report, "{} {}", status.into_raw(), u8::from(left));
    drop(report);
    while left && others_in_group() {
        let any_signal = select_all(caught.iter_mut().map(|s| Box::pin(s.recv())));
        tokio::select! {
            _ = tokio::time::sleep(LEFTOVER_POLL) => {}
            _ = any_signal => {}
        }
        if getppid() != parent {
            kill_group();
        }
    }
    end_like(status)
}

/// How often, after CMD ended, this process looks whether what CMD left is gone.
const LEFTOVER_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Reaps every child that ended, then looks whether any live process but
/// this one is in its process group. A process that left the group on
/// purpose (`setsid`) is not waited for: it is beyond reach (docs/cli.md).
fn others_in_group() -> bool {
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
    let me = std::process::id().to_string();
    let group = getpgrp().as_raw().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            return false;
        };
        if pid == me {
            return false;
        }
        // `pid (comm) state ppid pgrp …`; comm may hold spaces and parentheses.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            return false;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1);
        state != Some("Z") && pgrp == Some(group.as_str())
    })
}

/// Gives the terminal to this process group when `run`'s group had it.
/// SIGTTOU is blocked meanwhile, so a background group may do this.
fn take_terminal(parent: Pid) {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return;
    }
    let (Ok(foreground), Ok(parents)) = (tcgetpgrp(&stdin), getpgid(Some(parent))) else {
        return;
    };
    if foreground != parents {
        return;
    }
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), None).is_ok() {
        let _ = tcsetpgrp(&stdin, getpgrp());
        let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&ttou), None);
    }
}

/// SIGKILL to the whole group, this process included.
fn kill_group() {
    let _ = killpg(getpgrp(), Signal::SIGKILL);
}

/// Ends this process the way CMD ended, as far as it can: the same exit
/// code, `128 + N` for a signal this process catches or that dumps core,
/// else death by the same signal (SIGKILL above all).
fn end_like(status: std::process::ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    let Some(number) = status.signal() else {
        return ExitCode::from(CANNOT_RUN);
    };
    if let Ok(sig) = Signal::try_from(number)
        && !DUMPS_CORE.contains(&sig)
        && !CAUGHT.contains(&sig)
    {
        let _ = raise(sig);
    }
    ExitCode::from((128 + number).clamp(0, 255) as u8)
}
