//! What a client error means for the caller, decided in one place.
//!
//! Messages are short and secret-free: they name the error kind and the
//! server's first words, never arguments (keys, lease ids, passwords).

use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};

use crate::store::StoreError;

/// Whether an operation can change state; decides what a lost reply means.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Effect {
    /// Reads only.
    Read,
    /// May change state.
    Write,
}

/// The operation's deadline passed without a reply.
pub(super) fn deadline_passed(effect: Effect, timeout: Duration) -> StoreError {
    let after = humantime::format_duration(timeout);
    match effect {
        Effect::Write => StoreError::OutcomeUnknown(format!(
            "no reply from valkey within {after}; retry with the same request id"
        )),
        Effect::Read => {
            StoreError::BackendUnavailable(format!("no reply from valkey within {after}"))
        }
    }
}

/// A short, secret-free description of a client error.
pub(super) fn describe(e: &FredError) -> String {
    let details: String = e.details().chars().take(200).collect();
    format!("{:?}: {details}", e.kind())
}

/// Decides, once, what a client error means for the caller.
///
/// Server refusals that happen before a script runs (BUSY, LOADING, READONLY,
/// OOM, NOPERM, auth) are definite: nothing happened. A lost reply to a write
/// is `OutcomeUnknown`: the caller must retry with the same request id.
pub(super) fn classify(e: &FredError, effect: Effect) -> StoreError {
    let code = e.details().split_whitespace().next().unwrap_or("");
    let refused = matches!(
        code,
        "BUSY"
            | "LOADING"
            | "READONLY"
            | "OOM"
            | "NOPERM"
            | "WRONGPASS"
            | "NOAUTH"
            | "MASTERDOWN"
            | "CLUSTERDOWN"
            | "TRYAGAIN"
            | "CROSSSLOT"
    );
    if refused {
        return StoreError::BackendUnavailable(format!(
            "server refused the operation: {}",
            describe(e)
        ));
    }
    let lost = matches!(
        e.kind(),
        ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled | ErrorKind::Unknown
    );
    match (effect, lost) {
        (Effect::Write, true) => StoreError::OutcomeUnknown(format!(
            "no reply from valkey ({}); retry with the same request id",
            describe(e)
        )),
        _ => StoreError::BackendUnavailable(describe(e)),
    }
}
