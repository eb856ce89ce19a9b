//! What a failed call means for the caller, decided in one place.
//!
//! Three facts decide it: whether the request can have reached the server,
//! whether the server refused it before running it, and whether the operation
//! writes. The client never re-sends a request that may have run (only after
//! "Function not found", `MOVED` or `ASK`, which the server answers instead
//! of running the command), so when a refusal code comes back, no copy of the
//! request has run.
//!
//! | what happened | read | write |
//! |---|---|---|
//! | nothing was sent (no connection, refused connect, queue never reached) | `backend_unavailable` | `backend_unavailable` |
//! | refused before running (codes below or "Function not found", no `script:` in the message) | `backend_unavailable` | `backend_unavailable` |
//! | redirected until the limit (every copy `MOVED`/`ASK`), or redirected outside a cluster | `backend_unavailable` | `backend_unavailable` |
//! | sent, no complete reply (deadline, reset, EOF) | `backend_unavailable` | `outcome_unknown` |
//! | failed while running (any other error) | `backend_unavailable` | `outcome_unknown` |
//! | ran, reply unreadable | `corrupt_state` | `outcome_unknown` |
//!
//! Messages are short and secret-free: they name the cause and the server's
//! first words, never arguments (keys, lease ids, passwords).

use std::time::Duration;

use super::wire::dial::first_words;
use super::wire::{Error, Kind};
use crate::store::StoreError;

/// Whether an operation can change state; decides what a lost reply means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Effect {
    /// Reads only.
    Read,
    /// May change state.
    Write,
}

/// Error codes the server answers before running a command: nothing ran.
/// (`MOVED`/`ASK` are followed in a cluster; one that gets here could not be.)
const REFUSED_BEFORE_RUNNING: [&str; 15] = [
    "MOVED",
    "ASK",
    "BUSY",
    "LOADING",
    "READONLY",
    "OOM",
    "NOPERM",
    "WRONGPASS",
    "NOAUTH",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "CROSSSLOT",
    "NOREPLICAS",
    "MISCONF",
];

/// True when `FCALL` was answered that its function is not loaded: nothing
/// ran (the library is loaded and the call sent once more). Not an error
/// raised by a command inside a running function, which carries "script:".
pub(super) fn function_missing(error: &str) -> bool {
    error.starts_with("ERR Function not found") && !error.contains("script:")
}

/// True when an error reply says the server did not run the command.
pub(super) fn refused_before_running(error: &str) -> bool {
    let code = error.split_whitespace().next().unwrap_or("");
    // Errors raised inside a running script carry "script:" (e.g. "NOPERM …
    // script: …" from a command the script called after it wrote).
    (REFUSED_BEFORE_RUNNING.contains(&code) && !error.contains("script:"))
        || function_missing(error)
}

/// The server answered `error` to a request sent once.
pub(super) fn server_error(error: &str, effect: Effect) -> StoreError {
    let said = first_words(error);
    // A server without hash-field expiry (one that joined after the version
    // check at connect, say): every script calls one of those commands
    // before its first write (lua/lib.lua), so nothing ran.
    // (Redis says "Unknown Redis command", Valkey "Unknown command".)
    if error.contains("Unknown Redis command called from script")
        || error.contains("Unknown command called from script")
    {
        return StoreError::BackendUnavailable(format!(
            "valkey refused the operation ({said}): the server lacks hash-field expiry; \
             targetlease needs Valkey 9.0 or newer"
        ));
    }
    // Still missing after this client tried to load it: a user that may
    // not load the library (a tenant's) needs someone else to.
    if function_missing(error) {
        let load = error.split_once("; ").map_or("", |(_, load)| load);
        let who = if load.contains("NOPERM") {
            format!(" and this user may not load them ({load})")
        } else if load.is_empty() {
            String::new()
        } else {
            format!(" and could not be loaded ({load})")
        };
        return StoreError::BackendUnavailable(format!(
            "valkey refused the operation: the lease functions are not loaded on the \
             server{who}; a user that may load them must, on the primary (the operator does \
             when it starts if its user may, and so does `targetlease check` run as such a \
             user)"
        ));
    }
    if refused_before_running(error) {
        StoreError::BackendUnavailable(format!("valkey refused the operation: {said}"))
    } else if effect == Effect::Read {
        StoreError::BackendUnavailable(format!("valkey failed the read: {said}"))
    } else {
        StoreError::OutcomeUnknown(format!(
            "valkey failed the operation while running it (it may have written): {said}; \
             retry with the same request id"
        ))
    }
}

