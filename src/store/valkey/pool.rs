//! A few connections to one server, opened lazily and replaced when they break.
//!
//! After a failed connect, the next attempt waits (100ms doubling to 5s, with
//! jitter); calls in between fail at once with the last cause instead of
//! queueing behind a server that is not there.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::Rng;
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
        }
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
                let link = Link::start(conn);
                *slot = Some(link.clone());
                Ok(link)
            }
            Err(e) => {
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Closes every connection (requests on them end as the link says).
    pub async fn close(&self) {
        for s in &self.slots {
            if let Some(l) = s.lock().await.take() {
                l.close();
            }
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
