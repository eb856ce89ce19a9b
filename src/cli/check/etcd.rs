//! `targetlease check` against etcd: etcd has no eviction, no asynchronous
//! replication and no scripts to load, so what can go wrong is reaching a
//! leader (and the time it takes), the permissions of the user, and space:
//! at its quota etcd raises `NOSPACE` and refuses every write.

use super::{Check, EXIT_UNREACHABLE, SLOW, Verdict, check};
use crate::store::etcd::{EtcdConfig, EtcdStore, Space};
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
    out.push(match store.space().await {
        Ok(space) => space_check(&space),
        Err(e) => check(
            "space",
            Verdict::Warn,
            format!(
                "cannot read etcd's alarms and database size ({e}): watch its NOSPACE alarm and etcd_mvcc_db_total_size_in_bytes yourself"
            ),
        ),
    });
    let code = if out.iter().any(|c| c.status == Verdict::Fail) {
        super::EXIT_FAILED
    } else {
        0
    };
    (out, code)
}

/// A database this full of its quota is warned about.
const NEARLY_FULL_PERCENT: u64 = 80;

/// The verdict on etcd's alarms and space.
fn space_check(space: &Space) -> Check {
    const MIB: u64 = 1024 * 1024;
    let size = space.db_size.div_ceil(MIB);
    if !space.alarms.is_empty() {
        return check(
            "space",
            Verdict::Fail,
            format!(
                "etcd refuses every write while an alarm is raised: {} (compact and defragment, then `etcdctl alarm disarm`)",
                space.alarms.join(", ")
            ),
        );
    }
    match space.quota {
        Some(quota)
            if space.db_size.saturating_mul(100) >= quota.saturating_mul(NEARLY_FULL_PERCENT) =>
        {
            check(
                "space",
                Verdict::Warn,
                format!(
                    "the answering member's database uses {size} MiB of its {} MiB quota: at the quota etcd refuses every write (run etcd with --auto-compaction-retention, defragment, or raise --quota-backend-bytes)",
                    quota.div_ceil(MIB)
                ),
            )
        }
        Some(quota) => check(
            "space",
            Verdict::Ok,
            format!(
                "no alarm; the answering member's database uses {size} MiB of its {} MiB quota",
                quota.div_ceil(MIB)
            ),
        ),
        None => check(
            "space",
            Verdict::Ok,
            format!(
                "no alarm; the answering member's database uses {size} MiB (its quota is not reported before etcd 3.6; the default is 2 GiB)"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(alarms: &[&str], db_size: u64, quota: Option<u64>) -> Space {
        Space {
            alarms: alarms.iter().map(|a| a.to_string()).collect(),
            db_size,
            quota,
        }
    }

    #[test]
    fn an_alarm_fails_and_a_nearly_full_database_warns() {
        const MIB: u64 = 1024 * 1024;
        let full = space_check(&space(&["NOSPACE on member 1"], MIB, Some(2048 * MIB)));
        assert_eq!(full.status, Verdict::Fail);
        assert!(
            full.detail.contains("NOSPACE on member 1"),
            "{}",
            full.detail
        );
        let nearly = space_check(&space(&[], 80 * MIB, Some(100 * MIB)));
        assert_eq!(nearly.status, Verdict::Warn);
        assert!(
            nearly.detail.contains("80 MiB of its 100 MiB"),
            "{}",
            nearly.detail
        );
        assert_eq!(
            space_check(&space(&[], 79 * MIB, Some(100 * MIB))).status,
            Verdict::Ok
        );
        let unknown = space_check(&space(&[], 79 * MIB, None));
        assert_eq!(unknown.status, Verdict::Ok);
        assert!(
            unknown.detail.contains("not reported"),
            "{}",
            unknown.detail
        );
    }
}
