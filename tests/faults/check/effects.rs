//! (c) Honesty of renewals, releases, revokes and commits, judged against
//! what observers saw (an observer's `get` and commit reads straight on the
//! server, other clients' `held` and `acquired` replies):
//!
//! - an acknowledged acquire or renew (`until E`) must have happened: an
//!   observation sent after the reply came shows the lease with an expiry of
//!   at least E, or, before E on the server's clock, an operation that could
//!   have ended it (a release, a revoke) was already sent;
//! - an acknowledged release or revoke must have happened: no observation
//!   sent after its reply shows that lease alive;
//! - a refused or `backend_unavailable` renew must not have happened: no
//!   observation shows an expiry that only it could have set; a refused
//!   release or revoke must not have happened: the lease did not vanish
//!   before its expiry with nothing else to end it;
//! - an acknowledged commit must have happened: no read sent after its reply
//!   shows a lower token, or a value surely older than it.
//!
//! Where the store has no clock (etcd reports the client's clock before the
//! call was sent), an observation is placed at its reply, the latest moment
//! it can describe: a look sent just before an expiry and answered after it
//! proves nothing about the time before the expiry.
//!
//! An observation is evidence only when real time orders it after the
//! reply (sent after the reply came), and only until a fault that can lose
//! acknowledged state (restart, failover, power cut): what a lossy mode
//! forgets is (a), (b) and (d)'s to count, not a lie.

use std::collections::{BTreeMap, HashMap};

use super::{Property, Scope, Violation};
use crate::history::{Answer, History, LeaseView, OpKind, OpRecord, Sink};

mod looks;
pub(crate) use looks::{Look, looks};

fn kind_word(k: OpKind) -> &'static str {
    match k {
        OpKind::Acquire => "acquire",
        OpKind::Renew => "renew",
        OpKind::Release => "release",
        OpKind::Revoke => "revoke",
    }
}

fn same(l: &LeaseView, issue: &str, token: u64) -> bool {
    l.token == token && (l.issue.is_empty() || issue.is_empty() || l.issue == issue)
}

/// The attempts of one request (same client, kind, target and request id).
struct Request<'a> {
    attempts: Vec<&'a OpRecord>,
}

impl Request<'_> {
    fn first_invoke(&self) -> u64 {
        self.attempts.iter().map(|o| o.invoke_ms).min().unwrap_or(0)
    }
    /// The acknowledged attempt, if any.
    fn ack(&self, word: &str) -> Option<&OpRecord> {
        self.attempts.iter().copied().find(|o| o.answer.is(word))
    }
    fn no_effect(&self) -> bool {
        self.attempts.iter().all(|o| o.answer.promises_no_effect())
    }
    fn may_have_run(&self) -> bool {
        !self.no_effect()
    }
}

fn requests(h: &History, kind: OpKind) -> Vec<Request<'_>> {
    let mut by: BTreeMap<(&str, &str, &str), Vec<&OpRecord>> = BTreeMap::new();
    for o in h.ops.iter().filter(|o| o.kind == kind) {
        by.entry((&o.client, &o.target, &o.request_id))
            .or_default()
            .push(o);
    }
    by.into_values()
        .map(|attempts| Request { attempts })
        .collect()
}

/// Which lease a renew, release or revoke acts on: (issue, token).
fn acts_on(o: &OpRecord) -> Option<(&str, u64)> {
    Some((o.issue.as_deref().unwrap_or(""), o.token?))
}

/// When faults that can lose acknowledged state began and healed (local
/// times): what was acknowledged while one was on (a failover's lag window)
/// can be lost too.
pub(crate) fn lossy(h: &History) -> Vec<(u64, u64)> {
    h.faults
        .iter()
        .filter(|f| f.loses_data)
        .map(|f| (f.at_ms, f.healed_ms.max(f.at_ms)))
        .collect()
}

/// True when a loss in `lossy` may lie between `from` and `to`.
pub(crate) fn loss_between(lossy: &[(u64, u64)], from: u64, to: u64) -> bool {
    lossy.iter().any(|&(at, healed)| at <= to && healed >= from)
}

/// True when `look` is evidence about the state after a reply at `acked_ms`
/// to a request sent at `sent_ms`: sent after that reply, with no loss
/// between the request's sending and the look (a request applied before a
/// loss can be answered after it healed: its effect was lost, not denied).
fn after(look: &Look, sent_ms: u64, acked_ms: u64, lossy: &[(u64, u64)]) -> bool {
    look.invoke_ms > acked_ms && !loss_between(lossy, sent_ms, look.complete_ms)
}

pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let looks = looks(h);
    let lossy = lossy(h);
    let none = Vec::new();
    let releases = requests(h, OpKind::Release);
    let revokes = requests(h, OpKind::Revoke);
    // What could end a lease: (target, token, issue) -> when each possible ender was sent.
    let mut enders: ByLease<Vec<(u64, &Request)>> = BTreeMap::new();
    for r in releases.iter().chain(&revokes) {
        if let Some((issue, token)) = acts_on(r.attempts[0]) {
            enders
                .entry((&r.attempts[0].target, token, issue))
                .or_default()
                .push((r.first_invoke(), r));
        }
    }
    let ended_before = |target: &str, token: u64, issue: &str, by_ms: u64, may_run: bool| {
        of_lease(&enders, target, token, issue)
            .flatten()
            .any(|(at, r)| *at <= by_ms && (!may_run || r.may_have_run()))
    };
    // Acknowledged acquires and renewals: the lease lives until E.
    let grants = h.ops.iter().filter(|o| {
        (o.kind == OpKind::Acquire && o.answer.is("acquired"))
            || (o.kind == OpKind::Renew && o.answer.is("renewed"))
    });
    for o in grants {
        let Some(l) = &o.lease else { continue };
        let issue = if o.kind == OpKind::Acquire {
            l.issue.as_str()
        } else {
            o.issue.as_deref().unwrap_or(&l.issue)
        };
        let what = if o.kind == OpKind::Acquire {
            "acquire"
        } else {
            "renew"
        };
        for look in looks.get(o.target.as_str()).unwrap_or(&none) {
            if !after(look, o.invoke_ms, o.complete_ms, &lossy) {
                continue;
            }
            let detail = match look.lease {
                Some(seen) if same(seen, issue, l.token) => {
                    if seen.expires_at_ms >= l.expires_at_ms {
                        continue;
                    }
                    format!(
                        "its expiry was {} at {}",
                        seen.expires_at_ms, look.latest_ms
                    )
                }
                _ if look.latest_ms >= l.expires_at_ms => continue,
                _ if ended_before(&o.target, l.token, issue, look.complete_ms, false) => continue,
                Some(other) => format!(
                    "at {} the target was held by {} (token {})",
                    look.latest_ms, other.issue, other.token
                ),
                None => format!("at {} the target was free", look.latest_ms),
            };
            out.push(Violation::new(
                Property::Honesty,
                Scope::Lease,
                &o.target,
                format!(
                    "{what} {} of {issue} (token {}) was reported done until {}, but {detail}",
                    o.request_id, l.token, l.expires_at_ms
                ),
            ));
            break;
        }
    }
    // Acknowledged releases and revokes: that lease is gone.
    for (r, word) in releases
        .iter()
        .map(|r| (r, "released"))
        .chain(revokes.iter().map(|r| (r, "revoked")))
    {
        let Some(ack) = r.ack(word) else { continue };
        let Some((issue, token)) = acts_on(ack) else {
            continue;
        };
        let seen = looks
            .get(ack.target.as_str())
            .unwrap_or(&none)
            .iter()
            .find(|look| {
                after(look, r.first_invoke(), ack.complete_ms, &lossy)
                    && look.lease.is_some_and(|l| same(l, issue, token))
            });
        if let Some(look) = seen {
            out.push(Violation::new(
                Property::Honesty,
                Scope::Lease,
                &ack.target,
                format!(
                    "{} {} by {} of token {token} was reported {word}, but the lease was live at {}",
                    kind_word(ack.kind),
                    ack.request_id,
                    ack.client,
                    look.latest_ms
                ),
            ));
        }
    }
    refused_renewals(h, &looks, &mut out);
    refused_enders(h, &looks, &lossy, &releases, &revokes, &mut out);
    commits(h, &lossy, &mut out);
    out
}

/// What is known per lease: (target, token, issue).
type ByLease<'h, V> = BTreeMap<(&'h str, u64, &'h str), V>;

