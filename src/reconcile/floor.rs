//! The token floor's part in a deletion: cover the last published token
//! before anything is released, and say so on the resource when it cannot.

use kube::ResourceExt;

use super::Error;
use super::pass::Pass;
use super::transition;

impl Pass<'_> {
    /// Covers the last published token with the floor before anything is released.
    pub(super) async fn raise_floor(&mut self) -> Result<(), Error> {
        if crate::failpoints::on("floor-skip-raise") {
            return Ok(());
        }
        let Some(token) = self.published().fencing_token else {
            return Ok(());
        };
        let ns = self.tl.namespace().unwrap_or_default();
        let target = self.tl.spec.target.clone();
        // The cache is a safe shortcut: floors never decrease between versions.
        if self.ctx.floors.get(&ns, &target) >= token {
            return Ok(());
        }
        self.ctx.leadership.check()?;
        match self.ctx.floors.raise(&ns, &target, token).await {
            Ok(None) => Ok(()),
            Ok(Some(fold)) => {
                let t = transition::floors_folded(&self.facts(), &self.working, &ns, &fold);
                self.absorb(t);
                Ok(())
            }
            Err(e) => {
                let e = Error::Kube(e);
                let why = unwritten(&e);
                tracing::warn!(namespace = %ns, token, error = %e, "cannot raise the token floor; the finalizer stays");
                let t = transition::floor_unwritten(&self.facts(), &self.working, &ns, token, &why);
                self.absorb(t);
                // Say so on the resource (best effort: the API may be what fails).
                if let Err(shown) = self.flush().await {
                    tracing::debug!(error = %shown, "cannot show why the floor was not written");
                }
                Err(e)
            }
        }
    }

    /// The floor now covers what this process published for the target.
    pub(super) fn forget_published(&self) {
        let ns = self.tl.namespace().unwrap_or_default();
        let target = self.tl.spec.target.clone();
        let floor = self.ctx.floors.get(&ns, &target);
        let mut published = self.ctx.published.lock().unwrap_or_else(|p| p.into_inner());
        if published
            .get(&(ns.clone(), target.clone()))
            .is_some_and(|t| *t <= floor)
        {
            published.remove(&(ns, target));
        }
    }
}

/// Why a floor write failed, in one sentence that stays the same from one
/// retry to the next (the condition is rewritten only when it changes).
fn unwritten(e: &Error) -> String {
    match e {
        Error::Kube(kube::Error::Api(s)) => {
            format!("the API server answered {} ({})", s.code, s.message)
        }
        e if e.category() == "api_timeout" => "the API server did not answer in time".into(),
        _ => "the API server could not be reached".into(),
    }
}
