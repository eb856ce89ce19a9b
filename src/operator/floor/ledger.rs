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
mod tests {
    use super::*;

    const DAY: i64 = 86_400;
    const NOW: i64 = 1_750_000_000;

    fn ledger(entries: &[(&str, u64, i64)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, token, at)| {
                let v = if *k == BASE_KEY {
                    token.to_string()
                } else {
                    Entry {
                        token: *token,
                        at: *at,
                    }
                    .value()
                };
                (k.to_string(), v)
            })
            .collect()
    }

    /// Every key's floor in `after` is at least what it was in `before`.
    fn lowers_nothing(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) {
        for key in before.keys() {
            assert!(
                floor_in(after, key) >= floor_in(before, key),
                "{key} lowered: {before:?} -> {after:?}"
            );
        }
    }

    #[test]
    fn values_read_back_as_written_and_bare_tokens_are_the_oldest() {
        let e = Entry { token: 17, at: NOW };
        assert_eq!(e.value(), "17@2025-06-15T15:06:40Z");
        assert_eq!(Entry::parse(&e.value()), Some(e));
        assert_eq!(Entry::parse("9"), Some(Entry { token: 9, at: 0 }));
        assert_eq!(Entry::parse("x@2025-06-15T15:06:40Z"), None);
        assert_eq!(Entry::parse("9@yesterday"), None);
    }

    #[test]
    fn a_raise_only_ever_raises_and_keeps_every_other_entry() {
        let data = ledger(&[("t-a", 5, NOW - DAY), ("t-b", 9, NOW - DAY)]);
        let next = raised(&data, &[("t-c".into(), 3)], NOW, 100).unwrap();
        assert_eq!(next.folded, None);
        assert_eq!(
            next.data,
            ledger(&[
                ("t-a", 5, NOW - DAY),
                ("t-b", 9, NOW - DAY),
                ("t-c", 3, NOW)
            ])
        );
        let next = raised(&next.data, &[("t-a".into(), 7)], NOW, 100).unwrap();
        assert_eq!(floor_in(&next.data, "t-a"), 7);
        assert_eq!(floor_in(&next.data, "t-b"), 9);
        assert_eq!(raised(&next.data, &[("t-b".into(), 9)], NOW, 100), None);
        assert_eq!(raised(&next.data, &[("t-b".into(), 4)], NOW, 100), None);
    }

    /// Two writers each raise their own target from the same version; the
    /// loser of the race re-reads the winner's version and raises again.
    /// Whichever order, both floors end up in the ledger.
    #[test]
    fn concurrent_raises_in_either_order_keep_both_floors() {
        let start = ledger(&[("t-old", 2, NOW - DAY)]);
        let a = ("t-a".to_string(), 5);
        let b = ("t-b".to_string(), 8);
        for (first, second) in [(&a, &b), (&b, &a)] {
            let won = raised(&start, std::slice::from_ref(first), NOW, 100).unwrap();
            let retried = raised(&won.data, std::slice::from_ref(second), NOW, 100).unwrap();
            for (key, token) in [&a, &b, &("t-old".to_string(), 2)] {
                assert_eq!(floor_in(&retried.data, key), *token, "{key}");
            }
        }
    }

    #[test]
    fn the_base_covers_every_target_of_the_namespace() {
        let data = ledger(&[(BASE_KEY, 40, 0), ("t-a", 50, NOW)]);
        assert_eq!(floor_in(&data, "t-a"), 50);
        assert_eq!(floor_in(&data, "t-never-seen"), 40);
        assert_eq!(entries(&data), 1);
        assert_eq!(raised(&data, &[("t-b".into(), 40)], NOW, 100), None);
        assert!(raised(&data, &[("t-b".into(), 41)], NOW, 100).is_some());
    }

    /// A raise that would pass the cap folds the oldest entries (not the
    /// lowest) into the base, down to three quarters of the cap; nothing is
    /// lowered, and the newest entries stay exact.
    #[test]
    fn the_cap_folds_the_oldest_entries_and_lowers_no_floor() {
        // Older entries carry higher tokens: age decides, not the token.
        let entries_: Vec<(String, u64, i64)> = (0..8)
            .map(|i| (format!("t-{i}"), 100 - i as u64, NOW - (10 - i) * DAY))
            .collect();
        let refs: Vec<_> = entries_
            .iter()
            .map(|(k, t, a)| (k.as_str(), *t, *a))
            .collect();
        let data = ledger(&refs);
        assert_eq!(
            raised(&data, &[("t-8".into(), 1)], NOW, 9).unwrap().folded,
            None
        );
        let change = raised(&data, &[("t-new".into(), 1)], NOW, 8).unwrap();
        let fold = change.folded.unwrap();
        assert_eq!(
            fold,
            Fold {
                folded: 3,
                kept: 6,
                base: 100
            }
        );
        assert_eq!(entries(&change.data), 6);
        for gone in ["t-0", "t-1", "t-2"] {
            assert!(
                !change.data.contains_key(gone),
                "{gone} is among the oldest"
            );
        }
        for kept in ["t-3", "t-7", "t-new"] {
            assert!(change.data.contains_key(kept), "{kept} is among the newest");
        }
        lowers_nothing(&data, &change.data);
        assert_eq!(floor_in(&change.data, "t-never-seen"), 100, "the jump");
    }

    /// Entries raised `retention` ago or earlier fold into the base, unless a
    /// TargetLease still names their target; newer ones stay.
    #[test]
    fn retention_folds_only_old_entries_of_unused_targets() {
        let data = ledger(&[
            (BASE_KEY, 3, 0),
            ("t-old", 20, NOW - 31 * DAY),
            ("t-old-in-use", 30, NOW - 40 * DAY),
            ("t-edge", 7, NOW - 30 * DAY),
            ("t-new", 10, NOW - 29 * DAY),
        ]);
        let change = expired(&data, NOW, 30 * DAY, |k| k == "t-old-in-use").unwrap();
        assert_eq!(
            change.folded,
            Some(Fold {
                folded: 2,
                kept: 2,
                base: 20
            })
        );
        assert_eq!(
            change.data.keys().collect::<Vec<_>>(),
            [BASE_KEY, "t-new", "t-old-in-use"]
        );
        lowers_nothing(&data, &change.data);
        let again = expired(&change.data, NOW, 30 * DAY, |_| false);
        assert_eq!(again.and_then(|c| c.folded).map(|f| f.folded), Some(1));
        assert_eq!(expired(&change.data, NOW, 50 * DAY, |_| false), None);
    }

    /// The figure docs/operator.md quotes: a namespace at the largest cap the
    /// operator accepts, every token and time at its longest, stays far below the
    /// API server's 1 MiB object limit.
    #[test]
    fn a_namespace_at_the_largest_cap_fits_the_object_limit() {
        let max = crate::operator::floor::MAX_ENTRIES_LIMIT;
        let mut data = BTreeMap::new();
        for i in 0..max {
            let key = crate::operator::floor::floor_key("tenant", &format!("t-{i}"));
            let e = Entry {
                token: u64::MAX / 2 - i as u64,
                at: NOW,
            };
            data.insert(key, e.value());
        }
        data.insert(BASE_KEY.into(), (u64::MAX / 2).to_string());
        let size = bytes(&data);
        assert!(size < 700 * 1024, "{size} bytes at {max} entries");
        println!("a namespace at {max} entries: {size} bytes of keys and values");
    }
}
