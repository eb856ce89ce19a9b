//! Cluster routing: which node a request goes to, following `MOVED`, `ASK`
//! and `TRYAGAIN` (each an answer that it did not run), the slot map and its
//! refresh, and the pools per node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use super::super::client::{Pools, Route, Sent, Use, exchange, forget_if_not_primary};
use super::super::endpoint::Addr;
use super::super::error::{Error, Kind};
use super::super::pool::{Place, Pool};
use super::super::resp::{Cmd, Value};
use super::{Redirect, SlotMap, redirect};

/// The routing of a Valkey Cluster: the slot map, learned from the seeds
/// and kept up to date, and a pool per primary.
pub(in super::super) struct Router {
    seeds: Vec<Addr>,
    map: RwLock<SlotMap>,
    pools: Mutex<HashMap<Addr, Arc<Pool>>>,
    /// How to make a node's pool.
    make: Pools,
    stale: AtomicBool,
    refreshing: tokio::sync::Mutex<()>,
    /// Nodes whose last exchange failed (unreachable, closed, late): asked
    /// for the slot map only after the others.
    suspects: Mutex<Vec<Addr>>,
    /// Whether `suspects` may hold any (a call that succeeds skips its lock).
    any_suspects: AtomicBool,
}

/// Redirections one request follows in a row (`MOVED` after a resharding,
/// `ASK` then `MOVED` around a migration) before it pauses and starts again
/// from a fresh slot map.
const MAX_REDIRECTIONS: usize = 3;

/// Time a call restarted after a redirection loop must have left beyond
/// its pause (a slot map refresh and the call itself).
const RESTART_ROOM: Duration = Duration::from_millis(50);

/// The pause before the `n`th retry of a request answered `TRYAGAIN`: from
/// 5 ms, doubling to 100 ms, ±50 % jitter (a migration moves a slot's keys
/// in milliseconds to seconds; retries must not add to its load).
fn try_again_pause(n: u32) -> Duration {
    use rand::Rng;
    let base = Duration::from_millis(5 * 2u64.pow(n.min(5))).min(Duration::from_millis(100));
    base.mul_f64(rand::rng().random_range(0.5..1.5))
}

impl Router {
    /// A router that learns the map from `seeds` (at the first refresh).
    pub(in super::super) fn new(seeds: Vec<Addr>, make: Pools) -> Router {
        Router {
            seeds,
            map: RwLock::new(SlotMap::default()),
            pools: Mutex::new(HashMap::new()),
            make,
            stale: AtomicBool::new(true),
            refreshing: tokio::sync::Mutex::new(()),
            suspects: Mutex::new(Vec::new()),
            any_suspects: AtomicBool::new(false),
        }
    }

    /// Sends to the slot's owner (any primary for [`Route::Any`]),
    /// wherever the cluster redirects it.
    pub(in super::super) async fn send(
        &self,
        route: Route,
        how: Use,
        cmds: &[Cmd],
        deadline: Instant,
    ) -> Result<Sent, Error> {
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
                    Ok(sent) => {
                        self.suspect(&addr, false);
                        sent
                    }
                    Err(e) => {
                        // Our own pool being full says nothing of the node.
                        if e.kind != Kind::Busy {
                            self.suspect(&addr, true);
                        }
                        // The node may have failed over: learn the map again
                        // next time — not for a reply that is only late (an
                        // overloaded or silent node), which would send every
                        // caller of every shard to ask it for the map first.
                        if e.kind != Kind::Late {
                            self.stale.store(true, Ordering::SeqCst);
                        }
                        // Any primary will do: another one, if one is left.
                        if matches!(route, Route::Any)
                            && matches!(e.kind, Kind::Dial | Kind::Busy | Kind::Closed)
                            && Instant::now() < deadline
                        {
                            unreachable.push(addr);
                            let left = self
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
                self.stale.store(true, Ordering::SeqCst);
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
                // Nodes sending the slot to each other: a migration being
                // closed one node at a time (the source already names the
                // destination, which still names the source). Nothing ran:
                // again from a fresh map after a pause, until the deadline.
                // Not started again when the pause and a map refresh would
                // leave no time: the caller gets the redirection, not a
                // deadline met half-way through the refresh.
                let pause = try_again_pause(tries);
                if Instant::now() + pause + RESTART_ROOM >= deadline {
                    return Err(Error::new(
                        Kind::Redirected,
                        format!("too many redirections (last: {said}); the command never ran"),
                    ));
                }
                tries += 1;
                redirections = 0;
                self.stale.store(true, Ordering::SeqCst);
                tokio::time::sleep(pause).await;
                continue;
            }
            next = Some(match redirection {
                Redirect::Moved(slot, to) => {
                    self.map
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .moved(slot, to.clone());
                    self.stale.store(true, Ordering::SeqCst);
                    (to, false)
                }
                Redirect::Ask(_, to) => (to, true),
            });
        }
    }

