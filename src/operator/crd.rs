//! The `TargetLease` custom resource: what users apply and what they read back.
//!
//! Doc comments on these types become `kubectl explain` output, so they are
//! written for the person applying the YAML.

// Several `printcolumn(... type_ = "string" ...)` entries look like duplicates to clippy.
#![allow(clippy::duplicated_attributes)]

use std::time::Duration;

use crate::operator::config_error::ConfigError;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
    ValidationRule,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// The formats are CEL rules with a message, not schema patterns: a pattern's
// refusal prints the regular expression itself. Durations are Go-style
// without fractions, one or more `<integer><unit>` with unit ms, s, m or h
// (`^([0-9]+(ms|s|m|h))+$`); range rules only run on well-formed ones, so a
// malformed value gets the format message alone. Names stored in Valkey
// carry no control characters (C0, DEL, C1), as the store requires.

/// A lease with a fencing token on a named target, held for one holder or elected
/// among candidate pods. The operator acquires it in Valkey, keeps it renewed and
/// publishes the fencing token in `status`; deleting the resource releases it.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "targetlease.dev",
    version = "v1alpha1",
    kind = "TargetLease",
    namespaced,
    shortname = "tl",
    status = "TargetLeaseStatus",
    doc = "A lease with a monotonic fencing token on a named target, stored in Valkey.",
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.target"),
    printcolumn(name = "Holder", type_ = "string", json_path = ".status.holder"),
    printcolumn(name = "Token", type_ = "integer", json_path = ".status.fencingToken"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("has(self.holder) != has(self.candidates)").message("exactly one of spec.holder or spec.candidates must be set"))]
#[x_kube(validation = Rule::new("!has(self.renewInterval) || !self.renewInterval.matches('^([0-9]+(ms|s|m|h))+$') || !self.leaseDuration.matches('^([0-9]+(ms|s|m|h))+$') || duration(self.renewInterval) + duration(self.renewInterval) <= duration(self.leaseDuration)").message("spec.renewInterval must be at most half of spec.leaseDuration"))]
#[x_kube(validation = Rule::new("!has(self.maxLifetime) || !self.maxLifetime.matches('^([0-9]+(ms|s|m|h))+$') || !self.leaseDuration.matches('^([0-9]+(ms|s|m|h))+$') || duration(self.maxLifetime) >= duration(self.leaseDuration)").message("spec.maxLifetime must be at least spec.leaseDuration"))]
#[serde(rename_all = "camelCase")]
pub struct TargetLeaseSpec {
    /// Name of the thing only one holder may act on (a database, a shard, a job).
    /// Leases on the same target in the same namespace exclude each other; at most
    /// one of them is Held at a time, the others wait in creation order.
    /// 1 to 256 bytes (UTF-8), no control characters (line breaks, tabs, …).
    /// Immutable: create a new TargetLease to lease another target.
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.target is immutable"))]
    #[x_kube(validation = Rule::new("size(bytes(self)) <= 256").message("spec.target must be at most 256 bytes (UTF-8)"))]
    #[x_kube(validation = Rule::new(r"!self.matches('[\\x00-\\x1f\\x7f-\\x9f]')").message("spec.target must not contain control characters (line breaks, tabs, …)"))]
    pub target: String,

    /// A single named holder. Set exactly one of `holder` or `candidates`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<HolderSpec>,

    /// Leader election: the operator elects one Ready pod matching the selector and
    /// moves the lease (with a larger token) when that pod goes away or stops being
    /// Ready. Set exactly one of `holder` or `candidates`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<CandidatesSpec>,

    /// How long the lease lives in Valkey without a renewal, e.g. `90s`. If the
    /// operator cannot renew for this long, the lease ends and a new holder gets a
    /// larger token. A duration of whole numbers with units ms, s, m or h
    /// (`90s`, `1m30s`, `500ms`), from 1s to 24h. Default `90s`.
    #[serde(default = "default_lease_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h))+$')").message("spec.leaseDuration must be a duration such as 90s, 1m30s or 500ms (whole numbers; units ms, s, m, h)"))]
    #[x_kube(validation = Rule::new("!self.matches('^([0-9]+(ms|s|m|h))+$') || (duration(self) >= duration('1s') && duration(self) <= duration('24h'))").message("spec.leaseDuration must be between 1s and 24h"))]
    pub lease_duration: String,