/// The entries of `by` about the lease (`target`, `token`, `issue`): a token
/// can be issued twice when a fault loses the counter, so the request that
/// asked for the lease tells the two apart (an empty issue, unknown, matches
/// any).
fn of_lease<'m, 'h, V>(
    by: &'m ByLease<'h, V>,
    target: &'h str,
    token: u64,
    issue: &'h str,
) -> impl Iterator<Item = &'m V> + use<'m, 'h, V> {
    by.range((target, token, "")..)
        .take_while(move |((t, n, _), _)| *t == target && *n == token)
        .filter(move |((_, _, i), _)| i.is_empty() || issue.is_empty() || *i == issue)
        .map(|(_, v)| v)
}

/// The lease an acknowledged acquire granted or an acknowledged renew
/// extended, with the expiry its reply reported.
fn reported_expiry(o: &OpRecord) -> Option<((&str, u64, &str), u64)> {
    let l = o.lease.as_ref()?;
    if o.answer.is("acquired") {
        Some(((&o.target, l.token, &l.issue), l.expires_at_ms))
    } else if o.answer.is("renewed") {
        let (issue, token) = acts_on(o)?;
        Some(((&o.target, token, issue), l.expires_at_ms))
    } else {
        None
    }
}

/// A renew reported as refused or unavailable must not have set an expiry:
/// every expiry seen of a lease after such a renew was sent is one its
/// acquire or an acknowledged renew reported, unless some renew of it had
/// an unknown outcome. (What was seen before the renew was sent is none of
/// its doing: an acquire whose first reply was lost, retried after a
/// restart lost what it set, shows its first expiry only before.)
fn refused_renewals(h: &History, looks: &BTreeMap<&str, Vec<Look>>, out: &mut Vec<Violation>) {
    let renewals = requests(h, OpKind::Renew);
    // (target, token, issue) -> (expiries reported, any unknown attempt,
    // the refused requests and when each was first sent)
    type Known<'a> = (Vec<u64>, bool, Vec<(&'a str, u64)>);
    let mut leases: ByLease<Known> = BTreeMap::new();
    for o in h.ops.iter().filter(|o| o.kind == OpKind::Acquire) {
        if let Some((key, expires)) = reported_expiry(o) {
            leases.entry(key).or_default().0.push(expires);
        }
    }
    for r in &renewals {
        let Some((issue, token)) = acts_on(r.attempts[0]) else {
            continue;
        };
        let e = leases
            .entry((&r.attempts[0].target, token, issue))
            .or_default();
        for o in &r.attempts {
            match (&o.answer, &o.lease) {
                (Answer::Unknown, _) => e.1 = true,
                (a, Some(l)) if a.is("renewed") => e.0.push(l.expires_at_ms),
                _ => {}
            }
        }
        if r.no_effect() {
            e.2.push((&r.attempts[0].request_id, r.first_invoke()));
        }
    }
    for (target, ls) in looks {
        for look in ls {
            let Some(seen) = look.lease else { continue };
            // What every entry of that lease knows, together (an entry of an
            // unknown issue alone would explain any expiry).
            let known: Vec<&Known> = of_lease(&leases, target, seen.token, &seen.issue).collect();
            let sent_before = |(_, sent): &&(&str, u64)| *sent <= look.complete_ms;
            let Some(&(refused, _)) = known.iter().flat_map(|k| k.2.iter()).find(sent_before)
            else {
                continue;
            };
            let unknown = known.iter().any(|k| k.1);
            let reported: Vec<u64> = known.iter().flat_map(|k| k.0.iter().copied()).collect();
            if unknown || reported.is_empty() || reported.contains(&seen.expires_at_ms) {
                continue;
            }
            out.push(Violation::new(
                Property::Honesty,
                Scope::Lease,
                target,
                format!(
                    "renew {refused} of token {} was reported as refused or unavailable, yet the \
                     lease showed expiry {} that no acknowledged operation set",
                    seen.token, seen.expires_at_ms
                ),
            ));
            return;
        }
    }
}

