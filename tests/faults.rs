//! The fault matrix's runner: the matrix is the `targetlease-faults` member
//! (tests/faults/); this target, built with the product's fail points
//! (`--features failpoints`), hands it the `targetlease` binary cargo built
//! beside it and cargo's scratch directory, and runs it.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let built = targetlease_faults::Built {
        product_bin: env!("CARGO_BIN_EXE_targetlease").into(),
        scratch: env!("CARGO_TARGET_TMPDIR").into(),
    };
    targetlease_faults::main(&args, targetlease_faults::Config::from_env(built))
}
