//! Defaults and value parsers of the `lease` and `run` flags.

use std::sync::LazyLock;

use crate::store::{MAX_METADATA_BYTES, MAX_TOKEN};

/// The owner named when `--owner` is not given: in a pod, the pod's name
/// (`$POD_NAME`, from the downward API); elsewhere `user@host:pid`, who ran
/// it where (a pid alone means nothing a minute later).
pub fn default_owner() -> String {
    if let Some(pod) = non_empty_var("POD_NAME") {
        return pod;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{}@{host}:{}", user_name(), std::process::id())
}

/// The tenant when `--namespace` is not given, the same rule for every
/// command: in a pod, the pod's namespace (`$POD_NAMESPACE`, else its
/// service account's); elsewhere the kubeconfig's current namespace, as
/// kubectl takes it (`$KUBECONFIG`, else `~/.kube/config`); else `default`.
pub fn default_namespace() -> String {
    // clap asks once per subcommand that has the flag: read the files once.
    static NAMESPACE: LazyLock<String> = LazyLock::new(|| {
        non_empty_var("POD_NAMESPACE")
            .or_else(|| {
                std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                    .ok()
                    .map(|n| n.trim().to_owned())
                    .filter(|n| !n.is_empty())
            })
            .or_else(kubeconfig_namespace)
            .unwrap_or_else(|| "default".into())
    });
    NAMESPACE.clone()
}

/// The namespace of the kubeconfig's current context, if it names one. A
/// kubeconfig that cannot be read names none (commands that talk to
/// Kubernetes report it when they load it).
fn kubeconfig_namespace() -> Option<String> {
    let config = kube::config::Kubeconfig::read().ok()?;
    let current = config.current_context.as_deref()?;
    config
        .contexts
        .iter()
        .find(|c| c.name == current)?
        .context
        .as_ref()?
        .namespace
        .clone()
        .filter(|n| !n.trim().is_empty())
}

/// Where a pod's service account token volume names its namespace.
pub const SERVICE_ACCOUNT_NAMESPACE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

fn non_empty_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The login name of this process's user, or its uid when it has none.
fn user_name() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .or_else(|| non_empty_var("USER"))
        .unwrap_or_else(|| uid.to_string())
}

/// The lease duration when `--ttl` is not given.
pub const DEFAULT_TTL: &str = "30s";

/// How long `run` and `token` wait when `--wait` is not given.
pub const DEFAULT_WAIT: &str = "1m";

/// Parses a fencing token: a whole number from 1 to 2^63-1. Out-of-range
/// and negative values get the range in the message.
pub fn parse_token(text: &str) -> Result<u64, String> {
    let range = format!("token must be between 1 and {MAX_TOKEN}");
    match text.parse::<i128>() {
        Ok(n) if n >= 1 && n <= i128::from(MAX_TOKEN) => Ok(n as u64),
        Ok(_) => Err(range),
        Err(_) => Err(format!("{range} (a whole number)")),
    }
}

/// Parses `--metadata`: a JSON object of at most 4 KiB.
pub fn parse_metadata(
    text: Option<&str>,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, String> {
    let Some(text) = text else { return Ok(None) };
    if text.len() > MAX_METADATA_BYTES {
        return Err(format!(
            "--metadata is {} bytes; at most {MAX_METADATA_BYTES} are allowed",
            text.len()
        ));
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err("--metadata must be a JSON object, e.g. '{\"job\":\"nightly\"}'".into()),
        Err(e) => Err(format!(
            "--metadata is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        )),
    }
}
