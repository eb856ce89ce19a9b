//! Reads the test control plane's audit log (`scripts/controlplane.sh` writes
//! `DIR/audit.log`: every write to TargetLeases, their status, pods,
//! ConfigMaps, Events and Leases, with the user who made it). What the API
//! server recorded, independent of what a process under test says it did.

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
            }
        })
        .collect()
}
