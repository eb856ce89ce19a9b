//! Loading the lease function library at connect, so a broken library fails
//! there and not at the first lease.
//!
//! A user that may not load functions (a tenant's user, which is granted
//! `FCALL` but not `FUNCTION LOAD`, so that it cannot run Lua of its own)
//! works when a user that may has loaded the library: the operator does when
//! it starts, and so does `targetlease check` run with its user. For such a
//! user the connect checks with `FUNCTION LIST` that the library is there,
//! and says who must load it when it is not.

use tokio::time::Instant;

use super::ValkeyStore;
use super::errors::{Effect, unanswered};
use super::scripts::{SCRIPTS, already_loaded, lacks_field_expiry};
use super::wire::dial::first_words;
use super::wire::pool::Checkout;
use super::wire::resp::{Cmd, Value};
use crate::store::StoreError;

/// What [`ValkeyStore::load_scripts`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptsReady {
    /// The library is loaded on every primary that answered, by this user
    /// (or by another one just before: a library's name is its code's hash).
    Loaded,
    /// This user may not load functions; on some primary it found the
    /// library already loaded (by a user that may), and used it as it is.
    FoundLoaded,
}

impl ScriptsReady {
    /// What `targetlease check` says of it.
    pub fn describe(self) -> String {
        let library = &SCRIPTS.library.name;
        match self {
            Self::Loaded => format!("the lease functions load (library {library})"),
            Self::FoundLoaded => format!(
                "the lease functions found loaded (library {library}; this user may not load \
                 functions, or the server is a replica: a user that may, such as the \
                 operator's, loaded them)"
            ),
        }
    }
}

impl ValkeyStore {
    /// [`Self::load_scripts`]; unless `strict`, a primary that gives no answer
    /// (no connection, no reply in time) is skipped with a warning, as long
    /// as one primary answered. A refusal always fails, but for a user that
    /// may not load functions and finds the library loaded.
    pub(super) async fn preload_scripts(&self, strict: bool) -> Result<ScriptsReady, StoreError> {
        let library = &SCRIPTS.library;
        let load = || Cmd::new("FUNCTION").arg("LOAD").arg(&library.source);
        // The server's version first: the scripts need hash-field expiry.
        // At connect, look before loading: FUNCTION LOAD is a write, which
        // a write pause (CLIENT PAUSE WRITE, a FAILOVER in progress) holds
        // back, and the library is almost always there. `check` loads, to
        // prove this user may.
        let cmds = [
            Cmd::new("INFO").arg("server"),
            if strict { load() } else { list() },
        ];
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
                    unreachable.push(format!("cannot load the lease functions on {node}: {e}"));
                    continue;
                }
            };
            if let Some(Value::Bulk(info)) = sent.replies.first()
                && let Some(why) = lacks_field_expiry(&String::from_utf8_lossy(info))
            {
                return Err(StoreError::BackendUnavailable(format!("{node} {why}")));
            }
            let mut reply = sent.replies.get(1).cloned();
            if !strict {
                match reply.as_ref().map(listed) {
                    Some(Ok(Some(true))) => continue,
                    Some(Ok(Some(false))) => return Err(replaced(&node)),
                    Some(Ok(None)) => {}
                    Some(Err(why)) => {
                        return Err(StoreError::BackendUnavailable(format!(
                            "cannot check the lease functions on {node}: {why}"
                        )));
                    }
                    None => {
                        return Err(StoreError::BackendUnavailable(format!(
                            "no reply to FUNCTION LIST from {node}"
                        )));
                    }
                }
                reply = match sent.link.link().request(&[load()], deadline).await {
                    Ok(replies) => replies.into_iter().next(),
                    Err(e) => {
                        let e = unanswered(e, Effect::Read, self.timeout);
                        unreachable.push(format!("cannot load the lease functions on {node}: {e}"));
                        continue;
                    }
                };
            }
            match reply.as_ref() {
                // Loaded before (by another client since this one looked, or
                // for `check`, long ago): its name is this code's hash, but
                // whoever may load functions may replace one, so the code is
                // compared.
                Some(Value::Error(e)) if already_loaded(e) => {
                    if let Err(unanswered) = self
                        .loaded(&node, &first_words(e), &sent.link, deadline)
                        .await?
                    {
                        unreachable.push(unanswered);
                    }
                }
                // A user that may not load (a tenant's), or a replica: the
                // library may be there all the same (loaded by another user,
                // replicated from the primary).
                Some(Value::Error(e)) if e.starts_with("NOPERM") || e.starts_with("READONLY") => {
                    match self
                        .loaded(&node, &first_words(e), &sent.link, deadline)
                        .await?
                    {
                        Ok(()) => ready = ScriptsReady::FoundLoaded,
                        Err(unanswered) => unreachable.push(unanswered),
                    }
                }
                Some(Value::Error(e)) => {
                    return Err(StoreError::BackendUnavailable(format!(
                        "cannot load the lease functions on {node}: {}",
                        first_words(e)
                    )));
                }
                Some(v) if v.text().as_deref() == Some(library.name.as_str()) => {}
                v => {
                    return Err(StoreError::BackendUnavailable(format!(
                        "unexpected reply to FUNCTION LOAD from {node}: {:?}",
                        v.and_then(Value::text).unwrap_or_default()
                    )));
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
                "a primary is unreachable; the lease functions load there on first use"
            );
        }
        Ok(ready)
    }

    /// For a `FUNCTION LOAD` refused on `node` (`NOPERM`: a user that may not
    /// load; `READONLY`: a replica): `Ok(Ok(()))` when the
    /// library is loaded there all the same, an error saying who must load it
    /// when it is not, `Ok(Err(why))` when the question got no answer.
    async fn loaded(
        &self,
        node: &str,
        refusal: &str,
        link: &Checkout,
        deadline: Instant,
    ) -> Result<Result<(), String>, StoreError> {
        let name = &SCRIPTS.library.name;
        let replies = match link.link().request(&[list()], deadline).await {
            Ok(replies) => replies,
            Err(e) => {
                let e = unanswered(e, Effect::Read, self.timeout);
                return Ok(Err(format!(
                    "cannot check the lease functions on {node}: {e}"
                )));
            }
        };
        let found = match replies.first().map(listed) {
            Some(Ok(Some(true))) => true,
            Some(Ok(Some(false))) => return Err(replaced(node)),
            Some(Ok(None)) => false,
            Some(Err(why)) if refusal.starts_with("NOPERM") => {
                return Err(StoreError::BackendUnavailable(format!(
                    "this user may neither load the lease functions on {node} ({refusal}) nor \
                     check that they are loaded ({why}): grant it +function|load, or \
                     +function|list and have a user that may load them do so"
                )));
            }
            Some(Err(why)) => {
                return Err(StoreError::BackendUnavailable(format!(
                    "cannot check the lease functions on {node} ({refusal}), and this user may \
                     not list them ({why}): grant it +function|list"
                )));
            }
            None => {
                return Err(StoreError::BackendUnavailable(format!(
                    "no reply to FUNCTION LIST from {node}"
                )));
            }
        };
        if found {
            return Ok(Ok(()));
        }
        let who = if refusal.starts_with("NOPERM") {
            "this user may not load them"
        } else {
            "they cannot be loaded there"
        };
        Err(StoreError::BackendUnavailable(format!(
            "the lease functions (library {name}) are not loaded on {node} and {who} \
             ({refusal}): a user that may must load them first, on the primary (the operator \
             does when it starts if its user may, and so does `targetlease check` run as such a \
             user)"
        )))
    }
}

