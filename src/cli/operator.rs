//! `targetlease operator`: run the controller, the admin server and (with
//! several replicas) leader election.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::sync::watch;

use super::connection::{ConnectionArgs, StoreConfig, read_secret};
use super::logging::{self, LogArgs};
use crate::operator::admin::tls::AdminTls;
use crate::operator::admin::{self, AdminState, RuntimeStatus};
use crate::operator::api_timeout::ApiTimeoutLayer;
use crate::operator::election::Timings;
use crate::operator::election::write_gate::WriteGateLayer;
use crate::operator::floor::FloorPolicy;
use crate::operator::leadership::Leadership;
use crate::operator::lease_id::{LeaseIdKey, secret};
use crate::operator::metrics::{self, OperatorMetrics};
use crate::operator::reconcile::clock::ServerClock;
use crate::operator::reconcile::keeper::Keeper;
use crate::operator::subscribe::resubscribing;
use crate::operator::{self, Election, OperatorConfig};
use crate::store::etcd::EtcdStore;
use crate::store::metrics::{MeteredStore, StoreMetrics};
use crate::store::valkey::notices;
use crate::store::{LeaseStore, StoreError};

/// Flags of `targetlease operator`.
#[derive(Args, Debug)]
pub struct OperatorArgs {
    /// How to reach Valkey.
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
    /// File holding the secret that lease ids are derived from; every replica must
    /// share it so a new leader can renew the leases the old one acquired.
    #[arg(long, env = "TARGETLEASE_LEASE_ID_KEY_FILE")]
    pub lease_id_key_file: Option<PathBuf>,
    /// Instead of a file: the Secret (in the floor namespace) holding that key.
    /// The operator creates it with a random key if it does not exist; replicas
    /// starting at once agree on one key.
    #[arg(
        long,
        env = "TARGETLEASE_LEASE_ID_KEY_SECRET",
        conflicts_with = "lease_id_key_file"
    )]
    pub lease_id_key_secret: Option<String>,
    /// The operator's own ServiceAccount (in the floor namespace; the chart
    /// passes it from the downward API). With `--lease-id-key-secret`, a key
    /// Secret created before this ServiceAccount is refused: it predates the
    /// installation, so someone else made it and knows the key.
    #[arg(long, env = "POD_SERVICE_ACCOUNT")]
    pub service_account: Option<String>,
    /// Namespace of the ConfigMaps that keep the last token of deleted leases.
    #[arg(
        long,
        env = "TARGETLEASE_FLOOR_NAMESPACE",
        default_value = "targetlease-system"
    )]
    pub floor_namespace: String,
    /// Those ConfigMaps' names start with this: one `<name>.<namespace>` per
    /// namespace that deleted a TargetLease.
    #[arg(
        long,
        env = "TARGETLEASE_FLOOR_CONFIGMAP",
        default_value = "targetlease-token-floors"
    )]
    pub floor_configmap: String,
    /// Token floors one namespace keeps at most (one per deleted target); a
    /// deletion that would pass it folds the namespace's oldest quarter into
    /// the namespace's base floor, with a Warning Event.
    #[arg(
        long,
        env = "TARGETLEASE_FLOOR_MAX_ENTRIES",
        default_value_t = 4000,
        value_parser = clap::value_parser!(u64).range(1..=crate::operator::floor::MAX_ENTRIES_LIMIT as u64)
    )]
    pub floor_max_entries: u64,
    /// A target's floor raised this long ago, whose target no TargetLease
    /// names, is folded into its namespace's base floor.
    #[arg(long, env = "TARGETLEASE_FLOOR_RETENTION", default_value = "30days", value_parser = humantime::parse_duration)]
    pub floor_retention: Duration,
    /// Reconciles running at once; when all are busy, the namespaces waiting
    /// for one take turns.
    #[arg(long, env = "TARGETLEASE_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "TARGETLEASE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// This replica's name, for Events and leader election (the pod name in a cluster).
    #[arg(long, env = "POD_NAME", default_value = "targetlease-operator")]
    pub instance: String,
    /// Address of the admin server (/livez, /readyz, /metrics): `IP:PORT`,
    /// `[IPv6]:PORT` or a bare IPv6 address and port (what `$(POD_IP):PORT`
    /// expands to in an IPv6 pod). The default is reachable from this host
    /// only; the chart binds the pod's own IP. `[::]:PORT` listens on every
    /// address, IPv6 and IPv4 (IPv4 only where the node has no IPv6).
    #[arg(long, env = "TARGETLEASE_ADMIN_ADDR", default_value = "127.0.0.1:8080", value_parser = parse_listen_addr)]
    pub admin_addr: SocketAddr,
    /// PEM certificate chain: the admin server then speaks HTTPS only (probes
    /// included) and refuses plain HTTP. Read again when the file changes.
    #[arg(
        long,
        env = "TARGETLEASE_ADMIN_TLS_CERT_FILE",
        requires = "admin_tls_key_file"
    )]
    pub admin_tls_cert_file: Option<PathBuf>,
    /// PEM private key of that certificate.
    #[arg(
        long,
        env = "TARGETLEASE_ADMIN_TLS_KEY_FILE",
        requires = "admin_tls_cert_file"
    )]
    pub admin_tls_key_file: Option<PathBuf>,
    /// Elect one active replica on a coordination.k8s.io Lease (for several replicas).
    #[arg(long, env = "TARGETLEASE_LEADER_ELECTION", default_value_t = false)]
    pub leader_election: bool,
    /// Namespace of the leader election Lease (default: the floor namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the leader election Lease.
    #[arg(
        long,
        env = "TARGETLEASE_LEADER_ELECTION_LEASE",
        default_value = "targetlease-operator"
    )]
    pub leader_election_lease: String,
    /// How long a standby waits, after it last saw the Lease renewed, before
    /// taking over.
    #[arg(long, env = "TARGETLEASE_LEADER_ELECTION_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_election_duration: Duration,
    /// How long after sending its last successful renewal the leader keeps
    /// writing; it stops unless it renewed again. Shorter than the duration.
    #[arg(long, env = "TARGETLEASE_LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub leader_election_renew_deadline: Duration,
    /// How often the leader renews and a standby checks the Lease. Shorter
    /// than the renew deadline.
    #[arg(long, env = "TARGETLEASE_LEADER_ELECTION_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    pub leader_election_retry_period: Duration,
    /// Longest wait for one Kubernetes API request (a watch: for its response
    /// to start). A reconcile whose request takes longer gives up its slot
    /// and retries with backoff.
    #[arg(long, env = "TARGETLEASE_API_TIMEOUT", default_value = "15s", value_parser = humantime::parse_duration)]
    pub api_timeout: Duration,
    /// How long the API server keeps each watch open before ending it (the
    /// operator then watches again from where it was). A watch silent for
    /// this long plus 5s is taken for dead and made again.
    #[arg(long, env = "TARGETLEASE_WATCH_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub watch_timeout: Duration,
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("targetlease operator: {message}");
    ExitCode::from(2)
}

