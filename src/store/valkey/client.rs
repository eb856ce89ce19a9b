//! The connection side of the store: pools per server, Sentinel discovery,
//! Cluster routing, and the one rule about re-sending.
//!
//! A request is re-sent only after an answer that proves it did not run:
//! `MOVED` and `ASK` (the cluster refuses before running; outside a cluster
//! they are a definite refusal: the URL points at a cluster node), and
//! `TRYAGAIN` (a migrating slot), within the caller's deadline. A broken
//! connection or a missing reply is reported to the caller as it is
//! ([`SendError::Lost`]); deciding to retry, with the same request id, is the
//! caller's business. A request that never left its connection's queue
//! before that connection closed cannot have run: it goes once more, on
//! another connection, within its deadline. `NOSCRIPT`, the other "did not run" answer, is handled
//! one layer up, where the script source is known.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::cluster::SlotMap;
use super::dial::{DialError, Dialer, first_words};
use super::endpoint::{Addr, Endpoint, Topology};
use super::link::{Link, LinkError};
use super::pool::{Held, Place, Pool, Sizes};
use super::resp::{Cmd, Value};

mod routing;

/// Which server a request goes to.
#[derive(Clone, Copy, Debug)]
pub enum Route {
    /// The primary serving this cluster slot (the only primary elsewhere).
    Slot(u16),
    /// Any primary.
    Any,
}

/// Why a request has no reply.
#[derive(Clone, Debug)]
pub enum SendError {
    /// Nothing was written: no connection could be had, or the request never
    /// left the queue. It cannot have run.
    NotSent(String),
    /// It was written (or may have been) and no complete reply came: it may have run.
    Lost(String),
    /// It was written and no reply came before the deadline: it may have run.
    Late,
    /// Every copy was answered `MOVED`/`ASK` until the limit: none ran.
    Redirected(String),
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
    pub link: Held,
}

/// Takes a connection of `pool` as `how` says.
async fn take(pool: &Arc<Pool>, how: Use, deadline: Instant) -> Result<Held, DialError> {
    match how {
        Use::Shared => pool.link(deadline).await.map(Held::shared),
        Use::Exclusive => pool.exclusive(deadline).await,
    }
}

/// Takes a connection of `pool` and sends `cmds` on it. A request that a
/// connection closed before writing (it never left the queue, so it cannot
/// have run) goes once more, on another connection.
async fn exchange(
    pool: &Arc<Pool>,
    how: Use,
    cmds: &[Cmd],
    deadline: Instant,
) -> Result<(Held, Vec<Value>), SendError> {
    let mut again = true;
    loop {
        let held = take(pool, how, deadline)
            .await
            .map_err(|e| SendError::NotSent(e.0))?;
        match held.link().request(cmds, deadline).await {
            Ok(replies) => return Ok((held, replies)),
            Err(LinkError::Requeue(_)) if again => again = false,
            Err(e) => return Err(from_link(e)),
        }
    }
}

enum Kind {
    Single(Arc<Pool>),
    Cluster(Router),
}

struct Router {
    seeds: Vec<Addr>,
    map: RwLock<SlotMap>,
    pools: Mutex<HashMap<Addr, Arc<Pool>>>,
    stale: AtomicBool,
    refreshing: tokio::sync::Mutex<()>,
}

