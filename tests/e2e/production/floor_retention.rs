//! Floors of targets nobody uses for `--floor-retention` fold into their
//! namespace's base: the ConfigMap shrinks, no floor is lowered, and what a
//! target gets afterwards is exactly what docs/operator.md says.

use targetlease::operator::floor::{floor_key, ledger};

use super::floor_tenants::Tenant;
use super::*;

/// Promise (docs/operator.md "Token floor"): an entry raised a retention ago
/// whose target no TargetLease names is folded into the namespace's base;
/// an entry whose target is in use again stays. A target reused after the
/// retention gets a token above both its own last token (Valkey's counter
/// is never collected) and the base; a never-used target of the namespace
/// starts above the base (the jump).
#[tokio::test]
async fn floors_of_targets_unused_for_the_retention_fold_into_the_base() {
    let mut env = OperatorEnv::start_without_operator("floor-retention").await;
    env.start_operator_with(&["--floor-retention", "8s"]);
    let tenant = Tenant::of(&env);
    for i in 0..3 {
        assert_eq!(tenant.cycle(&format!("old-{i}"), "old").await, i + 1);
    }
    assert_eq!(tenant.cycle("live-0", "live").await, 1);
    tenant.create("live-1", "live").await;
    assert_eq!(tenant.held("live-1").await, 2);
    let (old, live) = (floor_key(&env.ns, "old"), floor_key(&env.ns, "live"));
    let (before, _) = tenant.floors().await.expect("the namespace's floors");
    assert_eq!(
        (
            ledger::floor_in(&before, &old),
            ledger::floor_in(&before, &live)
        ),
        (3, 1)
    );

    // The retention (8s) plus at most one sweep period (1s), plus slack.
    let what = "old's floor folded into the base";
    let after = eventually(what, Duration::from_secs(25), || async {
        let (data, _) = tenant.floors().await?;
        (!data.contains_key(&old)).then_some(data)
    })
    .await;
    assert_eq!(ledger::base(&after), 3, "{after:?}");
    assert_eq!(ledger::entries(&after), 1, "{after:?}");
    assert!(after.contains_key(&live), "live is in use: its entry stays");
    assert_eq!(
        ledger::floor_in(&after, &live),
        3,
        "raised by the base, never lowered"
    );

    tenant.create("old-again", "old").await;
    assert_eq!(
        tenant.held("old-again").await,
        4,
        "above max(counter 3, base 3)"
    );
    tenant.create("never", "never-used").await;
    assert_eq!(
        tenant.held("never").await,
        4,
        "above the base: a jump, never a repeat"
    );
}
