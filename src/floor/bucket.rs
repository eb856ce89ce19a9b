//! What one floor bucket holds and how a raise changes it. No client required.
//!
//! A bucket maps `t-<hash>` keys to the highest token published for that
//! target, plus an optional [`BASE_KEY`] entry every target of the bucket is
//! at least. Every change only raises: an entry is raised, or — when the
//! bucket outgrows its byte budget — the entries with the lowest tokens are
//! folded into the base, which becomes at least each of them. So the floor
//! of every target (`max(entry, base)`) never decreases from one version of
//! a bucket to the next, whoever writes it and in whatever order: a writer
//! that lost a race re-reads and raises again, and nothing it drops is left
//! uncovered.

use std::collections::BTreeMap;

/// The bucket-wide floor: every target of the bucket has at least this floor.
pub const BASE_KEY: &str = "base";

/// The floor of `key` in a bucket's data: its entry or the base, whichever is higher.
pub fn floor_in(data: &BTreeMap<String, String>, key: &str) -> u64 {
    value(data, key).max(value(data, BASE_KEY))
}

fn value(data: &BTreeMap<String, String>, key: &str) -> u64 {
    data.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Bytes of keys and values (what the 1 MiB object limit counts).
pub fn bytes(data: &BTreeMap<String, String>) -> usize {
    data.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// The bucket after raising each `(key, token)` of `floors`, compacted to
/// fit `max_bytes`; `None` when every floor is already that high (nothing to write).
pub fn raised(
    data: &BTreeMap<String, String>,
    floors: &[(String, u64)],
    max_bytes: usize,
) -> Option<BTreeMap<String, String>> {
    let missing: Vec<_> = floors
        .iter()
        .filter(|(key, token)| floor_in(data, key) < *token)
        .collect();
    if missing.is_empty() {
        return None;
    }
    let mut next = data.clone();
    for (key, token) in missing {
        next.insert(key.clone(), token.to_string());
    }
    compact(&mut next, max_bytes);
    Some(next)
}

/// Folds the entries with the lowest tokens into the base until the bucket
/// holds at most three quarters of `max_bytes` (so the next raises do not
/// compact again at once). Does nothing while the bucket fits `max_bytes`.
pub fn compact(data: &mut BTreeMap<String, String>, max_bytes: usize) {
    if bytes(data) <= max_bytes {
        return;
    }
    let mut base = value(data, BASE_KEY);
    if let Some(v) = data.remove(BASE_KEY) {
        base = base.max(v.parse().unwrap_or(0));
    }
    // Room for the base entry itself (a u64 has at most 20 digits).
    let target = (max_bytes / 4 * 3).saturating_sub(BASE_KEY.len() + 20);
    let mut size = bytes(data);
    let mut entries: Vec<(u64, String)> = data
        .iter()
        .filter_map(|(k, v)| Some((v.parse::<u64>().ok()?, k.clone())))
        .collect();
    entries.sort();
    for (token, key) in entries {
        if size <= target {
            break;
        }
        if let Some(v) = data.remove(&key) {
            size -= key.len() + v.len();
        }
        base = base.max(token);
    }
    data.insert(BASE_KEY.to_owned(), base.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(entries: &[(&str, u64)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_raise_only_ever_raises_and_keeps_every_other_entry() {
        let data = bucket(&[("t-a", 5), ("t-b", 9)]);
        let next = raised(&data, &[("t-c".into(), 3)], 1 << 20).unwrap();
        assert_eq!(next, bucket(&[("t-a", 5), ("t-b", 9), ("t-c", 3)]));
        let next = raised(&next, &[("t-a".into(), 7)], 1 << 20).unwrap();
        assert_eq!(floor_in(&next, "t-a"), 7);
        assert_eq!(floor_in(&next, "t-b"), 9);
        assert_eq!(raised(&next, &[("t-b".into(), 9)], 1 << 20), None);
        assert_eq!(raised(&next, &[("t-b".into(), 4)], 1 << 20), None);
    }

    /// Two writers each raise their own target from the same version; the
    /// loser of the race re-reads the winner's version and raises again.
    /// Whichever order, both floors end up in the bucket.
    #[test]
    fn concurrent_raises_in_either_order_keep_both_floors() {
        let start = bucket(&[("t-old", 2)]);
        let a = ("t-a".to_string(), 5);
        let b = ("t-b".to_string(), 8);
        for (first, second) in [(&a, &b), (&b, &a)] {
            let won = raised(&start, std::slice::from_ref(first), 1 << 20).unwrap();
            // The second writer's own attempt (from `start`) is refused with a
            // conflict; it retries from what won.
            let retried = raised(&won, std::slice::from_ref(second), 1 << 20).unwrap();
            for (key, token) in [&a, &b, &("t-old".to_string(), 2)] {
                assert_eq!(floor_in(&retried, key), *token, "{key}");
            }
        }
    }

    #[test]
    fn the_base_covers_every_target_of_the_bucket() {
        let data = bucket(&[(BASE_KEY, 40), ("t-a", 50)]);
        assert_eq!(floor_in(&data, "t-a"), 50);
        assert_eq!(floor_in(&data, "t-never-seen"), 40);
        assert_eq!(raised(&data, &[("t-b".into(), 40)], 1 << 20), None);
        assert!(raised(&data, &[("t-b".into(), 41)], 1 << 20).is_some());
    }

    /// A bucket over its budget folds its lowest entries into the base: it
    /// shrinks below the budget, and no target's floor is lower than before.
    #[test]
    fn compaction_fits_the_budget_and_lowers_no_floor() {
        let mut data = BTreeMap::new();
        for i in 0..5_000u64 {
            data.insert(format!("t-{i:040x}"), (1_000 + i * 7 % 4_999).to_string());
        }
        let before = data.clone();
        let max = bytes(&before) / 2;
        let next = raised(&data, &[("t-new".into(), 10)], max).unwrap();
        assert!(bytes(&next) <= max / 4 * 3, "{} > {}", bytes(&next), max);
        for key in before.keys().chain(["t-new".to_string()].iter()) {
            let was = floor_in(&before, key).max(if key == "t-new" { 10 } else { 0 });
            assert!(floor_in(&next, key) >= was, "{key} lowered");
        }
        // The highest entries stay exact; the base is the highest folded one.
        let base = value(&next, BASE_KEY);
        assert!(
            next.iter()
                .all(|(k, v)| k == BASE_KEY || v.parse::<u64>().unwrap() >= base)
        );
        data = next;
        // Within budget, nothing is folded.
        let again = raised(&data, &[("t-x".into(), 1 << 40)], max).unwrap();
        assert_eq!(again.len(), data.len() + 1);
    }
}
