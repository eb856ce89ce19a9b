//! The real `targetlease` binary, invoked the way a test reads: a builder
//! per `lease` command and the parsed JSON line it prints.
//!
//! ```ignore
//! let j = lease(&url, "acquire").target("db").owner("alice").ttl("10s").ok("acquired", 0);
//! lease(&url, "renew").target("db").handle(&j.json).ttl("60s").ok("renewed", 0);
//! ```

use std::collections::BTreeSet;
use std::fmt::Display;
use std::process::{Command, Output};

use serde_json::Value;

/// The binary under test: `<target>/<profile>/targetlease`, the one cargo
/// links beside the `deps/` directory of the running test or benchmark
/// executable (a library cannot read `CARGO_BIN_EXE_targetlease` when it is
/// compiled; a cargo that sets it when the test runs is believed).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(set) = std::env::var_os("CARGO_BIN_EXE_targetlease") {
            return set.into_string().expect("a UTF-8 path");
        }
        let exe = std::env::current_exe().expect("the running executable's path");
        let profile = exe
            .parent()
            .and_then(std::path::Path::parent)
            .expect("test executables live in <target>/<profile>/deps");
        let bin = profile.join("targetlease");
        bin.into_os_string().into_string().expect("a UTF-8 path")
    })
}

/// A `targetlease` command with no `TARGETLEASE_*` or `RUST_LOG` leaking in
/// from the test's environment, and no kubeconfig (outside a pod, the
/// default namespace is the kubeconfig's: a developer's own must not move it).
pub fn targetlease<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Command {
    let mut cmd = Command::new(bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TARGETLEASE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("RUST_LOG");
    cmd.env("KUBECONFIG", "/nonexistent/targetlease-tests/kubeconfig");
    cmd.args(args);
    cmd
}

/// `targetlease lease <op> … --valkey-url <url>`, one flag at a time.
#[derive(Clone, Debug)]
pub struct Lease {
    args: Vec<String>,
}

/// Starts `targetlease lease <op>` against `url`.
pub fn lease(url: &str, op: &str) -> Lease {
    Lease {
        args: vec!["lease".into(), op.into(), "--valkey-url".into(), url.into()],
    }
}

impl Lease {
    /// More arguments, as given.
    pub fn with(mut self, more: &[&str]) -> Self {
        self.args.extend(more.iter().map(|a| a.to_string()));
        self
    }

    /// `--<name> <value>`.
    pub fn flag(mut self, name: &str, value: impl Display) -> Self {
        self.args.push(format!("--{name}"));
        self.args.push(value.to_string());
        self
    }

    /// `--<name>` alone.
    pub fn switch(mut self, name: &str) -> Self {
        self.args.push(format!("--{name}"));
        self
    }

    pub fn target(self, t: impl Display) -> Self {
        self.flag("target", t)
    }

    pub fn owner(self, o: impl Display) -> Self {
        self.flag("owner", o)
    }

    pub fn ttl(self, t: impl Display) -> Self {
        self.flag("ttl", t)
    }

    pub fn token(self, t: impl Display) -> Self {
        self.flag("token", t)
    }

    pub fn lease_id(self, id: impl Display) -> Self {
        self.flag("lease-id", id)
    }

    pub fn request_id(self, id: impl Display) -> Self {
        self.flag("request-id", id)
    }

    /// The lease handle (`--owner`, `--lease-id`, `--token`) of the lease a command printed
    /// (its whole JSON line, or its `lease` object).
    pub fn handle(self, printed: &Value) -> Self {
        let l = printed.get("lease").unwrap_or(printed);
        let field = |k: &str| {
            l.get(k)
                .unwrap_or_else(|| panic!("no {k} in the printed lease {l}"))
                .clone()
        };
        let owner = field("owner");
        let id = field("lease_id");
        self.owner(owner.as_str().expect("owner"))
            .lease_id(id.as_str().expect("lease_id"))
            .token(field("fencing_token"))
    }

    /// `--timeout 1s --connect-timeout 1s`.
    pub fn short_deadlines(self) -> Self {
        self.flag("timeout", "1s").flag("connect-timeout", "1s")
    }

    /// The arguments after `targetlease`.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The command, not yet run.
    pub fn command(&self) -> Command {
        targetlease(&self.args)
    }

    /// Runs it.
    pub fn output(&self) -> Output {
        self.command().output().expect("run targetlease")
    }

    /// Runs it and parses the one JSON line it must print.
    pub fn res(&self) -> Res {
        Res::parse(self.output())
    }

    /// Runs it and checks it was refused as `backend_unavailable` (exit 3)
    /// with a message naming `why`, and that neither stream shows any of
    /// `secrets`.
    pub fn refused(&self, why: &str, secrets: &[&str]) -> Res {
        let r = self.ok("backend_unavailable", 3);
        let message = r.json["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(why),
            "expected {why:?} in the message: {}",
            r.stdout
        );
        for secret in secrets {
            assert!(
                !r.stdout.contains(secret) && !r.stderr.contains(secret),
                "a secret shows: {} {}",
                r.stdout,
                r.stderr
            );
        }
        r
    }

    /// Runs it and checks its outcome and exit code.
    pub fn ok(&self, outcome: &str, code: i32) -> Res {
        let r = self.res();
        assert_eq!(
            r.json["outcome"], outcome,
            "{:?}: {} (stderr {})",
            self.args, r.stdout, r.stderr
        );
        assert_eq!(r.code, code, "{:?}: {}", self.args, r.stdout);
        r
    }
}

/// What a `lease` command printed: exit code, its JSON line, both streams.
#[derive(Debug)]
pub struct Res {
    pub code: i32,
    pub json: Value,
    pub stdout: String,
    pub stderr: String,
}

impl Res {
    /// Parses the output of a `lease` command: exactly one JSON line with
    /// the four envelope fields.
    pub fn parse(out: Output) -> Res {
        let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
        let stderr = String::from_utf8(out.stderr).expect("utf-8 stderr");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "expected exactly one JSON line on stdout, got {stdout:?} (stderr {stderr:?})"
        );
        let json: Value = serde_json::from_str(lines[0]).expect("stdout is JSON");
        let obj = json.as_object().expect("a JSON object");
        let keys: BTreeSet<&str> = obj.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["outcome", "lease", "server_time_ms", "message"]),
            "{stdout}"
        );
        assert!(json["message"].is_string(), "{stdout}");
        assert!(json["server_time_ms"].is_u64(), "{stdout}");
        Res {
            code: out.status.code().expect("exit code"),
            json,
            stdout,
            stderr,
        }
    }

    /// The printed lease's fencing token.
    pub fn token(&self) -> u64 {
        self.json["lease"]["fencing_token"]
            .as_u64()
            .unwrap_or_else(|| panic!("no token in {}", self.stdout))
    }
}

