//! What tests do in Valkey beside the operator under test: an outside holder
//! taking a target, or the acquire the operator itself would have sent.

use std::time::Duration;

use super::operator_env::OperatorEnv;

impl OperatorEnv {
    /// An outside holder (not the operator) takes `target` for `ttl`; it must
    /// be granted.
    pub async fn hold_outside(
        &self,
        store: &(impl targetlease::store::LeaseStore + ?Sized),
        target: &targetlease::store::Target,
        owner: &str,
        ttl: Duration,
    ) -> targetlease::store::Reply {
        use targetlease::store::{AcquireRequest, Outcome};
        let reply = store
            .acquire(&AcquireRequest::new(target.clone(), owner, ttl))
            .await
            .expect("the outside acquire gets an answer");
        assert_eq!(reply.outcome, Outcome::Acquired, "{reply:?}");
        reply
    }

    /// The acquire the operator sends for TargetLease `name` in attempt
    /// `acquisition`: its lease id derived from the attempt, its metadata
    /// naming both. What a crash between the acquire and its status write
    /// leaves in Valkey.
    pub fn operator_acquire(
        &self,
        name: &str,
        target: &str,
        acquisition: &str,
        ttl: Duration,
    ) -> targetlease::store::AcquireRequest {
        let target = targetlease::store::Target::new(&self.ns, target);
        let mut req = targetlease::store::AcquireRequest::new(target, name, ttl);
        req.lease_id = Some(self.lease_id_key().derive(acquisition));
        let mut meta = serde_json::Map::new();
        meta.insert("targetlease".into(), format!("{}/{name}", self.ns).into());
        meta.insert("acquisition".into(), acquisition.into());
        req.metadata = Some(meta);
        req
    }
}
