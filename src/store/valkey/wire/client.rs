//! The client of one deployment: pools per server and the one rule about
//! re-sending, whatever the topology; where a request goes is the
//! topology's business ([`super::standalone`] for a server or a
//! Sentinel-managed primary, [`super::cluster`] for a Cluster).
//!
//! A request is re-sent only after an answer that proves it did not run:
//! `MOVED` and `ASK` (the cluster refuses before running; outside a cluster
//! they are a definite refusal: the URL points at a cluster node), and
//! `TRYAGAIN` (a migrating slot), within the caller's deadline. A broken
//! connection or a missing reply is reported to the caller as it is
//! ([`Kind::Lost`], [`Kind::Late`]); deciding to retry, with the same
//! request id, is the caller's business. A request that never left its
//! connection's queue before that connection closed ([`Kind::Closed`])
//! cannot have run: it goes once more, on another connection, within its
//! deadline. "Function not found", the other "did not run" answer, is
//! handled one layer up, where the lease library is known.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::cluster::routing::Router;
use super::dial::Dialer;
use super::endpoint::{Endpoint, Topology};
use super::error::{Error, Kind};
use super::link::Link;
use super::pool::{Checkout, Place, Pool, Sizes};
use super::resp::{Cmd, Value};
use super::standalone::Single;

/// Which server a request goes to.
#[derive(Clone, Copy, Debug)]
pub enum Route {
    /// The primary serving this cluster slot (the only primary elsewhere).
    Slot(u16),
    /// Any primary.
    Any,
}

/// How a request uses its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Pipelined with other callers' requests.
    Shared,
    /// Alone, until given back: for a script followed by a blocking
    /// durability wait, which must run on the same connection and must not
    /// hold up anyone else.
    Exclusive,
}

/// A request's replies and the connection that carried them (where a
/// script ran, and so where its durability wait must run).
pub struct Sent {
    /// One reply per command.
    pub replies: Vec<Value>,
    /// The connection the final copy went over (give it back when done).
    pub link: Checkout,
}

/// How to make a pool for a server: one set of settings for every pool of
/// a client, and one count of the connections they open.
#[derive(Clone)]
pub(super) struct Pools {
    dialer: Dialer,
    sizes: Sizes,
    connect_timeout: Duration,
    opened: Counter,
}

impl Pools {
    /// A new pool of connections to `place`.
    pub(super) fn pool(&self, place: Place) -> Arc<Pool> {
        Arc::new(Pool::new(
            place,
            self.dialer.clone(),
            self.sizes,
            self.connect_timeout,
            self.opened.clone(),
        ))
    }
}

/// Takes a connection of `pool` as `how` says.
async fn take(pool: &Arc<Pool>, how: Use, deadline: Instant) -> Result<Checkout, Error> {
    match how {
        Use::Shared => pool.link(deadline).await.map(Checkout::shared),
        Use::Exclusive => pool.exclusive(deadline).await,
    }
}

/// Takes a connection of `pool` and sends `cmds` on it. A request that a
/// connection closed before writing (it never left the queue, so it cannot
/// have run) goes once more, on another connection.
pub(super) async fn exchange(
    pool: &Arc<Pool>,
    how: Use,
    cmds: &[Cmd],
    deadline: Instant,
) -> Result<(Checkout, Vec<Value>), Error> {
    let mut again = true;
    loop {
        let held = take(pool, how, deadline).await?;
        match held.link().request(cmds, deadline).await {
            Ok(replies) => return Ok((held, replies)),
            Err(e) if e.kind == Kind::Closed && again => again = false,
            Err(e) => return Err(e),
        }
    }
}

/// Where requests go: the topology's routing.
enum Routing {
    /// One primary (a server, or the one the Sentinels name).
    Single(Single),
    /// A Valkey Cluster (boxed: its slot map and pools are large).
    Cluster(Box<Router>),
}

/// Connections to one deployment.
pub struct Client {
    routing: Routing,
    /// Connections opened by every pool, since connecting.
    opened: Counter,
}

impl Client {
    /// Opens the first connection (and, in a cluster, learns the slot map)
    /// within `connect_timeout`.
    pub async fn connect(
        endpoint: &Endpoint,
        dialer: Dialer,
        sizes: Sizes,
        connect_timeout: Duration,
    ) -> Result<Client, Error> {
        let deadline = Instant::now() + connect_timeout;
        let opened = Counter::default();
        let pools = Pools {
            dialer,
            sizes,
            connect_timeout,
            opened: opened.clone(),
        };
        let routing = match &endpoint.topology {
            Topology::Standalone(addr) => {
                Routing::Single(Single::new(pools.pool(Place::Fixed(addr.clone()))))
            }
            Topology::Sentinel { sentinels, service } => {
                Routing::Single(Single::new(pools.pool(Place::Sentinel {
                    sentinels: sentinels.clone(),
                    service: service.clone(),
                })))
            }
            Topology::Cluster(seeds) => {
                Routing::Cluster(Box::new(Router::new(seeds.clone(), pools)))
            }
        };
        match &routing {
            Routing::Single(single) => single.connect(deadline).await?,
            Routing::Cluster(router) => router.refresh(deadline).await?,
        }
        Ok(Client { routing, opened })
    }