/// `targetlease run --target T --owner O --ttl TTL [more…] -- CMD…`, with
/// the server's URL in the environment.
#[derive(Clone, Debug)]
pub struct Run {
    url: String,
    args: Vec<String>,
}

/// Starts `targetlease run` for `owner` on `target` with a lease of `ttl`.
pub fn run(url: &str, target: &str, owner: &str, ttl: &str) -> Run {
    let args = ["run", "--target", target, "--owner", owner, "--ttl", ttl];
    Run {
        url: url.to_owned(),
        args: args.iter().map(|a| a.to_string()).collect(),
    }
}

impl Run {
    /// More `run` flags, as given.
    pub fn with(mut self, more: &[&str]) -> Self {
        self.args.extend(more.iter().map(|a| a.to_string()));
        self
    }

    /// `--wait <wait>`.
    pub fn wait(self, wait: &str) -> Self {
        self.with(&["--wait", wait])
    }

    /// `--timeout 1s --connect-timeout 1s`.
    pub fn short_deadlines(self) -> Self {
        self.with(&["--timeout", "1s", "--connect-timeout", "1s"])
    }

    /// The command for running `cmd` under the lease.
    pub fn exec(&self, cmd: &[&str]) -> Command {
        let mut all = self.args.clone();
        all.push("--".into());
        all.extend(cmd.iter().map(|a| a.to_string()));
        let mut command = targetlease(&all);
        command.env("TARGETLEASE_VALKEY_URL", &self.url);
        command
    }

    /// The command for running a shell script under the lease.
    pub fn sh(&self, script: &str) -> Command {
        self.exec(&["sh", "-c", script])
    }
}
