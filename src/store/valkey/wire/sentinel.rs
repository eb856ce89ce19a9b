//! Asking Sentinels which server is the primary (the routing of a
//! Sentinel-managed deployment: its pool dials whatever primary they name),
//! each Sentinel in turn within its share of the deadline, and checking that
//! the server named says it is a primary before it is used.

use tokio::time::Instant;

use super::dial::{Conn, Dialer, Login, NAMED_A_SENTINEL, ask_one, exchange, first_words};
use super::endpoint::Addr;
use super::error::{Error, Kind};
use super::resp::{Cmd, Value};

fn dial(why: String) -> Error {
    Error::new(Kind::Dial, why)
}

impl Dialer {
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
    ) -> Result<(Addr, Conn), Error> {
        let mut why = Vec::new();
        for (i, s) in sentinels.iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            let share = left / u32::try_from(sentinels.len() - i).unwrap_or(u32::MAX);
            let by = (Instant::now() + share).min(deadline);
            match self.primary_named_by(s, sentinels, service, by).await {
                Ok(found) => return Ok(found),
                Err(e) => why.push(e.detail),
            }
        }
        Err(dial(format!(
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
    ) -> Result<(Addr, Conn), Error> {
        let addr = self.ask_sentinel(sentinel, service, deadline).await?;
        let named = |why: String| dial(format!("sentinel {sentinel} named {addr}: {why}"));
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
            .map_err(|e| named(e.detail))?;
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
    ) -> Result<Addr, Error> {
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
            .map_err(|_| dial(format!("sentinel {s}: no answer in time")))?
            .map_err(|e| dial(format!("sentinel {s}: {e}")))?;
        match reply.first() {
            Some(Value::Array(hp)) if hp.len() == 2 => {
                let host = hp[0].text().unwrap_or_default();
                let port = hp[1].int().and_then(|p| u16::try_from(p).ok());
                match port {
                    Some(port) if !host.is_empty() => Ok(Addr { host, port }),
                    _ => Err(dial(format!("sentinel {s}: unreadable address"))),
                }
            }
            Some(Value::Nil) => Err(dial(format!(
                "sentinel {s} does not know a primary named {service:?}"
            ))),
            Some(Value::Error(e)) => Err(dial(format!("sentinel {s}: {}", first_words(e)))),
            _ => Err(dial(format!("sentinel {s}: unexpected reply"))),
        }
    }
}
