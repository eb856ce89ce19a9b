//! What the operator needs from a spec, checked once per pass (no client required).
//!
//! The CRD schema and its CEL rules refuse bad specs at admission; this check
//! repeats the rules the operator depends on (objects created before a CRD
//! upgrade, selectors the schema cannot judge, names the store would refuse)
//! so that an invalid spec becomes `SpecValid=False` instead of a loop of
//! store errors.

use crate::operator::config_error::ConfigError;
use std::time::Duration;

use kube::ResourceExt;
use kube::core::Selector;

use crate::operator::crd::{MAX_NAME_CHARS, TargetLease};
use crate::store;

/// Timing from the spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease lives without a renewal.
    pub ttl: Duration,
    /// How often it is renewed.
    pub renew: Duration,
    /// Hard limit on one lease's life.
    pub max_lifetime: Option<Duration>,
}

/// Who may hold the lease, as the spec says.
#[derive(Clone, Debug)]
pub enum Holders {
    /// One named owner (`spec.holder.identity`), optionally tied to a pod.
    Named {
        /// The owner to record in the store (`spec.holder.identity`).
        owner: String,
        /// The pod the lease is tied to.
        pod: Option<String>,
    },
    /// Leader election among the pods this selector matches.
    Elected(Selector),
}

/// A spec the operator can act on.
#[derive(Clone, Debug)]
pub struct ValidSpec {
    /// Durations.
    pub timing: Timing,
    /// The holder or candidates.
    pub holders: Holders,
}

/// Checks the spec; the error is one sentence for the `SpecValid` condition.
pub fn validate(tl: &TargetLease) -> Result<ValidSpec, ConfigError> {
    let spec = &tl.spec;
    if tl.name_any().chars().count() > MAX_NAME_CHARS {
        return Err(ConfigError::of(
            "metadata.name",
            format!("must be at most {MAX_NAME_CHARS} characters"),
        ));
    }
    store::check_name("spec.target", &spec.target).map_err(invalid)?;
    let ttl = spec.lease_duration()?;
    let renew = spec.renew_interval()?;
    let max_lifetime = spec.max_lifetime()?;
    if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(24 * 3600) {
        return Err(ConfigError::new(
            "spec.leaseDuration must be between 1s and 24h",
        ));
    }
    if renew < Duration::from_millis(100) || renew * 2 > ttl {
        return Err(ConfigError::new(
            "spec.renewInterval must be at least 100ms and at most half of spec.leaseDuration",
        ));
    }
    if let Some(max) = max_lifetime
        && (max < ttl || max > Duration::from_secs(8760 * 3600))
    {
        return Err(ConfigError::new(
            "spec.maxLifetime must be between spec.leaseDuration and 8760h",
        ));
    }
    let holders = match (&spec.holder, &spec.candidates) {
        (Some(h), None) => {
            store::check_name("spec.holder.identity", &h.identity).map_err(invalid)?;
            Holders::Named {
                owner: h.identity.clone(),
                pod: h.pod_name.clone(),
            }
        }
        (None, Some(c)) => {
            let selector = Selector::try_from(c.pod_selector.clone())
                .map_err(|e| ConfigError::of("spec.candidates.podSelector", e))?;
            if selector.selects_all() {
                return Err(ConfigError::new(
                    "spec.candidates.podSelector must not be empty",
                ));
            }
            Holders::Elected(selector)
        }
        _ => {
            return Err(ConfigError::new(
                "exactly one of spec.holder or spec.candidates must be set",
            ));
        }
    };
    Ok(ValidSpec {
        timing: Timing {
            ttl,
            renew,
            max_lifetime,
        },
        holders,
    })
}

fn invalid(e: store::StoreError) -> ConfigError {
    match e {
        store::StoreError::Invalid(m) => ConfigError::new(m),
        other => ConfigError::new(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::crd::TargetLeaseSpec;
    use serde_json::json;

    fn tl(spec: serde_json::Value) -> TargetLease {
        let spec: TargetLeaseSpec = serde_json::from_value(spec).unwrap();
        TargetLease::new("x", spec)
    }

    #[test]
    fn a_valid_spec_yields_its_timing() {
        let v = validate(&tl(json!({"target": "t", "holder": {"identity": "a"}}))).unwrap();
        assert_eq!(
            v.timing,
            Timing {
                ttl: Duration::from_secs(90),
                renew: Duration::from_secs(30),
                max_lifetime: None
            }
        );
    }

    #[test]
    fn specs_the_store_or_the_planner_cannot_use_are_refused() {
        let cases = [
            (
                json!({"target": "a\u{85}b", "holder": {"identity": "a"}}),
                "control characters",
            ),
            (
                json!({"target": "é".repeat(200), "holder": {"identity": "a"}}),
                "bytes",
            ),
            (
                json!({"target": "t", "holder": {"identity": "a\nb"}}),
                "control characters",
            ),
            (
                json!({"target": "t", "candidates": {"podSelector": {}}}),
                "must not be empty",
            ),
            (
                json!({"target": "t", "candidates": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Bogus"}]}}}),
                "podSelector",
            ),
            (
                json!({"target": "t", "holder": {"identity": "a"}, "leaseDuration": "10s", "renewInterval": "6s"}),
                "at most half",
            ),
            (
                json!({"target": "t", "holder": {"identity": "a"}, "leaseDuration": "10s", "maxLifetime": "5s"}),
                "maxLifetime",
            ),
            (json!({"target": "t"}), "exactly one"),
        ];
        for (spec, expected) in cases {
            let err = validate(&tl(spec.clone())).expect_err(&spec.to_string());
            assert!(err.to_string().contains(expected), "{spec}: {err}");
        }
    }
}
