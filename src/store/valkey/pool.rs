//! A few connections to one server, opened lazily and replaced when they break.
//!
//! Most calls share the pool's connections, pipelined. A call that blocks
//! its connection on the server (a durability `WAIT` after its script) takes
//! one for itself instead ([`Pool::exclusive`]), so it never holds up, or
//! fails, the calls of others; such connections are kept for reuse, up to
//! the pool size, and at most [`MAX_EXCLUSIVE`] are open at once.
//!
//! After a failed connect, the next attempt waits (100ms doubling to 5s, with
//! jitter); calls in between fail at once with the last cause instead of
//! queueing behind a server that is not there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::dial::{DialError, Dialer};
use super::endpoint::Addr;
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

/// Connections taken one caller at a time, open at once to one server.
pub const MAX_EXCLUSIVE: usize = 64;

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

struct Backoff {
    delay: Duration,
    retry_at: Option<Instant>,
    last: Option<String>,
}

/// Connections to one place.
pub struct Pool {
    place: Place,
    dialer: Dialer,
    connect_timeout: Duration,
    slots: Vec<tokio::sync::Mutex<Option<Link>>>,
    next: AtomicUsize,
    backoff: Mutex<Backoff>,
    /// Exclusive connections not in use.
    idle: Mutex<Vec<Link>>,
    /// One per exclusive connection in use.
    exclusive: Arc<Semaphore>,
}

/// A connection for one caller: shared (pipelined with others) or taken
/// for this caller alone until [`Held::give_back`].
pub struct Held {
    link: Link,
    home: Option<(Arc<Pool>, OwnedSemaphorePermit)>,
}

impl Held {
    /// A shared connection (nothing to give back).
    pub fn shared(link: Link) -> Held {
        Held { link, home: None }
    }

    /// The connection.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Done with it: an exclusive connection goes back to its pool for the
    /// next caller when it is still healthy. One dropped without this (its
    /// caller went away mid-call) is closed: something may still be running on it.
    pub fn give_back(mut self) {
        let Some((pool, _permit)) = self.home.take() else {
            return;
        };
        if self.link.is_alive() && !pool.exclusive.is_closed() {
            let mut idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < pool.slots.len() {
                idle.push(self.link.clone());
                return;
            }
        }
        // Every request of its caller is answered: nothing is cut short.
        self.link.close();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.home.take().is_some() {
            self.link.close();
        }
    }
}

impl Pool {
    /// A pool of `size` connections (opened on first use).
    pub fn new(place: Place, dialer: Dialer, size: usize, connect_timeout: Duration) -> Pool {
        Pool {
            place,
            dialer,
            connect_timeout,
            slots: (0..size.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
            backoff: Mutex::new(Backoff {
                delay: BACKOFF_MIN,
                retry_at: None,
                last: None,
            }),
            idle: Mutex::new(Vec::new()),
            exclusive: Arc::new(Semaphore::new(MAX_EXCLUSIVE)),
        }
    }

    /// A connection for this caller alone (an idle one, or a new one within
    /// the connect timeout and `deadline`), until [`Held::give_back`].
    pub async fn exclusive(self: &Arc<Self>, deadline: Instant) -> Result<Held, DialError> {
        let permit = tokio::time::timeout_at(deadline, self.exclusive.clone().acquire_owned())
            .await
            .map_err(|_| DialError("no connection became free in time".into()))?
            .map_err(|_| DialError("the connection pool is closed".into()))?;
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
        Ok(Held {
            link,
            home: Some((self.clone(), permit)),
        })
    }

    /// A live connection, opening one when needed (within the connect timeout
    /// and `deadline`, whichever comes first).
    pub async fn link(&self, deadline: Instant) -> Result<Link, DialError> {
        let n = self.slots.len();
        let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
        // Any live connection will do; only open one when none is at hand.
        for k in 0..n {
            if let Ok(slot) = self.slots[(i + k) % n].try_lock()
                && let Some(link) = slot.as_ref().filter(|l| l.is_alive())
            {
                return Ok(link.clone());
            }
        }
        let mut slot = tokio::time::timeout_at(deadline, self.slots[i].lock())
            .await
            .map_err(|_| DialError("no connection became free in time".into()))?;
        if let Some(link) = slot.as_ref().filter(|l| l.is_alive()) {
            return Ok(link.clone());
        }
        *slot = None;
        let link = self.open(deadline).await?;
        *slot = Some(link.clone());
        Ok(link)
    }

    /// Opens a connection (unless still backing off after a failure).
    async fn open(&self, deadline: Instant) -> Result<Link, DialError> {
        self.check_backoff()?;
        let connect_by = deadline.min(Instant::now() + self.connect_timeout);
        let opened = match &self.place {
            Place::Fixed(addr) => self.dialer.connect(addr, connect_by).await,
            Place::Sentinel { sentinels, service } => self
                .dialer
                .connect_primary(sentinels, service, connect_by)
                .await
                .map(|(_, conn)| conn),
        };
        match opened {
            Ok(conn) => {
                self.connected();
                Ok(Link::start(conn))
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
        for s in &self.slots {
            if let Some(l) = s.lock().await.take() {
                l.close();
            }
        }
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        for l in idle {
            l.close();
        }
    }

    fn check_backoff(&self) -> Result<(), DialError> {
        let b = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        match (b.retry_at, &b.last) {
            (Some(at), Some(last)) if Instant::now() < at => Err(DialError(format!(
                "{last} (next attempt in {}ms)",
                at.saturating_duration_since(Instant::now()).as_millis()
            ))),
            _ => Ok(()),
        }
    }

    fn connected(&self) {
        let mut b = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        b.delay = BACKOFF_MIN;
        b.retry_at = None;
        b.last = None;
    }

    fn failed(&self, e: &DialError) {
        let mut b = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        let jitter = rand::rng().random_range(0.8..1.2);
        b.retry_at = Some(Instant::now() + b.delay.mul_f64(jitter));
        b.delay = (b.delay * 2).min(BACKOFF_MAX);
        b.last = Some(e.0.clone());
    }
}
