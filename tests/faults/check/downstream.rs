//! (b) A downstream never accepted a write with a token lower than one it had
//! already accepted, and no acknowledged write is missing at the end.
//!
//! PostgreSQL keeps every accepted write as a row; per resource the rows are
//! in commit order (the recipe locks the fence row before the row gets its
//! sequence number), so their tokens must never go down, and every write
//! acknowledged to a client must be there. Valkey's fenced commit keeps only
//! the last value: acknowledged commits, in Valkey-clock order, must never
//! go down (a commit acknowledged only on a retry after an unknown outcome is
//! left out: its reply may be a replay, whose time is not when it took
//! effect), and the value at the end must carry at least the highest
//! acknowledged token.

use std::collections::{BTreeMap, HashSet};

use super::{Property, Scope, Violation, group_by};
use crate::history::{Answer, History, Sink, WriteRecord};

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    postgres(h, &mut out);
    commits(h, &mut out);
    out
}

fn acked<'a>(h: &'a History, sink: Sink, word: &str) -> Vec<&'a WriteRecord> {
    h.writes
        .iter()
        .filter(|w| w.sink == sink && w.answer.is(word))
        .collect()
}

fn postgres(h: &History, out: &mut Vec<Violation>) {
    let accepted = acked(h, Sink::Postgres, "accepted");
    let Some(rows) = &h.rows else {
        if let Some(w) = accepted.first() {
            out.push(Violation::new(
                Property::Downstream,
                Scope::Postgres,
                &w.resource,
                "the final PostgreSQL rows were never read",
            ));
        }
        return;
    };
    for (resource, mut rs) in group_by(rows, |r| r.resource.as_str()) {
        rs.sort_by_key(|r| r.seq);
        let mut highest: Option<(u64, &str)> = None;
        for r in rs {
            if let Some((top, by)) = highest
                && r.token < top
            {
                out.push(Violation::new(
                    Property::Downstream,
                    Scope::Postgres,
                    &resource,
                    format!(
                        "write {} with token {} accepted after write {by} with token {top}",
                        r.write_id, r.token
                    ),
                ));
            }
            if highest.is_none_or(|(top, _)| r.token > top) {
                highest = Some((r.token, &r.write_id));
            }
        }
    }
    let present: HashSet<&str> = rows.iter().map(|r| r.write_id.as_str()).collect();
    for w in accepted {
        if !present.contains(w.write_id.as_str()) {
            out.push(Violation::new(
                Property::Downstream,
                Scope::Postgres,
                &w.resource,
                format!(
                    "acknowledged write {} (token {}) is missing at the end",
                    w.write_id, w.token
                ),
            ));
        }
    }
}

/// Write ids of commits that had an attempt with an unknown outcome: a later
/// "committed" may be a replay of that attempt, whose effect time is unknown
/// (its reply carries the replay's server time), so it cannot be ordered.
fn uncertain(h: &History) -> HashSet<&str> {
    h.writes
        .iter()
        .filter(|w| w.sink == Sink::Commit && w.answer == Answer::Unknown)
        .map(|w| w.write_id.as_str())
        .collect()
}

