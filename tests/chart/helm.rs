//! Running the `helm` binary and reading what it renders.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde::Deserialize;
use serde_json::Value;

/// The oldest Kubernetes the chart supports (Chart.yaml `kubeVersion`).
pub const KUBE_VERSION: &str = "1.33.0";
pub const RBAC_TEMPLATES: [&str; 6] = [
    "--show-only",
    "templates/serviceaccount.yaml",
    "--show-only",
    "templates/rbac.yaml",
    "--show-only",
    "templates/admissionpolicy.yaml",
];

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn chart() -> String {
    repo().join("charts/targetlease").display().to_string()
}

pub fn helm_bin() -> PathBuf {
    crate::support::tools::tool("helm")
}

/// Runs helm with private cache/config/data directories.
pub fn helm(args: &[&str]) -> Output {
    static HOME: OnceLock<tempfile::TempDir> = OnceLock::new();
    let home = HOME.get_or_init(|| tempfile::tempdir().expect("helm home"));
    Command::new(helm_bin())
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("run helm")
}

pub fn helm_ok(args: &[&str]) -> String {
    let out = helm(args);
    assert!(
        out.status.success(),
        "helm {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("helm prints UTF-8")
}

/// The documents `helm template` renders, as JSON values.
pub struct Rendered(pub Vec<Value>);

impl Rendered {
    pub fn parse(text: &str) -> Self {
        let docs = serde_yaml::Deserializer::from_str(text)
            .map(|d| Value::deserialize(d).expect("helm renders valid YAML"))
            .filter(|v| !v.is_null())
            .collect();
        Rendered(docs)
    }

    pub fn kinds(&self) -> BTreeSet<String> {
        self.0
            .iter()
            .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    pub fn find(&self, kind: &str) -> Option<&Value> {
        let mut all = self.0.iter().filter(|d| d["kind"] == kind);
        let first = all.next();
        assert!(all.next().is_none(), "more than one {kind} rendered");
        first
    }

    /// The operator's own ClusterRole (not the aggregated read-only one).
    pub fn operator_cluster_role(&self) -> &Value {
        let mut roles = self.0.iter().filter(|d| {
            d["kind"] == "ClusterRole"
                && d["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"].is_null()
        });
        let role = roles.next().expect("the operator's ClusterRole");
        assert!(roles.next().is_none(), "one operator ClusterRole");
        role
    }

    /// The one `kind` named `name`.
    pub fn named(&self, kind: &str, name: &str) -> &Value {
        let mut all = self
            .0
            .iter()
            .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name);
        let first = all
            .next()
            .unwrap_or_else(|| panic!("no {kind} {name} rendered; got {:?}", self.kinds()));
        assert!(all.next().is_none(), "more than one {kind} {name} rendered");
        first
    }

    /// The admission policy whose name ends with `-{which}`
    /// (`status-writers`, `pod-marks`, `lease-metadata`), if rendered.
    pub fn find_policy(&self, kind: &str, which: &str) -> Option<&Value> {
        let suffix = format!("-{which}");
        let mut all = self.0.iter().filter(|d| {
            d["kind"] == kind
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(&suffix))
        });
        let first = all.next();
        assert!(all.next().is_none(), "more than one {kind} *{suffix}");
        first
    }

    /// The ValidatingAdmissionPolicy `-{which}`.
    pub fn policy(&self, which: &str) -> &Value {
        self.find_policy("ValidatingAdmissionPolicy", which)
            .unwrap_or_else(|| panic!("no policy {which}; got {:?}", self.kinds()))
    }

    /// The ValidatingAdmissionPolicyBinding `-{which}`.
    pub fn policy_binding(&self, which: &str) -> &Value {
        self.find_policy("ValidatingAdmissionPolicyBinding", which)
            .unwrap_or_else(|| panic!("no policy binding {which}; got {:?}", self.kinds()))
    }

    /// The Role in the release namespace (floors, election Lease, lease-id key).
    pub fn release_role(&self) -> &Value {
        let ns = self.get("ServiceAccount")["metadata"]["namespace"].clone();
        let mut roles = self.0.iter().filter(|d| {
            d["kind"] == "Role"
                && d["metadata"]["namespace"] == ns
                && !d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .ends_with("-workloads")
        });
        let role = roles.next().expect("the release namespace's Role");
        assert!(roles.next().is_none(), "one release Role");
        role
    }

    pub fn get(&self, kind: &str) -> &Value {
        self.find(kind)
            .unwrap_or_else(|| panic!("no {kind} rendered; got {:?}", self.kinds()))
    }

    pub fn container(&self) -> &Value {
        let containers = &self.get("Deployment")["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers.as_array().map(Vec::len), Some(1));
        &containers[0]
    }

    pub fn args(&self) -> Vec<String> {
        strings(&self.container()["args"])
    }

    pub fn volume(&self, name: &str) -> &Value {
        self.get("Deployment")["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
    }
}

pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

pub fn template(release: &str, namespace: &str, extra: &[&str]) -> Rendered {
    let mut args = vec![
        "template",
        release,
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
    ];
    let chart = chart();
    args.push(&chart);
    args.extend_from_slice(extra);
    Rendered::parse(&helm_ok(&args))
}

/// `helm template` with `extra` must fail, saying `expect` on stderr.
pub fn refused(extra: &[&str], expect: &str) {
    let chart = chart();
    let mut args = vec!["template", "t", &chart, "--kube-version", KUBE_VERSION];
    args.extend_from_slice(extra);
    let out = helm(&args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{extra:?} was accepted");
    assert!(err.contains(expect), "{extra:?}: {err}");
}

/// `helm template` with `extra` renders.
pub fn accepted(extra: &[&str]) -> Rendered {
    template("t", "default", extra)
}
