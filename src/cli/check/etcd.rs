//! `targetlease check` against etcd: etcd has no eviction, no asynchronous
//! replication and no scripts to load, so what can go wrong is reaching a
//! leader (and the time it takes) and the permissions of the user.

use super::{Check, EXIT_UNREACHABLE, SLOW, Verdict, check};
use crate::store::etcd::{EtcdConfig, EtcdStore};
use crate::store::{LeaseStore, StoreError, Target};

/// Every etcd check, in order, and the exit code.
pub(super) async fn checks(cfg: &EtcdConfig) -> (Vec<Check>, u8) {
    let store = match EtcdStore::connect(cfg).await {
        Ok(s) => s,
        Err(e) => {
            return (
                vec![check("reachability", Verdict::Fail, e.to_string())],
                EXIT_UNREACHABLE,
            );
        }
    };
    let mut out = Vec::new();
    match store.health().await {
        Ok(h) => {
            let ms = h.latency.as_secs_f64() * 1000.0;
            let status = if h.latency > SLOW {
                Verdict::Warn
            } else {
                Verdict::Ok
            };
            let what = format!("a leader answered a linearizable read in {ms:.1}ms");
            out.push(check("reachability", status, what));
        }
        Err(e) => {
            out.push(check("reachability", Verdict::Fail, e.to_string()));
            return (out, EXIT_UNREACHABLE);
        }
    }
    // A read of a probe target needs read access to the key range.
    let probe = Target::new("targetlease-check", "probe");
    out.push(match store.get(&probe).await {
        Ok(_) => check("permissions", Verdict::Ok, "the lease keys can be read (writes are not probed: a probe would write)"),
        Err(StoreError::BackendUnavailable(why)) if why.contains("permission denied") => check(
            "permissions",
            Verdict::Fail,
            format!(
                "the user may not read the lease keys ({why}): grant read and write on the key prefix"
            ),
        ),
        Err(e) => check("permissions", Verdict::Fail, e.to_string()),
    });
    let code = if out.iter().any(|c| c.status == Verdict::Fail) {
        super::EXIT_FAILED
    } else {
        0
    };
    (out, code)
}
