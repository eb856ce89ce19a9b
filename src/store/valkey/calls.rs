//! Argument order: how each operation fills its script's KEYS and ARGV.
//!
//! Every key and argument carries the name its script's header gives it
//! (`-- KEYS[1] lease …`); a test reads the headers and checks count, order
//! and names against these call sites, so the two cannot drift.

use std::time::Duration;

use super::errors::Effect;
use super::keys::{KeySpace, commit_field, request_field};
use super::scripts::{SCRIPTS, Script};
use crate::store::{
    AcquireRequest, CommitRequest, IDEMPOTENCY_WINDOW, ReleaseRequest, RenewRequest, RevokeRequest,
    Target,
};

/// One script invocation, ready to send.
pub(super) struct ScriptCall {
    /// The script.
    pub script: &'static Script,
    /// `KEYS`, in order, each with its header name.
    pub keys: Vec<(&'static str, String)>,
    /// `ARGV`, in order, each with its header name.
    pub args: Vec<(&'static str, String)>,
    /// Whether the script may write.
    pub effect: Effect,
    /// Whether a success waits for the configured durability (`WAIT`/`WAITAOF`).
    pub may_wait: bool,
}

fn window_ms(extra: Duration) -> String {
    (IDEMPOTENCY_WINDOW + extra).as_millis().to_string()
}

fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

pub(super) fn acquire(ks: &KeySpace, req: &AcquireRequest) -> ScriptCall {
    let t = &req.target;
    let lease_id = req
        .lease_id
        .clone()
        .unwrap_or_else(|| derived_lease_id(t, &req.owner, &req.request_id));
    ScriptCall {
        script: &SCRIPTS.acquire,
        keys: vec![("target", ks.target(t))],
        args: vec![
            ("owner", req.owner.clone()),
            ("ttl", ms(req.ttl)),
            (
                "max_life",
                req.max_lifetime.map(ms).unwrap_or_else(|| "0".into()),
            ),
            ("lease_id", lease_id),
            ("metadata", req.metadata_json()),
            ("floor", req.token_floor.unwrap_or(0).to_string()),
            ("window", window_ms(Duration::ZERO)),
            (
                "request",
                request_field("acquire", &req.owner, &req.request_id),
            ),
        ],
        effect: Effect::Write,
        may_wait: true,
    }
}

/// The lease id of an acquire whose caller chose none: derived from what
/// identifies the request, so that a retry of it (same request id) asks for
/// the same lease id, and the store never needs to keep the id itself (it
/// keeps its hash). Knowing the request id is knowing this lease id: a request
/// id is a capability (docs/protocol.md).
fn derived_lease_id(t: &Target, owner: &str, request_id: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [
        "targetlease lease id v1",
        &t.namespace,
        &t.name,
        owner,
        request_id,
    ] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part.as_bytes());
    }
    let digest = ctx.finish();
    digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) fn renew(ks: &KeySpace, req: &RenewRequest) -> ScriptCall {
    let (t, h) = (&req.target, &req.handle);
    ScriptCall {
        script: &SCRIPTS.renew,
        keys: vec![("target", ks.target(t))],
        args: vec![
            ("owner", h.owner.clone()),
            ("lease_id", h.lease_id.clone()),
            ("token", h.token.to_string()),
            ("ttl", ms(req.ttl)),
            ("window", window_ms(Duration::ZERO)),
            ("request", request_field("renew", &h.owner, &req.request_id)),
            ("extend", if req.extend_only { "1" } else { "0" }.into()),
        ],
        effect: Effect::Write,
        may_wait: true,
    }
}

pub(super) fn release(ks: &KeySpace, req: &ReleaseRequest) -> ScriptCall {
    let (t, h) = (&req.target, &req.handle);
    ScriptCall {
        script: &SCRIPTS.release,
        keys: vec![("target", ks.target(t))],
        args: vec![
            ("owner", h.owner.clone()),
            ("lease_id", h.lease_id.clone()),
            ("token", h.token.to_string()),
            ("window", window_ms(Duration::ZERO)),
            (
                "request",
                request_field("release", &h.owner, &req.request_id),
            ),
        ],
        effect: Effect::Write,
        may_wait: false,
    }
}

pub(super) fn get(ks: &KeySpace, t: &Target) -> ScriptCall {
    ScriptCall {
        script: &SCRIPTS.get,
        keys: vec![("target", ks.target(t))],
        args: vec![],
        effect: Effect::Read,
        may_wait: false,
    }
}

pub(super) fn read(ks: &KeySpace, t: &Target, key: &str) -> ScriptCall {
    ScriptCall {
        script: &SCRIPTS.read,
        keys: vec![("target", ks.target(t))],
        args: vec![("commit", commit_field(key))],
        effect: Effect::Read,
        may_wait: false,
    }
}