/// Connects to the store, retrying with capped backoff until it answers or
/// shutdown (`Ok(None)`); settings that can never work end it at once.
async fn connect(
    config: &StoreConfig,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<(Arc<dyn LeaseStore>, StoreMetrics)>, String> {
    let mut delay = Duration::from_millis(200);
    loop {
        match config.connect_with_metrics().await {
            Ok(store) => return Ok(Some(store)),
            Err(StoreError::Invalid(why)) => return Err(why),
            Err(e) => tracing::warn!(error = %e, retry_in = ?delay, "lease store not reachable"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {},
            _ = shutdown.wait_for(|s| *s) => return Ok(None),
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// Runs the operator until SIGTERM or Ctrl-C.
pub async fn main(args: OperatorArgs) -> ExitCode {
    logging::init(&args.log);
    let key_file = match &args.lease_id_key_file {
        Some(path) => {
            match read_secret(path, "lease id key file")
                .and_then(|s| LeaseIdKey::new(s.expose().as_bytes()))
            {
                Ok(k) => Some(k),
                Err(e) => return usage(&e),
            }
        }
        None => None,
    };
    let config = match args.connection.to_store_config() {
        Ok(c) => c,
        Err(e) => return usage(&e),
    };
    let admin_tls = match (&args.admin_tls_cert_file, &args.admin_tls_key_file) {
        (Some(cert), Some(key)) => match AdminTls::from_files(cert, key) {
            Ok(tls) => Some(tls),
            Err(why) => {
                return usage(format!(
                    "--admin-tls-cert-file, --admin-tls-key-file: {why}"
                ));
            }
        },
        _ => None,
    };
    let timings = Timings {
        lease_duration: args.leader_election_duration,
        renew_deadline: args.leader_election_renew_deadline,
        retry_period: args.leader_election_retry_period,
    };
    if args.leader_election
        && let Err(e) = timings.validate()
    {
        return usage(format!(
            "--leader-election-duration, --leader-election-renew-deadline, --leader-election-retry-period: {e}"
        ));
    }
    if args.api_timeout.is_zero() || args.watch_timeout < Duration::from_secs(1) {
        return usage("--api-timeout must be more than zero and --watch-timeout at least 1s");
    }
    if args.floor_retention < Duration::from_secs(1) {
        return usage("--floor-retention must be at least 1s");
    }
    let leadership = if args.leader_election {
        Leadership::elected()
    } else {
        Leadership::always()
    };
    let metrics = OperatorMetrics::default();
    let (client, election_client) = match clients(&leadership, &metrics, args.api_timeout).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("targetlease operator: kubernetes client: {e}");
            return ExitCode::from(3);
        }
    };
    let (shutdown_tx, mut shutdown) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = shutdown_tx.send(true);
    });

    let lease_ids = match (key_file, &args.lease_id_key_secret) {
        (Some(k), _) => k,
        (None, Some(name)) => {
            // The ungated client: every replica reads (or creates) the key
            // before it may lead.
            let ns = &args.floor_namespace;
            match secret::load_or_create_retrying(
                &election_client,
                ns,
                name,
                args.service_account.as_deref(),
                &mut shutdown,
            )
            .await
            {
                Ok(Some((k, origin))) => {
                    tracing::info!(secret = %format!("{ns}/{name}"), ?origin, "lease-id key");
                    k
                }
                Ok(None) => return ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("targetlease operator: lease-id key: {e}");
                    return ExitCode::from(3);
                }
            }
        }
        (None, None) => {
            tracing::warn!(
                "no --lease-id-key-file or --lease-id-key-secret: leases cannot be re-adopted after a restart or by another replica"
            );
            LeaseIdKey::random()
        }
    };

    let (store, store_metrics) = match connect(&config, &mut shutdown).await {
        Ok(Some(connected)) => connected,
        Ok(None) => return ExitCode::SUCCESS,
        Err(why) => return usage(why),
    };
    let store: Arc<dyn LeaseStore> = Arc::new(MeteredStore::new(store, store_metrics.clone()));
    let registry = metrics::registry(&metrics, &store_metrics);
    let runtime = Arc::new(RuntimeStatus::default());
    // Published leases outlive trouble with the API server (and this
    // replica's leadership terms): the keeper renews them meanwhile.
    let clock = Arc::new(ServerClock::new());
    let keeper = Arc::new(Keeper::new(store.clone(), clock.clone()));
    let keeping = tokio::spawn(keeper.clone().run());

    let admin_state = Arc::new(AdminState::new(
        registry,
        metrics.clone(),
        store.clone(),
        runtime.clone(),
        leadership.clone(),
    ));
    let admin_shutdown = {
        let mut rx = shutdown.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let admin_https = admin_tls.is_some();
    let admin = tokio::spawn(admin::serve(
        args.admin_addr,
        admin_tls,
        admin_state,
        admin_shutdown,
    ));

    let cfg = OperatorConfig {
        client,
        store,
        floor_namespace: args.floor_namespace.clone(),
        floor_configmap: args.floor_configmap,
        floor_policy: FloorPolicy {
            max_entries: args.floor_max_entries as usize,
            retention: args.floor_retention,
        },
        lease_ids,
        concurrency: args.concurrency,
        watch_namespace: args.watch_namespace,
        instance: args.instance,
        metrics,
        runtime: runtime.clone(),
        leadership,
        clock,
        keeper,
        watch_timeout: args.watch_timeout,
    };
    let subscribe = {
        let config = config.clone();
        move || match &config {
            StoreConfig::Valkey(c) => {
                let c = c.clone();
                resubscribing(move || {
                    let c = c.clone();
                    async move { notices::release_notices(&c).await }
                })
            }
            StoreConfig::Etcd(c) => {
                let c = c.clone();
                resubscribing(move || {
                    let c = c.clone();
                    async move { EtcdStore::connect(&c).await?.release_notices().await }
                })
            }
        }
    };
    tracing::info!(admin = %args.admin_addr, admin_https, leader_election = args.leader_election, "operator starting");
    if args.leader_election {
        let election = Election {
            client: election_client,
            namespace: args
                .leader_election_namespace
                .unwrap_or(args.floor_namespace),
            lease_name: args.leader_election_lease,
            timings,
        };
        operator::control_while_leading(cfg, election, subscribe, shutdown.clone()).await;
    } else {
        runtime
            .leading
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut rx = shutdown.clone();
        let stop = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let notices = subscribe();
        operator::control(&cfg, notices, stop).await;
    }
    keeping.abort();
    if let Ok(Err(e)) = admin.await {
        tracing::error!(error = %e, "admin server failed");
        return ExitCode::from(3);
    }
    tracing::info!("operator stopped");
    ExitCode::SUCCESS
}

/// The Kubernetes clients: one whose writes need the gate open (everything
/// the controller does, each write counted by kind once it passed the gate),
/// and one without it for the election Lease and the lease-id key Secret.
/// Every request of both has a deadline of `timeout`.
async fn clients(
    gate: &Leadership,
    metrics: &OperatorMetrics,
    timeout: Duration,
) -> Result<(kube::Client, kube::Client), kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    let deadline = ApiTimeoutLayer::new(timeout);
    // The last layer added is the outermost: the gate decides first.
    let gated = kube::client::ClientBuilder::try_from(config.clone())?
        .with_layer(&deadline)
        .with_layer(&metrics.api_writes.layer())
        .with_layer(&WriteGateLayer::new(gate.clone()))
        .build();
    let ungated = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&deadline)
        .build();
    Ok((gated, ungated))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// `IP:PORT` and `[IPv6]:PORT`, and a bare IPv6 address with its port
