//! Defaults and value parsers of the `lease` and `run` flags.

use crate::store::{MAX_METADATA_BYTES, MAX_TOKEN};

/// The owner named when `--owner` is not given: this host's name and this
/// process's id (`host:pid`; in a pod the host name is the pod name).
pub fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", std::process::id())
}

/// The lease duration when `--ttl` is not given.
pub const DEFAULT_TTL: &str = "30s";

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
