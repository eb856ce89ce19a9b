//! Routing with one primary: a fixed server, or whichever primary the
//! Sentinels name (`sentinel.rs`; the pool asks them again whenever it
//! opens a connection). Every request goes to the one pool; a `READONLY`
//! answer (the server became a replica) retires the connection so the next
//! one finds the primary again, and `MOVED`/`ASK` (the URL names a Cluster
//! node) is a definite refusal: nothing ran.

use std::sync::Arc;

use tokio::time::Instant;

use super::client::{Sent, Use, exchange, forget_if_not_primary};
use super::dial::first_words;
use super::error::{Error, Kind};
use super::pool::Pool;
use super::resp::{Cmd, Value};

/// The routing of a deployment with one primary.
pub(super) struct Single {
    pool: Arc<Pool>,
}

impl Single {
    /// Every request to `pool`.
    pub(super) fn new(pool: Arc<Pool>) -> Single {
        Single { pool }
    }

    /// Opens the first connection by `deadline`.
    pub(super) async fn connect(&self, deadline: Instant) -> Result<(), Error> {
        self.pool.link(deadline).await.map(drop)
    }

    /// Sends `cmds` on a connection taken as `how` says.
    pub(super) async fn send(
        &self,
        how: Use,
        cmds: &[Cmd],
        deadline: Instant,
    ) -> Result<Sent, Error> {
        let (link, replies) = exchange(&self.pool, how, cmds, deadline).await?;
        forget_if_not_primary(link.link(), &replies);
        if let (1, Some(Value::Error(e))) = (cmds.len(), replies.first())
            && matches!(e.split_whitespace().next(), Some("MOVED" | "ASK"))
        {
            link.give_back();
            return Err(Error::new(
                Kind::Redirected,
                format!(
                    "the server is a Valkey Cluster node (it answered {}); use a \
                     redis-cluster:// URL. The command did not run",
                    first_words(e)
                ),
            ));
        }
        Ok(Sent { replies, link })
    }

    /// The one primary, named for messages.
    pub(super) fn primaries(&self) -> Vec<(String, Arc<Pool>)> {
        vec![("the server".into(), self.pool.clone())]
    }

    /// Every pool (to close).
    pub(super) fn pools(&self) -> Vec<Arc<Pool>> {
        vec![self.pool.clone()]
    }
}
