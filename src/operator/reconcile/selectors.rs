//! Candidate selectors compiled once per TargetLease version (no client required).
//!
//! Every pod event of a namespace asks each election of the namespace
//! whether its selector matches the pod ([`super::pods::concerns`]).
//! Compiling `spec.candidates.podSelector` anew for each of those questions
//! costs a clone of the selector and its parse, per election, per pod
//! event; here it is done once per (UID, `metadata.generation`): the
//! selector is part of the spec, and the API server changes the generation
//! with every spec change (status and metadata writes leave it alone).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::core::Selector;

use crate::operator::crd::TargetLease;

/// One compiled selector and the generation it was compiled from.
struct Compiled {
    generation: i64,
    /// `None`: the selector does not compile (the spec is refused elsewhere).
    selector: Option<Arc<Selector>>,
}

/// Compiled candidate selectors by TargetLease UID.
#[derive(Default)]
pub struct Selectors {
    by_uid: Mutex<HashMap<String, Compiled>>,
}

fn compile(tl: &TargetLease) -> Option<Arc<Selector>> {
    let c = tl.spec.candidates.as_ref()?;
    Selector::try_from(c.pod_selector.clone())
        .ok()
        .map(Arc::new)
}

impl Selectors {
    /// The compiled `spec.candidates.podSelector` of `tl` (`None` without
    /// candidates, or when it does not compile). Compiled at most once per
    /// version; an object without a UID or generation (never from the API
    /// server) is compiled every time.
    pub fn of(&self, tl: &TargetLease) -> Option<Arc<Selector>> {
        tl.spec.candidates.as_ref()?;
        let (Some(uid), Some(generation)) = (tl.uid(), tl.metadata.generation) else {
            return compile(tl);
        };
        let mut all = self.by_uid.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = all.get(&uid)
            && c.generation == generation
        {
            return c.selector.clone();
        }
        let selector = compile(tl);
        all.insert(
            uid,
            Compiled {
                generation,
                selector: selector.clone(),
            },
        );
        selector
    }

    /// Keeps only the selectors of the UIDs `keep` says still exist.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut all = self.by_uid.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|uid, _| keep(uid));
    }

    /// Selectors kept.
    pub fn len(&self) -> usize {
        self.by_uid.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::crd::TargetLeaseSpec;
    use kube::core::SelectorExt;
    use std::collections::BTreeMap;

    fn election(uid: &str, generation: i64, app: &str) -> TargetLease {
        let spec: TargetLeaseSpec = serde_json::from_value(serde_json::json!({
            "target": "t", "candidates": { "podSelector": { "matchLabels": { "app": app } } },
        }))
        .unwrap();
        let mut tl = TargetLease::new("e", spec);
        tl.metadata.namespace = Some("ns".into());
        tl.metadata.uid = Some(uid.into());
        tl.metadata.generation = Some(generation);
        tl
    }

    fn labels(app: &str) -> BTreeMap<String, String> {
        [("app".to_string(), app.to_string())].into()
    }

    #[test]
    fn one_compilation_per_version_and_a_new_one_when_the_spec_changes() {
        let selectors = Selectors::default();
        let v1 = election("u-1", 1, "web");
        let a = selectors.of(&v1).unwrap();
        // A status or metadata write: same generation, same compiled selector.
        let mut v1_status = v1.clone();
        v1_status.metadata.resource_version = Some("43".into());
        let b = selectors.of(&v1_status).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "compiled once for generation 1");
        assert!(b.matches(&labels("web")));

        // A spec edit: a new generation selects other pods at once.
        let v2 = election("u-1", 2, "api");
        let c = selectors.of(&v2).unwrap();
        assert!(!Arc::ptr_eq(&a, &c), "compiled again for generation 2");
        assert!(c.matches(&labels("api")) && !c.matches(&labels("web")));
        assert_eq!(selectors.len(), 1, "one entry per object");

        // Another object (or the same name recreated) has its own.
        let other = election("u-2", 1, "db");
        assert!(selectors.of(&other).unwrap().matches(&labels("db")));
        assert_eq!(selectors.len(), 2);
        selectors.retain(|uid| uid == "u-2");
        assert_eq!(selectors.len(), 1, "a vanished object's selector goes");

        // No candidates: nothing compiled or kept.
        let mut named = v1.clone();
        named.spec.candidates = None;
        named.metadata.uid = Some("u-3".into());
        assert!(selectors.of(&named).is_none());
        assert_eq!(selectors.len(), 1);
    }
}
