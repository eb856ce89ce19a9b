//! One run of one scenario: start the deployment and the downstream, run the
//! workload while the fault is injected, stop, read the final downstream
//! state, check the history.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use targetlease::store::etcd::{EtcdConfig, EtcdStore, is_etcd_url};
use targetlease::store::valkey::{Durability, ValkeyConfig, ValkeyStore};
use targetlease::store::{LeaseStore, Outcome, StoreError, Target};

use crate::check::{self, Report};
use crate::controls::{self, Control};
use crate::history::{CommitState, History, Recorder};
use crate::inject::{self, Pace, Targets};
use crate::scenarios::{Backend, Fault, Scenario};
use crate::sink::{Guard, PgSink};
use crate::support::postgres::Postgres;
use crate::support::resp::Resp;
use crate::valkey::Valkey;
use crate::workload::Stop;
use crate::workload::cli::CliStore;
use crate::workload::client::{COMMIT_KEY, Client};
use crate::workload::holder::{Holder, HolderConfig};
use crate::workload::lag::Cue;
use crate::workload::{LAG_HOLDER, observer, revoker};

/// Per-operation deadline of library clients (the CLI uses the same).
const TIMEOUT: Duration = Duration::from_millis(500);
/// Library clients and CLI clients per run.
const LIB_CLIENTS: usize = 3;
const CLI_CLIENTS: usize = 1;
pub const NAMESPACE: &str = "faults";
pub const TARGETS: [&str; 2] = ["t0", "t1"];
/// How often the administrator revokes a client lease (about).
const REVOKE_EVERY: Duration = Duration::from_millis(1500);

/// What one run produced.
pub struct RunResult {
    pub history: History,
    pub report: Report,
    pub elapsed: Duration,
}

/// A store of either kind, by its URL (`etcd://…` or a Valkey URL), with
/// the workload's deadlines.
pub async fn try_connect(
    url: &str,
    durability: Durability,
) -> Result<Arc<dyn LeaseStore>, StoreError> {
    if is_etcd_url(url) {
        let store = EtcdStore::connect(&EtcdConfig {
            url: url.to_string(),
            timeout: TIMEOUT,
            connect_timeout: TIMEOUT,
            ..EtcdConfig::default()
        })
        .await?;
        return Ok(Arc::new(store));
    }
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: url.to_string(),
        timeout: TIMEOUT,
        connect_timeout: TIMEOUT,
        durability,
        ..ValkeyConfig::default()
    })
    .await?;
    Ok(Arc::new(store))
}

/// [`try_connect`], tried again for 20 s (a fault may be on).
pub async fn connect(url: &str, durability: Durability) -> Arc<dyn LeaseStore> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match try_connect(url, durability).await {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                eprintln!("  connecting to the store: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("cannot connect to the store at {url}: {e}"),
        }
    }
}

fn guard(control: Option<Control>) -> Guard {
    match control {
        Some(Control::Unguarded) => Guard::Unguarded,
        Some(Control::BrokenRecipe) => Guard::BrokenRecipe,
        Some(Control::LoseAckedWrites) => Guard::AckBeforeCommit,
        _ => Guard::Recipe,
    }
}

/// Runs one raw command against the current primary; None while unreachable.
pub type Primary = Arc<dyn Fn(&[&str]) -> Option<Resp> + Send + Sync>;

/// Where the final fenced-commit values are read from.
pub enum Finals {
    /// Valkey: the commit field of each target's hash, on the current
    /// primary; `url` names the deployment (for the key layout).
    Valkey { primary: Primary, url: String },
    /// Any store: `read` of the commit key, straight to the server at this URL.
    Store(String),
}

