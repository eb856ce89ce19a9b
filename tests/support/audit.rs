//! Reads the test control plane's audit log (`scripts/controlplane.sh` writes
//! `DIR/audit.log`: every write to TargetLeases, their status, pods,
//! ConfigMaps, Events and Leases, and every list of pods, with the user who
//! made it). What the API server recorded, independent of what a process
//! under test says it did.

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::kube_env::ControlPlane;

/// One write, as the API server recorded it when it finished.
#[derive(Clone, Debug)]
pub struct Write {
    pub user: String,
    pub verb: String,
    /// `targetleases`, `targetleases/status`, `pods`, `leases`, …
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
    /// When the API server received the request.
    pub received: Timestamp,
    /// The request's path and query, percent-decoded.
    pub uri: String,
}

impl Write {
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

impl std::fmt::Display for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {} {}/{} -> {} by {}",
            self.received,
            self.verb,
            self.resource,
            self.namespace,
            self.name,
            self.code,
            self.user
        )
    }
}

/// Every write recorded so far in `namespace`.
pub fn writes_in(cp: &ControlPlane, namespace: &str) -> Vec<Write> {
    let mut all = recorded_in(cp, namespace);
    all.retain(|w| w.verb != "list");
    all
}

/// Every list of pods recorded so far in `namespace` (a [`Write`] by its
/// shape; `uri` says what was asked).
pub fn pod_lists_in(cp: &ControlPlane, namespace: &str) -> Vec<Write> {
    let mut all = recorded_in(cp, namespace);
    all.retain(|w| w.verb == "list" && w.resource == "pods");
    all
}

fn recorded_in(cp: &ControlPlane, namespace: &str) -> Vec<Write> {
    let path = cp.dir().join("audit.log");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the control plane writes it unless CONTROLPLANE_AUDIT=0)",
            path.display()
        )
    });
    text.lines()
        // The last line may be half written.
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["objectRef"]["namespace"] == namespace)
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            let object = &e["objectRef"];
            let resource = match object["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", s(&object["resource"])),
                None => s(&object["resource"]),
            };
            Write {
                user: s(&e["user"]["username"]),
                verb: s(&e["verb"]),
                resource,
                namespace: s(&object["namespace"]),
                name: s(&object["name"]),
                code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
                received: s(&e["requestReceivedTimestamp"])
                    .parse()
                    .expect("an RFC 3339 requestReceivedTimestamp"),
                uri: percent_decoded(&s(&e["requestURI"])),
            }
        })
        .collect()
}

/// `%XX` escapes (and `+` for a space) decoded.
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