pub(super) fn revoke(ks: &KeySpace, req: &RevokeRequest) -> ScriptCall {
    let t = &req.target;
    ScriptCall {
        script: &SCRIPTS.revoke,
        keys: vec![("target", ks.target(t))],
        args: vec![
            (
                "token",
                req.token.map(|n| n.to_string()).unwrap_or_default(),
            ),
            ("window", window_ms(Duration::ZERO)),
            ("request", request_field("revoke", "", &req.request_id)),
        ],
        effect: Effect::Write,
        may_wait: false,
    }
}

pub(super) fn commit(ks: &KeySpace, req: &CommitRequest) -> ScriptCall {
    let t = &req.target;
    ScriptCall {
        script: &SCRIPTS.commit,
        keys: vec![("target", ks.target(t))],
        args: vec![
            ("token", req.token.to_string()),
            ("key", req.key.clone()),
            ("value", req.value.clone()),
            ("window", window_ms(Duration::ZERO)),
            ("commit", commit_field(&req.key)),
            ("request", request_field("commit", "", &req.request_id)),
        ],
        effect: Effect::Write,
        may_wait: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LeaseHandle;

    /// `(index, name)` of every `-- KEYS[i] name` (or ARGV) line of a header.
    fn declared(body: &str, what: &str) -> Vec<(usize, String)> {
        body.lines()
            .take_while(|l| l.starts_with("--"))
            .filter_map(|l| {
                let rest = l.trim_start_matches("--").trim().strip_prefix(what)?;
                let (i, name) = rest.strip_prefix('[')?.split_once(']')?;
                Some((i.parse().ok()?, name.split_whitespace().next()?.to_owned()))
            })
            .collect()
    }

    /// Highest `KEYS[i]`/`ARGV[i]` index used in the code (not the header).
    fn highest_used(body: &str, what: &str) -> usize {
        let code: String = body
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        code.match_indices(&format!("{what}["))
            .filter_map(|(at, m)| {
                let rest = &code[at + m.len()..];
                rest[..rest.find(']')?].parse().ok()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn every_script_header_matches_its_call_site() {
        let ks = KeySpace::new("tl").unwrap();
        let t = Target::new("ns", "t");
        let h = LeaseHandle {
            owner: "o".into(),
            lease_id: "lease-id-0123456789".into(),
            token: 7,
        };
        let ttl = Duration::from_secs(10);
        let calls = [
            acquire(&ks, &AcquireRequest::new(t.clone(), "o", ttl)),
            renew(&ks, &RenewRequest::new(t.clone(), h.clone(), ttl)),
            release(&ks, &ReleaseRequest::new(t.clone(), h)),
            get(&ks, &t),
            revoke(&ks, &RevokeRequest::new(t.clone())),
            commit(&ks, &CommitRequest::new(t.clone(), 7, "k", "v")),
            read(&ks, &t, "k"),
        ];
        assert_eq!(calls.len(), SCRIPTS.all().len(), "one call site per script");
        for call in calls {
            let s = call.script;
            // The lib helpers it pulls in are exactly those its code names.
            assert_eq!(
                crate::store::valkey::scripts::uses(s.body),
                crate::store::valkey::scripts::helpers_named(s.body),
                "{}: `-- uses:` vs the lib.lua helpers its code names",
                s.name
            );
            for (what, sent) in [("KEYS", &call.keys), ("ARGV", &call.args)] {
                let header = declared(s.body, what);
                let expected: Vec<(usize, String)> = sent
                    .iter()
                    .enumerate()
                    .map(|(i, (name, _))| (i + 1, name.to_string()))
                    .collect();
                assert_eq!(header, expected, "{} {what}: header vs call site", s.name);
                assert!(
                    highest_used(s.body, what) <= sent.len(),
                    "{} uses a {what} index the call site does not send",
                    s.name
                );
            }
        }
    }

    #[test]
    fn a_derived_lease_id_names_its_request_and_nothing_else() {
        let t = Target::new("ns", "t");
        let id = derived_lease_id(&t, "o", "r");
        assert_eq!(
            id,
            derived_lease_id(&t, "o", "r"),
            "a retry asks for the same id"
        );
        assert_eq!(id.len(), 32);
        for other in [
            derived_lease_id(&Target::new("ns", "u"), "o", "r"),
            derived_lease_id(&Target::new("nst", ""), "o", "r"),
            derived_lease_id(&t, "o2", "r"),
            derived_lease_id(&t, "o", "r2"),
            derived_lease_id(&t, "or", ""),
        ] {
            assert_ne!(id, other);
        }
    }
}