/// A release or revoke reported as refused or unavailable must not have
/// ended the lease: a lease gone before its expiry, with nothing else sent
/// that could have ended it, was ended by one of them.
fn refused_enders(
    h: &History,
    looks: &BTreeMap<&str, Vec<Look>>,
    lossy: &[(u64, u64)],
    releases: &[Request],
    revokes: &[Request],
    out: &mut Vec<Violation>,
) {
    // (target, token, issue) -> each expiry reported, with the time of its reply.
    let mut expiry: ByLease<Vec<(u64, u64)>> = BTreeMap::new();
    for o in &h.ops {
        if let Some((key, expires)) = reported_expiry(o) {
            expiry
                .entry(key)
                .or_default()
                .push((o.complete_ms, expires));
        }
    }
    for r in releases.iter().chain(revokes).filter(|r| r.no_effect()) {
        let first = r.attempts[0];
        let Some((issue, token)) = acts_on(first) else {
            continue;
        };
        let started = r.first_invoke();
        let others_may_end = releases.iter().chain(revokes).any(|o| {
            !std::ptr::eq(o, r)
                && o.may_have_run()
                && acts_on(o.attempts[0]).is_some_and(|(i, t)| {
                    t == token && (i.is_empty() || issue.is_empty() || i == issue)
                })
                && o.attempts[0].target == first.target
        });
        if others_may_end {
            continue;
        }
        let reported: Vec<(u64, u64)> = of_lease(&expiry, &first.target, token, issue)
            .flatten()
            .copied()
            .collect();
        if reported.is_empty() {
            continue;
        }
        let granted = reported.iter().map(|(acked, _)| *acked).min().unwrap_or(0);
        let gone = looks
            .get(first.target.as_str())
            .into_iter()
            .flatten()
            .find(|look| {
                let promised = reported
                    .iter()
                    .filter(|(acked, _)| *acked < look.invoke_ms)
                    .map(|(_, e)| *e)
                    .max();
                look.invoke_ms > started
                    && promised.is_some_and(|e| look.latest_ms < e)
                    && look.lease.is_none_or(|l| !same(l, issue, token))
                    && !loss_between(lossy, granted, look.complete_ms)
            });
        if let Some(look) = gone {
            out.push(Violation::new(
                Property::Honesty,
                Scope::Lease,
                &first.target,
                format!(
                    "{} {} by {} of token {token} was reported as refused or unavailable, yet the \
                     lease was gone at {}, before its expiry, with nothing else sent to end it",
                    kind_word(first.kind),
                    first.request_id,
                    first.client,
                    look.latest_ms
                ),
            ));
        }
    }
}

/// An acknowledged commit must have happened: a read sent after its reply
/// shows its token or a higher one, and not a value acknowledged before the
/// commit was sent (the commit would have replaced it).
fn commits(h: &History, lossy: &[(u64, u64)], out: &mut Vec<Violation>) {
    // write id -> (first invoke, first acknowledged reply)
    let mut times: HashMap<&str, (u64, Option<u64>)> = HashMap::new();
    for w in h.writes.iter().filter(|w| w.sink == Sink::Commit) {
        let e = times.entry(&w.write_id).or_insert((w.invoke_ms, None));
        e.0 = e.0.min(w.invoke_ms);
        if w.answer.is("committed") {
            e.1 = Some(e.1.map_or(w.complete_ms, |t: u64| t.min(w.complete_ms)));
        }
    }
    let mut reported = std::collections::HashSet::new();
    for w in h
        .writes
        .iter()
        .filter(|w| w.sink == Sink::Commit && w.answer.is("committed"))
    {
        if !reported.insert(&w.write_id) {
            continue;
        }
        let (first_invoke, _) = times[w.write_id.as_str()];
        let contradiction = h.reads.iter().find_map(|r| {
            let look = Look {
                invoke_ms: r.invoke_ms,
                complete_ms: r.complete_ms,
                latest_ms: h.dating.latest(r.server_ms, r.complete_ms),
                lease: None,
            };
            if r.resource != w.resource
                || !after(&look, times[w.write_id.as_str()].0, w.complete_ms, lossy)
            {
                return None;
            }
            match &r.committed {
                None => Some(format!("at {} nothing was committed", r.server_ms)),
                Some((token, _)) if *token < w.token => Some(format!(
                    "at {} the value carried token {token}",
                    r.server_ms
                )),
                Some((_, id)) if id != &w.write_id => {
                    let older = times
                        .get(id.as_str())
                        .and_then(|(_, acked)| *acked)
                        .is_some_and(|acked| acked < first_invoke);
                    older.then(|| {
                        format!(
                            "at {} the value was {id}, acknowledged before it was sent",
                            r.server_ms
                        )
                    })
                }
                Some(_) => None,
            }
        });
        if let Some(detail) = contradiction {
            out.push(Violation::new(
                Property::Honesty,
                Scope::Commit,
                &w.resource,
                format!(
                    "commit {} (token {}) was reported committed, but {detail}",
                    w.write_id, w.token
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests;
