//! `targetlease check` against etcd: etcd has no eviction, no asynchronous
//! replication and no scripts to load, so what can go wrong is reaching a
//! leader (and the time it takes), the permissions of the user, and space:
//! at its quota etcd raises `NOSPACE` and refuses every write.

use super::{Check, EXIT_UNREACHABLE, SLOW, Verdict, check};
use crate::store::etcd::{EtcdConfig, EtcdStore, Space};
use crate::store::{LeaseStore, StoreError, Target};

/// Every etcd check, in order, and the exit code; settings that cannot
/// be used (refused before anything connects) are the caller's to report.
pub(super) async fn checks(cfg: &EtcdConfig) -> Result<(Vec<Check>, u8), String> {
    let store = match EtcdStore::connect(cfg).await {
        Ok(s) => s,
        Err(StoreError::Invalid(why)) => return Err(why),
        Err(e) => {
            return Ok((
                vec![check("reachability", Verdict::Fail, e.to_string())],
                EXIT_UNREACHABLE,
            ));
        }
    };
    Ok(on(&store).await)
}

/// The checks of a connected store, and the exit code.
async fn on(store: &EtcdStore) -> (Vec<Check>, u8) {
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
    match store.get(&probe).await {
        Ok(_) => out.push(check("permissions", Verdict::Ok, "the lease keys can be read (writes are not probed: a probe would write)")),
        Err(StoreError::BackendUnavailable(why)) if why.contains("permission denied") => out.push(check(
            "permissions",
            Verdict::Fail,
            format!(
                "the user may not read the lease keys ({why}): grant read and write on the key prefix"
            ),
        )),
        Err(e) => {
            out.push(check("permissions", Verdict::Fail, e.to_string()));
            return (out, EXIT_UNREACHABLE);
        }
    }
    match store.space().await {
        Ok(space) => out.push(space_check(&space)),
        Err(StoreError::BackendUnavailable(why)) if refused_to_user(&why) => out.push(check(
            "space",
            Verdict::Warn,
            format!(
                "cannot read etcd's alarms and database size ({why}): watch its NOSPACE alarm and etcd_mvcc_db_total_size_in_bytes yourself"
            ),
        )),
        Err(e) => {
            out.push(check("space", Verdict::Fail, e.to_string()));
            return (out, EXIT_UNREACHABLE);
        }
    }
    let code = if out.iter().any(|c| c.status == Verdict::Fail) {
        super::EXIT_FAILED
    } else {
        0
    };
    (out, code)
}

/// Whether etcd refused a call to this user (rather than not answering).
fn refused_to_user(why: &str) -> bool {
    [
        "permission denied",
        "user name",
        "authentication",
        "auth token",
    ]
    .iter()
    .any(|m| why.contains(m))
}

/// A database this full of its quota is warned about.
const NEARLY_FULL_PERCENT: u64 = 80;

/// etcd's quota when a member does not report one (before 3.6).
const DEFAULT_QUOTA: u64 = 2 * 1024 * 1024 * 1024;

/// The verdict on etcd's alarms and space.
fn space_check(space: &Space) -> Check {
    const MIB: u64 = 1024 * 1024;
    if !space.alarms.is_empty() {
        let raised: Vec<String> = space
            .alarms
            .iter()
            .map(|(kind, member)| format!("{kind} on member {member:x}"))
            .collect();
        let what_to_do = if space.alarms.iter().any(|(kind, _)| kind == "CORRUPT") {
            "a member's data differs from the others': follow etcd's data corruption recovery (replace that member), do not just disarm it"
        } else {
            "compact and defragment, then `etcdctl alarm disarm`"
        };
        return check(
            "space",
            Verdict::Fail,
            format!(
                "etcd refuses every write while an alarm is raised: {} ({what_to_do})",
                raised.join(", ")
            ),
        );
    }
    let size = space.db_size.div_ceil(MIB);
    let (quota, assumed) = match space.quota {
        Some(q) => (q, ""),
        None => (
            DEFAULT_QUOTA,
            " (not reported before etcd 3.6: etcd's default assumed)",
        ),
    };
    let used = format!(
        "the answering member's database uses {size} MiB of its {} MiB quota{assumed}",
        quota.div_ceil(MIB)
    );
    if space.db_size.saturating_mul(100) >= quota.saturating_mul(NEARLY_FULL_PERCENT) {
        check(
            "space",
            Verdict::Warn,
            format!(
                "{used}: at the quota etcd refuses every write (run etcd with --auto-compaction-retention, defragment, or raise --quota-backend-bytes)"
            ),
        )
    } else {
        check("space", Verdict::Ok, format!("no alarm; {used}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(alarms: &[(&str, u64)], db_size: u64, quota: Option<u64>) -> Space {
        Space {
            alarms: alarms.iter().map(|(k, m)| (k.to_string(), *m)).collect(),
            db_size,
            quota,
        }
    }

    #[test]
    fn an_alarm_fails_and_a_nearly_full_database_warns() {
        const MIB: u64 = 1024 * 1024;
        let full = space_check(&space(&[("NOSPACE", 0x1f)], MIB, Some(2048 * MIB)));
        assert_eq!(full.status, Verdict::Fail);
        assert!(
            full.detail.contains("NOSPACE on member 1f"),
            "{}",
            full.detail
        );
        assert!(full.detail.contains("alarm disarm"), "{}", full.detail);
        let corrupt = space_check(&space(&[("CORRUPT", 2)], MIB, Some(2048 * MIB)));
        assert_eq!(corrupt.status, Verdict::Fail);
        assert!(
            !corrupt.detail.contains("alarm disarm"),
            "{}",
            corrupt.detail
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
        // Not reported (before 3.6): etcd's default of 2 GiB.
        let unknown = space_check(&space(&[], 1700 * MIB, None));
        assert_eq!(unknown.status, Verdict::Warn);
        assert!(
            unknown
                .detail
                .contains("of its 2048 MiB quota (not reported"),
            "{}",
            unknown.detail
        );
        assert_eq!(
            space_check(&space(&[], 100 * MIB, None)).status,
            Verdict::Ok
        );
    }
}