    /// How often the operator renews the lease, e.g. `30s`: at least 100ms and
    /// at most half of `leaseDuration` (so one renewal can fail and the next
    /// still comes in time). The same duration format as `leaseDuration`.
    /// Default: a third of `leaseDuration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h))+$')").message("spec.renewInterval must be a duration such as 30s, 1m or 500ms (whole numbers; units ms, s, m, h)"))]
    #[x_kube(validation = Rule::new("!self.matches('^([0-9]+(ms|s|m|h))+$') || duration(self) >= duration('100ms')").message("spec.renewInterval must be at least 100ms"))]
    pub renew_interval: Option<String>,

    /// Hard limit on one lease's life from acquisition, e.g. `1h`; renewals never
    /// extend past it. When it is reached the lease ends and (if the holder or a
    /// candidate still qualifies) a new one with a larger token is acquired. At
    /// least `leaseDuration` and at most 8760h (a year), in the same duration
    /// format. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h))+$')").message("spec.maxLifetime must be a duration such as 2h, 90m or 1h30m (whole numbers; units ms, s, m, h)"))]
    #[x_kube(validation = Rule::new("!self.matches('^([0-9]+(ms|s|m|h))+$') || duration(self) <= duration('8760h')").message("spec.maxLifetime must be at most 8760h"))]
    pub max_lifetime: Option<String>,
}

fn default_lease_duration() -> String {
    "90s".into()
}

/// A single named holder of the lease.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HolderSpec {
    /// Who holds the lease, as recorded in Valkey and shown in `status.holder`
    /// (for example a job name). 1 to 256 bytes (UTF-8), no control characters.
    /// Not a secret.
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new("size(bytes(self)) <= 256").message("spec.holder.identity must be at most 256 bytes (UTF-8)"))]
    #[x_kube(validation = Rule::new(r"!self.matches('[\\x00-\\x1f\\x7f-\\x9f]')").message("spec.holder.identity must not contain control characters (line breaks, tabs, …)"))]
    pub identity: String,

    /// Optional pod in this namespace the lease is tied to: while it is missing or
    /// not Ready the lease is not held, and when it is deleted the lease is released.
    /// The pod must opt in: it carries the label
    /// `<name>.targetlease.dev/candidate: "true"`, where `<name>` is this
    /// TargetLease's name (set it in the pod's template). A pod without it is
    /// never marked and never holds the lease: the lease stays Pending with
    /// the reason PodNotOptedIn (and a Warning Event), so whoever may create
    /// TargetLeases cannot put labels on pods they may not edit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pod_name: Option<String>,
}

/// Candidate pods for leader election.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CandidatesSpec {
    /// Pods in this namespace that may lead. Only Ready pods that opted in are
    /// elected: a pod opts in with the label `<name>.targetlease.dev/candidate: "true"`,
    /// where `<name>` is this TargetLease's name (set it in the pods' template;
    /// the selector may require that label itself). Matching pods without it are
    /// never marked; when no Ready matching pod has it the lease stays Pending
    /// with the reason PodNotOptedIn. Must not be empty (`{}` would make every pod
    /// of the namespace a candidate): select exactly one application's pods, e.g.
    /// `matchLabels: {app: web}`. The elected pod gets the label
    /// `<name>.targetlease.dev/leader: "true"`, so a Service can route to this
    /// election's leader only.
    /// At most 32 `matchLabels` (keys up to 317 characters, values up to 63) and
    /// 16 `matchExpressions` of up to 32 values each.
    #[x_kube(validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)").message("spec.candidates.podSelector must not be empty"))]
    pub pod_selector: LabelSelector,
}

/// Where a lease stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Waiting: the target is held by someone else, or no candidate is Ready yet.
    Pending,
    /// The lease is held; `fencingToken` is the current token.
    Held,
    /// The lease was given back (the resource is being deleted).
    Released,
    /// The lease ended without being released (expired, revoked, pod gone); a new
    /// acquisition will carry a larger token.
    Lost,
    /// The spec or the backend is in a state the operator cannot act on; see conditions.
    Error,
    /// The lease may still exist, but the store could not confirm it since its
    /// published expiry: do not act on it. Becomes Held again (same token) when
    /// a renewal succeeds, or Lost.
    Unknown,
}

