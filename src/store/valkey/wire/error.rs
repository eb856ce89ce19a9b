//! Why the wire has no answer: one error for every layer of the client
//! (RESP, dial, TLS, link, pool, routing), its kind saying what the caller
//! may conclude, its detail saying why, in words safe to show (never a
//! password, key or argument).
//!
//! The kind that matters most is whether the request may have run:
//! [`Kind::Lost`] and [`Kind::Late`] were written and got no complete reply
//! (the outcome is unknown); every other kind was never written, or was
//! refused before it ran (the server is unavailable, nothing changed). That
//! is what keeps a request at most once: the client re-sends only what
//! cannot have run.

use std::fmt;

/// What kind of failure, and so what the caller may conclude.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Settings that cannot work (an unreadable TLS file, say), found before
    /// anything connects.
    Config,
    /// No connection could be opened (TCP, TLS, login, a Sentinel or the
    /// Cluster's topology): nothing of the request was sent.
    Dial,
    /// No room or no time: too many requests in flight, no connection free,
    /// no turn before the deadline. Never sent.
    Busy,
    /// The connection closed (or was retired) before the request was
    /// written: never sent, so it may go once more on another connection.
    Closed,
    /// The server refused it before running it (a refusal the caller cannot
    /// act on, e.g. `SCAN` denied by the ACL). Nothing ran.
    Refused,
    /// The peer sent bytes that are not RESP2 within our bounds; a
    /// connection that reads them closes.
    Protocol,
    /// Written (or partly), and the connection ended before a complete
    /// reply: it may have run.
    Lost,
    /// Written, and its deadline passed without a reply: it may have run.
    Late,
    /// Every copy was answered `MOVED`/`ASK` until the limit, or outside a
    /// cluster: none ran.
    Redirected,
}

impl Kind {
    /// True when the request was written and got no complete reply: it may
    /// have run, and only the caller (with the same request id) can find out.
    pub fn may_have_run(self) -> bool {
        matches!(self, Kind::Lost | Kind::Late)
    }
}

/// A failure on the wire: what kind, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What the caller may conclude.
    pub kind: Kind,
    /// Why, in words (no secrets).
    pub detail: String,
}

impl Error {
    /// An error of `kind` because of `detail`.
    pub fn new(kind: Kind, detail: impl Into<String>) -> Error {
        Error {
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for Error {}
