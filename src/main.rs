//! The `targetlease` binary; everything lives in the library's `cli` module.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    targetlease::cli::main().await
}
