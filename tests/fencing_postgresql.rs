//! The PostgreSQL fencing recipe (`examples/fencing/postgresql.sql`) against a
//! real server: a stale token is refused after a higher one, the refused
//! transaction writes nothing, tokens are exact up to 2^63-1, and concurrent
//! writers of one resource are serialized by the fence row.

use targetlease_test_support as support;

use std::sync::Arc;
use std::time::Duration;

use support::postgres::{Postgres, STALE_TOKEN_SQLSTATE, fencing_recipe};
use tokio_postgres::Client;

const LEDGER: &str = "CREATE TABLE ledger (
    id bigserial PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL, writer text NOT NULL)";

/// How a guarded write ended.
#[derive(Debug, PartialEq, Eq)]
enum Write {
    Accepted,
    Stale,
}

/// The recipe's transaction: fence, then the data write, then commit.
/// `hold` keeps the transaction open between the two, widening any race.
async fn guarded_write(
    db: &mut Client,
    resource: &str,
    token: i64,
    writer: &str,
    hold: Duration,
) -> Write {
    let tx = db.transaction().await.expect("begin");
    if let Err(e) = tx
        .execute("SELECT targetlease_fence($1, $2)", &[&resource, &token])
        .await
    {
        let code = e.code().map(|c| c.code().to_owned());
        assert_eq!(code.as_deref(), Some(STALE_TOKEN_SQLSTATE), "{e}");
        return Write::Stale; // dropping the transaction rolls it back
    }
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    tx.execute(
        "INSERT INTO ledger (resource, token, writer) VALUES ($1, $2, $3)",
        &[&resource, &token, &writer],
    )
    .await
    .expect("data write");
    tx.commit().await.expect("commit");
    Write::Accepted
}

async fn fresh(pg: &Postgres, name: &str) -> Client {
    pg.create_database(name).await;
    let db = pg.client(name).await;
    db.batch_execute(&fencing_recipe())
        .await
        .expect("load the recipe");
    db.batch_execute(LEDGER).await.expect("ledger table");
    db
}

