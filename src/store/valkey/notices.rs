//! "A target may be free" notifications, so waiters wake when a lease is given
//! back, including by holders outside Kubernetes (`targetlease run`).
//!
//! The release and revoke scripts publish the target's key on
//! `<prefix>:events`; this module subscribes on a connection of its own
//! (resubscribing after reconnects, pinging a quiet one) and turns messages
//! back into [`Target`]s: every target for the operator
//! ([`release_notices`]), one target for a waiter ([`Source::for_target`],
//! behind [`crate::store::LeaseStore::notices`]).
//! Expiry publishes nothing: waiters also ask again at the holder's expiry.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::config::ValkeyConfig;
use super::keys::parse_base;
use super::wire::dial::{Dialer, Stream};
use super::wire::endpoint::{Addr, Endpoint, Topology};
use super::wire::resp::{Cmd, Decoder, Value};
use super::wire::tls::describe_io;
use crate::store::{Notice, Notices, StoreError, Target};

/// How often a quiet subscription checks that the server still answers.
const PING_EVERY: Duration = Duration::from_secs(30);

/// Subscribes to release notifications under `cfg.key_prefix`. The first
/// subscription must work (within the connect timeout); after that the
/// stream reconnects and resubscribes by itself, backing off up to 5s.
pub async fn release_notices(cfg: &ValkeyConfig) -> Result<BoxStream<'static, Target>, StoreError> {
    let (endpoint, dialer) = super::prepare(cfg)?;
    let rx = Source::new(cfg, &endpoint, dialer).open().await?;
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await? {
                Heard::Freed(t) => return Some((t, rx)),
                Heard::Resubscribed => {}
            }
        }
    });
    Ok(stream.boxed())
}

/// What a subscription heard.
enum Heard {
    /// A release notice for this target.
    Freed(Target),
    /// Subscribed again after the connection broke: notices may be lost.
    Resubscribed,
}

/// Where release notices are subscribed, kept by a store so its waiters
/// can subscribe.
#[derive(Clone)]
pub(super) struct Source {
    dialer: Dialer,
    topology: Topology,
    channel: String,
    prefix: String,
    connect_timeout: Duration,
}

impl Source {
    pub(super) fn new(cfg: &ValkeyConfig, endpoint: &Endpoint, dialer: Dialer) -> Self {
        Self {
            dialer,
            topology: endpoint.topology.clone(),
            channel: format!("{}:events", cfg.key_prefix),
            prefix: cfg.key_prefix.clone(),
            connect_timeout: cfg.connect_timeout,
        }
    }

    /// The notices of `target` alone, on a subscription of its own.
    pub(super) async fn for_target(&self, target: &Target) -> Result<Notices, StoreError> {
        let rx = self.open().await?;
        let stream = futures::stream::unfold((rx, target.clone()), |(mut rx, t)| async move {
            loop {
                match rx.recv().await? {
                    Heard::Freed(freed) if freed == t => return Some((Notice::Freed, (rx, t))),
                    Heard::Freed(_) => {}
                    Heard::Resubscribed => return Some((Notice::Resubscribed, (rx, t))),
                }
            }
        });
        Ok(stream.boxed())
    }

    /// Subscribes (the first time within the connect timeout) and forwards
    /// what is heard until the receiver is dropped.
    async fn open(&self) -> Result<mpsc::Receiver<Heard>, StoreError> {
        let first = self
            .subscribe()
            .await
            .map_err(|e| StoreError::BackendUnavailable(format!("subscriber: {e}")))?;
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(self.clone().pump(first, tx));
        Ok(rx)
    }

    /// A connection subscribed to the channel (any node of a cluster: classic
    /// pub/sub messages reach every node).
    async fn subscribe(&self) -> Result<Subscribed, String> {
        let deadline = Instant::now() + self.connect_timeout;
        let mut stream = match &self.topology {
            Topology::Standalone(a) => {
                self.dialer
                    .connect(a, deadline)
                    .await
                    .map_err(|e| e.detail)?
                    .stream
            }
            Topology::Sentinel { sentinels, service } => {
                let (_, s) = self
                    .dialer
                    .connect_primary(sentinels, service, deadline)
                    .await
                    .map_err(|e| e.detail)?;
                s.stream
            }
            Topology::Cluster(seeds) => first_reachable(&self.dialer, seeds, deadline).await?,
        };
        let decoder = subscribe_on(&mut stream, &self.channel, deadline).await?;
        Ok(Subscribed { stream, decoder })
    }

