//! The durable token floor: tokens never go backwards, even if Valkey forgets.
//!
//! Valkey can lose a fence counter (failover before replication, a restart
//! without AOF, a flush). Every token the operator publishes stays visible in
//! the Kubernetes API: in the status of the TargetLease that holds it, and —
//! once that resource is deleted — in one ConfigMap in the operator's
//! namespace, written by the finalizer before it lets go. An acquire asks the
//! store for a token above the highest of those.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

/// Where deleted leases leave their last token.
#[derive(Clone)]
pub struct FloorStore {
    api: Api<ConfigMap>,
    name: String,
}

/// The ConfigMap key of a (namespace, target): a hash, since targets may hold any character.
pub fn floor_key(namespace: &str, target: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{namespace}\u{0}{target}").as_bytes(),
    );
    let hex: String = digest.as_ref()[..20]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("t-{hex}")
}

impl FloorStore {
    /// Floors kept in ConfigMap `name` of namespace `namespace`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
        }
    }

    /// The recorded floor of a target (0 when none).
    pub async fn get(&self, namespace: &str, target: &str) -> Result<u64, kube::Error> {
        let cm = self.api.get_opt(&self.name).await?;
        Ok(cm
            .and_then(|cm| cm.data)
            .and_then(|d| d.get(&floor_key(namespace, target)).cloned())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// Raises a target's floor to at least `token` (optimistic concurrency, retried).
    pub async fn raise(
        &self,
        namespace: &str,
        target: &str,
        token: u64,
    ) -> Result<(), kube::Error> {
        let key = floor_key(namespace, target);
        for _ in 0..10 {
            match self.api.get_opt(&self.name).await? {
                None => {
                    let cm = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            ..Default::default()
                        },
                        data: Some(BTreeMap::from([(key.clone(), token.to_string())])),
                        ..Default::default()
                    };
                    match self.api.create(&PostParams::default(), &cm).await {
                        Ok(_) => return Ok(()),
                        Err(kube::Error::Api(e)) if e.code == 409 => continue,
                        Err(e) => return Err(e),
                    }
                }
                Some(mut cm) => {
                    let data = cm.data.get_or_insert_with(BTreeMap::new);
                    let current: u64 = data.get(&key).and_then(|v| v.parse().ok()).unwrap_or(0);
                    if current >= token {
                        return Ok(());
                    }
                    data.insert(key.clone(), token.to_string());
                    match self
                        .api
                        .replace(&self.name, &PostParams::default(), &cm)
                        .await
                    {
                        Ok(_) => return Ok(()),
                        Err(kube::Error::Api(e)) if e.code == 409 => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Err(kube::Error::Api(
            kube::core::Status::failure("too many conflicts raising the token floor", "Conflict")
                .with_code(409)
                .boxed(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_configmap_keys_and_do_not_collide() {
        let a = floor_key("a:b", "c");
        let b = floor_key("a", "b:c");
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert_eq!(a.len(), 42);
    }
}