/// Reads each target's fenced-commit value (retrying while the store is
/// unreachable: a fault may have just ended).
async fn final_commits(finals: Finals) -> Vec<CommitState> {
    match finals {
        Finals::Valkey { primary, url } => {
            let deadline = Instant::now() + Duration::from_secs(20);
            let config = ValkeyConfig {
                url: url.clone(),
                timeout: TIMEOUT,
                connect_timeout: TIMEOUT,
                ..ValkeyConfig::default()
            };
            let reader = loop {
                match ValkeyStore::connect(&config).await {
                    Ok(r) => break r,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("  connecting to valkey: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("cannot connect to valkey at {url}: {e}"),
                }
            };
            valkey_commits(primary, &reader).await
        }
        Finals::Store(url) => store_commits(connect(&url, Durability::None).await).await,
    }
}

/// Each target's committed value by the store's own `read`.
async fn store_commits(store: Arc<dyn LeaseStore>) -> Vec<CommitState> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::new();
    for t in TARGETS {
        let target = Target::new(NAMESPACE, t);
        let read = loop {
            match store.read(&target, COMMIT_KEY).await {
                Ok(r) if matches!(r.outcome, Outcome::Found | Outcome::NotFound) => break r,
                other => {
                    assert!(
                        Instant::now() < deadline,
                        "the store never came back: {other:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        if let Some(c) = read.committed {
            out.push(CommitState {
                resource: t.to_string(),
                token: c.fencing_token,
                write_id: c.value,
            });
        }
    }
    out
}

/// Each target's fenced-commit value from the Valkey primary.
async fn valkey_commits(primary: Primary, store: &ValkeyStore) -> Vec<CommitState> {
    let field = targetlease::store::valkey::keys::commit_field(COMMIT_KEY);
    let keys: Vec<(String, String)> = TARGETS
        .iter()
        .map(|t| {
            let key = store.keys().target(&Target::new(NAMESPACE, *t));
            (t.to_string(), key)
        })
        .collect();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        for (target, key) in keys {
            let reply = loop {
                if let Some(r) = primary(&["HGET", &key, &field]) {
                    break r;
                }
                assert!(Instant::now() < deadline, "valkey never came back");
                std::thread::sleep(Duration::from_millis(100));
            };
            // "<token>:<committed_ms>:<value>" (lua/lib.lua)
            match reply {
                Resp::Bulk(None) => {}
                Resp::Bulk(Some(record)) => {
                    let mut parts = record.splitn(3, ':');
                    let (Some(token), Some(_), Some(value)) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        panic!("commit record {key}: {record:?}");
                    };
                    out.push(CommitState {
                        resource: target,
                        token: token.parse().expect("a numeric commit token"),
                        write_id: value.to_owned(),
                    });
                }
                other => panic!("HGET {key} {field}: {other:?}"),
            }
        }
        out
    })
    .await
    .expect("read final commits")
}

/// The environment that turns a scenario's product fail points on in a
/// CLI or operator process.
pub fn failpoint_env(s: &Scenario) -> Vec<(String, String)> {
    if s.failpoints.is_empty() {
        return Vec::new();
    }
    let list: Vec<String> = s
        .failpoints
        .iter()
        .map(|(n, a)| format!("{n}={a}"))
        .collect();
    vec![("TARGETLEASE_FAILPOINTS".into(), list.join(";"))]
}

/// Injects `s`'s fault into `targets` for `secs` seconds while the workload
/// runs, waits out the recovery bound (the last fault is always judged),
/// then stops the workload and the paused holder.
pub async fn inject_then_stop(
    s: &Scenario,
    secs: u64,
    targets: Targets,
    rec: &Recorder,
    stop: &Stop,
) {
    let faults = Stop::default();
    let fault = tokio::spawn(inject::run(
        s.fault,
        targets,
        rec.clone(),
        Pace::new(faults.clone(), s.quiet()),
    ));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    faults.set();
    let back = fault.await.expect("fault task");
    tokio::time::sleep(s.quiet()).await;
    rec.stopped();
    stop.set();
    if let Some(h) = back.holder {
        h.stop().await;
    }
}

/// Turns a scenario's fail points on (or off) in this process.
pub fn failpoints_here(s: &Scenario, on: bool) {
    if !s.failpoints_here {
        return;
    }
    for (name, action) in s.failpoints {
        targetlease::store::failpoints::set(name, if on { action } else { "off" })
            .unwrap_or_else(|e| panic!("fail point {name}={action}: {e}"));
    }
}

/// What the workload runs on: the URL clients use (through a faulty proxy,
/// if any) and the one observers use (straight to the server).
pub struct Urls {
    pub clients: String,
    pub observer: String,
}

/// The lease clients (library and CLI), the administrator revoking their
/// leases and the observer; `extra` are more targets to observe (the
/// operator's, which carry no commit key). With a `lag` cue (failovers),
/// also the lag-window holder.
pub async fn clients(
    urls: &Urls,
    s: &Scenario,
    sink: &PgSink,
    rec: &Recorder,
    stop: &Stop,
    extra: &[Target],
    lag: Option<watch::Receiver<Option<Cue>>>,
) -> Vec<JoinHandle<()>> {
    let url = urls.clients.as_str();
    let targets: Vec<Target> = TARGETS.iter().map(|t| Target::new(NAMESPACE, *t)).collect();
    let mut tasks = Vec::new();
    for i in 0..LIB_CLIENTS + CLI_CLIENTS {
        let (name, store): (String, Arc<dyn LeaseStore>) = if i < LIB_CLIENTS {
            let lib = connect(url, s.durability).await;
            (format!("lib{i}"), controls::wrap(s.control, lib))
        } else {
            let cli = CliStore {
                url: url.to_string(),
                timeout: TIMEOUT,
                durability: s.durability,
                rec: rec.clone(),
                env: failpoint_env(s),
            };
            (format!("cli{}", i - LIB_CLIENTS), Arc::new(cli))
        };
        let client = Client {
            pg: Some(sink.writer(&name).await),
            name,
            store,
            targets: targets.clone(),
            ttl: s.ttl,
            rec: rec.clone(),
            stop: stop.clone(),
        };
        tasks.push(tokio::spawn(client.run()));
    }
    if let Some(cue) = lag {
        let store = connect(url, s.durability).await;
        let holder = Client {
            pg: Some(sink.writer(LAG_HOLDER).await),
            name: LAG_HOLDER.into(),
            store,
            targets: targets.clone(),
            ttl: s.ttl,
            rec: rec.clone(),
            stop: stop.clone(),
        };
        tasks.push(tokio::spawn(holder.hold_across_failovers(cue)));
    }
    let admin = connect(url, Durability::None).await;
    tasks.push(tokio::spawn(revoker::run(
        admin,
        targets.clone(),
        REVOKE_EVERY,
        rec.clone(),
        stop.clone(),
    )));
    let observer_store = connect(&urls.observer, Durability::None).await;
    let observed = targets
        .into_iter()
        .map(|t| (t, true))
        .chain(extra.iter().map(|t| (t.clone(), false)))
        .collect();
    tasks.push(tokio::spawn(observer::run(
        observer_store,
        observed,
        rec.clone(),
        stop.clone(),
    )));
    tasks
}

