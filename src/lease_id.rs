//! Lease ids derived from acquisition ids, so a restarted operator can renew
//! the leases it holds without ever storing their capability anywhere.
//!
//! `lease_id = HMAC-SHA256(key, acquisition_id)`. The acquisition id is public
//! (it sits in status); the key is a secret shared by the operator's replicas.

use crate::config_error::ConfigError;
use ring::hmac;

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
        tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }
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
}
