//! Opening one connection: TCP (keepalive), TLS, then the handshake
//! (`AUTH` or `PING`, `SELECT`), all within one deadline. (Asking Sentinels
//! which server is the primary: `sentinel.rs`.)
//!
//! Nothing here retries: a failure is a [`Kind::Dial`] error with its cause,
//! and the caller (the pool) decides when to try again.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::endpoint::Addr;
use super::error::{Error, Kind};
use super::resp::{Cmd, Decoder, Value};
use super::tls::{describe_io, handshake_failure};

/// A secret string whose `Debug` and `Display` never show the value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A byte stream to a server: plain TCP or TLS over TCP.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A boxed [`Io`].
pub type Stream = Box<dyn Io>;

/// TLS settings: our rustls config and an optional name to verify against.
#[derive(Clone)]
pub struct Tls {
    /// Verification is always on (see `tls.rs`).
    pub config: Arc<rustls::ClientConfig>,
    /// Verify every server against this name instead of the host it was reached by.
    pub server_name: Option<String>,
}

/// How to open and authenticate a connection to any server of one deployment.
#[derive(Clone)]
pub struct Dialer {
    /// TLS to the data nodes, when the URL asks for it.
    pub tls: Option<Tls>,
    /// TLS to the Sentinels, when the URL asks for it: their own settings,
    /// or the data nodes' where none are given.
    pub sentinel_tls: Option<Tls>,
    /// ACL user of the data nodes.
    pub username: Option<String>,
    /// ACL password of the data nodes (or the legacy `requirepass` password
    /// without a user).
    pub password: Option<Secret>,
    /// ACL user of the Sentinels.
    pub sentinel_username: Option<String>,
    /// Password of the Sentinels; none: Sentinels get no `AUTH` (the data
    /// nodes' password is never sent to them).
    pub sentinel_password: Option<Secret>,
    /// Database to select (never in a cluster).
    pub db: Option<u32>,
}

/// Who to log in as on one connection.
#[derive(Clone, Copy)]
pub(super) struct Login<'a> {
    pub(super) username: Option<&'a str>,
    pub(super) password: Option<&'a Secret>,
}

/// A second handle on a connection's TCP socket, to ask the kernel whether
/// the server has already closed it. Tokio only learns that when its driver
/// next polls; a request written into a connection the server had already
/// closed could not have run, and must not be reported as possibly run.
///
/// The handle is a duplicate of the socket, which keeps the connection open
/// after the stream is dropped: [`Probe::shut`] closes it for real.
pub struct Probe(Mutex<Option<socket2::Socket>>);

impl Probe {
    fn of(tcp: &TcpStream) -> Probe {
        Probe(Mutex::new(SockRef::from(tcp).try_clone().ok()))
    }

    /// A probe of no socket (a stream that is not TCP): it never sees a close.
    #[cfg(test)]
    pub(super) fn none() -> Probe {
        Probe(Mutex::new(None))
    }

