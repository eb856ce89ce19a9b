//! "A target may be free" notifications, so waiters wake when a lease is given
//! back, including by holders outside Kubernetes (`targetlease run`).
//!
//! The release and revoke scripts publish the target's key base on
//! `<prefix>:events`; this module subscribes on a connection of its own
//! (resubscribing after reconnects) and turns messages back into [`Target`]s.
//! Expiry publishes nothing: waiters also retry at the holder's expiry.

use fred::prelude::*;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::config::ValkeyConfig;
use crate::store::{StoreError, Target};

/// Subscribes to release notifications under `cfg.key_prefix`.
pub async fn release_events(cfg: &ValkeyConfig) -> Result<BoxStream<'static, Target>, StoreError> {
    let client = super::builder(cfg)?
        .build_subscriber_client()
        .map_err(|e| StoreError::Invalid(format!("valkey subscriber: {}", e.details())))?;
    match tokio::time::timeout(cfg.connect_timeout, client.init()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            return Err(StoreError::BackendUnavailable(format!(
                "subscriber cannot connect: {}",
                e.details()
            )));
        }
        Err(_) => {
            return Err(StoreError::BackendUnavailable(
                "subscriber connect timed out".into(),
            ));
        }
    }
    let channel = format!("{}:events", cfg.key_prefix);
    client
        .subscribe(channel.as_str())
        .await
        .map_err(|e| StoreError::BackendUnavailable(format!("subscribe: {}", e.details())))?;
    let _resubscriber = client.manage_subscriptions();
    let prefix = cfg.key_prefix.clone();
    let rx = client.message_rx();
    let stream = futures::stream::unfold((rx, client), move |(mut rx, client)| {
        let prefix = prefix.clone();
        async move {
            loop {
                match rx.recv().await {
                    Ok(msg) => {
                        let text = msg.value.as_string().unwrap_or_default();
                        if let Some(target) = parse_base(&prefix, &text) {
                            return Some((target, (rx, client)));
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    Ok(stream.boxed())
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