/// Connections to one deployment.
pub struct Client {
    kind: Kind,
    dialer: Dialer,
    sizes: Sizes,
    connect_timeout: Duration,
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
    ) -> Result<Client, DialError> {
        let deadline = Instant::now() + connect_timeout;
        let opened = Counter::default();
        let single = |place| {
            Kind::Single(Arc::new(Pool::new(
                place,
                dialer.clone(),
                sizes,
                connect_timeout,
                opened.clone(),
            )))
        };
        let kind = match &endpoint.topology {
            Topology::Standalone(addr) => single(Place::Fixed(addr.clone())),
            Topology::Sentinel { sentinels, service } => single(Place::Sentinel {
                sentinels: sentinels.clone(),
                service: service.clone(),
            }),
            Topology::Cluster(seeds) => Kind::Cluster(Router {
                seeds: seeds.clone(),
                map: RwLock::new(SlotMap::default()),
                pools: Mutex::new(HashMap::new()),
                stale: AtomicBool::new(true),
                refreshing: tokio::sync::Mutex::new(()),
            }),
        };
        let client = Client {
            kind,
            dialer,
            sizes,
            connect_timeout,
            opened,
        };
        match &client.kind {
            Kind::Single(pool) => {
                pool.link(deadline).await?;
            }
            Kind::Cluster(_) => client.refresh(deadline).await?,
        }
        Ok(client)
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
        matches!(self.kind, Kind::Cluster(_))
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
    ) -> Result<Sent, SendError> {
        let router = match &self.kind {
            Kind::Single(pool) => {
                let (link, replies) = exchange(pool, how, cmds, deadline).await?;
                forget_if_not_primary(link.link(), &replies);
                if let (1, Some(Value::Error(e))) = (cmds.len(), replies.first())
                    && matches!(e.split_whitespace().next(), Some("MOVED" | "ASK"))
                {
                    link.give_back();
                    return Err(SendError::Redirected(format!(
                        "the server is a Valkey Cluster node (it answered {}); use a \
                         redis-cluster:// URL. The command did not run",
                        first_words(e)
                    )));
                }
                return Ok(Sent { replies, link });
            }
            Kind::Cluster(router) => router,
        };
        self.send_routed(router, route, how, cmds, deadline).await
    }

    /// Every primary with its name: the server, or each Cluster primary
    /// (refreshing a stale slot map first).
    async fn primaries(&self, deadline: Instant) -> Result<Vec<(String, Arc<Pool>)>, SendError> {
        match &self.kind {
            Kind::Single(pool) => Ok(vec![("the server".into(), pool.clone())]),
            Kind::Cluster(router) => {
                if router.stale.load(Ordering::SeqCst) {
                    let _ = self.refresh(deadline).await;
                }
                let primaries = router
                    .map
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .primaries();
                if primaries.is_empty() {
                    return Err(SendError::NotSent("no known cluster primary".into()));
                }
                Ok(primaries
                    .iter()
                    .map(|a| (a.to_string(), self.pool(a)))
                    .collect())
            }
        }
    }

    /// Sends `cmds` to every primary (one connection each, in parallel).
    pub async fn send_to_primaries(
        &self,
        cmds: &[Cmd],
        deadline: Instant,
    ) -> Result<Vec<(String, Result<Sent, SendError>)>, SendError> {
        let targets = self.primaries(deadline).await?;
        let calls = targets.into_iter().map(|(name, pool)| async move {
            let sent = async {
                let link = pool
                    .link(deadline)
                    .await
                    .map_err(|e| SendError::NotSent(e.0))?;
                let replies = link.request(cmds, deadline).await.map_err(from_link)?;
                Ok(Sent {
                    replies,
                    link: Held::shared(link),
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
    ) -> Result<Vec<String>, SendError> {
        let pools = self.primaries(deadline).await?;
        let scans = pools.into_iter().map(|(_, pool)| async move {
            let link = pool
                .link(deadline)
                .await
                .map_err(|e| SendError::NotSent(e.0))?;
            let mut keys = Vec::new();
            let mut cursor = "0".to_owned();
            loop {
                let cmd = Cmd::new("SCAN")
                    .arg(&cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg("1000");
                let mut replies = link
                    .request(std::slice::from_ref(&cmd), deadline)
                    .await
                    .map_err(from_link)?;
                let page = match replies.pop() {
                    Some(Value::Array(page)) if page.len() == 2 => page,
                    Some(Value::Error(e)) => {
                        let hint = if e.starts_with("NOPERM") {
                            " (the ACL user needs +scan to list)"
                        } else {
                            ""
                        };
                        return Err(SendError::NotSent(format!(
                            "valkey refused SCAN: {e}{hint}"
                        )));
                    }
                    other => {
                        return Err(SendError::NotSent(format!(
                            "unexpected SCAN reply {other:?}"
                        )));
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
            Held::shared(link).give_back();
            Ok::<_, SendError>(keys)
        });
        let mut all = Vec::new();
        for keys in futures::future::join_all(scans).await {
            all.extend(keys?);
        }
        Ok(all)
    }

    /// Closes every connection.
    pub async fn close(&self) {
        let pools: Vec<Arc<Pool>> = match &self.kind {
            Kind::Single(p) => vec![p.clone()],
            Kind::Cluster(r) => r
                .pools
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .cloned()
                .collect(),
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
fn forget_if_not_primary(link: &Link, replies: &[Value]) -> bool {
    let demoted = replies
        .iter()
        .any(|r| matches!(r, Value::Error(e) if e.starts_with("READONLY")));
    if demoted {
        link.retire();
    }
    demoted
}

pub(super) fn from_link(e: LinkError) -> SendError {
    match e {
        LinkError::NotSent(why) | LinkError::Requeue(why) => SendError::NotSent(why),
        LinkError::Lost(why) => SendError::Lost(why),
        LinkError::Late => SendError::Late,
    }
}

fn link_text(e: &LinkError) -> String {
    match e {
        LinkError::NotSent(w) | LinkError::Requeue(w) | LinkError::Lost(w) => w.clone(),
        LinkError::Late => "no reply in time".into(),
    }
}