impl Phase {
    /// The name as written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Held => "Held",
            Phase::Released => "Released",
            Phase::Lost => "Lost",
            Phase::Error => "Error",
            Phase::Unknown => "Unknown",
        }
    }
}

/// What the operator observed and published. Written only by the operator.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetLeaseStatus {
    /// Pending, Held, Released, Lost, Error or Unknown. Only `Held` means the
    /// lease is held, and only until `expiresAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Identity of the current holder (the elected pod's name in leader election).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,

    /// The pod the lease is tied to (the elected pod, or `spec.holder.podName`).
    /// That pod, and only while `phase` is Held, carries the lease's marks: the
    /// label `<name>.targetlease.dev/leader: "true"` and the annotations
    /// `<name>.targetlease.dev/fencing-token` and `<name>.targetlease.dev/expires-at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_pod: Option<String>,

    /// UID of `holderPod`: a pod recreated under the same name is a new holder
    /// and gets a new lease with a larger token.
    #[serde(
        default,
        rename = "holderPodUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub holder_pod_uid: Option<String>,

    /// The fencing token of the current (or, when not Held, the last) lease. It is
    /// strictly greater than every token published before for this target in this
    /// namespace; pass it with every write downstream and refuse writes carrying a
    /// smaller token than one already seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "token_schema")]
    pub fencing_token: Option<u64>,

    /// When Valkey granted the current lease (Valkey server time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<Time>,

    /// A lower bound on the lease's expiry in Valkey (Valkey server time): Valkey
    /// will not end the lease before this instant, and may keep it longer because
    /// renewals are not all published. Refreshed before it passes while the lease is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Opaque id of the current acquisition attempt; lets the operator retry an
    /// acquire after a crash without ever getting a second token. Not a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquisition_id: Option<String>,

    /// Acquisition id of a lease being given back: no longer held, but possibly
    /// still in Valkey until the store confirms the release (`holder` and
    /// `fencingToken` name it until then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub releasing_acquisition_id: Option<String>,

    /// Latest observations, one per type: `Held`, `BackendAvailable`, `SpecValid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

fn token_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "integer", "format": "int64", "minimum": 1, "nullable": true })
}

fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema
}

/// Longest TargetLease name: the name becomes the prefix of the pod mark keys
/// (`<name>.targetlease.dev/leader`), and a label key prefix is at most 253 characters.
pub const MAX_NAME_CHARS: usize = 253 - ".targetlease.dev".len();

/// Most `matchLabels` entries of a candidate selector.
pub const MAX_SELECTOR_LABELS: u64 = 32;
/// Most `matchExpressions` of a candidate selector.
pub const MAX_SELECTOR_EXPRESSIONS: u64 = 16;
/// Most values of one selector expression.
pub const MAX_SELECTOR_VALUES: u64 = 32;
/// A label key: a DNS-subdomain prefix (253), a slash and a name (63).
const MAX_LABEL_KEY: u64 = 317;
/// A label value.
const MAX_LABEL_VALUE: u64 = 63;

/// Size limits on `spec.candidates.podSelector`. The operator keeps every
/// TargetLease in memory and matches every pod event against every selector:
/// without limits, one tenant's megabyte selectors would exhaust the memory
/// every tenant's leases depend on. The limits are far above any real
/// selector (a Deployment's has one to three labels) and bound one object to
/// about 40 KB.
fn limit_selector(selector: &mut JSONSchemaProps) {
    let Some(props) = selector.properties.as_mut() else {
        return;
    };
    if let Some(labels) = props.get_mut("matchLabels") {
        labels.max_properties = Some(MAX_SELECTOR_LABELS as i64);
        if let Some(JSONSchemaPropsOrBool::Schema(value)) = labels.additional_properties.as_mut() {
            value.max_length = Some(MAX_LABEL_VALUE as i64);
        }
        labels
            .x_kubernetes_validations
            .get_or_insert_with(Vec::new)
            .push(ValidationRule {
                rule: format!("self.all(k, size(k) <= {MAX_LABEL_KEY})"),
                message: Some(format!(
                    "spec.candidates.podSelector.matchLabels keys must be at most {MAX_LABEL_KEY} characters"
                )),
                ..ValidationRule::default()
            });
    }
    if let Some(expressions) = props.get_mut("matchExpressions") {
        expressions.max_items = Some(MAX_SELECTOR_EXPRESSIONS as i64);
        if let Some(JSONSchemaPropsOrArray::Schema(item)) = expressions.items.as_mut()
            && let Some(fields) = item.properties.as_mut()
        {
            if let Some(key) = fields.get_mut("key") {
                key.max_length = Some(MAX_LABEL_KEY as i64);
            }
            if let Some(operator) = fields.get_mut("operator") {
                operator.enum_ = Some(
                    ["In", "NotIn", "Exists", "DoesNotExist"]
                        .iter()
                        .map(|o| JSON(serde_json::json!(o)))
                        .collect(),
                );
            }
            if let Some(values) = fields.get_mut("values") {
                values.max_items = Some(MAX_SELECTOR_VALUES as i64);
                if let Some(JSONSchemaPropsOrArray::Schema(value)) = values.items.as_mut() {
                    value.max_length = Some(MAX_LABEL_VALUE as i64);
                }
            }
        }
    }
}

