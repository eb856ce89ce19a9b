//! A loopback TCP proxy whose forwarding a test can degrade on purpose: pass
//! everything, forward requests but drop the replies (a reply lost on the way
//! back: the request took effect, the client never learns), or blackhole both
//! directions (a partition). It can also refuse new connections for a while
//! (a server that is unreachable for a moment). Connections stay open in every
//! mode, so clients see timeouts, never resets.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Everything is forwarded.
pub const PASS: u8 = 0;
/// Client bytes are forwarded; server bytes are read and thrown away.
pub const DROP_REPLIES: u8 = 1;
/// Nothing is forwarded in either direction (bytes are read and thrown away).
pub const BLACKHOLE: u8 = 2;

pub struct TcpProxy {
    pub port: u16,
    mode: Arc<AtomicU8>,
    refuse: Arc<AtomicBool>,
    /// While `refuse` is set, connections beyond this many accepted ones are refused.
    refuse_beyond: Arc<AtomicU64>,
    /// Client bytes forwarded to the server so far.
    forwarded: Arc<AtomicU64>,
    /// Connections accepted (and not refused) so far.
    accepted: Arc<AtomicU64>,
    /// Bumped to close every open connection (a partition long enough that
    /// TCP gives up: clients reconnect afterwards instead of resuming).
    epoch: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards to `upstream` ("host:port").
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(PASS));
        let refuse = Arc::new(AtomicBool::new(false));
        let refuse_beyond = Arc::new(AtomicU64::new(0));
        let forwarded = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let (epoch, epoch_rx) = tokio::sync::watch::channel(0u64);
        let task = {
            let (mode, refuse, beyond, forwarded, accepted) = (
                mode.clone(),
                refuse.clone(),
                refuse_beyond.clone(),
                forwarded.clone(),
                accepted.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    if refuse.load(Ordering::SeqCst)
                        && accepted.load(Ordering::SeqCst) >= beyond.load(Ordering::SeqCst)
                    {
                        drop(client);
                        continue;
                    }
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let rx = epoch_rx.clone();
                    tokio::spawn(pump(
                        cr,
                        sw,
                        mode.clone(),
                        true,
                        forwarded.clone(),
                        rx.clone(),
                    ));
                    tokio::spawn(pump(sr, cw, mode.clone(), false, forwarded.clone(), rx));
                }
            })
        };
        Self {
            port,
            mode,
            refuse,
            refuse_beyond,
            forwarded,
            accepted,
            epoch,
            task,
        }
    }

    /// Closes every open connection (new ones are accepted as usual).
    pub fn reset_connections(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn set_mode(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    /// While true, new connections are accepted and closed at once.
    pub fn refuse_new(&self, refuse: bool) {
        self.refuse_beyond.store(0, Ordering::SeqCst);
        self.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Accepts `n` connections in all, then refuses new ones until `refuse_new(false)`.
    pub fn refuse_after(&self, n: u64) {
        self.refuse_beyond.store(n, Ordering::SeqCst);
        self.refuse.store(true, Ordering::SeqCst);
    }

    pub fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::SeqCst)
    }

    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: Arc<AtomicU8>,
    requests: bool,
    forwarded: Arc<AtomicU64>,
    mut epoch: tokio::sync::watch::Receiver<u64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    epoch.borrow_and_update();
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = epoch.changed() => return,
        };
        let forward = match mode.load(Ordering::SeqCst) {
            PASS => true,
            DROP_REPLIES => requests,
            _ => false,
        };
        if forward {
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
            if requests {
                forwarded.fetch_add(n as u64, Ordering::SeqCst);
            }
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
