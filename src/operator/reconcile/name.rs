//! A namespace and a name as the operator's per-TargetLease maps key them
//! (no client required).
//!
//! A map of 10,000 entries has 16,384 slots, each as large as a key and its
//! value. An [`ObjectRef`] is 96 bytes and two strings (four with the
//! version and UID `ObjectRef::from_obj` carries); a `(String, String)` is
//! 48 bytes and two strings. An [`NsName`] is 16 bytes and one shared
//! string, so the maps' room for 10,000 TargetLeases costs about 1 MB less
//! per map. The strings are shared too: every map that keeps a name of one
//! TargetLease (or of one target) holds the same string, found in a set of
//! the names in use ([`NsName::shared`]) and dropped from it once no map
//! holds it ([`NsName::forget_unused`], at the leader's minute sweep). A
//! name made only to look something up ([`NsName::new`]) is never added to
//! that set: what others send (a release notice names any target it likes)
//! cannot grow it.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};

use kube::runtime::reflector::ObjectRef;

use crate::operator::crd::TargetLease;

/// A namespace and a name in one shared string, `namespace/name`. Kubernetes
/// namespaces never hold a `/`, so the first one separates the two, whatever
/// the name holds (a target may hold any).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NsName(Arc<str>);

/// The names in use: one string per name, however many maps hold it.
static IN_USE: LazyLock<Mutex<HashSet<NsName>>> = LazyLock::new(Mutex::default);

fn in_use() -> std::sync::MutexGuard<'static, HashSet<NsName>> {
    IN_USE.lock().unwrap_or_else(|p| p.into_inner())
}

fn joined(namespace: &str, name: &str) -> String {
    debug_assert!(!namespace.contains('/'), "a namespace never holds a '/'");
    let mut s = String::with_capacity(namespace.len() + 1 + name.len());
    s.push_str(namespace);
    s.push('/');
    s.push_str(name);
    s
}

impl NsName {
    /// `name` in `namespace`, to look it up: a string of its own, not
    /// added to the names in use.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self(joined(namespace, name).into())
    }

    /// `name` in `namespace`, to keep in a map: the string already in use
    /// for it, or a new one added to the names in use.
    pub fn shared(namespace: &str, name: &str) -> Self {
        let s = joined(namespace, name);
        let mut names = in_use();
        if let Some(shared) = names.get(s.as_str()) {
            return shared.clone();
        }
        let fresh = Self(s.into());
        names.insert(fresh.clone());
        fresh
    }

    /// Drops the names no map holds any more from the names in use (the
    /// set's own copy is the only one left); how many were dropped. A name
    /// can only be copied from a holder or found in the set under its lock,
    /// so none is dropped while something can still get it.
    pub fn forget_unused() -> usize {
        let mut names = in_use();
        let before = names.len();
        names.retain(|n| Arc::strong_count(&n.0) > 1);
        if names.capacity() > 64 && names.len() * 4 < names.capacity() {
            names.shrink_to_fit();
        }
        before - names.len()
    }

    /// The TargetLease `r` names, to look it up ([`Self::new`]).
    pub fn of(r: &ObjectRef<TargetLease>) -> Self {
        Self::new(r.namespace.as_deref().unwrap_or_default(), &r.name)
    }

    /// The TargetLease `r` names, to keep in a map ([`Self::shared`]).
    pub fn shared_of(r: &ObjectRef<TargetLease>) -> Self {
        Self::shared(r.namespace.as_deref().unwrap_or_default(), &r.name)
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        self.0.split_once('/').map_or("", |(ns, _)| ns)
    }

    /// The name.
    pub fn name(&self) -> &str {
        self.0.split_once('/').map_or(&self.0, |(_, name)| name)
    }

    /// The TargetLease it names, as the controller's queue takes it.
    pub fn to_ref(&self) -> ObjectRef<TargetLease> {
        ObjectRef::new(self.name()).within(self.namespace())
    }
}

impl Borrow<str> for NsName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_slash_separates_namespace_and_name_whatever_the_name_holds() {
        let n = NsName::new("team-a", "db/orders/primary");
        assert_eq!((n.namespace(), n.name()), ("team-a", "db/orders/primary"));
        assert_eq!(n.to_string(), "team-a/db/orders/primary");
        assert_ne!(NsName::new("team-a", "x"), NsName::new("team-a", "y"));
        assert_ne!(NsName::new("a", "b"), NsName::new("ab", ""));
    }

    #[test]
    fn it_names_the_same_target_lease_as_the_object_ref_it_came_from() {
        let r = ObjectRef::<TargetLease>::new("lease-1").within("team-a");
        let n = NsName::of(&r);
        assert_eq!((n.namespace(), n.name()), ("team-a", "lease-1"));
        assert_eq!(n.to_ref(), r);
        assert_eq!(std::mem::size_of::<NsName>(), 16);
    }

    #[test]
    fn every_holder_of_a_name_shares_one_string_until_none_holds_it() {
        let (ns, name) = ("name-tests", "shared-until-unused");
        let a = NsName::shared(ns, name);
        let b = NsName::shared(ns, name);
        assert!(Arc::ptr_eq(&a.0, &b.0), "one string for both");
        drop(a);
        NsName::forget_unused();
        let c = NsName::shared(ns, name);
        assert!(Arc::ptr_eq(&b.0, &c.0), "still held by b: kept");
        drop((b, c));
        NsName::forget_unused();
        assert!(
            in_use().get(&*format!("{ns}/{name}")).is_none(),
            "dropped once nothing holds it"
        );
    }

    #[test]
    fn a_name_made_to_look_up_is_not_added_to_the_names_in_use() {
        let (ns, name) = ("name-tests", "looked-up-only");
        let looked_up = NsName::new(ns, name);
        assert!(in_use().get(looked_up.to_string().as_str()).is_none());
        let kept = NsName::shared(ns, name);
        assert!(!Arc::ptr_eq(&looked_up.0, &kept.0));
        assert_eq!(looked_up, kept, "the same name all the same");
        let mut map = std::collections::HashMap::new();
        map.insert(kept, 1);
        assert_eq!(map.get(&looked_up), Some(&1));
    }
}
