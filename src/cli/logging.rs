//! Diagnostics to stderr, filtered by `RUST_LOG`, with the client library muted.
//!
//! stdout belongs to the JSON envelope (or, under `run`, to the child), so
//! logs always go to stderr. Our own Valkey client never logs commands or
//! replies; the TLS library logs handshake details at debug/trace and is
//! capped at `warn` whatever `RUST_LOG` says, including more specific
//! directives such as `rustls::client=trace`.

use clap::{Args, ValueEnum};
use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

/// Crates whose logs are connection internals, not ours to show.
const MUTED_TARGETS: [&str; 2] = ["rustls", "tokio_rustls"];

/// Log lines are text for people or JSON for collectors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging flags, shared by every command that logs.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Format of the diagnostics written to stderr (`RUST_LOG` picks what is logged; default warn).
    #[arg(long, env = "TARGETLEASE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn is_muted(target: &str) -> bool {
    MUTED_TARGETS.iter().any(|m| {
        target
            .strip_prefix(m)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// The `RUST_LOG` filter (default `warn`) with the muted crates capped at `warn`.
fn env_filter() -> EnvFilter {
    let mut filter = EnvFilter::builder()
        .with_default_directive(Level::WARN.into())
        .from_env_lossy();
    for target in MUTED_TARGETS {
        if let Ok(directive) = format!("{target}=warn").parse() {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// Installs the stderr subscriber once; later calls are no-ops.
pub fn init(args: &LogArgs) {
    // A more specific directive (`rustls::x=trace`) would beat `rustls=warn` in the
    // env filter, so the cap is enforced again on the target name itself.
    let cap = filter_fn(|meta| !is_muted(meta.target()) || *meta.level() <= Level::WARN);
    let filter = env_filter().and(cap);
    let layer = match args.log_format {
        LogFormat::Text => fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .boxed(),
        LogFormat::Json => fmt::layer().json().with_writer(std::io::stderr).boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::is_muted;

    #[test]
    fn muted_targets_match_crates_and_their_modules_only() {
        assert!(is_muted("rustls"));
        assert!(is_muted("rustls::client::hs"));
        assert!(is_muted("tokio_rustls"));
        assert!(!is_muted("rustls_native_certs"));
        assert!(!is_muted("targetlease::cli"));
    }
}
