//! `targetlease operator`: run the controller.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use super::connection::{ConnectionArgs, read_secret};
use super::logging::{self, LogArgs};
use crate::lease_id::LeaseIdKey;
use crate::operator::{self, OperatorConfig};
use futures::StreamExt;

use crate::store::valkey::{ValkeyStore, events};

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
    /// Namespace of the ConfigMap that keeps the last token of deleted leases.
    #[arg(
        long,
        env = "TARGETLEASE_FLOOR_NAMESPACE",
        default_value = "targetlease-system"
    )]
    pub floor_namespace: String,
    /// Name of that ConfigMap.
    #[arg(
        long,
        env = "TARGETLEASE_FLOOR_CONFIGMAP",
        default_value = "targetlease-token-floors"
    )]
    pub floor_configmap: String,
    /// Reconciles running at once.
    #[arg(long, env = "TARGETLEASE_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "TARGETLEASE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// This replica's name, for Events (the pod name in a cluster).
    #[arg(long, env = "POD_NAME", default_value = "targetlease-operator")]
    pub instance: String,
}

fn fail(message: &str) -> ExitCode {
    tracing::error!("{message}");
    eprintln!("targetlease operator: {message}");
    ExitCode::from(3)
}

/// Runs the operator until SIGTERM or Ctrl-C.
pub async fn main(args: OperatorArgs) -> ExitCode {
    logging::init(&args.log);
    let lease_ids = match &args.lease_id_key_file {
        Some(path) => {
            match read_secret(path).and_then(|s| LeaseIdKey::new(s.expose().as_bytes())) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("targetlease operator: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        None => {
            tracing::warn!(
                "no --lease-id-key-file: leases cannot be re-adopted after a restart or by another replica"
            );
            LeaseIdKey::random()
        }
    };
    let config = match args.connection.to_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("targetlease operator: {e}");
            return ExitCode::from(2);
        }
    };
    let store = match ValkeyStore::connect(&config).await {
        Ok(s) => Arc::new(s),
        Err(e) => return fail(&e.to_string()),
    };
    let release_events = match events::release_events(&config).await {
        Ok(stream) => stream,
        Err(e) => {
            tracing::warn!(error = %e, "no release notifications; waiters retry at the holder's expiry");
            futures::stream::pending().boxed()
        }
    };
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => return fail(&format!("kubernetes client: {e}")),
    };
    tracing::info!("operator starting");
    operator::run(
        OperatorConfig {
            client,
            store,
            floor_namespace: args.floor_namespace,
            floor_configmap: args.floor_configmap,
            lease_ids,
            concurrency: args.concurrency,
            watch_namespace: args.watch_namespace,
            instance: args.instance,
            release_events,
        },
        shutdown_signal(),
    )
    .await;
    tracing::info!("operator stopped");
    ExitCode::SUCCESS
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