/// The CustomResourceDefinition as installed: the derived one plus the rules
/// that need the object's metadata (only reachable from the schema's root)
/// and the size limits of the candidate selector.
pub fn definition() -> CustomResourceDefinition {
    let mut crd = <TargetLease as kube::CustomResourceExt>::crd();
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            if let Some(selector) = schema
                .properties
                .as_mut()
                .and_then(|p| p.get_mut("spec"))
                .and_then(|spec| spec.properties.as_mut())
                .and_then(|p| p.get_mut("candidates"))
                .and_then(|c| c.properties.as_mut())
                .and_then(|p| p.get_mut("podSelector"))
            {
                limit_selector(selector);
            }
            schema
                .x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(ValidationRule {
                    rule: format!("size(self.metadata.name) <= {MAX_NAME_CHARS}"),
                    message: Some(format!(
                        "metadata.name must be at most {MAX_NAME_CHARS} characters: it prefixes the pod label <name>.targetlease.dev/leader"
                    )),
                    ..ValidationRule::default()
                });
        }
    }
    crd
}

impl TargetLeaseSpec {
    /// The lease duration as a `Duration`.
    pub fn lease_duration(&self) -> Result<Duration, ConfigError> {
        parse_duration(&self.lease_duration).map_err(|e| e.in_setting("spec.leaseDuration"))
    }

    /// The renew interval, defaulting to a third of the lease duration.
    pub fn renew_interval(&self) -> Result<Duration, ConfigError> {
        match &self.renew_interval {
            Some(s) => parse_duration(s).map_err(|e| e.in_setting("spec.renewInterval")),
            None => Ok(self.lease_duration()? / 3),
        }
    }

    /// The maximum lifetime, when set.
    pub fn max_lifetime(&self) -> Result<Option<Duration>, ConfigError> {
        self.max_lifetime
            .as_deref()
            .map(|s| parse_duration(s).map_err(|e| e.in_setting("spec.maxLifetime")))
            .transpose()
    }
}

/// Parses the Go-style durations the schema admits (`90s`, `1m30s`, `500ms`).
pub fn parse_duration(s: &str) -> Result<Duration, ConfigError> {
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(ConfigError::new("empty duration"));
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(ConfigError::new(format!(
                "{s:?} is not a duration like 90s or 1m30s"
            )));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| ConfigError::new(format!("{s:?} is too large")))?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else {
            return Err(ConfigError::new(format!(
                "{s:?} is not a duration like 90s or 1m30s"
            )));
        };
        rest = &rest[len..];
        let part = u32::try_from(n)
            .ok()
            .and_then(|n| unit.checked_mul(n))
            .ok_or_else(|| ConfigError::new(format!("{s:?} is too large")))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| ConfigError::new(format!("{s:?} is too large")))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_durations_the_schema_admits() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("99999999999h").is_err());
    }

    #[test]
    fn renew_interval_defaults_to_a_third() {
        let spec = TargetLeaseSpec {
            target: "t".into(),
            holder: None,
            candidates: None,
            lease_duration: "90s".into(),
            renew_interval: None,
            max_lifetime: None,
        };
        assert_eq!(spec.renew_interval(), Ok(Duration::from_secs(30)));
    }
}