    /// Notes whether the last exchange with `addr` failed.
    fn suspect(&self, addr: &Addr, failed: bool) {
        if !failed && !self.any_suspects.load(Ordering::Relaxed) {
            return;
        }
        let mut suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        let known = suspects.iter().position(|a| a == addr);
        match (failed, known) {
            (true, None) => suspects.push(addr.clone()),
            (false, Some(i)) => {
                suspects.swap_remove(i);
            }
            _ => {}
        }
        self.any_suspects
            .store(!suspects.is_empty(), Ordering::Relaxed);
    }

    /// The pool of the node at `addr` (made on first use).
    fn pool(&self, addr: &Addr) -> Arc<Pool> {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(addr.clone())
            .or_insert_with(|| self.make.pool(Place::Fixed(addr.clone())))
            .clone()
    }

    /// Every pool (to close).
    pub(in super::super) fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Every primary with its name and pool, refreshing a stale map first.
    pub(in super::super) async fn primaries(
        &self,
        deadline: Instant,
    ) -> Result<Vec<(String, Arc<Pool>)>, Error> {
        if self.stale.load(Ordering::SeqCst) {
            let _ = self.refresh(deadline).await;
        }
        let primaries = self
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .primaries();
        if primaries.is_empty() {
            return Err(Error::new(Kind::Dial, "no known cluster primary"));
        }
        Ok(primaries
            .iter()
            .map(|a| (a.to_string(), self.pool(a)))
            .collect())
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
    ) -> Result<Addr, Error> {
        for _ in 0..2 {
            if self.stale.load(Ordering::SeqCst) {
                // A failed refresh keeps the old map: it may still be right.
                if let Err(e) = self.refresh(deadline).await {
                    tracing::debug!(error = %e, "cluster slot map refresh failed");
                }
            }
            let map = self.map.read().unwrap_or_else(|p| p.into_inner());
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
            self.stale.store(true, Ordering::SeqCst);
        }
        Err(Error::new(Kind::Dial, "no cluster node serves the slot"))
    }

    /// Learns the slot map from the first node that answers `CLUSTER SLOTS`.
    pub(in super::super) async fn refresh(&self, deadline: Instant) -> Result<(), Error> {
        let _one_at_a_time = tokio::time::timeout_at(deadline, self.refreshing.lock())
            .await
            .map_err(|_| Error::new(Kind::Dial, "cluster topology: no turn in time"))?;
        if !self.stale.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut candidates = self
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .primaries();
        for s in &self.seeds {
            if !candidates.contains(s) {
                candidates.push(s.clone());
            }
        }
        // A node that just failed (a silent one, say) is asked last, so a
        // call to a healthy shard does not spend its time waiting on it.
        {
            let suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
            candidates.sort_by_key(|a| suspects.contains(a));
        }
        let mut why = Vec::new();
        let count = candidates.len();
        for (i, addr) in candidates.into_iter().enumerate() {
            // An equal share of the time left, so one silent node cannot use
            // up the caller's whole deadline before the others are asked.
            let left = deadline.saturating_duration_since(Instant::now());
            let by = Instant::now() + left / u32::try_from(count - i).unwrap_or(u32::MAX);
            let asked = async {
                let link = self.pool(&addr).link(by).await.map_err(|e| e.detail)?;
                let reply = link
                    .request(&[Cmd::new("CLUSTER").arg("SLOTS")], by)
                    .await
                    .map_err(|e| e.detail)?;
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
                    self.suspect(&addr, false);
                    // Pools of nodes that left the map go (their connections
                    // close once the requests still on them are done).
                    let primaries = map.primaries();
                    self.pools
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|a, _| primaries.contains(a));
                    {
                        let mut suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
                        suspects.retain(|a| primaries.contains(a) || self.seeds.contains(a));
                        self.any_suspects
                            .store(!suspects.is_empty(), Ordering::Relaxed);
                    }
                    *self.map.write().unwrap_or_else(|p| p.into_inner()) = map;
                    self.stale.store(false, Ordering::SeqCst);
                    return Ok(());
                }
                Err(e) => {
                    self.suspect(&addr, true);
                    why.push(e)
                }
            }
        }
        Err(Error::new(
            Kind::Dial,
            format!("cluster topology unknown: {}", why.join("; ")),
        ))
    }
}