/// (`fd00::5:8080`: the last colon separates the port).
fn parse_listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let refused =
        || format!("{s:?} is not an address and port (IP:PORT, [IPv6]:PORT or IPv6:PORT)");
    let (ip, port) = s.rsplit_once(':').ok_or_else(refused)?;
    let ip: std::net::Ipv6Addr = ip.parse().map_err(|_| refused())?;
    let port: u16 = port.parse().map_err(|_| refused())?;
    Ok(SocketAddr::from((ip, port)))
}

#[cfg(test)]
mod listen_addr_tests {
    use super::{OperatorArgs, parse_listen_addr};

    /// Outside the chart (which binds the pod's IP), the admin server is
    /// reachable from this host only unless told otherwise.
    #[test]
    fn the_default_admin_address_is_reachable_from_this_host_only() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: OperatorArgs,
        }
        let cli = Cli::try_parse_from(["t"]).unwrap();
        assert_eq!(cli.args.admin_addr.to_string(), "127.0.0.1:8080");
        assert!(cli.args.admin_tls_cert_file.is_none());
        assert!(Cli::try_parse_from(["t", "--admin-tls-cert-file", "c"]).is_err());
    }

    #[test]
    fn pod_ips_of_either_family_with_a_port() {
        for (given, want) in [
            ("10.1.2.3:8080", "10.1.2.3:8080"),
            ("[::]:8080", "[::]:8080"),
            ("[fd00::5]:8080", "[fd00::5]:8080"),
            ("fd00::5:8080", "[fd00::5]:8080"),
            ("fd00:1:2:3:4:5:6:7:9090", "[fd00:1:2:3:4:5:6:7]:9090"),
        ] {
            assert_eq!(
                parse_listen_addr(given).unwrap().to_string(),
                want,
                "{given}"
            );
        }
        for bad in [
            "",
            "8080",
            "10.1.2.3",
            "host:8080",
            "fd00::5",
            "10.1.2.3:99999",
            ":8080",
        ] {
            assert!(parse_listen_addr(bad).is_err(), "{bad:?} accepted");
        }
    }
}
