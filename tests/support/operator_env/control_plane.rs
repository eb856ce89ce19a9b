//! An env on a control plane of its own, for tests that hang, kill and
//! restart kube-apiserver (which the shared control plane's other tests
//! must never see), and kubeconfigs that reach it through a proxy.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::OperatorEnv;
use crate::kube_env::ControlPlane;

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}/{file}: {e}", dir.display()))
        .trim()
        .to_string()
}

fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name in parentheses; a zombie has exited.
    let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
    !stat.is_empty() && !matches!(state, Some('Z' | 'X'))
}

/// A kube-apiserver stopped by [`OperatorEnv::kill_apiserver`]: its command line.
pub struct StoppedApiServer(Vec<String>);

impl OperatorEnv {
    /// Namespace, Valkey and CRD on a new control plane of this env's own
    /// (stopped when the env is dropped), no operator yet.
    pub async fn start_on_own_control_plane(prefix: &str) -> Self {
        let cp: &'static ControlPlane = Box::leak(Box::new(ControlPlane::start().await));
        let mut env = Self::start_without_operator_on(cp, prefix).await;
        env.owns_control_plane = true;
        env
    }

    /// Operators started from now on watch every namespace of this env's
    /// own control plane (a shared one has other tests' namespaces).
    pub fn watch_every_namespace(&mut self) {
        assert!(
            self.owns_control_plane,
            "only an env's own control plane may be watched whole"
        );
        self.watch_all = true;
    }

    fn apiserver_pid(&self) -> i32 {
        read(self.cp.dir(), "kube-apiserver.pid")
            .parse()
            .expect("kube-apiserver pid")
    }

    /// Freezes (SIGSTOP) or resumes (SIGCONT) this env's kube-apiserver:
    /// connections stay open and nothing answers.
    pub fn pause_apiserver(&self, paused: bool) {
        assert!(
            self.owns_control_plane,
            "only an env's own control plane may be paused"
        );
        let sig = if paused { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([sig, &self.apiserver_pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {sig} kube-apiserver");
    }

    /// Kills this env's kube-apiserver (SIGKILL, a crash) and waits until it is gone.
    pub fn kill_apiserver(&self) -> StoppedApiServer {
        assert!(
            self.owns_control_plane,
            "only an env's own control plane may be killed"
        );
        let pid = self.apiserver_pid();
        let cmdline =
            std::fs::read(format!("/proc/{pid}/cmdline")).expect("apiserver command line");
        let argv = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        while alive(pid) {
            std::thread::sleep(Duration::from_millis(50));
        }
        StoppedApiServer(argv)
    }

    /// Starts kube-apiserver again as it ran, and waits until it serves.
    pub fn restart_apiserver(&self, stopped: StoppedApiServer) {
        crate::kube_env::start_apiserver_again(self.cp.dir(), &stopped.0);
    }

    /// The admin kubeconfig with the API server reached at `127.0.0.1:port`
    /// instead (a proxy in front of it; the serving certificate names 127.0.0.1).
    pub fn kubeconfig_via(&self, port: u16) -> PathBuf {
        let text = std::fs::read_to_string(self.cp.kubeconfig_path()).expect("kubeconfig");
        let server = self.cp.server_url();
        assert!(text.contains(&server), "the kubeconfig names {server}");
        let path = self.dir.path().join(format!("kubeconfig-via-{port}"));
        std::fs::write(
            &path,
            text.replace(&server, &format!("https://127.0.0.1:{port}")),
        )
        .expect("write kubeconfig");
        path
    }

    /// Stops the control plane this env owns (after its operators).
    pub(super) fn stop_own_control_plane(&self) {
        let script = crate::repo().join("scripts/controlplane.sh");
        // A paused API server would not stop on SIGTERM.
        if let Ok(pid) = std::fs::read_to_string(self.cp.dir().join("kube-apiserver.pid")) {
            let _ = Command::new("kill")
                .args(["-CONT", pid.trim()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = Command::new("bash")
            .arg(script)
            .arg("stop")
            .arg(self.cp.dir())
            .output();
    }
}
