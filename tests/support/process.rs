//! Components a fixture starts (valkey-server, a Sentinel, redis-server with
//! TLS, stunnel, a restarted kube-apiserver) explain themselves when they die
//! or do not come up, the way `explain_exit` in `scripts/lib/process.sh`
//! does for the scripts: the exit status or signal, the last lines of the
//! component's own log (its stdout and stderr go there: [`log_to`]), and what
//! else was running and how much memory was left, so that a component killed
//! before it wrote a line (the OOM killer, a stray signal) still says why.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How many lines of a component's log a failure shows.
const LOG_LINES: usize = 20;

/// Points `cmd`'s stdout and stderr at the end of `log` (created if need be;
/// appended to, so a restart keeps what the earlier run wrote, and a server
/// that also writes the file itself, `--logfile`, interleaves safely).
pub fn log_to<'a>(cmd: &'a mut Command, log: &Path) -> &'a mut Command {
    let file = open_log(log);
    let err = file
        .try_clone()
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    cmd.stdin(Stdio::null()).stdout(file).stderr(err)
}

fn open_log(log: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("open the log {}: {e}", log.display()))
}

/// `exited with status 1`, `was killed by signal 9 (KILL)`.
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => {
            let name = nix::sys::signal::Signal::try_from(sig)
                .map(|s| s.as_str().trim_start_matches("SIG").to_string())
                .unwrap_or_else(|_| "?".into());
            format!("was killed by signal {sig} ({name})")
        }
        (None, None) => format!("ended ({status})"),
    }
}

/// Why component `name` is not (or not yet) serving: `how` (e.g. `exited
/// with status 1`, from [`describe`]), the last lines of its `log`, the
/// machine's memory and its largest processes, and the kernel's OOM-killer
/// lines if there are any. One text, for a panic message.
pub fn explain(name: &str, how: &str, log: &Path) -> String {
    let mut text = format!("{name} {how}\n");
    match std::fs::read_to_string(log) {
        Ok(t) if t.trim().is_empty() => {
            text += &format!("----- {} is empty -----\n", log.display());
        }
        Ok(t) => {
            let lines: Vec<&str> = t.lines().collect();
            let from = lines.len().saturating_sub(LOG_LINES);
            text += &format!(
                "----- last {} lines of {} -----\n",
                lines.len() - from,
                log.display()
            );
            for line in &lines[from..] {
                text += line;
                text.push('\n');
            }
        }
        Err(e) => text += &format!("----- {} unreadable: {e} -----\n", log.display()),
    }
    text += &what_else_ran();
    text
}

/// The machine's memory, its largest processes and the kernel's OOM-killer
/// lines: what else ran when a component died.
pub fn what_else_ran() -> String {
    let mut text = String::from("----- memory -----\n");
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    for line in meminfo.lines().filter(|l| {
        ["MemTotal:", "MemAvailable:", "SwapFree:"]
            .iter()
            .any(|k| l.starts_with(k))
    }) {
        text += line;
        text.push('\n');
    }
    text += "----- the largest processes running -----\n";
    if let Ok(out) = Command::new("ps")
        .args(["-eo", "pid,ppid,rss,etime,args", "--sort=-rss"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines().take(12) {
            text += &line.chars().take(200).collect::<String>();
            text.push('\n');
        }
    }
    if let Ok(out) = Command::new("dmesg").stderr(Stdio::null()).output() {
        let oom: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| {
                let l = l.to_lowercase();
                l.contains("out of memory")
                    || l.contains("oom-kill")
                    || l.contains("killed process")
            })
            .map(str::to_owned)
            .collect();
        if !oom.is_empty() {
            text += "----- the kernel's OOM killer -----\n";
            text += &oom[oom.len().saturating_sub(5)..].join("\n");
            text.push('\n');
        }
    }
    text
}

/// Waits until `ready` holds for component `name` (process `child`, whose
/// stdout and stderr go to `log`). If the process exits first, or `within`
/// passes, the error explains it ([`explain`]); a process that exited is
/// reaped (`try_wait`), one that hangs is left to the caller.
pub fn wait_ready(
    name: &str,
    child: &mut Child,
    log: &Path,
    within: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        if ready() {
            return Ok(());
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                let how = format!("(pid {}) {} during startup", child.id(), describe(status));
                return Err(explain(name, &how, log));
            }
            Ok(None) => {}
            Err(e) => return Err(format!("{name}: cannot wait for pid {}: {e}", child.id())),
        }
        if Instant::now() >= deadline {
            let how = format!(
                "(pid {}) is running but did not come up within {within:?}",
                child.id()
            );
            return Err(explain(name, &how, log));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `cmd` as component `name`, its stdout and stderr in `log`
/// ([`log_to`]), and waits until `ready` holds; if it exits first or does not
/// get there within `within`, kills it and panics with the explanation
/// ([`wait_ready`]).
pub fn start_ready(
    name: &str,
    cmd: &mut Command,
    log: &Path,
    within: Duration,
    ready: impl FnMut() -> bool,
) -> Child {
    let mut child = log_to(cmd, log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name} ({:?}): {e}", cmd.get_program()));
    if let Err(why) = wait_ready(name, &mut child, log, within, ready) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{why}");
    }
    child
}
