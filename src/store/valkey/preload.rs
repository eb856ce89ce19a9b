//! Loading the lease scripts at connect, so a broken script fails there and
//! not at the first lease.
//!
//! A user that may not load scripts (a tenant's user, which is granted
//! `EVALSHA` but neither `EVAL` nor `SCRIPT LOAD`, so that it cannot run Lua
//! of its own) works when a user that may has loaded them: the operator does
//! when it starts, and so does `targetlease check` run with its user. For
//! such a user the connect checks with `SCRIPT EXISTS` that every script is
//! there, and says who must load them when one is not.

use tokio::time::Instant;

use super::ValkeyStore;
use super::errors::{Effect, unanswered};
use super::scripts::{SCRIPTS, Script, lacks_field_expiry};
use super::wire::dial::first_words;
use super::wire::pool::Checkout;
use super::wire::resp::{Cmd, Value};
use crate::store::StoreError;

/// What [`ValkeyStore::load_scripts`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptsReady {
    /// This user loaded every script on every primary that answered.
    Loaded,
    /// This user may not load scripts; on some primary it found every
    /// script already loaded (by a user that may), and used them as they are.
    FoundLoaded,
}

impl ValkeyStore {
    /// [`Self::load_scripts`]; unless `strict`, a primary that gives no answer
    /// (no connection, no reply in time) is skipped with a warning, as long
    /// as one primary answered. A refusal or a wrong hash always fails, but
    /// for a user that may not load scripts and finds them all loaded.
    pub(super) async fn preload_scripts(&self, strict: bool) -> Result<ScriptsReady, StoreError> {
        let all = SCRIPTS.all();
        // The server's version first: the scripts need hash-field expiry.
        let cmds: Vec<Cmd> = std::iter::once(Cmd::new("INFO").arg("server"))
            .chain(
                all.iter()
                    .map(|s| Cmd::new("SCRIPT").arg("LOAD").arg(&s.source)),
            )
            .collect();
        let deadline = Instant::now() + self.timeout;
        let per_node = self
            .client
            .send_to_primaries(&cmds, deadline)
            .await
            .map_err(|e| unanswered(e, Effect::Read, self.timeout))?;
        let mut unreachable = Vec::new();
        let mut ready = ScriptsReady::Loaded;
        let nodes = per_node.len();
        for (node, result) in per_node {
            let sent = match result {
                Ok(sent) => sent,
                Err(e) => {
                    let e = unanswered(e, Effect::Read, self.timeout);
                    unreachable.push(format!("cannot load the scripts on {node}: {e}"));
                    continue;
                }
            };
            if let Some(Value::Bulk(info)) = sent.replies.first()
                && let Some(why) = lacks_field_expiry(&String::from_utf8_lossy(info))
            {
                return Err(StoreError::BackendUnavailable(format!("{node} {why}")));
            }
            let mut may_not_load = None;
            for (script, reply) in all.iter().zip(sent.replies.iter().skip(1)) {
                match reply {
                    Value::Error(e) if e.starts_with("NOPERM") => {
                        may_not_load.get_or_insert_with(|| first_words(e));
                    }
                    Value::Error(e) => {
                        return Err(StoreError::BackendUnavailable(format!(
                            "cannot load script {} on {node}: {}",
                            script.name,
                            first_words(e)
                        )));
                    }
                    v if v.text().as_deref() == Some(script.sha.as_str()) => {}
                    v => {
                        return Err(StoreError::BackendUnavailable(format!(
                            "script {} loaded on {node} with hash {}, expected {}",
                            script.name,
                            v.text().unwrap_or_default(),
                            script.sha
                        )));
                    }
                }
            }
            if let Some(refusal) = may_not_load {
                match self
                    .loaded(&all, &node, &refusal, &sent.link, deadline)
                    .await?
                {
                    Ok(()) => ready = ScriptsReady::FoundLoaded,
                    Err(unanswered) => unreachable.push(unanswered),
                }
            }
        }
        if unreachable.is_empty() {
            return Ok(ready);
        }
        if strict || unreachable.len() == nodes {
            return Err(StoreError::BackendUnavailable(unreachable.join("; ")));
        }
        for why in &unreachable {
            tracing::warn!(
                error = %why,
                "a primary is unreachable; its scripts load on first use"
            );
        }
        Ok(ready)
    }

    /// For a user refused `SCRIPT LOAD` on `node`: `Ok(Ok(()))` when every
    /// script is loaded there all the same, an error saying who must load them
    /// when one is not, `Ok(Err(why))` when the question got no answer.
    async fn loaded(
        &self,
        all: &[&Script],
        node: &str,
        refusal: &str,
        link: &Checkout,
        deadline: Instant,
    ) -> Result<Result<(), String>, StoreError> {
        let exists = Cmd::new("SCRIPT")
            .arg("EXISTS")
            .args(all.iter().map(|s| &s.sha));
        let replies = match link.link().request(&[exists], deadline).await {
            Ok(replies) => replies,
            Err(e) => {
                let e = unanswered(e, Effect::Read, self.timeout);
                return Ok(Err(format!("cannot check the scripts on {node}: {e}")));
            }
        };
        let flags = match replies.into_iter().next() {
            Some(Value::Array(flags)) if flags.len() == all.len() => flags,
            Some(Value::Error(e)) => {
                return Err(StoreError::BackendUnavailable(format!(
                    "this user may neither load the lease scripts on {node} ({refusal}) nor check \
                 that they are loaded ({}): grant it +script|load, or +script|exists and have a \
                 user that may load them do so",
                    first_words(&e)
                )));
            }
            other => {
                return Err(StoreError::BackendUnavailable(format!(
                    "unexpected reply to SCRIPT EXISTS from {node}: {other:?}"
                )));
            }
        };
        let missing: Vec<&str> = all
            .iter()
            .zip(&flags)
            .filter(|(_, flag)| **flag != Value::Int(1))
            .map(|(s, _)| s.name)
            .collect();
        if missing.is_empty() {
            return Ok(Ok(()));
        }
        Err(StoreError::BackendUnavailable(format!(
            "the lease scripts {} are not loaded on {node} and this user may not load them \
         ({refusal}): a user that may must load them first (the operator does when it starts, \
         and so does `targetlease check` run with its user)",
            missing.join(", ")
        )))
    }
}
