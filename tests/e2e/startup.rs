//! A component that dies while the scripts start it names why: its exit
//! status or signal, the last lines of its own log (stdout and stderr), and
//! what else was running. Shown with an API server bound to fail, started by
//! the real `scripts/controlplane.sh` next to a real etcd; and for the Rust
//! fixtures (`support::process`), with a valkey-server given an option it
//! does not know.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::process::start_ready;
use crate::support::tools::{tool, tools_dir};
use crate::support::valkey_server::ValkeyServer;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A tools directory holding the real tools, except a `kube-apiserver` that
/// runs `body` (a shell script).
fn tools_with_apiserver(body: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(tools_dir()).unwrap().flatten() {
        let name = entry.file_name();
        if name != "kube-apiserver" && !name.to_string_lossy().starts_with('.') {
            std::os::unix::fs::symlink(entry.path(), dir.path().join(&name)).unwrap();
        }
    }
    let fake = dir.path().join("kube-apiserver");
    std::fs::write(&fake, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// `controlplane.sh start` with `tools`; its exit status and stderr.
fn start_with(tools: &Path) -> (Option<i32>, String) {
    tool("etcd");
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("cp");
    let out = Command::new("bash")
        .arg(repo().join("scripts/controlplane.sh"))
        .arg("start")
        .arg(&dir)
        .env("TARGETLEASE_TOOLS_DIR", tools)
        .env("CONTROLPLANE_KCM", "0")
        .output()
        .expect("run scripts/controlplane.sh");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !dir.exists(),
        "a failed start must stop what it started and remove {}:\n{stderr}",
        dir.display()
    );
    (out.status.code(), stderr)
}

#[test]
fn an_apiserver_that_exits_at_startup_names_its_status_and_its_last_words() {
    let tools = tools_with_apiserver(
        "echo 'listening would need a certificate we do not have' >&2\necho 'E1202 bound to fail at startup' >&2\nexit 3",
    );
    let (code, stderr) = start_with(tools.path());
    assert_ne!(code, Some(0), "start must fail:\n{stderr}");
    assert!(
        stderr.contains("kube-apiserver (pid ") && stderr.contains(") exited with status 3"),
        "the exit status is named:\n{stderr}"
    );
    assert!(
        stderr.contains("E1202 bound to fail at startup"),
        "the component's own stderr is shown:\n{stderr}"
    );
    assert!(
        stderr.contains("----- memory (MiB) -----")
            && stderr.contains("----- the largest processes running -----"),
        "what else ran is shown:\n{stderr}"
    );
    assert!(
        stderr.contains("kube-apiserver exited during startup"),
        "the summary line:\n{stderr}"
    );
}

#[test]
fn an_apiserver_killed_before_it_wrote_a_line_names_the_signal() {
    // What the OOM killer or a stray signal does: no line in the log at all.
    let tools = tools_with_apiserver("kill -KILL $$");
    let (code, stderr) = start_with(tools.path());
    assert_ne!(code, Some(0), "start must fail:\n{stderr}");
    assert!(
        stderr.contains(") was killed by signal 9 (KILL)"),
        "the signal is named:\n{stderr}"
    );
    assert!(
        stderr.contains("kube-apiserver.log is empty"),
        "an empty log says so:\n{stderr}"
    );
}

/// With job control on, a background job leads its own process group and
/// setsid(1) forks again: the recorded pid was setsid's, gone at once, and a
/// live component was reported as "exited during startup" with an empty
/// log. `spawn` must record the component's own pid whatever the caller's
/// shell options.
#[test]
fn spawn_records_the_components_own_pid_even_under_job_control() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink("/bin/sleep", bin.join("component")).unwrap();
    let script = format!(
        r#"set -euo pipefail
log() {{ echo "$*" >&2; }}
BIN='{bin}'
source '{lib}'
for mode in plain monitor; do
  [ "$mode" = monitor ] && set -m
  for i in $(seq 1 20); do
    spawn '{dir}' component 30
    pid="$(cat '{dir}/component.pid')"
    is_ours "$pid" component || {{ echo "$mode: pid $pid is not the component"; exit 1; }}
    kill "$pid"
  done
done
echo ok"#,
        bin = bin.display(),
        lib = repo().join("scripts/lib/process.sh").display(),
        dir = dir.path().display(),
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Between setsid's exec and the component's, a live process's command line
/// reads empty (one kube-apiserver spawn in four shows it when polled
/// closely). Taking that for "exited" failed starts with an empty log; the
/// check must take it for a process starting, while a dead or zombie one
/// is still gone.
#[test]
fn a_process_in_the_middle_of_its_exec_is_not_taken_for_dead() {
    let script = format!(
        r#"set -uo pipefail
log() {{ echo "$*" >&2; }}
source '{lib}'
sleep 30 & live=$!
proc_cmdline() {{ :; }}   # what /proc/PID/cmdline reads mid-exec
is_ours "$live" kube-apiserver || {{ echo "a live process mid-exec was taken for dead"; exit 1; }}
unset -f proc_cmdline
source '{lib}'
is_ours "$live" kube-apiserver && {{ echo "a live sleep was taken for kube-apiserver"; exit 1; }}
kill "$live"; wait "$live" 2>/dev/null
is_ours "$live" sleep && {{ echo "a dead process was taken for alive"; exit 1; }}
echo ok"#,
        lib = repo().join("scripts/lib/process.sh").display(),
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The message a panic carried.
fn panic_message(run: impl FnOnce()) -> String {
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
        .expect_err("the component must not start");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn a_fixtures_valkey_server_that_exits_at_startup_names_its_status_and_its_last_words() {
    let message = panic_message(|| {
        ValkeyServer::start_with(&["--no-such-option", "bound-to-fail"]);
    });
    assert!(
        message.contains(") exited with status 1 during startup"),
        "the exit status is named:\n{message}"
    );
    assert!(
        message.contains("'no-such-option \"bound-to-fail\"'")
            && message.contains("Bad directive or wrong number of arguments"),
        "the server's own stderr is shown:\n{message}"
    );
    assert!(
        message.contains("----- memory -----")
            && message.contains("----- the largest processes running -----"),
        "what else ran is shown:\n{message}"
    );
    assert_eq!(
        message.matches("exited with status").count(),
        1,
        "a bad option is not retried on other ports:\n{message}"
    );
}

#[test]
fn a_fixture_component_killed_before_it_wrote_a_line_names_the_signal() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("component.log");
    let message = panic_message(|| {
        let mut started = start_ready(
            "component",
            Command::new("sh").args(["-c", "kill -KILL $$"]),
            &log,
            std::time::Duration::from_secs(10),
            || false,
        );
        let _ = started.wait();
    });
    assert!(
        message.contains(") was killed by signal 9 (KILL) during startup"),
        "the signal is named:\n{message}"
    );
    assert!(
        message.contains("component.log is empty"),
        "an empty log says so:\n{message}"
    );
}
