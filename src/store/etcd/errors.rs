//! What a failed etcd call means for the caller, decided in one place.
//!
//! etcd answers some refusals before it proposes anything to Raft (no
//! leader, too many requests, no space, authentication and permission
//! errors, a request too large), and a transaction that names a lease that
//! no longer exists is refused whole when applied: nothing was written, so
//! every operation can answer `backend_unavailable`. A connection that was
//! never made sent nothing either. Anything else that goes wrong once a
//! write was sent (our deadline passed, the stream was reset, a proposal
//! timed out in a leader change) may have been applied: `outcome_unknown`,
//! retried by the caller with the same request id.
//!
//! | what happened | read | write |
//! |---|---|---|
//! | not sent (no connection, connect refused or timed out, TLS handshake refused, connection closed before the call was handed to it; sent again, within the deadline) | `backend_unavailable` | `backend_unavailable` |
//! | refused before proposing (messages below, auth/permission/argument codes) | `backend_unavailable` | `backend_unavailable` |
//! | sent, then deadline, reset or any other error | `backend_unavailable` | `outcome_unknown` |
//!
//! Messages name the cause and etcd's own words, never keys or values.

use std::time::Duration;

use tonic::Code;

use crate::store::StoreError;

/// Whether an operation can change state; decides what a lost reply means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Effect {
    /// Reads only (or grants an etcd lease no key uses yet: harmless if lost).
    Read,
    /// May change the lease protocol's state.
    Write,
}

/// etcd's messages for requests it refused before proposing them, or that
/// were applied as a refusal (nothing written).
const REFUSED: [&str; 14] = [
    "etcdserver: no leader",
    "etcdserver: too many requests",
    "database space exceeded",
    "etcdserver: requested lease not found",
    "etcdserver: permission denied",
    "etcdserver: invalid auth token",
    "etcdserver: authentication failed",
    "etcdserver: user name is empty",
    "etcdserver: user name not found",
    "etcdserver: request is too large",
    "etcdserver: too many operations in txn request",
    "etcdserver: duplicate key given in txn request",
    "etcdserver: not capable",
    "etcdserver: revision of auth store is old",
];

/// True when `e` says the transaction named an etcd lease that is gone
/// (nothing was written: the caller may grant a new one and try again).
pub(super) fn lease_not_found(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("requested lease not found"))
}

/// The meaning of `e`, an answer to a request sent once.
pub(super) fn classify(e: &etcd_client::Error, effect: Effect) -> StoreError {
    use etcd_client::Error as E;
    let unknown = |why: String| match effect {
        Effect::Read => StoreError::BackendUnavailable(why),
        Effect::Write => StoreError::OutcomeUnknown(format!(
            "{why}; the write may have been applied: retry with the same request id"
        )),
    };
    match e {
        E::GRpcStatus(s) => {
            let said = first_words(s.message());
            if let Some((tls, handshake)) = std::error::Error::source(s).and_then(tls_failure) {
                if handshake {
                    // A refusal of the handshake: no request was read.
                    StoreError::BackendUnavailable(format!("cannot reach etcd: {tls}"))
                } else {
                    // Any other TLS failure can end a connection a request
                    // was already read from.
                    unknown(format!("etcd's TLS connection failed: {tls}"))
                }
            } else if not_sent(s) {
                // Refused by the connection before it was handed over: no
                // byte of it left this process, whatever it would change.
                StoreError::BackendUnavailable(format!("etcd {CLOSED} (the request was not sent)"))
            } else if closed_unanswered(s) {
                unknown(format!("etcd {CLOSED}"))
            } else if refused(s) {
                StoreError::BackendUnavailable(format!("etcd refused the operation: {said}"))
            } else if never_connected(s) {
                StoreError::BackendUnavailable(format!("cannot reach etcd: {said}"))
            } else {
                // The status alone may say only "transport error": the
                // causes under it are what a reader can act on.
                let why = first_words(&chain(s));
                unknown(format!("etcd call failed ({:?}): {why}", s.code()))
            }
        }
        E::TransportError(t) => StoreError::BackendUnavailable(format!(
            "cannot reach etcd: {}",
            tls_failure(t).map_or_else(|| first_words(&chain(t)), |(tls, _)| tls)
        )),
        E::InvalidArgs(_) | E::InvalidUri(_) | E::EndpointError(_) => {
            StoreError::BackendUnavailable(format!("cannot use the etcd endpoints: {e}"))
        }
        other => unknown(format!(
            "etcd call failed: {}",
            first_words(&other.to_string())
        )),
    }
}

/// True when `e` says the call was never sent: the connection it was
/// handed could not be made, or had ended before the call was handed to it.
/// Making it again cannot apply anything twice.
pub(super) fn unsent(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if not_sent(s) || never_connected(s))
}

/// Our deadline passed while a call was out.
pub(super) fn late(effect: Effect, timeout: Duration) -> StoreError {
    let why = format!(
        "no answer from etcd within {}",
        humantime::format_duration(timeout)
    );
    match effect {
        Effect::Read => StoreError::BackendUnavailable(why),
        Effect::Write => StoreError::OutcomeUnknown(format!(
            "{why}; the write may have been applied: retry with the same request id"
        )),
    }
}