/// `FUNCTION LIST` of the lease library, with its code (`LIBRARYNAME` is a
/// pattern; the name holds no pattern characters, but only an exact match
/// counts).
fn list() -> Cmd {
    Cmd::new("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(&SCRIPTS.library.name)
        .arg("WITHCODE")
}

/// What a reply to [`list`] says of the lease library: `None` when it is not
/// there, `Some(true)` when it is with this code, `Some(false)` when a
/// library of its name holds other code; an error reply's first words.
fn listed(reply: &Value) -> Result<Option<bool>, String> {
    let library = &SCRIPTS.library;
    let field = |fields: &[Value], key: &str| {
        fields
            .chunks(2)
            .find(|kv| kv[0].text().as_deref() == Some(key))
            .and_then(|kv| kv.get(1).cloned())
    };
    match reply {
        Value::Array(libraries) => Ok(libraries.iter().find_map(|lib| match lib {
            Value::Array(fields)
                if field(fields, "library_name")
                    .and_then(|v| v.text())
                    .as_deref()
                    == Some(library.name.as_str()) =>
            {
                Some(
                    field(fields, "library_code")
                        == Some(Value::Bulk(library.source.clone().into_bytes())),
                )
            }
            _ => None,
        })),
        Value::Error(e) => Err(first_words(e)),
        other => Err(format!("unexpected reply to FUNCTION LIST: {other:?}")),
    }
}

/// A library of the lease library's name holds other code: someone who may
/// load functions replaced it (Valkey's ACL cannot refuse `REPLACE` to a
/// user that may load). Fail closed: its functions would run with this
/// user's permissions.
fn replaced(node: &str) -> StoreError {
    let name = &SCRIPTS.library.name;
    StoreError::BackendUnavailable(format!(
        "the function library {name} on {node} holds other code than this version of \
         targetlease: it was replaced by a user that may load functions; nothing was run. \
         Delete it (FUNCTION DELETE {name}), load it again (`targetlease check` run as a \
         user that may load functions), and find out who replaced it"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }

    /// One library as `FUNCTION LIST … WITHCODE` gives it in RESP2.
    fn library(name: &str, code: Option<&str>) -> Value {
        let function = Value::Array(vec![bulk("name"), bulk("library_name"), bulk("flags")]);
        let mut fields = vec![
            bulk("library_name"),
            bulk(name),
            bulk("engine"),
            bulk("LUA"),
            bulk("functions"),
            Value::Array(vec![function]),
        ];
        if let Some(code) = code {
            fields.extend([bulk("library_code"), bulk(code)]);
        }
        Value::Array(fields)
    }

    #[test]
    fn a_listed_library_counts_only_by_its_name_and_exact_code() {
        let ours = &SCRIPTS.library;
        let name = ours.name.as_str();
        let list = |libs: Vec<Value>| listed(&Value::Array(libs));
        assert_eq!(list(vec![]), Ok(None));
        // Another library first, whose code names "library_name" and ours.
        let other = library("other", Some(&format!("-- library_name {name}")));
        assert_eq!(list(vec![other.clone()]), Ok(None));
        let same = library(name, Some(&ours.source));
        assert_eq!(list(vec![other.clone(), same]), Ok(Some(true)));
        let changed = library(name, Some(&ours.source.replace("allow-oom", "no-writes")));
        assert_eq!(list(vec![other, changed]), Ok(Some(false)));
        // No code in the reply: not proven ours.
        assert_eq!(list(vec![library(name, None)]), Ok(Some(false)));
        assert!(listed(&Value::Error("NOPERM no".into())).is_err());
    }
}
