//! TargetLease specs as a test reads them:
//! `lease_for("db").identity("job-a").pod("job-a").durations("4s", "1s")`.
//! Anything the builder does not name goes in with [`Spec::set`].

use serde_json::{Value, json};

/// A TargetLease `spec`, built field by field.
#[derive(Clone, Debug)]
pub struct Spec(Value);

/// A spec for `target` with nothing else set.
pub fn lease_for(target: &str) -> Spec {
    Spec(json!({ "target": target }))
}

impl Spec {
    /// `holder.identity`.
    pub fn identity(mut self, identity: &str) -> Self {
        self.0["holder"]["identity"] = json!(identity);
        self
    }

    /// `holder.podName`: the lease is tied to that pod's readiness.
    pub fn pod(mut self, pod: &str) -> Self {
        self.0["holder"]["podName"] = json!(pod);
        self
    }

    /// An election among the pods labelled `app: <app>`.
    pub fn elect(self, app: &str) -> Self {
        self.set(
            "candidates",
            json!({ "podSelector": { "matchLabels": { "app": app } } }),
        )
    }

    /// `leaseDuration` and `renewInterval`.
    pub fn durations(self, lease: &str, renew: &str) -> Self {
        self.set("leaseDuration", json!(lease))
            .set("renewInterval", json!(renew))
    }

    /// `maxLifetime`.
    pub fn max_lifetime(self, max: &str) -> Self {
        self.set("maxLifetime", json!(max))
    }

    /// Any other field of the spec.
    pub fn set(mut self, field: &str, value: Value) -> Self {
        self.0[field] = value;
        self
    }
}

impl From<Spec> for Value {
    fn from(s: Spec) -> Value {
        s.0
    }
}
