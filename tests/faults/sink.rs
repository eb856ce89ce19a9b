//! The PostgreSQL downstream: every workload write goes through the fencing
//! recipe users copy (`examples/fencing/postgresql.sql`), in one transaction
//! with the data row. Three deliberately broken variants are positive
//! controls: a table without the guard, the recipe itself broken (its
//! guard's comparison removed), and a writer that acknowledges before its
//! transaction commits (and then rolls it back).

use std::sync::Arc;

use tokio_postgres::Client;

use crate::history::{Answer, Row, Sink, WriteRecord, now_ms};
use crate::support::postgres::{Postgres, STALE_TOKEN_SQLSTATE, fencing_recipe};

const TABLE: &str = "CREATE TABLE fault_writes (
    seq bigserial PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL,
    write_id text NOT NULL UNIQUE, writer text NOT NULL)";

/// How the downstream treats the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// The recipe: `targetlease_fence` in the same transaction.
    Recipe,
    /// Control: no fence call at all.
    Unguarded,
    /// Control: the recipe's own function with the comparison of its guard
    /// removed, so that every token, lower ones too, becomes the floor.
    BrokenRecipe,
    /// Control: says "accepted" and then rolls the transaction back.
    AckBeforeCommit,
}

/// The recipe as `guard` loads it: as users copy it, or broken.
fn recipe(guard: Guard) -> String {
    let text = fencing_recipe();
    if guard != Guard::BrokenRecipe {
        return text;
    }
    // The line that keeps a lower token from becoming the floor.
    const CHECK: &str = "\n        WHERE f.token <= EXCLUDED.token;";
    assert!(
        text.contains(CHECK),
        "examples/fencing/postgresql.sql no longer has {CHECK:?}: control-recipe-broken \
         must break the recipe's guard as it is now"
    );
    text.replace(CHECK, ";")
}

/// One database for one run.
#[derive(Clone)]
pub struct PgSink {
    pg: Arc<Postgres>,
    db: String,
    guard: Guard,
}

impl PgSink {
    /// Creates the run's database with the recipe and the data table.
    pub async fn create(pg: Arc<Postgres>, db: &str, guard: Guard) -> Self {
        pg.create_database(db).await;
        let c = pg.client(db).await;
        c.batch_execute(&recipe(guard))
            .await
            .expect("load the fencing recipe");
        c.batch_execute(TABLE).await.expect("create the data table");
        Self {
            pg,
            db: db.to_string(),
            guard,
        }
    }

    /// libpq connection string of the run's database (for worker processes).
    pub fn conn_string(&self) -> String {
        self.pg.conn_string(&self.db)
    }

    /// A writer with its own connection.
    pub async fn writer(&self, name: &str) -> PgWriter {
        PgWriter {
            db: self.pg.client(&self.db).await,
            guard: self.guard,
            name: name.to_string(),
        }
    }

    /// Every row, in commit order per resource.
    pub async fn rows(&self) -> Vec<Row> {
        let c = self.pg.client(&self.db).await;
        c.query(
            "SELECT resource, seq, token, write_id FROM fault_writes ORDER BY seq",
            &[],
        )
        .await
        .expect("read the data table")
        .iter()
        .map(|r| Row {
            resource: r.get(0),
            seq: r.get(1),
            token: r.get::<_, i64>(2) as u64,
            write_id: r.get(3),
        })
        .collect()
    }
}

/// One client's connection to the downstream.
pub struct PgWriter {
    db: Client,
    guard: Guard,
    name: String,
}

impl PgWriter {
    /// A recipe writer on an existing connection (the holder worker's).
    pub fn from_client(db: Client, name: &str) -> Self {
        Self {
            db,
            guard: Guard::Recipe,
            name: name.to_string(),
        }
    }

    /// One fenced write of `write_id` with `token`; returns its record.
    pub async fn write(&mut self, resource: &str, token: u64, write_id: &str) -> WriteRecord {
        let invoke_ms = now_ms();
        let answer = self.attempt(resource, token as i64, write_id).await;
        WriteRecord {
            client: self.name.clone(),
            sink: Sink::Postgres,
            resource: resource.to_string(),
            token,
            write_id: write_id.to_string(),
            invoke_ms,
            complete_ms: now_ms(),
            answer,
            server_ms: 0,
        }
    }

    async fn attempt(&mut self, resource: &str, token: i64, write_id: &str) -> Answer {
        let Ok(tx) = self.db.transaction().await else {
            return Answer::Unavailable;
        };
        if self.guard != Guard::Unguarded
            && let Err(e) = tx
                .execute("SELECT targetlease_fence($1, $2)", &[&resource, &token])
                .await
        {
            return match e.code().map(|c| c.code()) {
                Some(STALE_TOKEN_SQLSTATE) => Answer::Said("refused".into()),
                // Nothing committed: the transaction is rolled back on drop.
                _ => Answer::Unavailable,
            };
        }
        let inserted = tx
            .execute(
                "INSERT INTO fault_writes (resource, token, write_id, writer) VALUES ($1, $2, $3, $4)",
                &[&resource, &token, &write_id, &self.name],
            )
            .await;
        if inserted.is_err() {
            return Answer::Unavailable;
        }
        if self.guard == Guard::AckBeforeCommit {
            let _ = tx.rollback().await;
            return Answer::Said("accepted".into());
        }
        match tx.commit().await {
            Ok(()) => Answer::Said("accepted".into()),
            Err(_) => Answer::Unknown,
        }
    }
}