fn refused(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        Code::Unauthenticated | Code::PermissionDenied | Code::InvalidArgument
    ) || REFUSED.iter().any(|m| s.message().contains(m))
}

/// A status the client made up because no connection could be opened: the
/// request never left this process.
fn never_connected(s: &tonic::Status) -> bool {
    if s.code() != Code::Unavailable {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            )
        {
            return true;
        }
        let text = e.to_string();
        if e.is::<tonic::ConnectError>()
            || text.contains("tcp connect error")
            || text.contains("dns error")
        {
            return true;
        }
        source = e.source();
    }
    // Never the status's message: it may be the server's (a proxy's words
    // would otherwise make a write that ran look unsent, and sent again).
    false
}

/// What [`classify`] says of a connection closed before its answer came.
pub(super) const CLOSED: &str = "closed the connection before answering";

/// The connection under the call was closed or reset before an answer came
/// (with TLS 1.3 that is also how a member refuses a client certificate, or
/// its absence: the client's handshake had already ended, and the member's
/// close reaches the client as a clean close or, when the client had
/// already sent its request, as a reset).
fn closed_unanswered(s: &tonic::Status) -> bool {
    let causes = chain(s).to_ascii_lowercase();
    matches!(s.code(), Code::Cancelled | Code::Unknown)
        && ["connection closed", "connection reset", "broken pipe"]
            .iter()
            .any(|w| causes.contains(w))
}

/// The connection had already ended when the call was handed to it, so
/// the request was given back unsent (hyper's "connection was not ready";
/// with TLS 1.3 also how a member's refusal of our certificate, or of its
/// absence, can reach a call made right after the handshake).
fn not_sent(s: &tonic::Status) -> bool {
    // The causes under the status only: its message may be the server's.
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    let mut said = false;
    while let Some(e) = source {
        said |= e.to_string().contains("connection was not ready");
        source = e.source();
    }
    s.code() == Code::Cancelled && said
}

/// The TLS failure among `e` and its sources, as a sentence (never the TLS
/// library's variant names), and whether only a handshake ends that way.
fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<(String, bool)> {
    let mut source = Some(e);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                let said = crate::store::valkey::tls::describe_io(io, None);
                return Some((said, handshake_only(tls)));
            }
            // An alert read after the handshake reaches us as text only.
            if let Some(alert) = alert_named(&io.to_string()) {
                let handshake = handshake_only(&alert);
                let io = std::io::Error::new(std::io::ErrorKind::InvalidData, alert);
                let said = crate::store::valkey::tls::describe_io(&io, None);
                return Some((said, handshake));
            }
        }
        source = e.source();
    }
    None
}

/// Whether `e` can end only a handshake: a certificate, name or protocol
/// refused, by us or by the member (which refuses before reading a request,
/// even when, with TLS 1.3, its refusal of our certificate arrives after
/// we sent one). Anything else (a record that does not decrypt, a member
/// that misbehaves) can end a connection a request was read from.
fn handshake_only(e: &rustls::Error) -> bool {
    use rustls::{AlertDescription as A, Error as E};
    match e {
        E::InvalidCertificate(_)
        | E::NoCertificatesPresented
        | E::UnsupportedNameType
        | E::PeerIncompatible(_)
        | E::InvalidCertRevocationList(_) => true,
        E::AlertReceived(a) => matches!(
            a,
            A::HandshakeFailure
                | A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::AccessDenied
                | A::ProtocolVersion
                | A::InsufficientSecurity
                | A::CertificateRequired
                | A::UnrecognisedName
                | A::NoApplicationProtocol
        ),
        _ => false,
    }
}

/// The TLS alert `text` says was received ("received fatal alert: Name").
fn alert_named(text: &str) -> Option<rustls::Error> {
    let name = text
        .split("received fatal alert: ")
        .nth(1)?
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()?;
    (0..=u8::MAX)
        .map(rustls::AlertDescription::from)
        .find(|a| format!("{a:?}") == name)
        .map(rustls::Error::AlertReceived)
}

