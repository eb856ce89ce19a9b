//! The checker: pure functions from a recorded [`History`] to the violations
//! of the four properties, per target or resource, and to what recovery
//! after each fault looked like ([`recovery`]).
//!
//! - (a) [`tokens`]: tokens strictly increase in issue order and no token is
//!   issued twice (client leases, operator status, pod marks).
//! - (b) [`downstream`]: a downstream never accepted a lower token after a
//!   higher one, and no acknowledged write is missing at the end.
//! - (c) [`honesty`], [`effects`]: every reported outcome matches what was
//!   observed: a success happened, a refusal or `backend_unavailable` had no
//!   effect, `outcome_unknown` may go either way.
//! - (d) [`exclusion`]: no two claims (client leases, Held TargetLeases,
//!   marked pods of one election) overlap in server time.

pub mod downstream;
pub mod effects;
pub mod exclusion;
#[cfg(test)]
pub mod fixtures;
pub mod honesty;
pub mod liveness;
pub mod published;
pub mod recovery;
pub mod tokens;
pub mod withdrawn;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::history::{Dating, History};

/// The checker's version, recorded with every run it judged (and raised
/// whenever a rule changes, so that records judged by different rules are
/// never counted together): 1 judged acquires only for (c), claims to the
/// last reply for (d), and liveness as one success per part; 2 judges every
/// operation, claims to the holder's deadline, watch gaps, fault effects and
/// recovery; 3: a lease nobody was told of binds its token only until a
/// fault that can lose state, recovery is judged per part (each client,
/// each sink, status, marks) against its bound after every fault followed
/// by a fault-free gap that long, the lossy modes must show their cost, and
/// a control must be caught by every violation it expects; 4: a token
/// issued twice names two leases (renewals, releases and revokes are
/// judged per lease, the request that asked for it telling them apart); 5:
/// a renew reported refused is held only to what was seen after it was sent;
/// 6: where the fault wipes every fence counter, PostgreSQL's recovery is
/// shown, not held to the bound (it rightly refuses the tokens issued again
/// until the counter passes the highest it accepted); 7: where the store
/// has no clock (etcd dates a reply by the client's clock before the call
/// was sent), a look is placed at its reply and a commit is ordered after
/// another only when it was sent after the other's reply ([`counts_as`]
/// says which records of 6 count as 7).
pub const CHECKER: u32 = 7;

/// The checker version a record counts as: one judged by `v`, of a
/// scenario whose store's times are read as `dating`, in which that checker
/// found `violations`. Version 7 changed only how looks and commits are
/// dated where the store has no clock, and there it can only find fewer
/// violations (a look placed later proves less about the time before a
/// deadline, an ordering needs more), with every other figure unchanged. So
/// a record of 6 counts as 7 when the store dates its history (the rules
/// are the same), or when 6 found no violation in it (7 would find none
/// either); any other needs `rejudge` or a new run.
pub fn counts_as(v: u32, dating: Dating, violations: usize) -> u32 {
    if v == 6 && (dating == Dating::Store || violations == 0) {
        7
    } else {
        v
    }
}

/// One of the four checked properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Property {
    /// (a) tokens strictly increase in issue order; none is issued twice.
    Tokens,
    /// (b) no lower token accepted after a higher one; no acknowledged write lost.
    Downstream,
    /// (c) a success happened; a refusal or `backend_unavailable` had no effect.
    Honesty,
    /// (d) no two live claims on one target at once.
    Exclusion,
}

impl Property {
    /// The letter the issue and the docs use.
    pub fn letter(self) -> char {
        match self {
            Property::Tokens => 'a',
            Property::Downstream => 'b',
            Property::Honesty => 'c',
            Property::Exclusion => 'd',
        }
    }
}

/// Which part of the history a violation is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// Leases held by library and CLI clients.
    Lease,
    /// What the operator published: TargetLease status and pod marks.
    Published,
    /// The PostgreSQL downstream (the fencing recipe).
    Postgres,
    /// Valkey's fenced commit.
    Commit,
}

impl Scope {
    pub const ALL: [Scope; 4] = [
        Scope::Lease,
        Scope::Published,
        Scope::Postgres,
        Scope::Commit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Lease => "client leases",
            Scope::Published => "operator status/marks",
            Scope::Postgres => "PostgreSQL",
            Scope::Commit => "lease commit",
        }
    }
}

/// One violation, with enough context to find it in the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub property: Property,
    pub scope: Scope,
    /// The target (or downstream resource) it is about.
    pub target: String,
    pub detail: String,
}

impl Violation {
    pub fn new(property: Property, scope: Scope, target: &str, detail: impl Into<String>) -> Self {
        Self {
            property,
            scope,
            target: target.to_string(),
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "({}) {} {}: {}",
            self.property.letter(),
            self.scope.name(),
            self.target,
            self.detail
        )
    }
}

/// Everything the checker found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub violations: Vec<Violation>,
    /// How long what a lossy mode lost lasted, in ms of server time (only
    /// where something was lost; 0 ms is a loss of one grant): (a) in client leases, the longest stretch of
    /// grants one counter loss forgot ([`tokens::forgotten_ms`]); (d)
    /// in client leases, the longest time two leases on one target were
    /// both promised ([`exclusion::measure`]).
    pub windows: BTreeMap<(Property, Scope), usize>,
}

impl Report {
    /// Number of violations of `p` in `s`.
    pub fn count(&self, p: Property, s: Scope) -> usize {
        self.violations
            .iter()
            .filter(|v| v.property == p && v.scope == s)
            .count()
    }

    /// Counts per (property, scope), only the non-zero ones.
    pub fn counts(&self) -> BTreeMap<(Property, Scope), usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry((v.property, v.scope)).or_default() += 1;
        }
        m
    }
}

/// Checks every property over the whole history.
pub fn check(h: &History) -> Report {
    let mut violations = tokens::check(h);
    violations.extend(downstream::check(h));
    violations.extend(honesty::check(h));
    violations.extend(effects::check(h));
    violations.extend(withdrawn::check(h));
    let (exclusions, overlap_ms) = exclusion::measure(h);
    violations.extend(exclusions);
    let windows = [
        ((Property::Tokens, Scope::Lease), tokens::forgotten_ms(h)),
        ((Property::Exclusion, Scope::Lease), overlap_ms),
    ]
    .into_iter()
    .filter_map(|(k, ms)| Some((k, ms? as usize)))
    .collect();
    Report {
        violations,
        windows,
    }
}

/// Groups items by a string key, keeping arrival order inside each group.
pub(crate) fn group_by<'a, T>(
    items: impl IntoIterator<Item = &'a T>,
    key: impl Fn(&T) -> &str,
) -> BTreeMap<String, Vec<&'a T>>
where
    T: 'a,
{
    let mut m: BTreeMap<String, Vec<&T>> = BTreeMap::new();
    for it in items {
        m.entry(key(it).to_string()).or_default().push(it);
    }
    m
}
