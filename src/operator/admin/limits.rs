//! What one client may hold of the admin server: connections at once (in
//! all, and per client address) and how long a connection may stay silent.
//!
//! The admin server answers the kubelet's probes. Without bounds, a client
//! that opens connections and says nothing (before or after the TLS
//! handshake) holds a task and a file descriptor each, forever, and enough
//! of them leave no room for the probes: the kubelet restarts the operator.
//! Here a connection that sends nothing for [`Limits::idle`] is closed, and
//! so is one whose request is not complete (answered) within
//! [`Limits::request`] of its first byte (a client that trickles a header
//! line every few seconds is never idle), and so is one that reads nothing
//! of an answer for [`Limits::request`]. One client address holds at most
//! [`Limits::per_peer`] connections (and [`Limits::handshakes_per_peer`]
//! TLS handshakes), and the last [`Limits::reserve`] free connections go
//! only to addresses that hold none, so one address alone leaves the
//! others — the kubelet's, Prometheus's — room below the totals; clients
//! from enough addresses together (`(connections − reserve) / per_peer +
//! reserve`, 31 by default) can still take them all (docs/security.md,
//! "Not yet defended").

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Bounds on the admin server's connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once; more wait in the kernel's backlog.
    pub connections: usize,
    /// Connections one client address holds at once; more are closed at once.
    pub per_peer: usize,
    /// Of [`Limits::connections`], how many are kept for addresses that hold
    /// none: an address's second and later connections are closed at once
    /// when fewer are free.
    pub reserve: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle: Duration,
    /// A request not answered this long after its first byte arrived (its
    /// headers still trickling in) has its connection closed. Longer than
    /// any handler takes (the store probe gives up after 2 s).
    pub request: Duration,
    /// How long a client has to complete its TLS handshake.
    pub handshake_timeout: Duration,
    /// TLS handshakes in progress at once.
    pub handshakes: usize,
    /// TLS handshakes one client address has in progress at once.
    pub handshakes_per_peer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 256,
            per_peer: 16,
            reserve: 16,
            idle: Duration::from_secs(60),
            request: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            handshakes: 64,
            handshakes_per_peer: 8,
        }
    }
}

/// How many of something each client address holds.
#[derive(Clone, Default)]
pub struct PerPeer {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One held by one address; given back when dropped.
pub struct PeerSlot {
    peer: IpAddr,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerPeer {
    /// How many `peer` holds.
    pub fn holds(&self, peer: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&peer).copied().unwrap_or(0)
    }

    /// One more for `peer`, unless it already holds `max`.
    pub fn take(&self, peer: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(peer).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peer,
            held: self.held.clone(),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

/// A listener whose connections obey [`Limits`].
pub struct Bounded<L> {
    inner: L,
    limits: Limits,
    slots: Arc<Semaphore>,
    peers: PerPeer,
}

impl<L> Bounded<L> {
    /// Bounds the connections `inner` accepts.
    pub fn new(inner: L, limits: Limits) -> Self {
        Bounded {
            inner,
            limits,
            slots: Arc::new(Semaphore::new(limits.connections)),
            peers: PerPeer::default(),
        }
    }
}

impl<L> axum::serve::Listener for Bounded<L>
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    type Io = Guarded<L::Io>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                // The semaphore is never closed.
                return std::future::pending().await;
            };
            let (io, peer) = self.inner.accept().await;
            if self.peers.holds(peer.ip()) > 0
                && self.slots.available_permits() < self.limits.reserve
            {
                tracing::debug!(%peer, "admin server: the free connections are kept for other addresses");
                continue;
            }
            match self.peers.take(peer.ip(), self.limits.per_peer) {
                Some(peer_slot) => {
                    let io = Guarded {
                        io,
                        idle: self.limits.idle,
                        deadline: Box::pin(tokio::time::sleep(self.limits.idle)),
                        request: self.limits.request,
                        request_deadline: None,
                        write_stall: None,
                        _slots: (slot, peer_slot),
                    };
                    return (io, peer);
                }
                None => {
                    tracing::debug!(%peer, "admin server: too many connections from one address")
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that is closed after [`Limits::idle`] without a byte from
/// its client, [`Limits::request`] after a request's first byte without an
/// answer, or [`Limits::request`] into a write its client does not read,
/// and gives its slots back when it ends.
pub struct Guarded<T> {
    io: T,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    request: Duration,
    /// Set by the first byte of a request, cleared by the answer's.
    request_deadline: Option<Pin<Box<Sleep>>>,
    /// Set when a write finds the client's window full, cleared by any
    /// progress: a client that stops reading is closed after
    /// [`Limits::request`] (hyper reads nothing more while it writes).
    write_stall: Option<Pin<Box<Sleep>>>,
    _slots: (OwnedSemaphorePermit, PeerSlot),
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let too_slow = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took too long to send its request",
            )
        };
        if let Some(d) = self.request_deadline.as_mut()
            && d.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(too_slow()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    let next = Instant::now() + self.idle;
                    self.deadline.as_mut().reset(next);
                    if self.request_deadline.is_none() {
                        let request = self.request;
                        self.request_deadline = Some(Box::pin(tokio::time::sleep(request)));
                    }
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if let Some(d) = self.request_deadline.as_mut()
                    && d.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Err(too_slow()));
                }
                ready!(self.deadline.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent nothing for too long",
                )))
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.written(written, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.io).poll_flush(cx);
        if flushed.is_ready() {
            self.write_stall = None;
            return flushed;
        }
        self.stalled(cx)?;
        Poll::Pending
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.written(written, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<T> Guarded<T> {
    /// After a write: progress answers the request and ends any stall; no
    /// progress starts one, and one that has lasted [`Limits::request`]
    /// closes the connection.
    fn written(
        &mut self,
        written: Poll<io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(n)) if n > 0 => {
                self.request_deadline = None;
                self.write_stall = None;
                Poll::Ready(Ok(n))
            }
            Poll::Pending => {
                self.stalled(cx)?;
                Poll::Pending
            }
            other => other,
        }
    }

    /// A write made no progress: an error once it has made none for
    /// [`Limits::request`].
    fn stalled(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let request = self.request;
        let stall = self
            .write_stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(request)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of its answer for too long",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
