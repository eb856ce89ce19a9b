//! The `targetlease` binary; everything lives in the library's `cli` module.

use std::process::ExitCode;

/// jemalloc, not the C library's malloc: the operator's heap comes and goes
/// in waves (every renewal wave queues thousands of reconciles), and with
/// glibc's per-thread arenas its memory grew wave after wave while the heap
/// did not; with jemalloc it grew about half as much (docs/operator.md,
/// "Memory").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // `run`'s supervisor of CMD: a process of its own, on a runtime of its own.
    if let Some(code) = targetlease::cli::run::supervise::from_args() {
        return code;
    }
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(targetlease::cli::main()),
        Err(e) => {
            eprintln!("targetlease: cannot start the async runtime: {e}");
            ExitCode::from(targetlease::cli::output::EXIT_BACKEND)
        }
    }
}
