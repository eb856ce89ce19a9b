//! Fail points: places where the fault matrix (`tests/faults/`) breaks the
//! product on purpose, to show that its checker catches what each break
//! does (its positive controls). Compiled in only with the `failpoints`
//! cargo feature, which only the matrix's own build turns on; without it
//! [`on`] is `false`, every site compiles to nothing, and no shipped binary
//! or normal test contains one.
//!
//! With the feature, a process turns fail points on through
//! `TARGETLEASE_FAILPOINTS` (`name=action;…` in the `fail` crate's syntax:
//! `return`, `25%return`, `off`), read at the first site reached; the
//! matrix's harness sets it in the environment of the CLI and operator
//! processes of one run, and configures its own process with [`set`].
//!
//! | name | site | what breaks |
//! |---|---|---|
//! | `floor-skip-raise` | `operator::reconcile::executor` (`raise_floor`) | the token floor is never raised before a release |
//! | `mark-before-unmark` | `operator::reconcile::executor` (`flush`) | a pod's marks stay until the next holder is marked |
//! | `held-after-lost` | `operator::reconcile::transition::hold` (`after_renew`) | status stays as it was after the store said the lease ended |
//! | `lost-reply-ok` | `store::valkey` (`call`), `store::etcd` (`lost`) | a renew, release, commit or revoke whose reply was lost is reported done |
//! | `lost-reply-unavailable` | `store::valkey` (`call`), `store::etcd` (`lost`) | a write whose reply was lost is reported `backend_unavailable` |
//! | `acquire-previous-token` | `store::valkey` (`finish`), `store::etcd` (`acquire`) | an acquire reports the token before the one granted (a first grant, token 1, as it is) |
//! | `skip-durability-wait` | `store::valkey` (`wait_durable`) | `WAIT`/`WAITAOF` is never sent |

use crate::store::{Lease, Outcome, Reply, StoreError};

/// True when fail point `name` is configured to fire now.
#[cfg(feature = "failpoints")]
pub fn on(name: &str) -> bool {
    static FROM_ENV: std::sync::Once = std::sync::Once::new();
    FROM_ENV.call_once(|| {
        if let Ok(list) = std::env::var("TARGETLEASE_FAILPOINTS") {
            for (point, action) in list.split(';').filter_map(|kv| kv.split_once('=')) {
                if let Err(e) = fail::cfg(point.trim(), action.trim()) {
                    eprintln!("TARGETLEASE_FAILPOINTS: {point}: {e}");
                }
            }
        }
    });
    fail::eval(name, |_| ()).is_some()
}

/// Always `false`: this build has no fail points.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn on(_name: &str) -> bool {
    false
}

/// Configures fail point `name` in this process (`action` as in
/// `TARGETLEASE_FAILPOINTS`; `off` removes it).
#[cfg(feature = "failpoints")]
pub fn set(name: &str, action: &str) -> Result<(), String> {
    on(name); // the environment's configuration first, so this one wins
    if action == "off" {
        fail::remove(name);
        Ok(())
    } else {
        fail::cfg(name, action)
    }
}

/// Always an error: this build has no fail points to configure.
#[cfg(not(feature = "failpoints"))]
pub fn set(name: &str, _action: &str) -> Result<(), String> {
    Err(format!(
        "fail point {name}: this build has no fail points (build with --features failpoints)"
    ))
}

/// An acquire's reply as the `acquire-previous-token` fail point has it:
/// a grant reports the token before its own. A first grant has no token
/// before it (0 is no token at all: a caller would refuse it up front,
/// which is not the lie tested), so it is left as it is.
pub fn acquired(reply: &mut Reply) {
    if reply.outcome == Outcome::Acquired && on("acquire-previous-token") {
        reply
            .lease
            .iter_mut()
            .filter(|l| l.fencing_token > 1)
            .for_each(|l| l.fencing_token -= 1);
    }
}

/// What a call whose reply was lost (`lost`, already classified) is reported
/// as under the `lost-reply-*` fail points; `None`: as classified.
/// `script` and `args` are the call's script name and named arguments.
pub fn lost_reply(
    lost: &StoreError,
    script: &str,
    args: &[(&'static str, String)],
) -> Option<Result<Reply, StoreError>> {
    if !matches!(lost, StoreError::OutcomeUnknown(_)) {
        return None;
    }
    if on("lost-reply-unavailable") {
        return Some(Err(StoreError::BackendUnavailable(
            "control: a lost reply reported as nothing done".into(),
        )));
    }
    if !on("lost-reply-ok") {
        return None;
    }
    let arg = |name: &str| {
        args.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let (outcome, lease) = match script {
        // The lease the renewal would have set, from the request.
        "renew" => (
            Outcome::Renewed,
            Some(Lease {
                target: String::new(),
                lease_id: Some(arg("lease_id")),
                owner: arg("owner"),
                fencing_token: arg("token").parse().ok()?,
                acquired_at_ms: 0,
                expires_at_ms: now + arg("ttl").parse::<u64>().ok()?,
                max_expires_at_ms: None,
                metadata: None,
            }),
        ),
        "release" => (Outcome::Released, None),
        "commit" => (Outcome::Committed, None),
        "revoke" => (Outcome::Revoked, None),
        _ => return None,
    };
    Some(Ok(Reply {
        outcome,
        lease,
        server_time_ms: now,
        message: "control: a lost reply reported as done".into(),
    }))
}
