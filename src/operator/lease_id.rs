//! Lease ids derived from acquisition ids, so a restarted operator can renew
//! the leases it holds without ever storing their capability anywhere.
//!
//! `lease_id = HMAC-SHA256(key, acquisition_id)`. The acquisition id is public
//! (it sits in status); the key is a secret shared by the operator's replicas.
//! The request id an acquire is sent with derives from it the same way (with
//! another domain), so whoever reads the status cannot replay the acquire and
//! be handed the lease id: a request id is a capability too.
//!
//! The key comes from a file or from a Secret the operator creates itself
//! ([`secret`]).

pub mod secret;

use crate::operator::config_error::ConfigError;
use ring::hmac;

/// A fresh random acquisition id (for an attempt recorded in status).
pub fn new_acquisition_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The secret key lease ids are derived with.
#[derive(Clone)]
pub struct LeaseIdKey(hmac::Key);

impl std::fmt::Debug for LeaseIdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseIdKey(<redacted>)")
    }
}

impl LeaseIdKey {
    /// A key from secret bytes (at least 16).
    pub fn new(secret: &[u8]) -> Result<Self, ConfigError> {
        if secret.len() < 16 {
            return Err(ConfigError::new(
                "the lease id key must be at least 16 bytes",
            ));
        }
        Ok(Self(hmac::Key::new(hmac::HMAC_SHA256, secret)))
    }

    /// A random key: leases cannot be re-adopted after a restart.
    pub fn random() -> Self {
        let secret: [u8; 32] = rand::random();
        Self(hmac::Key::new(hmac::HMAC_SHA256, &secret))
    }

    /// The lease id of an acquisition.
    pub fn derive(&self, acquisition_id: &str) -> String {
        let tag = hmac::sign(&self.0, acquisition_id.as_bytes());
        hex(tag.as_ref())
    }

    /// The request id an acquisition's acquire is sent with: secret like the
    /// lease id, and never equal to any lease id (acquisition ids hold no NUL).
    pub fn request_id(&self, acquisition_id: &str) -> String {
        let mut ctx = hmac::Context::with_key(&self.0);
        ctx.update(b"request id\0");
        ctx.update(acquisition_id.as_bytes());
        hex(ctx.sign().as_ref())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivation_is_stable_per_key_and_differs_across_keys() {
        let a = LeaseIdKey::new(b"0123456789abcdef").unwrap();
        let b = LeaseIdKey::new(b"0123456789abcdeX").unwrap();
        assert_eq!(a.derive("x"), a.derive("x"));
        assert_ne!(a.derive("x"), a.derive("y"));
        assert_ne!(a.derive("x"), b.derive("x"));
        assert_eq!(a.derive("x").len(), 64);
        assert!(LeaseIdKey::new(b"short").is_err());
    }

    #[test]
    fn request_ids_are_secret_and_apart_from_lease_ids() {
        let a = LeaseIdKey::new(b"0123456789abcdef").unwrap();
        let b = LeaseIdKey::new(b"0123456789abcdeX").unwrap();
        assert_eq!(a.request_id("x"), a.request_id("x"));
        assert_ne!(a.request_id("x"), a.request_id("y"));
        assert_ne!(a.request_id("x"), b.request_id("x"));
        assert_ne!(a.request_id("x"), "x");
        assert_ne!(a.request_id("x"), a.derive("x"));
        assert_eq!(a.request_id("x").len(), 64);
    }
}
