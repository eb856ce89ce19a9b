//! "A target may be free" notifications, so waiters wake when a lease is given
//! back, including by holders outside Kubernetes (`targetlease run`).
//!
//! The release and revoke scripts publish the target's key base on
//! `<prefix>:events`; this module subscribes on a connection of its own
//! (resubscribing after reconnects, pinging a quiet one) and turns messages
//! back into [`Target`]s.
//! Expiry publishes nothing: waiters also retry at the holder's expiry.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::config::ValkeyConfig;
use super::dial::{Dialer, Stream};
use super::endpoint::{Addr, Topology};
use super::resp::{self, Cmd, Value};
use crate::store::{StoreError, Target};

/// How often a quiet subscription checks that the server still answers.
const PING_EVERY: Duration = Duration::from_secs(30);

/// Subscribes to release notifications under `cfg.key_prefix`. The first
/// subscription must work (within the connect timeout); after that the
/// stream reconnects and resubscribes by itself, backing off up to 5s.
pub async fn release_notices(cfg: &ValkeyConfig) -> Result<BoxStream<'static, Target>, StoreError> {
    let (endpoint, dialer) = super::prepare(cfg)?;
    let sub = Subscriber {
        dialer,
        topology: endpoint.topology,
        channel: format!("{}:events", cfg.key_prefix),
        connect_timeout: cfg.connect_timeout,
    };
    let first = sub
        .subscribe()
        .await
        .map_err(|e| StoreError::BackendUnavailable(format!("subscriber: {e}")))?;
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(sub.pump(first, tx, cfg.key_prefix.clone()));
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|t| (t, rx)) });
    Ok(stream.boxed())
}

struct Subscriber {
    dialer: Dialer,
    topology: Topology,
    channel: String,
    connect_timeout: Duration,
}

impl Subscriber {
    /// A connection subscribed to the channel (any node of a cluster: classic
    /// pub/sub messages reach every node).
    async fn subscribe(&self) -> Result<Stream, String> {
        let deadline = Instant::now() + self.connect_timeout;
        let mut stream = match &self.topology {
            Topology::Standalone(a) => {
                self.dialer
                    .connect(a, deadline)
                    .await
                    .map_err(|e| e.0)?
                    .stream
            }
            Topology::Sentinel { sentinels, service } => {
                let (_, s) = self
                    .dialer
                    .connect_primary(sentinels, service, deadline)
                    .await
                    .map_err(|e| e.0)?;
                s.stream
            }
            Topology::Cluster(seeds) => first_reachable(&self.dialer, seeds, deadline).await?,
        };
        let subscribe = tokio::time::timeout_at(
            deadline,
            super::dial::exchange(&mut stream, &[Cmd::new("SUBSCRIBE").arg(&self.channel)]),
        )
        .await
        .map_err(|_| "no answer to SUBSCRIBE in time".to_owned())??;
        match subscribe.first() {
            Some(Value::Array(a))
                if a.first().and_then(Value::text).as_deref() == Some("subscribe") =>
            {
                Ok(stream)
            }
            Some(Value::Error(e)) => Err(format!(
                "SUBSCRIBE refused: {}",
                super::dial::first_words(e)
            )),
            _ => Err("unexpected reply to SUBSCRIBE".into()),
        }
    }

    /// Forwards messages until the receiver is gone, reconnecting as needed.
    async fn pump(self, first: Stream, tx: mpsc::Sender<Target>, prefix: String) {
        let mut stream = Some(first);
        let mut delay = Duration::from_millis(100);
        loop {
            let s = match stream.take() {
                Some(s) => s,
                None => match self.subscribe().await {
                    Ok(s) => {
                        delay = Duration::from_millis(100);
                        s
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "release events: resubscribe failed");
                        let pause = delay.mul_f64(rand::rng().random_range(0.8..1.2));
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = tx.closed() => return,
                        }
                        delay = (delay * 2).min(Duration::from_secs(5));
                        continue;
                    }
                },
            };
            tokio::select! {
                why = forward(s, &tx, &prefix) => {
                    tracing::debug!(why = %why, "release events: subscription lost; resubscribing");
                }
                _ = tx.closed() => return,
            }
        }
    }
}

async fn first_reachable(
    dialer: &Dialer,
    seeds: &[Addr],
    deadline: Instant,
) -> Result<Stream, String> {
    let mut why = Vec::new();
    for a in seeds {
        match dialer.connect(a, deadline).await {
            Ok(c) => return Ok(c.stream),
            Err(e) => why.push(e.0),
        }
    }
    Err(why.join("; "))
}

/// Reads messages off a subscribed connection until it breaks; returns why.
async fn forward(mut s: Stream, tx: &mpsc::Sender<Target>, prefix: &str) -> String {
    let mut buf = Vec::with_capacity(4096);
    let mut ping_at = Instant::now() + PING_EVERY;
    let mut answered_since_ping = true;
    loop {
        tokio::select! {
            read = s.read_buf(&mut buf) => match read {
                Ok(0) => return "connection closed by the server".into(),
                Err(e) => return e.to_string(),
                Ok(_) => {}
            },
            _ = tokio::time::sleep_until(ping_at) => {
                if !answered_since_ping {
                    return "no answer to PING".into();
                }
                let mut ping = Vec::new();
                Cmd::new("PING").encode(&mut ping);
                if let Err(e) = s.write_all(&ping).await {
                    return e.to_string();
                }
                answered_since_ping = false;
                ping_at = Instant::now() + PING_EVERY / 3;
                continue;
            }
        }
        answered_since_ping = true;
        ping_at = Instant::now() + PING_EVERY;
        loop {
            match resp::parse(&buf) {
                Ok(Some((v, used))) => {
                    buf.drain(..used);
                    if let Value::Array(parts) = v
                        && parts.first().and_then(Value::text).as_deref() == Some("message")
                        && let Some(target) = parts
                            .get(2)
                            .and_then(Value::text)
                            .and_then(|b| parse_base(prefix, &b))
                        && tx.send(target).await.is_err()
                    {
                        return "no more listeners".into();
                    }
                }
                Ok(None) => break,
                Err(e) => return e.0,
            }
        }
    }
}

/// Reads `<prefix>:{<ns>:<target>}` back into a target (see `keys.rs` for the escaping).
pub fn parse_base(prefix: &str, base: &str) -> Option<Target> {
    let tag = base
        .strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix('}')?;
    let (ns, name) = tag.split_once(':')?;
    Some(Target::new(unescape(ns)?, unescape(name)?))
}

fn unescape(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::valkey::KeySpace;

    #[test]
    fn key_bases_round_trip() {
        let ks = KeySpace::new("tl").unwrap();
        for t in [
            Target::new("a:b", "c"),
            Target::new("ns}", "%{x}:y"),
            Target::new("n", "plain"),
        ] {
            let lease = ks.lease(&t);
            let base = lease.strip_suffix(":lease").unwrap();
            assert_eq!(parse_base("tl", base), Some(t));
        }
        assert_eq!(parse_base("tl", "other:{a:b}"), None);
    }
}
