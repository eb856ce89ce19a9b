//! What one namespace's floor ConfigMap holds and how a change rewrites it.
//! No client required.
//!
//! A ledger maps `t-<hash>` keys to `<token>@<time>`: the highest token
//! published for a deleted target of the namespace, and when that floor was
//! last raised (RFC 3339, UTC). An optional [`BASE_KEY`] entry is a floor
//! every target of the namespace is at least. Every change only raises: an
//! entry is raised, or entries are folded into the base, which becomes at
//! least each of them. So the floor of every target (`max(entry, base)`)
//! never decreases from one version of a ledger to the next, whoever writes
//! it and in whatever order: a writer that lost a race re-reads and changes
//! again, and nothing it removes is left uncovered.
//!
//! Two things fold entries: the namespace's cap ([`raised`] folds the oldest
//! when a raise would pass it) and the retention ([`expired`] folds entries
//! of targets nobody uses any more).

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

/// The namespace-wide floor: every target of the namespace has at least this floor.
pub const BASE_KEY: &str = "base";

/// One target's floor: its token, and when it was last raised (Unix
/// seconds; 0 when unknown, which counts as the oldest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The highest token published for the target.
    pub token: u64,
    /// When the floor was last raised.
    pub at: i64,
}

impl Entry {
    /// Reads `<token>@<time>` (or a bare `<token>`, written by hand).
    pub fn parse(value: &str) -> Option<Self> {
        let (token, at) = match value.split_once('@') {
            Some((token, at)) => (token, at.parse::<Timestamp>().ok()?.as_second()),
            None => (value, 0),
        };
        Some(Self {
            token: token.parse().ok()?,
            at,
        })
    }

    /// `<token>@<time>`.
    pub fn value(&self) -> String {
        match Timestamp::from_second(self.at) {
            Ok(at) if self.at > 0 => format!("{}@{at}", self.token),
            _ => self.token.to_string(),
        }
    }
}

/// Entries folded into a namespace's base by one change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fold {
    /// How many entries were folded.
    pub folded: usize,
    /// How many entries the namespace keeps.
    pub kept: usize,
    /// The base afterwards: every target without an entry gets a token above it.
    pub base: u64,
}

/// A ledger after a change, and what the change folded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The data to write.
    pub data: BTreeMap<String, String>,
    /// Entries folded into the base, if any.
    pub folded: Option<Fold>,
}

/// The floor of `key` in a ledger: its entry or the base, whichever is higher.
pub fn floor_in(data: &BTreeMap<String, String>, key: &str) -> u64 {
    token(data, key).max(base(data))
}

/// The namespace's base (0 when none).
pub fn base(data: &BTreeMap<String, String>) -> u64 {
    token(data, BASE_KEY)
}

fn token(data: &BTreeMap<String, String>, key: &str) -> u64 {
    data.get(key)
        .and_then(|v| Entry::parse(v))
        .map_or(0, |e| e.token)
}

/// Entries (the base is not one).
pub fn entries(data: &BTreeMap<String, String>) -> usize {
    data.len() - usize::from(data.contains_key(BASE_KEY))
}

/// Bytes of keys and values (what the 1 MiB object limit counts).
pub fn bytes(data: &BTreeMap<String, String>) -> usize {
    data.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// The ledger after raising each `(key, token)` of `floors` at `now` (Unix
/// seconds); `None` when every floor is already that high (nothing to write).
/// When the namespace would hold more than `max_entries` entries, its oldest
/// are folded into the base first, down to three quarters of `max_entries`
/// (so the next raises do not fold again at once).
pub fn raised(
    data: &BTreeMap<String, String>,
    floors: &[(String, u64)],
    now: i64,
    max_entries: usize,
) -> Option<Change> {
    let missing: Vec<_> = floors
        .iter()
        .filter(|(key, token)| floor_in(data, key) < *token)
        .collect();
    if missing.is_empty() {
        return None;
    }
    let mut next = data.clone();
    for (key, token) in missing {
        next.insert(
            key.clone(),
            Entry {
                token: *token,
                at: now,
            }
            .value(),
        );
    }
    let folded = if entries(&next) > max_entries {
        let keep = max_entries / 4 * 3;
        let mut all = listed(&next);
        all.sort_by_key(|(key, e)| (e.at, e.token, key.clone()));
        let n = all.len() - keep;
        Some(fold(&mut next, all.into_iter().take(n).map(|(k, _)| k)))
    } else {
        None
    };
    Some(Change { data: next, folded })
}

/// The ledger after folding every entry raised `retention` seconds or more
/// before `now` whose target is not `in_use`; `None` when there is none.
pub fn expired(
    data: &BTreeMap<String, String>,
    now: i64,
    retention: i64,
    in_use: impl Fn(&str) -> bool,
) -> Option<Change> {
    let old: Vec<String> = listed(data)
        .into_iter()
        .filter(|(key, e)| e.at <= now.saturating_sub(retention) && !in_use(key))
        .map(|(key, _)| key)
        .collect();
    if old.is_empty() {
        return None;
    }
    let mut next = data.clone();
    let folded = fold(&mut next, old);
    Some(Change {
        data: next,
        folded: Some(folded),
    })
}

/// Every entry but the base (an unreadable value counts as token 0, raised at 0).
fn listed(data: &BTreeMap<String, String>) -> Vec<(String, Entry)> {
    data.iter()
        .filter(|(k, _)| *k != BASE_KEY)
        .map(|(k, v)| {
            let e = Entry::parse(v).unwrap_or(Entry { token: 0, at: 0 });
            (k.clone(), e)
        })
        .collect()
}

/// Removes `keys` and raises the base to at least each of their tokens.
fn fold(data: &mut BTreeMap<String, String>, keys: impl IntoIterator<Item = String>) -> Fold {
    let mut base = base(data);
    let mut folded = 0;
    for key in keys {
        if let Some(e) = data.remove(&key).and_then(|v| Entry::parse(&v)) {
            base = base.max(e.token);
        }
        folded += 1;
    }
    data.insert(BASE_KEY.to_owned(), base.to_string());
    Fold {
        folded,
        kept: entries(data),
        base,
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
