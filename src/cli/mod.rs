//! The `targetlease` command line: one binary, several subcommands.
//!
//! Exit codes are a contract: 0 success, 1 a refusal (held, not_owner, …),
//! 2 bad arguments, 3 backend trouble (backend_unavailable, corrupt_state,
//! outcome_unknown).

pub mod connection;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Leases with fencing tokens for Kubernetes workloads, stored in Valkey.
#[derive(Parser, Debug)]
#[command(name = "targetlease", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {}

/// Parses arguments, runs the command and returns its exit code.
pub async fn main() -> ExitCode {
    match Cli::parse().command {}
}
