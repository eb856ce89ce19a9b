//! Pure: the token floor's part in acquisitions and deletions — which token
//! an acquisition must exceed, when the floor already covers a token, what
//! this process remembers of its own publications until the floor covers
//! them, and how a failed floor write reads.

use std::collections::HashMap;

use super::Error;
use super::name::NsName;

/// The highest token published per (namespace, target) by this process.
pub type Published = HashMap<NsName, u64>;

/// The token every new acquisition on a target must exceed: the highest of
/// what the TargetLeases on it publish (`siblings`, from the cache), what
/// this process published there itself (`own`: the cache may lag its
/// writes), what this status names (`status`) and the floor kept for
/// deleted leases (`floor`).
pub fn token_floor(siblings: u64, own: Option<u64>, status: Option<u64>, floor: u64) -> u64 {
    siblings
        .max(own.unwrap_or(0))
        .max(status.unwrap_or(0))
        .max(floor)
}

/// The floor (`floor`) already covers `token`: no write needed (the cache
/// is a safe shortcut: floors never decrease between versions).
pub fn covers(floor: u64, token: u64) -> bool {
    floor >= token
}

/// A status write published `token` on `key`: remember the highest.
pub fn published(own: &mut Published, key: NsName, token: u64) {
    let slot = own.entry(key).or_default();
    *slot = (*slot).max(token);
}

/// Forgets what this process published on `key` once the floor covers it.
pub fn forget_covered(own: &mut Published, key: NsName, floor: u64) {
    if own.get(&key).is_some_and(|t| covers(floor, *t)) {
        own.remove(&key);
    }
}

/// Why a floor write failed, in one sentence that stays the same from one
/// retry to the next (the condition is rewritten only when it changes).
pub fn unwritten(e: &Error) -> String {
    match e {
        Error::Kube(kube::Error::Api(s)) => {
            format!("the API server answered {} ({})", s.code, s.message)
        }
        e if e.category() == "api_timeout" => "the API server did not answer in time".into(),
        _ => "the API server could not be reached".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acquisition_exceeds_every_token_anyone_published_or_the_floor_kept() {
        // (siblings, own, status, floor) -> floor of the acquisition
        let cases = [
            ((0, None, None, 0), 0),
            ((5, None, None, 0), 5),
            ((5, Some(7), None, 0), 7),
            ((5, Some(7), Some(9), 0), 9),
            ((5, Some(7), Some(9), 12), 12),
            ((11, Some(2), Some(3), 4), 11),
        ];
        for ((siblings, own, status, floor), want) in cases {
            assert_eq!(token_floor(siblings, own, status, floor), want);
        }
    }

    #[test]
    fn the_own_record_goes_once_the_floor_covers_it_and_never_decreases() {
        let key = || NsName::new("ns", "t");
        let mut own = Published::new();
        published(&mut own, key(), 7);
        published(&mut own, key(), 5);
        assert_eq!(own.get(&key()), Some(&7), "never decreases");
        forget_covered(&mut own, key(), 6);
        assert_eq!(own.get(&key()), Some(&7), "not covered yet");
        forget_covered(&mut own, key(), 7);
        assert_eq!(own.get(&key()), None, "covered: forgotten");
        assert!(covers(7, 7) && covers(8, 7) && !covers(6, 7));
    }
}
