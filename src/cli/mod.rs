//! The `targetlease` command line: one binary, several subcommands.
//!
//! Exit codes are a contract: 0 success, 1 a refusal (held, not_owner, …),
//! 2 bad arguments, 3 backend trouble (backend_unavailable, corrupt_state,
//! outcome_unknown).

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

use clap::{Parser, Subcommand};

/// Leases with fencing tokens for Kubernetes workloads, stored in Valkey.
#[derive(Parser, Debug)]
#[command(
    name = "targetlease",
    version,
    about,
    after_help = "Examples:\n  targetlease lease acquire --target db --ttl 60s\n  targetlease run --target nightly-report --wait 5m -- ./report.sh\n  targetlease lease get --target db -o text\n\nExit codes: 0 success, 1 refused, 2 bad arguments, 3 backend trouble."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Acquire, renew, release, get, revoke or fence-write a lease (one JSON object on stdout).
    Lease(lease::LeaseArgs),
    /// Hold a lease while a command runs: `run --target T --owner O --ttl 10s -- CMD [ARGS…]`.
    Run(run::RunArgs),
    /// Print the TargetLease CustomResourceDefinition as YAML (committed under crds/).
    Crd(crd::CrdArgs),
    /// Run the operator: reconcile TargetLeases against Valkey.
    Operator(operator::OperatorArgs),
    /// Check that a Valkey deployment is safe for leases (JSON on stdout; --human for text).
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
        Command::Operator(args) => operator::main(args).await,
        Command::Check(args) => check::main(args).await,
        Command::Token(args) => token::main(args).await,
        Command::Completion { shell } => {
            let mut cli = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cli, "targetlease", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
    }
}