    /// Connections opened since connecting (shared and exclusive, every server).
    pub fn connections_opened(&self) -> u64 {
        self.opened.get()
    }

    /// The counter behind [`Client::connections_opened`], for a metrics registry.
    pub fn connections_counter(&self) -> Counter {
        self.opened.clone()
    }

    /// True for a Valkey Cluster.
    pub fn is_clustered(&self) -> bool {
        matches!(self.routing, Routing::Cluster(_))
    }

    /// Sends `cmds` pipelined on one connection (taken as `how` says) and
    /// waits for their replies until `deadline`. A single command answered
    /// `MOVED`/`ASK` is re-sent where the cluster says (it did not run);
    /// outside a cluster that answer is a definite refusal.
    pub async fn send(
        &self,
        route: Route,
        how: Use,
        cmds: &[Cmd],
        deadline: Instant,
    ) -> Result<Sent, Error> {
        match &self.routing {
            Routing::Single(single) => single.send(how, cmds, deadline).await,
            Routing::Cluster(router) => router.send(route, how, cmds, deadline).await,
        }
    }

    /// Every primary with its name: the server, or each Cluster primary
    /// (refreshing a stale slot map first).
    async fn primaries(&self, deadline: Instant) -> Result<Vec<(String, Arc<Pool>)>, Error> {
        match &self.routing {
            Routing::Single(single) => Ok(single.primaries()),
            Routing::Cluster(router) => router.primaries(deadline).await,
        }
    }

    /// Sends `cmds` to every primary (one connection each, in parallel).
    pub async fn send_to_primaries(
        &self,
        cmds: &[Cmd],
        deadline: Instant,
    ) -> Result<Vec<(String, Result<Sent, Error>)>, Error> {
        let targets = self.primaries(deadline).await?;
        let calls = targets.into_iter().map(|(name, pool)| async move {
            let sent = async {
                let link = pool.link(deadline).await?;
                let replies = link.request(cmds, deadline).await?;
                Ok(Sent {
                    replies,
                    link: Checkout::shared(link),
                })
            };
            (name, sent.await)
        });
        Ok(futures::future::join_all(calls).await)
    }

    /// Every key matching `pattern` on every primary (`SCAN … MATCH`, cursor
    /// by cursor, whatever the key's type), within the deadline. A key may appear twice
    /// (SCAN's guarantee); callers dedupe.
    pub async fn scan_primaries(
        &self,
        pattern: &str,
        deadline: Instant,
    ) -> Result<Vec<String>, Error> {
        let pools = self.primaries(deadline).await?;
        let scans = pools.into_iter().map(|(_, pool)| async move {
            let link = pool.link(deadline).await?;
            let mut keys = Vec::new();
            let mut cursor = "0".to_owned();
            loop {
                let cmd = Cmd::new("SCAN")
                    .arg(&cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg("1000");
                let mut replies = link.request(std::slice::from_ref(&cmd), deadline).await?;
                let page = match replies.pop() {
                    Some(Value::Array(page)) if page.len() == 2 => page,
                    Some(Value::Error(e)) => {
                        let hint = if e.starts_with("NOPERM") {
                            " (the ACL user needs +scan to list)"
                        } else {
                            ""
                        };
                        return Err(Error::new(
                            Kind::Refused,
                            format!("valkey refused SCAN: {e}{hint}"),
                        ));
                    }
                    other => {
                        return Err(Error::new(
                            Kind::Refused,
                            format!("unexpected SCAN reply {other:?}"),
                        ));
                    }
                };
                cursor = page[0].text().unwrap_or_default();
                if let Value::Array(found) = &page[1] {
                    keys.extend(found.iter().filter_map(Value::text));
                }
                if cursor == "0" || cursor.is_empty() {
                    break;
                }
            }
            Checkout::shared(link).give_back();
            Ok::<_, Error>(keys)
        });
        let mut all = Vec::new();
        for keys in futures::future::join_all(scans).await {
            all.extend(keys?);
        }
        Ok(all)
    }

    /// Closes every connection.
    pub async fn close(&self) {
        let pools = match &self.routing {
            Routing::Single(single) => single.pools(),
            Routing::Cluster(router) => router.pools(),
        };
        for p in pools {
            p.close().await;
        }
    }
}

/// A `READONLY` answer means this connection reaches a replica now (a
/// failover happened): retire it, so the next call finds the primary again
/// (Sentinel asks again, Cluster relearns its map), while the requests
/// already on it still get their (definite) answers.
pub(in crate::store::valkey) fn forget_if_not_primary(link: &Link, replies: &[Value]) -> bool {
    let demoted = replies
        .iter()
        .any(|r| matches!(r, Value::Error(e) if e.starts_with("READONLY")));
    if demoted {
        link.retire();
    }
    demoted
}