async fn tokens_in_commit_order(db: &Client, resource: &str) -> Vec<i64> {
    db.query(
        "SELECT token FROM ledger WHERE resource = $1 ORDER BY id",
        &[&resource],
    )
    .await
    .expect("read ledger")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[tokio::test]
async fn a_stale_token_is_refused_after_a_higher_one_and_writes_nothing() {
    let pg = Postgres::start();
    let mut db = fresh(&pg, "stale").await;
    let none = Duration::ZERO;
    assert_eq!(
        guarded_write(&mut db, "orders", 5, "a", none).await,
        Write::Accepted
    );
    assert_eq!(
        guarded_write(&mut db, "orders", 5, "a", none).await,
        Write::Accepted,
        "the same holder writes again with its token"
    );
    assert_eq!(
        guarded_write(&mut db, "orders", 7, "b", none).await,
        Write::Accepted
    );
    assert_eq!(
        guarded_write(&mut db, "orders", 5, "a", none).await,
        Write::Stale,
        "the old holder is refused after a newer one wrote"
    );
    assert_eq!(
        guarded_write(&mut db, "other", 1, "c", none).await,
        Write::Accepted,
        "resources are fenced independently"
    );
    assert_eq!(tokens_in_commit_order(&db, "orders").await, [5, 5, 7]);
    let floor: i64 = db
        .query_one(
            "SELECT token FROM targetlease_fence WHERE resource = 'orders'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(floor, 7);
}

#[tokio::test]
async fn tokens_are_exact_up_to_the_largest_and_invalid_ones_are_refused() {
    let pg = Postgres::start();
    let mut db = fresh(&pg, "exact").await;
    let none = Duration::ZERO;
    let max = i64::MAX; // targetlease's MAX_TOKEN
    assert_eq!(
        guarded_write(&mut db, "r", max - 1, "a", none).await,
        Write::Accepted
    );
    assert_eq!(
        guarded_write(&mut db, "r", max, "b", none).await,
        Write::Accepted
    );
    assert_eq!(
        guarded_write(&mut db, "r", max - 1, "a", none).await,
        Write::Stale,
        "2^63-2 is lower than 2^63-1: no rounding through a double"
    );
    assert_eq!(tokens_in_commit_order(&db, "r").await, [max - 1, max]);
    for bad in [0_i64, -1] {
        let err = db
            .execute("SELECT targetlease_fence('r2', $1)", &[&bad])
            .await
            .expect_err("an invalid token is refused");
        assert_eq!(err.code().unwrap().code(), "TLF02", "{err}");
    }
}

/// Many writers with shuffled tokens race on one resource, each holding its
/// transaction open between the fence and the write. Whatever the
/// interleaving, the tokens that committed are in non-decreasing order and
/// every refused token is below one that committed. An unguarded insert of
/// a lower token after a higher one shows the check can fail.
#[tokio::test]
async fn concurrent_writers_are_serialized_by_the_fence() {
    let pg = Arc::new(Postgres::start());
    let db = fresh(&pg, "race").await;
    let mut tokens: Vec<i64> = (1..=24).collect();
    // A fixed shuffle: lower tokens often start after higher ones.
    tokens.sort_by_key(|t| (t * 7919) % 24);
    let mut tasks = Vec::new();
    for (i, token) in tokens.iter().copied().enumerate() {
        let pg = pg.clone();
        tasks.push(tokio::spawn(async move {
            let mut db = pg.client("race").await;
            tokio::time::sleep(Duration::from_millis((i as u64 % 4) * 3)).await;
            let hold = Duration::from_millis(10 + (token as u64 % 5) * 5);
            let w = guarded_write(&mut db, "hot", token, &format!("w{token}"), hold).await;
            (token, w)
        }));
    }
    let mut refused = Vec::new();
    for t in tasks {
        let (token, w) = t.await.unwrap();
        if w == Write::Stale {
            refused.push(token);
        }
    }
    let committed = tokens_in_commit_order(&db, "hot").await;
    assert!(!committed.is_empty());
    assert!(
        committed.windows(2).all(|w| w[0] <= w[1]),
        "commit order must never see a token go down: {committed:?}"
    );
    let highest = *committed.last().unwrap();
    assert_eq!(highest, 24, "the highest token always gets in");
    for t in &refused {
        assert!(
            committed.iter().any(|c| c > t),
            "{t} refused without a higher commit"
        );
    }
    assert_eq!(committed.len() + refused.len(), 24, "every writer answered");

    // Positive control: without the fence call a lower token lands after a
    // higher one, and the same check sees it.
    let mut late = pg.client("race").await;
    for token in [10_i64, 3] {
        let tx = late.transaction().await.unwrap();
        tx.execute(
            "INSERT INTO ledger (resource, token, writer) VALUES ('cold', $1, 'unguarded')",
            &[&token],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    let unguarded = tokens_in_commit_order(&db, "cold").await;
    assert!(
        !unguarded.windows(2).all(|w| w[0] <= w[1]),
        "the check must see the unguarded decrease"
    );
}

/// A port found free can be taken before the postmaster binds it (tests and
/// fault harnesses start side by side): the cluster starts on another one.
#[tokio::test]
async fn the_server_starts_on_another_port_when_its_first_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_port = taken.local_addr().expect("addr").port();
    let mut first = Some(taken_port);
    let pg = tokio::task::spawn_blocking(move || {
        Postgres::start_on_ports(|| {
            first
                .take()
                .unwrap_or_else(support::valkey_server::free_port)
        })
    })
    .await
    .expect("start");
    assert_ne!(pg.port, taken_port);
    assert!(pg.log().contains("Address already in use"), "{}", pg.log());
    let db = pg.client("postgres").await;
    let one: i32 = db.query_one("SELECT 1", &[]).await.expect("query").get(0);
    assert_eq!(one, 1);
}