fn commits(h: &History, out: &mut Vec<Violation>) {
    let committed = acked(h, Sink::Commit, "committed");
    let uncertain = uncertain(h);
    let finals: BTreeMap<&str, _> = h
        .commits
        .iter()
        .flatten()
        .map(|c| (c.resource.as_str(), c))
        .collect();
    for (resource, ws) in group_by(committed, |w| w.resource.as_str()) {
        let highest = ws.iter().map(|w| w.token).max();
        let mut ws: Vec<&WriteRecord> = ws
            .into_iter()
            .filter(|w| !uncertain.contains(w.write_id.as_str()))
            .collect();
        // A commit took effect no earlier than `server_ms` and no later than
        // `h.dating.latest(..)` (the same moment where the store dates it);
        // p is ordered before w only when p's latest is before w's earliest.
        let latest = |w: &WriteRecord| h.dating.latest(w.server_ms, w.complete_ms);
        ws.sort_by_key(|w| (w.server_ms, w.token));
        let mut by_latest = ws.clone();
        by_latest.sort_by_key(|w| (latest(w), w.token));
        let mut before = by_latest.iter().peekable();
        let mut top: Option<&WriteRecord> = None;
        for w in &ws {
            while let Some(p) = before.next_if(|p| latest(p) < w.server_ms) {
                if top.is_none_or(|t| p.token > t.token) {
                    top = Some(p);
                }
            }
            if let Some(t) = top
                && w.token < t.token
            {
                out.push(Violation::new(
                    Property::Downstream,
                    Scope::Commit,
                    &resource,
                    format!(
                        "commit {} with token {} accepted at {} after commit {} with token {} at {}",
                        w.write_id,
                        w.token,
                        w.server_ms,
                        t.write_id,
                        t.token,
                        latest(t)
                    ),
                ));
            }
        }
        let Some(highest) = highest else {
            continue;
        };
        if h.commits.is_none() {
            out.push(Violation::new(
                Property::Downstream,
                Scope::Commit,
                &resource,
                "the final commit values were never read",
            ));
            continue;
        }
        match finals.get(resource.as_str()) {
            Some(f) if f.token >= highest => {}
            Some(f) => out.push(Violation::new(
                Property::Downstream,
                Scope::Commit,
                &resource,
                format!(
                    "the value at the end carries token {} but token {highest} was acknowledged",
                    f.token
                ),
            )),
            None => out.push(Violation::new(
                Property::Downstream,
                Scope::Commit,
                &resource,
                format!("no value at the end, but token {highest} was acknowledged"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn a_guarded_history_is_clean() {
        let h = H::new()
            .write(Sink::Postgres, "r", 1, "w1", said("accepted"), 0)
            .write(Sink::Postgres, "r", 2, "w2", said("accepted"), 0)
            .write(Sink::Postgres, "r", 1, "w3", said("refused"), 0)
            .write(Sink::Postgres, "r", 2, "w4", Answer::Unknown, 0)
            .rows(&[("r", 1, 1, "w1"), ("r", 2, 2, "w2")])
            .write(Sink::Commit, "r", 1, "c1", said("committed"), 10)
            .write(Sink::Commit, "r", 2, "c2", said("committed"), 20)
            .write(Sink::Commit, "r", 1, "c3", said("committed"), 20) // same ms: unordered
            .commits(&[("r", 2, "c2")])
            .build();
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn an_unguarded_table_accepting_a_lower_token_is_caught() {
        let h = H::new()
            .write(Sink::Postgres, "r", 5, "w1", said("accepted"), 0)
            .write(Sink::Postgres, "r", 3, "w2", said("accepted"), 0)
            .rows(&[("r", 1, 5, "w1"), ("r", 2, 3, "w2")])
            .build();
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].detail
                .contains("write w2 with token 3 accepted after write w1")
        );
    }

    #[test]
    fn a_lost_acknowledged_write_is_caught() {
        let h = H::new()
            .write(Sink::Postgres, "r", 5, "w1", said("accepted"), 0)
            .rows(&[])
            .build();
        assert!(check(&h)[0].detail.contains("w1 (token 5) is missing"));
        let unread = H::new()
            .write(Sink::Postgres, "r", 5, "w1", said("accepted"), 0)
            .build();
        assert!(check(&unread)[0].detail.contains("never read"));
    }

    #[test]
    fn a_replayed_commit_is_not_ordered_by_its_reply() {
        // The first attempt ran before a restart; the retry's reply is a replay.
        let h = H::new()
            .write(Sink::Commit, "r", 4, "c1", Answer::Unknown, 0)
            .write(Sink::Commit, "r", 5, "c2", said("committed"), 20)
            .write(Sink::Commit, "r", 4, "c1", said("committed"), 21)
            .commits(&[("r", 5, "c2")])
            .build();
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn without_a_store_clock_commits_are_ordered_by_send_and_reply() {
        use crate::history::Dating;
        // Token 4 is sent at 100 and answered at 400; token 2 is sent at
        // 150, while token 4 may not have been applied yet.
        let history = |dating, sent_ms| {
            let mut h = H::new()
                .dated(dating)
                .at(100)
                .write(Sink::Commit, "r", 4, "c1", said("committed"), 100)
                .at(sent_ms)
                .write(Sink::Commit, "r", 2, "c2", said("committed"), sent_ms)
                .commits(&[("r", 4, "c1")])
                .build();
            h.writes[0].complete_ms = 400;
            h
        };
        assert_eq!(check(&history(Dating::ClientBeforeSend, 150)), vec![]);
        // Sent after token 4's reply: accepting it is caught.
        let after = check(&history(Dating::ClientBeforeSend, 500));
        assert!(
            after[0]
                .detail
                .contains("commit c2 with token 2 accepted at 500"),
            "{after:?}"
        );
        // Where the store dates commits, 100 before 150 orders them.
        let valkey = check(&history(Dating::Store, 150));
        assert!(
            valkey[0]
                .detail
                .contains("commit c2 with token 2 accepted at 150"),
            "{valkey:?}"
        );
    }

    #[test]
    fn commits_going_down_or_lost_are_caught() {
        let h = H::new()
            .write(Sink::Commit, "r", 4, "c1", said("committed"), 10)
            .write(Sink::Commit, "r", 2, "c2", said("committed"), 11)
            .commits(&[("r", 2, "c2")])
            .build();
        let v: Vec<String> = check(&h).iter().map(|v| v.detail.clone()).collect();
        assert!(
            v[0].contains("commit c2 with token 2 accepted at 11"),
            "{v:?}"
        );
        assert!(v[1].contains("carries token 2 but token 4"), "{v:?}");
        let lost = H::new()
            .write(Sink::Commit, "r", 4, "c1", said("committed"), 10)
            .commits(&[])
            .build();
        assert!(check(&lost)[0].detail.contains("no value at the end"));
    }
}
