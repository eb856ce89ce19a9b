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

use super::cluster::{Redirect, SlotMap, redirect};
use super::dial::{DialError, Dialer, first_words};
use super::endpoint::{Addr, Endpoint, Topology};
use super::link::{Link, LinkError};
use super::pool::{Held, Place, Pool, Sizes};
use super::resp::{Cmd, Value};

/// Redirections one request may follow (`MOVED` after a resharding, `ASK`
/// then `MOVED` around a migration).
const MAX_REDIRECTIONS: usize = 3;

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

/// The pause before the `n`th retry of a request answered `TRYAGAIN`: from
/// 5 ms, doubling to 100 ms, ±50 % jitter (a migration moves a slot's keys
/// in milliseconds to seconds; retries must not add to its load).
fn try_again_pause(n: u32) -> Duration {
    use rand::Rng;
    let base = Duration::from_millis(5 * 2u64.pow(n.min(5))).min(Duration::from_millis(100));
    base.mul_f64(rand::rng().random_range(0.5..1.5))
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
        let mut next: Option<(Addr, bool)> = None;
        let mut redirections = 0;
        let mut tries = 0;
        // Route::Any: primaries that could not be reached, tried no more.
        let mut unreachable: Vec<Addr> = Vec::new();
        loop {
            let (addr, asking) = match next.take() {
                Some(t) => t,
                None => (self.owner(route, &unreachable, deadline).await?, false),
            };
            let mut request = Vec::with_capacity(cmds.len() + 1);
            if asking {
                request.push(Cmd::new("ASKING"));
            }
            request.extend_from_slice(cmds);
            let (link, mut replies) =
                match exchange(&self.pool(&addr), how, &request, deadline).await {
                    Ok(sent) => sent,
                    Err(e) => {
                        // The node may have failed over: learn the map again
                        // next time — not for a reply that is only late (an
                        // overloaded or silent node), which would send every
                        // caller of every shard to ask it for the map first.
                        if !matches!(e, SendError::Late) {
                            router.stale.store(true, Ordering::SeqCst);
                        }
                        // Any primary will do: another one, if one is left.
                        if matches!(route, Route::Any)
                            && matches!(e, SendError::NotSent(_))
                            && Instant::now() < deadline
                        {
                            unreachable.push(addr);
                            let left = router
                                .map
                                .read()
                                .unwrap_or_else(|p| p.into_inner())
                                .primaries()
                                .into_iter()
                                .any(|a| !unreachable.contains(&a));
                            if left {
                                continue;
                            }
                        }
                        return Err(e);
                    }
                };
            if asking {
                replies.remove(0);
            }
            if forget_if_not_primary(link.link(), &replies) {
                router.stale.store(true, Ordering::SeqCst);
            }
            let moved = match (cmds.len(), replies.first()) {
                (1, Some(Value::Error(e))) => redirect(e, &addr).map(|r| (r, e.clone())),
                _ => None,
            };
            let Some((redirection, said)) = moved else {
                // TRYAGAIN: the slot is migrating and this script's keys are
                // split between the two nodes (or new on the importing one).
                // Nothing ran: again from the slot's owner, until the deadline,
                // then the refusal as it is.
                if let (1, Some(Value::Error(e))) = (cmds.len(), replies.first())
                    && e.split_whitespace().next() == Some("TRYAGAIN")
                {
                    let pause = try_again_pause(tries);
                    if Instant::now() + pause < deadline {
                        link.give_back();
                        tries += 1;
                        // The ASK that leads back here is not a redirection loop.
                        redirections = 0;
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                }
                return Ok(Sent { replies, link });
            };
            link.give_back();
            redirections += 1;
            if redirections > MAX_REDIRECTIONS {
                return Err(SendError::Redirected(format!(
                    "too many redirections (last: {said}); the command never ran"
                )));
            }
            next = Some(match redirection {
                Redirect::Moved(slot, to) => {
                    router
                        .map
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .moved(slot, to.clone());
                    router.stale.store(true, Ordering::SeqCst);
                    (to, false)
                }
                Redirect::Ask(_, to) => (to, true),
            });
        }
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

    fn pool(&self, addr: &Addr) -> Arc<Pool> {
        match &self.kind {
            Kind::Single(p) => p.clone(),
            Kind::Cluster(r) => r
                .pools
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(addr.clone())
                .or_insert_with(|| {
                    Arc::new(Pool::new(
                        Place::Fixed(addr.clone()),
                        self.dialer.clone(),
                        self.sizes,
                        self.connect_timeout,
                        self.opened.clone(),
                    ))
                })
                .clone(),
        }
    }

    /// The cluster primary for `route`, refreshing a stale slot map first. A
    /// slot the map has no owner for (a node that had not heard of a change
    /// yet answered the last refresh) is looked up once more after a refresh,
    /// and leaves the map stale for the next call if still unserved.
    async fn owner(
        &self,
        route: Route,
        unreachable: &[Addr],
        deadline: Instant,
    ) -> Result<Addr, SendError> {
        let Kind::Cluster(router) = &self.kind else {
            unreachable!("owner() is only asked in a cluster");
        };
        for _ in 0..2 {
            if router.stale.load(Ordering::SeqCst) {
                // A failed refresh keeps the old map: it may still be right.
                if let Err(e) = self.refresh(deadline).await {
                    tracing::debug!(error = %e.0, "cluster slot map refresh failed");
                }
            }
            let map = router.map.read().unwrap_or_else(|p| p.into_inner());
            let found = match route {
                Route::Slot(slot) => map.owner(slot).cloned(),
                Route::Any => map
                    .primaries()
                    .into_iter()
                    .find(|a| !unreachable.contains(a)),
            };
            if let Some(addr) = found {
                return Ok(addr);
            }
            router.stale.store(true, Ordering::SeqCst);
        }
        Err(SendError::NotSent("no cluster node serves the slot".into()))
    }

    /// Learns the slot map from the first node that answers `CLUSTER SLOTS`.
    async fn refresh(&self, deadline: Instant) -> Result<(), DialError> {
        let Kind::Cluster(router) = &self.kind else {
            return Ok(());
        };
        let _one_at_a_time = tokio::time::timeout_at(deadline, router.refreshing.lock())
            .await
            .map_err(|_| DialError("cluster topology: no turn in time".into()))?;
        if !router.stale.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut candidates = router
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .primaries();
        for s in &router.seeds {
            if !candidates.contains(s) {
                candidates.push(s.clone());
            }
        }
        let mut why = Vec::new();
        let count = candidates.len();
        for (i, addr) in candidates.into_iter().enumerate() {
            // An equal share of the time left, so one silent node cannot use
            // up the caller's whole deadline before the others are asked.
            let left = deadline.saturating_duration_since(Instant::now());
            let by = Instant::now() + left / u32::try_from(count - i).unwrap_or(u32::MAX);
            let asked = async {
                let link = self.pool(&addr).link(by).await.map_err(|e| e.0)?;
                let reply = link
                    .request(&[Cmd::new("CLUSTER").arg("SLOTS")], by)
                    .await
                    .map_err(|e| link_text(&e))?;
                match reply.first() {
                    Some(Value::Error(e)) => Err(format!("{addr}: {e}")),
                    Some(v) => SlotMap::from_cluster_slots(v, &addr)
                        .filter(|m| !m.primaries().is_empty())
                        .ok_or_else(|| format!("{addr}: unreadable CLUSTER SLOTS reply")),
                    None => Err(format!("{addr}: no reply")),
                }
            };
            match asked.await {
                Ok(map) => {
                    // Pools of nodes that left the map go (their connections
                    // close once the requests still on them are done).
                    let primaries = map.primaries();
                    router
                        .pools
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|a, _| primaries.contains(a));
                    *router.map.write().unwrap_or_else(|p| p.into_inner()) = map;
                    router.stale.store(false, Ordering::SeqCst);
                    return Ok(());
                }
                Err(e) => why.push(e),
            }
        }
        Err(DialError(format!(
            "cluster topology unknown: {}",
            why.join("; ")
        )))
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

fn from_link(e: LinkError) -> SendError {
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
