//! Starts a real PostgreSQL cluster (Debian's `postgresql` package) on a free
//! loopback port for one test process: `initdb` + `pg_ctl` in a temporary
//! directory, trust authentication on 127.0.0.1 only, user `postgres`.
//!
//! The binaries come from the tools directory's `postgresql` link, which
//! `scripts/setup.sh` points at the package's bin directory. A missing binary
//! is a test failure with a clear message, never a skip. PostgreSQL refuses to run as root, so as
//! root the cluster runs as the `postgres` user the package creates.
//!
//! Nothing outlives the test process: a watchdog stops the cluster (immediate
//! mode) at most a second after this process exits, whether or not `Drop` ran.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tokio_postgres::{Client, NoTls};

use super::valkey_server::free_port;

/// A running cluster, stopped on drop.
pub struct Postgres {
    pub port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
    run_as: Option<&'static str>,
}

/// The directory holding `initdb`, `pg_ctl` and `postgres` (apt's, linked
/// into the tools directory as `postgresql` by `scripts/setup.sh`), or a panic
/// that says how to get it.
pub fn bin_dir() -> PathBuf {
    // The link resolved: PostgreSQL finds its share directory relative to its
    // own binaries, and the cluster's user may not read the tools directory.
    let link = super::tools::tool("postgresql");
    let dir = std::fs::canonicalize(&link)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/setup.sh", link.display()));
    assert!(
        dir.join("pg_ctl").is_file(),
        "{} holds no pg_ctl: run scripts/setup.sh",
        dir.display()
    );
    dir
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Postgres {
    /// A fresh, empty cluster on a free port. Panics with the server log
    /// when it does not start.
    pub fn start() -> Self {
        Self::start_on_ports(free_port)
    }

    /// A fresh, empty cluster on a port `next_port` gives: asked again while
    /// the port it gave is in use, at most 5 ports in all.
    pub fn start_on_ports(mut next_port: impl FnMut() -> u16) -> Self {
        let run_as = is_root().then_some("postgres");
        let dir = tempfile::Builder::new()
            .prefix("targetlease-pg-")
            .tempdir()
            .expect("tempdir");
        if let Some(user) = run_as {
            let ok = Command::new("chown")
                .arg(user)
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "cannot give {} to user {user}", dir.path().display());
        }
        let mut pg = Self {
            port: 0, // chosen after initdb, as close to the bind as can be
            bin: bin_dir(),
            dir,
            run_as,
        };
        pg.run(
            "initdb",
            &[
                "-D",
                &pg.data(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        // A port found free can be taken by anything before the postmaster
        // binds it (tests and fault harnesses run side by side): a start that
        // found its port in use is tried again on a new port, any other
        // failure is reported at once.
        let mut failures = Vec::new();
        loop {
            pg.port = next_port();
            let Err(e) = pg.try_start() else { break };
            let in_use = e.contains("Address already in use");
            failures.push(e);
            if !in_use || failures.len() == 5 {
                panic!("PostgreSQL did not start: {failures:#?}");
            }
        }
        pg.start_watchdog();
        pg
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// `pg_ctl start` on `self.port`; the error carries this attempt's
    /// server log.
    fn try_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 \
             -c lc_messages=C",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        // pg_ctl appends: a failure shows only this attempt's lines.
        let from = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        self.try_run(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                &self.data(),
                "-l",
                &log.display().to_string(),
                "-o",
                &options,
            ],
        )
        .map_err(|e| {
            let lines = std::fs::read(&log).unwrap_or_default();
            format!(
                "{e}\n{}",
                String::from_utf8_lossy(lines.get(from..).unwrap_or_default())
            )
        })
    }

    fn command(&self, program: &str) -> Command {
        let exe = self.bin.join(program);
        match self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(exe);
                c
            }
            None => Command::new(exe),
        }
    }

    fn try_run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let out = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn run(&self, program: &str, args: &[&str]) {
        self.try_run(program, args)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    // The watchdog outlives this process by design (it is in its own session).
    #[allow(clippy::zombie_processes)]
    fn start_watchdog(&self) {
        let stop = format!(
            "{} -D {} stop -m immediate",
            self.bin.join("pg_ctl").display(),
            self.data()
        );
        let stop = match self.run_as {
            Some(user) => format!("runuser -u {user} -- {stop}"),
            None => stop,
        };
        let script = format!(
            "while kill -0 {} 2>/dev/null && [ -d {} ]; do sleep 1; done; {stop} >/dev/null 2>&1",
            std::process::id(),
            self.data()
        );
        Command::new("setsid")
            .args(["bash", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the PostgreSQL watchdog");
    }

    /// libpq connection string for database `db`.
    pub fn conn_string(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db} connect_timeout=5",
            self.port
        )
    }

    /// A connected client on database `db`; its connection task runs on the caller's runtime.
    pub async fn client(&self, db: &str) -> Client {
        self.try_client(db)
            .await
            .unwrap_or_else(|e| panic!("connect to PostgreSQL database {db}: {e}"))
    }

    /// A connected client, or the connection error.
    pub async fn try_client(&self, db: &str) -> Result<Client, tokio_postgres::Error> {
        let (client, conn) = tokio_postgres::connect(&self.conn_string(db), NoTls).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(client)
    }

    /// Creates an empty database and returns its name.
    pub async fn create_database(&self, name: &str) -> String {
        let admin = self.client("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
        name.to_string()
    }

    /// The server log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Where the cluster keeps its files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.try_run("pg_ctl", &["stop", "-m", "immediate", "-D", &self.data()]);
    }
}

/// The fencing recipe users copy (`examples/fencing/postgresql.sql`), as
/// this binary was built with it (a long run never reads a later checkout's).
pub fn fencing_recipe() -> String {
    include_str!("../../examples/fencing/postgresql.sql").to_string()
}

/// SQLSTATE the recipe raises for a token lower than the resource's floor.
pub const STALE_TOKEN_SQLSTATE: &str = "TLF01";
