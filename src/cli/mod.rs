//! The `targetlease` command line: one binary, several subcommands.
//!
//! Exit codes are a contract: 0 success, 1 a refusal (held, not_owner, …),
//! 2 bad arguments, 3 backend trouble (backend_unavailable, corrupt_state,
//! outcome_unknown). `run` has its own (busy, lost, failed) beside CMD's
//! code, and `token` one for a TargetLease it cannot see (docs/cli.md).

pub mod check;
pub mod connection;
pub mod crd;
pub mod lease;
pub mod list;
pub mod logging;
pub mod operator;
pub mod output;
pub mod run;
pub mod token;

use std::process::ExitCode;
use std::sync::LazyLock;

use clap::{Parser, Subcommand};

/// `0.1.0 (commit 1a2b3c4d5e6f)`, or `0.1.0 (dev build)` when the build
/// did not record its commit (see build.rs).
pub fn version() -> &'static str {
    static VERSION: LazyLock<String> = LazyLock::new(|| {
        let commit = env!("TARGETLEASE_BUILD_COMMIT");
        let built = if commit.is_empty() {
            "dev build".to_owned()
        } else {
            format!("commit {commit}")
        };
        format!("{} ({built})", env!("CARGO_PKG_VERSION"))
    });
    &VERSION
}

/// Leases with fencing tokens for Kubernetes workloads, stored in Valkey or etcd.
#[derive(Parser, Debug)]
#[command(
    name = "targetlease",
    version = version(),
    about,
    after_help = "Examples:\n  targetlease lease acquire --target db --ttl 60s\n  targetlease run --target nightly-report --wait 5m -- ./report.sh\n  targetlease lease get --target db -o text\n\nExit codes: 0 success, 1 refused, 2 bad arguments, 3 backend trouble;\n`run`: CMD's own, or 75 busy, 124 lease lost, 125 failed; `token`: also 4 no such\nTargetLease or not readable (docs/cli.md)."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Acquire, renew, release, get, revoke or fence-write a lease (one JSON object on stdout; -o text|yaml).
    Lease(lease::LeaseArgs),
    /// Hold a lease while a command runs: `run --target T [-n | --wait 1m] -- CMD [ARGS…]`.
    #[command(
        after_help = "Examples:\n  targetlease run --target nightly-report -- ./report.sh      # waits up to 1m while held\n  targetlease run -n --target nightly-report -- ./report.sh   # held: exit 75 at once\n\nCMD runs in a process group of its own, which dies with run (even by SIGKILL).\nIt gets TARGETLEASE_FENCING_TOKEN, _TARGET, _NAMESPACE, _OWNER and _EXPIRES_AT,\nand no other TARGETLEASE_* variable unless asked (--export-lease-id, --export-connection).\n\nExit codes: CMD's own (128+N: killed by signal N); 75 busy: held for all of --wait;\n124 the lease was lost while CMD ran; 125 run failed before CMD started;\n126/127 CMD cannot be run / was not found; 2 bad arguments."
    )]
    Run(run::RunArgs),
    /// Print the TargetLease CustomResourceDefinition as YAML (committed under crds/).
    Crd(crd::CrdArgs),
    /// Run the operator: reconcile TargetLeases against the store (Valkey or etcd).
    Operator(Box<operator::OperatorArgs>),
    /// Check that a Valkey deployment or an etcd cluster is safe for leases (JSON on stdout; -o text for people).
    Check(check::CheckArgs),
    /// Wait until a TargetLease is Held for this pod (or identity) and print its
    /// fencing token; `--follow --file F` keeps F up to date (a sidecar).
    Token(token::TokenArgs),
    /// Print a shell completion script: `targetlease completion bash > /etc/bash_completion.d/targetlease`.
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// Parses arguments, runs the command and returns its exit code.
pub async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Lease(args) => lease::main(args).await,
        Command::Run(args) => run::main(args).await,
        Command::Crd(args) => crd::main(args),
        Command::Operator(args) => operator::main(*args).await,
        Command::Check(args) => check::main(args).await,
        Command::Token(args) => token::main(args).await,
        Command::Completion { shell } => {
            let mut cli = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cli, "targetlease", &mut script);
            // Like every output: quiet for `| head`, exit 74 for a full disk.
            output::print_out(&String::from_utf8_lossy(&script));
            ExitCode::SUCCESS
        }
    }
}
