//! Opening one connection: TCP (keepalive), TLS, then the handshake
//! (`AUTH` or `PING`, `SELECT`), all within one deadline; and asking
//! Sentinels which server is the primary, each in turn within its share of
//! that deadline.
//!
//! Nothing here retries: a failure is reported with its cause, and the caller
//! (the pool) decides when to try again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::config::Secret;
use super::endpoint::Addr;
use super::resp::{Cmd, Decoder, Value};
use super::tls::{describe_io, handshake_failure};

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
struct Login<'a> {
    username: Option<&'a str>,
    password: Option<&'a Secret>,
}

/// Why a connection could not be opened; nothing was sent on it but the handshake.
#[derive(Clone, Debug)]
pub struct DialError(pub String);

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
    /// Connects to the data node `addr` and completes the handshake before `deadline`.
    pub async fn connect(&self, addr: &Addr, deadline: Instant) -> Result<Conn, DialError> {
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
    async fn connect_with(
        &self,
        addr: &Addr,
        deadline: Instant,
        db: Option<u32>,
        login: Login<'_>,
        tls: Option<&Tls>,
        role_first: bool,
    ) -> Result<Conn, DialError> {
        let fail = |why: String| DialError(format!("cannot connect to {addr}: {why}"));
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
            let replies = exchange(&mut stream, &hello).await.map_err(fail)?;
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

    /// Asks the Sentinels in order for the primary of `service` and connects
    /// to it; the primary must say it is one (`ROLE`, or `INFO replication`
    /// when the ACL does not grant `ROLE`) before the connection is used.
    /// Each Sentinel in turn, with the primary it names, gets an equal share
    /// of the time left, so one that hangs, names a server that is gone, or
    /// names one that is no longer the primary, does not keep the next
    /// Sentinel from being asked.
    ///
    /// What a Sentinel names is not trusted with the data nodes' password
    /// by itself: with TLS the named server must first complete a handshake
    /// with a certificate the TLS settings accept for the name (the named
    /// host, or `--tls-server-name`), and only then gets `AUTH`
    /// ([`Dialer::connect`]); without TLS nothing can prove who answers
    /// at that address (docs/security.md).
    pub async fn connect_primary(
        &self,
        sentinels: &[Addr],
        service: &str,
        deadline: Instant,
    ) -> Result<(Addr, Conn), DialError> {
        let mut why = Vec::new();
        for (i, s) in sentinels.iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            let share = left / u32::try_from(sentinels.len() - i).unwrap_or(u32::MAX);
            let by = (Instant::now() + share).min(deadline);
            match self.primary_named_by(s, sentinels, service, by).await {
                Ok(found) => return Ok(found),
                Err(e) => why.push(e.0),
            }
        }
        Err(DialError(format!(
            "no sentinel named a reachable primary: {}",
            why.join("; ")
        )))
    }

    /// The primary `sentinel` names for `service`, connected and checked, by
    /// `deadline`. Nothing but the handshake and the role question is sent
    /// before the server says it is a primary; a Sentinel of the URL
    /// (`sentinels`) named as the primary is not even connected to, so it
    /// never gets the data nodes' password.
    async fn primary_named_by(
        &self,
        sentinel: &Addr,
        sentinels: &[Addr],
        service: &str,
        deadline: Instant,
    ) -> Result<(Addr, Conn), DialError> {
        let addr = self.ask_sentinel(sentinel, service, deadline).await?;
        let named = |why: String| DialError(format!("sentinel {sentinel} named {addr}: {why}"));
        if sentinels.contains(&addr) {
            return Err(named(NAMED_A_SENTINEL.into()));
        }
        let login = Login {
            username: self.username.as_deref(),
            password: self.password.as_ref(),
        };
        let tls = self.tls.as_ref();
        let mut conn = self
            .connect_with(
                &addr,
                deadline,
                self.db,
                login,
                tls,
                login.password.is_some(),
            )
            .await
            .map_err(|e| named(e.0))?;
        let stream = &mut conn.stream;
        let role = match ask_one(stream, Cmd::new("ROLE"), deadline)
            .await
            .map_err(named)?
        {
            Value::Array(r) => r.first().and_then(Value::text),
            // Not granted (the documented ACL rule grants INFO, not ROLE).
            Value::Error(_) => match ask_one(stream, Cmd::new("INFO").arg("replication"), deadline)
                .await
                .map_err(named)?
            {
                Value::Error(_) => None,
                info => Some(
                    info.text()
                        .as_deref()
                        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("role:")))
                        .map(|r| r.trim().to_owned())
                        .unwrap_or_default(),
                ),
            },
            _ => Some(String::new()),
        };
        match role.as_deref() {
            Some("master") => Ok((addr, conn)),
            // Neither question allowed: writes there would be refused with
            // READONLY, and the connection dropped, if it is not the primary.
            None => Ok((addr, conn)),
            Some("") => Err(named("its role cannot be read".into())),
            Some("sentinel") => Err(named(NAMED_A_SENTINEL.into())),
            Some(other) => Err(named(format!(
                "it is not a primary (its role: {})",
                first_words(other)
            ))),
        }
    }

    /// What `sentinel` says the primary of `service` is, with the Sentinels' own login.
    async fn ask_sentinel(
        &self,
        sentinel: &Addr,
        service: &str,
        deadline: Instant,
    ) -> Result<Addr, DialError> {
        let s = sentinel;
        let login = Login {
            username: self.sentinel_username.as_deref(),
            password: self.sentinel_password.as_ref(),
        };
        let mut conn = self
            .connect_with(s, deadline, None, login, self.sentinel_tls.as_ref(), false)
            .await?;
        let ask = [Cmd::new("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(service)];
        let reply = tokio::time::timeout_at(deadline, exchange(&mut conn.stream, &ask))
            .await
            .map_err(|_| DialError(format!("sentinel {s}: no answer in time")))?
            .map_err(|e| DialError(format!("sentinel {s}: {e}")))?;
        match reply.first() {
            Some(Value::Array(hp)) if hp.len() == 2 => {
                let host = hp[0].text().unwrap_or_default();
                let port = hp[1].int().and_then(|p| u16::try_from(p).ok());
                match port {
                    Some(port) if !host.is_empty() => Ok(Addr { host, port }),
                    _ => Err(DialError(format!("sentinel {s}: unreadable address"))),
                }
            }
            Some(Value::Nil) => Err(DialError(format!(
                "sentinel {s} does not know a primary named {service:?}"
            ))),
            Some(Value::Error(e)) => Err(DialError(format!("sentinel {s}: {}", first_words(e)))),
            _ => Err(DialError(format!("sentinel {s}: unexpected reply"))),
        }
    }
}

/// Why a Sentinel named as the primary is refused.
const NAMED_A_SENTINEL: &str = "it is a Sentinel, not a primary: the Sentinels must monitor the \
     data nodes (check `sentinel monitor`), and a Sentinel is never sent the data nodes' password \
     or used for leases";

/// One command and its one reply, by `deadline`.
async fn ask_one(stream: &mut Stream, cmd: Cmd, deadline: Instant) -> Result<Value, String> {
    let what = cmd.name().to_owned();
    let reply = tokio::time::timeout_at(deadline, exchange(stream, &[cmd]))
        .await
        .map_err(|_| format!("no answer to {what} in time"))??;
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
pub async fn exchange(stream: &mut Stream, cmds: &[Cmd]) -> Result<Vec<Value>, String> {
    exchange_keeping(stream, cmds, &mut Decoder::new()).await
}

/// [`exchange`], leaving whatever arrived after the replies in `decoder`
/// (a subscription's first messages can share a read with its confirmation).
pub async fn exchange_keeping(
    stream: &mut Stream,
    cmds: &[Cmd],
    decoder: &mut Decoder,
) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for c in cmds {
        c.encode(&mut out);
    }
    stream
        .write_all(&out)
        .await
        .map_err(|e| describe_io(&e, None))?;
    stream.flush().await.map_err(|e| describe_io(&e, None))?;
    let mut replies = Vec::with_capacity(cmds.len());
    while replies.len() < cmds.len() {
        match decoder.next().map_err(|e| e.0)? {
            Some(v) => replies.push(v),
            None => {
                let n = stream
                    .read_buf(decoder.buffer())
                    .await
                    .map_err(|e| describe_io(&e, None))?;
                if n == 0 {
                    return Err("connection closed by the server".into());
                }
            }
        }
    }
    Ok(replies)
}