    /// Forwards messages until the receiver is gone, reconnecting as needed.
    async fn pump(self, first: Subscribed, tx: mpsc::Sender<Heard>) {
        let mut stream = Some(first);
        let mut delay = Duration::from_millis(100);
        loop {
            let s = match stream.take() {
                Some(s) => s,
                None => match self.subscribe().await {
                    Ok(s) => {
                        delay = Duration::from_millis(100);
                        if tx.send(Heard::Resubscribed).await.is_err() {
                            return;
                        }
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
                why = forward(s, &tx, &self.prefix) => {
                    tracing::debug!(why = %why, "release events: subscription lost; resubscribing");
                }
                _ = tx.closed() => return,
            }
        }
    }
}

/// A subscribed connection and what was read after the confirmation.
struct Subscribed {
    stream: Stream,
    /// Messages can arrive in the same read as the confirmation: they are here.
    decoder: Decoder,
}

/// Sends `SUBSCRIBE channel` and waits for its confirmation; the decoder
/// keeps every byte read after it.
async fn subscribe_on(
    stream: &mut Stream,
    channel: &str,
    deadline: Instant,
) -> Result<Decoder, String> {
    let mut decoder = Decoder::new();
    let subscribe = tokio::time::timeout_at(
        deadline,
        super::wire::dial::exchange_keeping(
            stream,
            &[Cmd::new("SUBSCRIBE").arg(channel)],
            &mut decoder,
        ),
    )
    .await
    .map_err(|_| "no answer to SUBSCRIBE in time".to_owned())?
    .map_err(|e| e.detail)?;
    match subscribe.first() {
        Some(Value::Array(a))
            if a.first().and_then(Value::text).as_deref() == Some("subscribe") =>
        {
            Ok(decoder)
        }
        Some(Value::Error(e)) => Err(format!(
            "SUBSCRIBE refused: {}",
            super::wire::dial::first_words(e)
        )),
        _ => Err("unexpected reply to SUBSCRIBE".into()),
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
            Err(e) => why.push(e.detail),
        }
    }
    Err(why.join("; "))
}

/// Reads messages off a subscribed connection until it breaks; returns why.
async fn forward(sub: Subscribed, tx: &mpsc::Sender<Heard>, prefix: &str) -> String {
    let Subscribed {
        stream: mut s,
        mut decoder,
    } = sub;
    let mut ping_at = Instant::now() + PING_EVERY;
    let mut answered_since_ping = true;
    loop {
        // Whatever is decoded first: messages read with the confirmation too.
        loop {
            match decoder.next() {
                Ok(Some(v)) => {
                    if let Value::Array(parts) = v
                        && parts.first().and_then(Value::text).as_deref() == Some("message")
                        && let Some(target) = parts
                            .get(2)
                            .and_then(Value::text)
                            .and_then(|b| parse_base(prefix, &b))
                        && tx.send(Heard::Freed(target)).await.is_err()
                    {
                        return "no more listeners".into();
                    }
                }
                Ok(None) => break,
                Err(e) => return e.detail,
            }
        }
        tokio::select! {
            read = s.read_buf(decoder.buffer()) => match read {
                Ok(0) => return "connection closed by the server".into(),
                Err(e) => return describe_io(&e, None),
                Ok(_) => {
                    answered_since_ping = true;
                    ping_at = Instant::now() + PING_EVERY;
                }
            },
            _ = tokio::time::sleep_until(ping_at) => {
                if !answered_since_ping {
                    return "no answer to PING".into();
                }
                let mut ping = Vec::new();
                Cmd::new("PING").encode(&mut ping);
                if let Err(e) = s.write_all(&ping).await {
                    return describe_io(&e, None);
                }
                answered_since_ping = false;
                ping_at = Instant::now() + PING_EVERY / 3;
            }
        }
    }
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
            let base = ks.target(&t);
            assert_eq!(parse_base("tl", &base), Some(t));
        }
        assert_eq!(parse_base("tl", "other:{a:b}"), None);
    }

    /// A message that arrives in the same read as the SUBSCRIBE confirmation
    /// is delivered, not dropped with the rest of that read.
    #[tokio::test]
    async fn a_message_read_with_the_confirmation_is_kept() {
        let (client, mut server) = tokio::io::duplex(4096);
        let mut stream: Stream = Box::new(client);
        let ks = KeySpace::new("tl").unwrap();
        let t = Target::new("ns", "freed");
        let base = ks.target(&t);
        let mut wire = Vec::new();
        wire.extend_from_slice(b"*3\r\n$9\r\nsubscribe\r\n$9\r\ntl:events\r\n:1\r\n");
        wire.extend_from_slice(
            format!(
                "*3\r\n$7\r\nmessage\r\n$9\r\ntl:events\r\n${}\r\n{base}\r\n",
                base.len()
            )
            .as_bytes(),
        );
        // The server answers only after the request, in one write.
        let serve = tokio::spawn(async move {
            let mut req = [0u8; 256];
            let _ = server.read(&mut req).await.unwrap();
            server.write_all(&wire).await.unwrap();
            server
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let decoder = subscribe_on(&mut stream, "tl:events", deadline)
            .await
            .unwrap();
        let _server = serve.await.unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let sub = Subscribed { stream, decoder };
        let got = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::select! {
                why = forward(sub, &tx, "tl") => panic!("forward ended: {why}"),
                t = rx.recv() => t,
            }
        })
        .await
        .expect("the message is delivered without another read");
        assert!(matches!(got, Some(Heard::Freed(got)) if got == t));
    }
}