/// The holder process the `PauseHolder` fault stops (none for other faults).
pub fn paused_holder(s: &Scenario, urls: &Urls, sink: &PgSink, rec: &Recorder) -> Option<Holder> {
    (s.fault == Fault::PauseHolder).then(|| {
        let cfg = HolderConfig {
            name: "paused".into(),
            store_url: urls.clients.clone(),
            pg: sink.conn_string(),
            namespace: NAMESPACE.into(),
            targets: TARGETS.iter().map(|t| t.to_string()).collect(),
            ttl_ms: s.ttl.as_millis() as u64,
        };
        Holder::spawn(&cfg, rec.clone())
    })
}

/// Waits for the workload to stop, reads the final downstream state and checks.
pub async fn finish(
    tasks: Vec<JoinHandle<()>>,
    sink: &PgSink,
    finals: Finals,
    rec: &Recorder,
    started: Instant,
) -> RunResult {
    for t in tasks {
        // Tasks finish their current step (every call is cut off as a hang
        // after 30 s); one that is still stuck is a harness failure.
        tokio::time::timeout(Duration::from_secs(180), t)
            .await
            .expect("a workload task did not stop within 180s")
            .expect("a workload task panicked");
    }
    rec.set_rows(sink.rows().await);
    rec.set_commits(final_commits(finals).await);
    let history = rec.snapshot();
    let report = check::check(&history);
    RunResult {
        history,
        report,
        elapsed: started.elapsed(),
    }
}

/// Runs `s` for `secs` seconds; `seq` names the run's database.
pub async fn run(s: &Scenario, secs: u64, pg: Arc<Postgres>, seq: usize) -> RunResult {
    failpoints_here(s, true);
    let result = run_inner(s, secs, pg, seq).await;
    failpoints_here(s, false);
    result
}

async fn run_inner(s: &Scenario, secs: u64, pg: Arc<Postgres>, seq: usize) -> RunResult {
    let started = Instant::now();
    let sink = PgSink::create(pg, &format!("run_{seq}"), guard(s.control)).await;
    let setup = match &s.backend {
        Backend::Valkey(setup) => setup,
        Backend::Etcd(setup) => return crate::etcd::run::run(s, *setup, secs, sink, started).await,
        Backend::Operator { .. } | Backend::EtcdOperator { .. } => {
            return crate::workload::operator::run(s, secs, sink, started).await;
        }
    };
    let setup = setup.clone();
    let valkey = Arc::new(
        tokio::task::spawn_blocking(move || Valkey::start(&setup))
            .await
            .expect("start valkey"),
    );
    let urls = Urls {
        clients: valkey.url(),
        observer: valkey.direct_url(),
    };
    let rec = Recorder::dated(s.backend.dating());
    let stop = Stop::default();
    let (lag, cue) = if s.lag_window_holder() {
        let (tx, rx) = watch::channel(None);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let tasks = clients(&urls, s, &sink, &rec, &stop, &[], cue).await;
    let holder = paused_holder(s, &urls, &sink, &rec);
    let targets = Targets {
        valkey: Some(valkey.clone()),
        etcd: None,
        holder,
        ttl: s.ttl,
        lag,
    };
    inject_then_stop(s, secs, targets, &rec, &stop).await;
    let v = valkey.clone();
    let stats = tokio::task::spawn_blocking(move || v.effects())
        .await
        .expect("server statistics");
    for (what, n) in stats {
        rec.effect(&what, n);
    }
    let primary: Primary = Arc::new(move |args: &[&str]| valkey.on_primary(args));
    let finals = Finals::Valkey {
        primary,
        url: urls.clients.clone(),
    };
    finish(tasks, &sink, finals, &rec, started).await
}
