//! A few connections to one server, opened lazily and replaced when they break.
//!
//! Most calls share the pool's connections, pipelined: up to
//! `--pool-size` of them per server, each call going to the least loaded,
//! another opened only when every open one is busy. A call that blocks
//! its connection on the server (a durability `WAIT` after its script) takes
//! one for itself instead ([`Pool::exclusive`]), so it never holds up, or
//! fails, the calls of others; up to `--durable-pool-size` such connections
//! are in use or kept warm for reuse, so a steady durable workload opens no
//! new ones.
//!
//! After a failed connect, the next attempt waits (100ms doubling to 5s, with
//! jitter); calls in between fail at once with the last cause instead of
//! queueing behind a server that is not there.
//!
//! Every error here is one of nothing sent: [`Kind::Dial`] (no connection
//! could be opened), [`Kind::Busy`] (none became free in time) or
//! [`Kind::Closed`] (the pool is closed).

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;

use super::dial::{Conn, Dialer};
use super::endpoint::Addr;
use super::error::{Error, Kind};
use super::link::Link;

/// Where a pool's connections go.
#[derive(Clone, Debug)]
pub enum Place {
    /// A fixed server.
    Fixed(Addr),
    /// Whatever primary the Sentinels name at connect time.
    Sentinel {
        /// Sentinels to ask, in order.
        sentinels: Vec<Addr>,
        /// The monitored primary's name.
        service: String,
    },
}

/// Opens one connection (connected and logged in) for a pool, by a deadline.
pub trait Connector: Send + Sync {
    /// A new connection, or why there is none ([`Kind::Dial`]).
    fn open(&self, deadline: Instant) -> BoxFuture<'_, Result<Conn, Error>>;
}

/// The connector of a real deployment: `dialer` to `place`.
struct Dialing {
    place: Place,
    dialer: Dialer,
}

impl Connector for Dialing {
    fn open(&self, deadline: Instant) -> BoxFuture<'_, Result<Conn, Error>> {
        Box::pin(async move {
            match &self.place {
                Place::Fixed(addr) => self.dialer.connect(addr, deadline).await,
                Place::Sentinel { sentinels, service } => self
                    .dialer
                    .connect_primary(sentinels, service, deadline)
                    .await
                    .map(|(_, conn)| conn),
            }
        })
    }
}

/// Most durable-write connections one pool keeps (`--durable-pool-size`).
pub const MAX_EXCLUSIVE: usize = 64;

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How many connections a pool may have, and how busy one may get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Shared (pipelined) connections per server.
    pub shared: usize,
    /// Connections for durable writes per server, in use or kept warm.
    pub durable: usize,
    /// Requests queued or awaiting a reply on one connection.
    pub max_in_flight: usize,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            shared: 1,
            durable: 16,
            max_in_flight: 1024,
        }
    }
}

struct Backoff {
    delay: Duration,
    retry_at: Option<Instant>,
    last: Option<String>,
}

/// The shared connections, and how many are being opened.
#[derive(Default)]
struct Shared {
    links: Vec<Link>,
    opening: usize,
}

/// Connections to one place.
pub struct Pool {
    connector: Box<dyn Connector>,
    connect_timeout: Duration,
    sizes: Sizes,
    shared: Mutex<Shared>,
    /// Bumped whenever an open ends, for callers waiting on one.
    opened_one: watch::Sender<u64>,
    /// Connections this pool's client has opened (all pools of one client share it).
    opened: Counter,
    backoff: Mutex<Backoff>,
    /// Exclusive connections not in use.
    idle: Mutex<Vec<Link>>,
    /// One per exclusive connection in use.
    exclusive: Arc<Semaphore>,
}

/// A connection for one caller: shared (pipelined with others) or taken
/// for this caller alone until [`Checkout::give_back`].
pub struct Checkout {
    link: Link,
    home: Option<(Arc<Pool>, OwnedSemaphorePermit)>,
}

impl Checkout {
    /// A shared connection (nothing to give back).
    pub fn shared(link: Link) -> Checkout {
        Checkout { link, home: None }
    }

    /// The connection.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Done with it: an exclusive connection goes back to its pool, kept
    /// warm for the next caller, when it is healthy and nothing of its
    /// caller is still outstanding on it (a request that went late may still
    /// be running there). One dropped without this (its caller went away
    /// mid-call) is closed: something may still be running on it.
    pub fn give_back(mut self) {
        let Some((pool, _permit)) = self.home.take() else {
            return;
        };
        let idle_now = self.link.load() == 0 && !self.link.is_suspect();
        if idle_now && self.link.is_alive() && !pool.exclusive.is_closed() {
            let mut idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < pool.sizes.durable {
                idle.push(self.link.clone());
                return;
            }
        }
        self.link.close();
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if self.home.take().is_some() {
            self.link.close();
        }
    }
}

/// Gives back a place being opened, however the open ends.
struct Opening<'a>(&'a Pool);

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.0.shared_links().opening -= 1;
        self.0.opened_one.send_modify(|n| *n += 1);
    }
}

/// What a caller does about a shared connection.
enum Choice {
    Use(Link),
    Open(Option<Link>),
    Wait,
}

impl Pool {
    /// A pool of up to `sizes.shared` shared connections and `sizes.durable`
    /// exclusive ones to `place` (opened on first use), counting opens in `opened`.
    pub fn new(
        place: Place,
        dialer: Dialer,
        sizes: Sizes,
        connect_timeout: Duration,
        opened: Counter,
    ) -> Pool {
        let connector = Box::new(Dialing { place, dialer });
        Pool::with_connector(connector, sizes, connect_timeout, opened)
    }