/// `e` and its sources, joined.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// At most 160 characters of `text`, on one line.
fn first_words(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match line.char_indices().nth(160) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, msg: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg))
    }

    /// A status that says only "transport error" over a reset connection
    /// (how a member's refusal of our certificate can reach a client that
    /// had already sent its request): a close before the answer, named.
    #[test]
    fn a_reset_under_a_transport_error_is_a_close_before_the_answer() {
        let reset = || {
            let mut s = tonic::Status::new(Code::Unknown, "transport error");
            s.set_source(std::sync::Arc::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "Connection reset by peer (os error 104)",
            )));
            etcd_client::Error::GRpcStatus(s)
        };
        match classify(&reset(), Effect::Read) {
            StoreError::BackendUnavailable(why) => assert!(why.contains(CLOSED), "{why}"),
            other => panic!("expected backend_unavailable, got {other:?}"),
        }
        match classify(&reset(), Effect::Write) {
            StoreError::OutcomeUnknown(why) => assert!(why.contains(CLOSED), "{why}"),
            other => panic!("expected outcome_unknown, got {other:?}"),
        }
        // Any other cause is named, not only the status's two words.
        let mut s = tonic::Status::new(Code::Unknown, "transport error");
        s.set_source(std::sync::Arc::new(std::io::Error::other(
            "frame too large",
        )));
        match classify(&etcd_client::Error::GRpcStatus(s), Effect::Read) {
            StoreError::BackendUnavailable(why) => {
                assert!(why.contains("frame too large"), "{why}")
            }
            other => panic!("expected backend_unavailable, got {other:?}"),
        }
    }

    /// A TLS refusal of the handshake is definite even for a write; any
    /// other TLS failure may end a connection the write was read from.
    #[test]
    fn only_a_handshake_refusal_is_a_definite_tls_failure() {
        let tls = |e: rustls::Error| {
            let mut s = tonic::Status::new(Code::Unknown, "transport error");
            s.set_source(std::sync::Arc::new(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e,
            )));
            etcd_client::Error::GRpcStatus(s)
        };
        let refused = tls(rustls::Error::AlertReceived(
            rustls::AlertDescription::CertificateRequired,
        ));
        assert!(matches!(
            classify(&refused, Effect::Write),
            StoreError::BackendUnavailable(_)
        ));
        let broken = tls(rustls::Error::DecryptError);
        assert!(matches!(
            classify(&broken, Effect::Write),
            StoreError::OutcomeUnknown(_)
        ));
        assert!(matches!(
            classify(&broken, Effect::Read),
            StoreError::BackendUnavailable(_)
        ));
    }

    /// A call the connection gave back unsent is a definite failure, even
    /// for a write, and still names the close (so a TLS refusal gets its
    /// hint); the transport's variant names stay out of the message.
    #[test]
    fn a_call_given_back_unsent_is_definite() {
        let unsent = || {
            let mut s = tonic::Status::new(Code::Cancelled, "operation was canceled");
            s.set_source(std::sync::Arc::new(std::io::Error::other(
                "hyper::Error(Canceled, \"connection was not ready\")",
            )));
            etcd_client::Error::GRpcStatus(s)
        };
        // The words in the status's message alone (a server's) do not count.
        let said = status(Code::Cancelled, "connection was not ready");
        assert!(matches!(
            classify(&said, Effect::Write),
            StoreError::OutcomeUnknown(_)
        ));
        for effect in [Effect::Read, Effect::Write] {
            match classify(&unsent(), effect) {
                StoreError::BackendUnavailable(why) => {
                    assert!(why.contains(CLOSED), "{why}");
                    assert!(!why.contains("Canceled"), "{why}");
                }
                other => panic!("expected backend_unavailable, got {other:?}"),
            }
        }
    }

    #[test]
    fn refusals_are_definite_and_lost_writes_unknown() {
        for (code, msg) in [
            (Code::Unavailable, "etcdserver: no leader"),
            (Code::ResourceExhausted, "etcdserver: too many requests"),
            (
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (Code::NotFound, "etcdserver: requested lease not found"),
            (Code::PermissionDenied, "etcdserver: permission denied"),
        ] {
            assert!(
                matches!(
                    classify(&status(code, msg), Effect::Write),
                    StoreError::BackendUnavailable(_)
                ),
                "{msg}"
            );
        }
        for (code, msg) in [
            (Code::Unavailable, "etcdserver: request timed out"),
            (Code::Unavailable, "etcdserver: leader changed"),
            (Code::Unknown, "h2 protocol error: stream reset"),
            (Code::Cancelled, "operation was canceled"),
        ] {
            assert!(
                matches!(
                    classify(&status(code, msg), Effect::Write),
                    StoreError::OutcomeUnknown(_)
                ),
                "{msg}"
            );
            assert!(
                matches!(
                    classify(&status(code, msg), Effect::Read),
                    StoreError::BackendUnavailable(_)
                ),
                "{msg}"
            );
        }
        assert!(matches!(
            late(Effect::Write, Duration::from_secs(1)),
            StoreError::OutcomeUnknown(_)
        ));
        // A certificate refused in the handshake: nothing was sent, even for a write.
        let tls = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let e = etcd_client::Error::GRpcStatus(tonic::Status::from_error(Box::new(tls)));
        match classify(&e, Effect::Write) {
            StoreError::BackendUnavailable(why) => {
                assert!(why.contains("not signed by a trusted"), "{why}")
            }
            other => panic!("expected backend_unavailable, got {other:?}"),
        }
        // The same alert when it comes as text, after the handshake.
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired",
        );
        let e = etcd_client::Error::GRpcStatus(tonic::Status::from_error(Box::new(alert)));
        match classify(&e, Effect::Write) {
            StoreError::BackendUnavailable(why) => {
                assert!(why.contains("requires a client certificate"), "{why}")
            }
            other => panic!("expected backend_unavailable, got {other:?}"),
        }
        assert!(lease_not_found(&status(
            Code::NotFound,
            "etcdserver: requested lease not found"
        )));
    }
}