    /// Closes the connection in both directions (the server sees it end at
    /// once, whoever still holds the stream) and lets go of the duplicate.
    pub fn shut(&self) {
        let sock = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(sock) = sock {
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Why the server side is gone (FIN or reset seen), if it is. Pending
    /// replies are only peeked at, never consumed; the socket is non-blocking.
    pub fn closed(&self) -> Option<String> {
        let guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let sock = guard.as_ref()?;
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        match sock.peek(&mut byte) {
            Ok(0) => Some("connection closed by the server".into()),
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => None,
            Err(e) => Some(e.to_string()),
        }
    }
}

/// An open, authenticated connection.
pub struct Conn {
    /// The byte stream (TLS or not).
    pub stream: Stream,
    /// Its TCP socket, to notice a close before writing.
    pub probe: Probe,
}

impl Dialer {
    /// Connects to the data node `addr` and completes the handshake before
    /// `deadline` (a [`Kind::Dial`] error otherwise: nothing but the
    /// handshake was sent).
    pub async fn connect(&self, addr: &Addr, deadline: Instant) -> Result<Conn, Error> {
        let login = Login {
            username: self.username.as_deref(),
            password: self.password.as_ref(),
        };
        self.connect_with(addr, deadline, self.db, login, self.tls.as_ref(), false)
            .await
    }

    /// Opens a connection and logs in. With `role_first`, `ROLE` is asked
    /// before `AUTH`: a server that answers it is a Sentinel is left before
    /// it is sent the password (a Sentinel that takes a password answers
    /// `NOAUTH` like a data node, and is told apart only after `AUTH`).
    pub(super) async fn connect_with(
        &self,
        addr: &Addr,
        deadline: Instant,
        db: Option<u32>,
        login: Login<'_>,
        tls: Option<&Tls>,
        role_first: bool,
    ) -> Result<Conn, Error> {
        let fail = |why: String| Error::new(Kind::Dial, format!("cannot connect to {addr}: {why}"));
        let open = async {
            let tcp = TcpStream::connect((addr.host.as_str(), addr.port))
                .await
                .map_err(|e| fail(e.to_string()))?;
            let _ = tcp.set_nodelay(true);
            // A dead peer behind a silent network is noticed in about a minute.
            let keepalive = TcpKeepalive::new()
                .with_time(Duration::from_secs(30))
                .with_interval(Duration::from_secs(10));
            let _ = SockRef::from(&tcp).set_tcp_keepalive(&keepalive);
            let probe = Probe::of(&tcp);
            let mut stream: Stream = match tls {
                None => Box::new(tcp),
                Some(tls) => {
                    let name = tls.server_name.clone().unwrap_or_else(|| addr.host.clone());
                    let server_name = rustls_pki_types::ServerName::try_from(name.clone())
                        .map_err(|e| fail(format!("bad TLS server name: {e}")))?;
                    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
                    let s = connector
                        .connect(server_name, tcp)
                        .await
                        .map_err(|e| fail(handshake_failure(&e, &name)))?;
                    Box::new(s)
                }
            };
            if role_first
                && let Value::Array(role) = ask_one(&mut stream, Cmd::new("ROLE"), deadline)
                    .await
                    .map_err(fail)?
                && role.first().and_then(Value::text).as_deref() == Some("sentinel")
            {
                return Err(fail(NAMED_A_SENTINEL.into()));
            }
            let mut hello = Vec::new();
            hello.push(match login.password {
                Some(pw) => match login.username {
                    Some(user) => Cmd::new("AUTH").arg(user).arg(pw.expose()),
                    None => Cmd::new("AUTH").arg(pw.expose()),
                },
                None => Cmd::new("PING"),
            });
            if let Some(db) = db {
                hello.push(Cmd::new("SELECT").arg(db.to_string()));
            }
            let replies = exchange(&mut stream, &hello)
                .await
                .map_err(|e| fail(e.detail))?;
            for (cmd, reply) in hello.iter().zip(&replies) {
                if let Value::Error(e) = reply {
                    return Err(fail(format!("{} refused: {}", cmd.name(), first_words(e))));
                }
            }
            Ok(Conn { stream, probe })
        };
        let budget = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout_at(deadline, open).await {
            Ok(r) => r,
            Err(_) => Err(fail(format!(
                "no answer within {} (TCP, TLS and AUTH/PING)",
                humantime::format_duration(Duration::from_millis(
                    (budget.as_millis() as u64).div_ceil(10) * 10
                ))
            ))),
        }
    }
}

/// Why a Sentinel named as the primary is refused.
pub(super) const NAMED_A_SENTINEL: &str = "it is a Sentinel, not a primary: the Sentinels must \
     monitor the data nodes (check `sentinel monitor`), and a Sentinel is never sent the data \
     nodes' password or used for leases";

/// One command and its one reply, by `deadline`.
pub(super) async fn ask_one(
    stream: &mut Stream,
    cmd: Cmd,
    deadline: Instant,
) -> Result<Value, String> {
    let what = cmd.name().to_owned();
    let reply = tokio::time::timeout_at(deadline, exchange(stream, &[cmd]))
        .await
        .map_err(|_| format!("no answer to {what} in time"))?
        .map_err(|e| e.detail)?;
    reply
        .into_iter()
        .next()
        .ok_or_else(|| format!("no reply to {what}"))
}

/// The first words of a server error, enough to name it without quoting arguments.
pub fn first_words(e: &str) -> String {
    e.chars().take(200).collect()
}

/// Sends `cmds` in one write and reads one reply per command (no deadline of
/// its own: callers bound it). For handshakes and one-off questions only.
/// A broken stream is [`Kind::Lost`], bytes that are not RESP
/// [`Kind::Protocol`].
pub async fn exchange(stream: &mut Stream, cmds: &[Cmd]) -> Result<Vec<Value>, Error> {
    exchange_keeping(stream, cmds, &mut Decoder::new()).await
}

/// [`exchange`], leaving whatever arrived after the replies in `decoder`
/// (a subscription's first messages can share a read with its confirmation).
pub async fn exchange_keeping(
    stream: &mut Stream,
    cmds: &[Cmd],
    decoder: &mut Decoder,
) -> Result<Vec<Value>, Error> {
    let lost = |why: String| Error::new(Kind::Lost, why);
    let mut out = Vec::new();
    for c in cmds {
        c.encode(&mut out);
    }
    stream
        .write_all(&out)
        .await
        .map_err(|e| lost(describe_io(&e, None)))?;
    stream
        .flush()
        .await
        .map_err(|e| lost(describe_io(&e, None)))?;
    let mut replies = Vec::with_capacity(cmds.len());
    while replies.len() < cmds.len() {
        match decoder.next()? {
            Some(v) => replies.push(v),
            None => {
                let n = stream
                    .read_buf(decoder.buffer())
                    .await
                    .map_err(|e| lost(describe_io(&e, None)))?;
                if n == 0 {
                    return Err(lost("connection closed by the server".into()));
                }
            }
        }
    }
    Ok(replies)
}