/// A request that got no reply. `timeout` names the deadline in messages.
/// Only a request that may have run ([`Kind::may_have_run`]) can be
/// `outcome_unknown`; every other kind never ran.
pub(super) fn unanswered(e: Error, effect: Effect, timeout: Duration) -> StoreError {
    let why = match e.kind {
        Kind::Late => format!("no reply within {}", humantime::format_duration(timeout)),
        Kind::Lost => format!("connection lost before the reply: {}", e.detail),
        Kind::Redirected => return StoreError::BackendUnavailable(e.detail),
        Kind::Config | Kind::Dial | Kind::Busy | Kind::Closed | Kind::Refused | Kind::Protocol => {
            return StoreError::BackendUnavailable(format!("not sent: {}", e.detail));
        }
    };
    match effect {
        Effect::Write => StoreError::OutcomeUnknown(format!(
            "{why}; it may have run, retry with the same request id"
        )),
        Effect::Read => StoreError::BackendUnavailable(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_definite_only_before_the_script_runs() {
        for e in [
            "READONLY You can't write against a read only replica.",
            "NOREPLICAS Not enough good replicas to write.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "BUSY Valkey is busy running a script.",
            "MOVED 1234 127.0.0.1:1",
            "ASK 1234 :7001",
        ] {
            assert!(matches!(
                server_error(e, Effect::Write),
                StoreError::BackendUnavailable(_)
            ));
        }
        for e in [
            "ERR ACL failure in script: no permissions to run the 'hset' command script: on @user_script:2.",
            "WRONGTYPE Operation against a key holding the wrong kind of value script: on @user_script:9.",
            "NOPERM this user has no permissions script: on @user_script:3.",
            "ERR something new",
        ] {
            assert!(
                matches!(
                    server_error(e, Effect::Write),
                    StoreError::OutcomeUnknown(_)
                ),
                "{e}"
            );
            assert!(matches!(
                server_error(e, Effect::Read),
                StoreError::BackendUnavailable(_)
            ));
        }
    }

    #[test]
    fn a_missing_function_ran_nothing_and_says_who_must_load_it() {
        assert!(refused_before_running("ERR Function not found"));
        let tenant = "ERR Function not found; loading the library: NOPERM User team-a has no \
                      permissions to run the 'function|load' command";
        for (e, said) in [
            ("ERR Function not found", "primary"),
            (tenant, "may not load"),
        ] {
            match server_error(e, Effect::Write) {
                StoreError::BackendUnavailable(m) => {
                    assert!(m.contains("not loaded") && m.contains(said), "{m}")
                }
                other => panic!("{other:?}"),
            }
        }
        // Raised by a command inside a running function: it may have written.
        let inside = "ERR Function not found script: on @user_function:3.";
        assert!(!refused_before_running(inside));
        assert!(matches!(
            server_error(inside, Effect::Write),
            StoreError::OutcomeUnknown(_)
        ));
    }

    #[test]
    fn a_server_too_old_for_the_scripts_refuses_definitely() {
        let e = "ERR Unknown Redis command called from script script: 441a6f7106d98a682c04fd6d333b7b06a89e99f1, on @user_script:318.";
        match server_error(e, Effect::Write) {
            StoreError::BackendUnavailable(m) => assert!(m.contains("Valkey 9.0"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_lost_reply_is_unknown_only_for_writes() {
        let t = Duration::from_secs(2);
        let lost = || Error::new(Kind::Late, "no reply in time");
        match unanswered(lost(), Effect::Write, t) {
            StoreError::OutcomeUnknown(m) => assert!(m.contains("within 2s"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            unanswered(lost(), Effect::Read, t),
            StoreError::BackendUnavailable(_)
        ));
        for definite in [
            Error::new(Kind::Busy, "x"),
            Error::new(Kind::Closed, "x"),
            Error::new(Kind::Dial, "x"),
            Error::new(Kind::Redirected, "y"),
        ] {
            assert!(matches!(
                unanswered(definite, Effect::Write, t),
                StoreError::BackendUnavailable(_)
            ));
        }
    }
}