    /// [`Pool::new`] with connections from `connector`.
    pub fn with_connector(
        connector: Box<dyn Connector>,
        sizes: Sizes,
        connect_timeout: Duration,
        opened: Counter,
    ) -> Pool {
        let sizes = Sizes {
            shared: sizes.shared.max(1),
            durable: sizes.durable.clamp(1, MAX_EXCLUSIVE),
            max_in_flight: sizes.max_in_flight.max(1),
        };
        Pool {
            connector,
            connect_timeout,
            sizes,
            shared: Mutex::new(Shared::default()),
            opened_one: watch::channel(0).0,
            opened,
            backoff: Mutex::new(Backoff {
                delay: BACKOFF_MIN,
                retry_at: None,
                last: None,
            }),
            idle: Mutex::new(Vec::new()),
            exclusive: Arc::new(Semaphore::new(sizes.durable)),
        }
    }

    fn shared_links(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection for this caller alone (an idle one, or a new one within
    /// the connect timeout and `deadline`), until [`Checkout::give_back`]. At
    /// most `sizes.durable` are in use at once; a caller beyond waits for
    /// one to come back, until its deadline.
    pub async fn exclusive(self: &Arc<Self>, deadline: Instant) -> Result<Checkout, Error> {
        let permit = tokio::time::timeout_at(deadline, self.exclusive.clone().acquire_owned())
            .await
            .map_err(|_| {
                Error::new(
                    Kind::Busy,
                    format!(
                        "all {} durable-write connections stayed busy (--durable-pool-size)",
                        self.sizes.durable
                    ),
                )
            })?
            .map_err(|_| pool_closed())?;
        let reuse = loop {
            let next = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match next {
                Some(link) if link.is_alive() => break Some(link),
                Some(link) => link.close(),
                None => break None,
            }
        };
        let link = match reuse {
            Some(link) => link,
            None => self.open(deadline).await?,
        };
        Ok(Checkout {
            link,
            home: Some((self.clone(), permit)),
        })
    }

    /// A shared connection: the least loaded of those open, or a new one
    /// (within the connect timeout and `deadline`) when every open one is
    /// busy and the pool has room. A connection checking a missed deadline
    /// is passed over while another will do.
    pub async fn link(&self, deadline: Instant) -> Result<Link, Error> {
        loop {
            let mut opened_one = self.opened_one.subscribe();
            let choice = {
                let mut s = self.shared_links();
                s.links.retain(Link::is_alive);
                let room = s.links.len() + s.opening < self.sizes.shared;
                let best = s
                    .links
                    .iter()
                    .filter(|l| !l.is_suspect())
                    .min_by_key(|l| l.load())
                    .cloned();
                match best {
                    Some(l) if l.load() == 0 || !room => Choice::Use(l),
                    _ if room => {
                        s.opening += 1;
                        Choice::Open(
                            best.or_else(|| s.links.iter().min_by_key(|l| l.load()).cloned()),
                        )
                    }
                    _ if s.opening > 0 => Choice::Wait,
                    // Every connection is checking a missed deadline and the
                    // pool is full: queue behind the least loaded one.
                    _ => match s.links.iter().min_by_key(|l| l.load()) {
                        Some(l) => Choice::Use(l.clone()),
                        None => Choice::Wait,
                    },
                }
            };
            match choice {
                Choice::Use(link) => return Ok(link),
                Choice::Wait => {
                    tokio::time::timeout_at(deadline, opened_one.changed())
                        .await
                        .map_err(|_| Error::new(Kind::Busy, "no connection became free in time"))?
                        .map_err(|_| pool_closed())?;
                }
                Choice::Open(fallback) => {
                    let _opening = Opening(self);
                    match self.open(deadline).await {
                        Ok(link) => {
                            self.shared_links().links.push(link.clone());
                            return Ok(link);
                        }
                        // A busy connection still beats none.
                        Err(e) => return fallback.filter(Link::is_alive).ok_or(e),
                    }
                }
            }
        }
    }

    /// Opens a connection (unless still backing off after a failure).
    async fn open(&self, deadline: Instant) -> Result<Link, Error> {
        self.check_backoff()?;
        let connect_by = deadline.min(Instant::now() + self.connect_timeout);
        match self.connector.open(connect_by).await {
            Ok(conn) => {
                self.connected();
                self.opened.inc();
                Ok(Link::start(conn, self.sizes.max_in_flight))
            }
            Err(e) => {
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Closes every connection (requests on them end as the link says;
    /// exclusive ones in use are closed when given back).
    pub async fn close(&self) {
        self.exclusive.close();
        let links = std::mem::take(&mut self.shared_links().links);
        for l in links {
            l.close();
        }
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        for l in idle {
            l.close();
        }
    }

    fn check_backoff(&self) -> Result<(), Error> {
        let b = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        match (b.retry_at, &b.last) {
            (Some(at), Some(last)) if Instant::now() < at => Err(Error::new(
                Kind::Dial,
                format!(
                    "{last} (next attempt in {}ms)",
                    at.saturating_duration_since(Instant::now()).as_millis()
                ),
            )),
            _ => Ok(()),
        }
    }

    fn connected(&self) {
        let mut b = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        b.delay = BACKOFF_MIN;
        b.retry_at = None;
        b.last = None;
    }

    fn failed(&self, e: &Error) {
        let mut b = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        let jitter = rand::rng().random_range(0.8..1.2);
        b.retry_at = Some(Instant::now() + b.delay.mul_f64(jitter));
        b.delay = (b.delay * 2).min(BACKOFF_MAX);
        b.last = Some(e.detail.clone());
    }
}

fn pool_closed() -> Error {
    Error::new(Kind::Closed, "the connection pool is closed")
}
