//! A loopback TCP proxy a test degrades on purpose, to put a fault between
//! one process and a server (one operator replica and kube-apiserver, the
//! operator and Valkey, a watcher and etcd) while everything else still
//! reaches the server. Connections stay open in every fault, so clients see
//! requests hang (the hard case: they must give up by themselves), never
//! resets, until the test closes them.
//!
//! - A cut ([`TcpProxy::cut`]) is a black hole: connections stay open and
//!   new ones are accepted, but no byte is forwarded either way. Restoring
//!   closes every connection that lived through the cut — bytes sent into
//!   the hole are lost, as after a partition long enough for both ends to
//!   reset — and forwards new connections again.
//! - A trap ([`TcpProxy::trap`]) is a black hole that falls at the next
//!   request: everything passes until a client next sends a byte, then
//!   nothing passes any more, either way, on any connection — except (if
//!   asked) that one request on its way in, so it reaches the server and its
//!   reply is lost.
//! - A mode ([`TcpProxy::set_mode`]) degrades the open connections too, and
//!   lifts without closing them: forward requests but drop the replies (the
//!   request took effect, the client never learns), or drop both ways.
//! - New connections can be refused for a while (a server unreachable for a
//!   moment), and every open connection closed at once.
//!
//! The proxy runs on its own thread and runtime, so a test that blocks its
//! own runtime never stalls the traffic it proxies, and sync and async tests
//! use it alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What passes on every connection, open or new, until the next
/// [`TcpProxy::set_mode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Everything is forwarded.
    Pass,
    /// Client bytes are forwarded; server bytes are read and thrown away.
    DropReplies,
    /// Nothing is forwarded in either direction (bytes are read and thrown away).
    Blackhole,
    /// Everything is forwarded, each read held this long first (a slow link).
    Delay(std::time::Duration),
}

/// A running proxy; stops (closing every connection) on drop.
pub struct TcpProxy {
    pub port: u16,
    shared: Arc<Shared>,
    cut: watch::Sender<bool>,
    /// Connections accepted before the latest `hang_open` forward nothing.
    hung: watch::Sender<u64>,
    /// Bumped to close every open connection.
    epoch: watch::Sender<u64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// What the test sets and reads while connections run.
struct Shared {
    mode: Mutex<Mode>,
    trap: Mutex<Trap>,
    refuse: AtomicBool,
    /// While `refuse` is set, connections beyond this many accepted ones are refused.
    refuse_beyond: AtomicU64,
    /// Client bytes forwarded to the server so far.
    forwarded: AtomicU64,
    /// Connections accepted (and not refused) so far.
    accepted: AtomicU64,
}

/// The channels each connection watches.
#[derive(Clone)]
struct Signals {
    cut: watch::Receiver<bool>,
    hung: watch::Receiver<u64>,
    epoch: watch::Receiver<u64>,
}

/// How long the bytes of the request that springs a trap keep passing.
const ONE_REQUEST: Duration = Duration::from_millis(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trap {
    Off,
    /// The next byte a client sends springs it; `pass`: that request goes through.
    Armed {
        pass: bool,
    },
    /// Nothing passes, but (until `until`) what connection `conn` sends.
    Sprung {
        conn: u64,
        until: Instant,
    },
}

impl TcpProxy {
    /// Forwards `127.0.0.1:<port>` to `upstream` (an address, or "host:port").
    pub fn start(upstream: impl ToString) -> Self {
        let upstream = upstream.to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            trap: Mutex::new(Trap::Off),
            refuse: AtomicBool::new(false),
            refuse_beyond: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
        });
        let (cut, cut_rx) = watch::channel(false);
        let (hung, hung_rx) = watch::channel(0u64);
        let (epoch, epoch_rx) = watch::channel(0u64);
        let signals = Signals {
            cut: cut_rx,
            hung: hung_rx,
            epoch: epoch_rx,
        };
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let shared_in = shared.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("proxy listener");
                tokio::select! {
                    _ = accept_loop(listener, upstream, signals, shared_in) => {},
                    _ = stop_rx => {},
                }
            });
        });
        Self {
            port,
            shared,
            cut,
            hung,
            epoch,
            stop: Some(stop),
        }
    }

    /// `redis://127.0.0.1:<port>`: the proxy as a Valkey URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// What passes from now on, on every connection, open or new.
    pub fn set_mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// Everything passes until a client next sends a byte (a request); from
    /// then on nothing passes, either way, on any connection, old or new —
    /// except, with `let_it_through`, the rest of that request (for a moment),
    /// which reaches the server while its reply is lost. `restore` ends it.
    pub fn trap(&self, let_it_through: bool) {
        *self.shared.trap.lock().unwrap() = Trap::Armed {
            pass: let_it_through,
        };
    }

    /// Whether a trap has sprung.
    pub fn sprung(&self) -> bool {
        matches!(*self.shared.trap.lock().unwrap(), Trap::Sprung { .. })
    }

    /// Every connection open now becomes a black hole for good (kept open,
    /// forwarding nothing either way); connections made from now on pass.
    pub fn hang_open(&self) {
        self.hung.send_modify(|g| *g += 1);
    }

    /// From now on nothing passes, in either direction.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Closes the connections that lived through the cut (or a trap); new
    /// ones pass again.
    pub fn restore(&self) {
        *self.shared.trap.lock().unwrap() = Trap::Off;
        self.cut.send_replace(false);
    }

    /// Closes every open connection (new ones are accepted as usual).
    pub fn reset_connections(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    /// While true, new connections are accepted and closed at once.
    pub fn refuse_new(&self, refuse: bool) {
        self.shared.refuse_beyond.store(0, Ordering::SeqCst);
        self.shared.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Accepts `n` connections in all, then refuses new ones until `refuse_new(false)`.
    pub fn refuse_after(&self, n: u64) {
        self.shared.refuse_beyond.store(n, Ordering::SeqCst);
        self.shared.refuse.store(true, Ordering::SeqCst);
    }

    /// Client bytes forwarded to the server so far.
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Connections accepted (and not refused) so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    signals: Signals,
    shared: Arc<Shared>,
) {
    let upstream: Arc<str> = upstream.into();
    let mut id = 0;
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if shared.refuse.load(Ordering::SeqCst)
            && shared.accepted.load(Ordering::SeqCst) >= shared.refuse_beyond.load(Ordering::SeqCst)
        {
            drop(client);
            continue;
        }
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        id += 1;
        tokio::spawn(connection(
            client,
            upstream.clone(),
            signals.clone(),
            (shared.clone(), id),
        ));
    }
}

impl Shared {
    /// Whether a trap lets bytes read now pass (`up`: from the client):
    /// always when none is set; a client's bytes spring one that is armed.
    fn trap_passes(&self, conn: u64, up: bool) -> bool {
        let mut trap = self.trap.lock().unwrap();
        match *trap {
            Trap::Off => true,
            Trap::Armed { .. } if !up => true,
            Trap::Armed { pass } => {
                *trap = Trap::Sprung {
                    conn: if pass { conn } else { 0 },
                    until: Instant::now() + ONE_REQUEST,
                };
                pass
            }
            Trap::Sprung { conn: c, until } => up && c == conn && Instant::now() < until,
        }
    }

    /// Whether the mode lets bytes read now pass (`up`: from the client).
    fn mode_passes(&self, up: bool) -> bool {
        match *self.mode.lock().unwrap() {
            Mode::Pass | Mode::Delay(_) => true,
            Mode::DropReplies => up,
            Mode::Blackhole => false,
        }
    }

    /// How long the mode holds bytes read now before forwarding them.
    fn mode_delay(&self) -> Option<std::time::Duration> {
        match *self.mode.lock().unwrap() {
            Mode::Delay(d) => Some(d),
            _ => None,
        }
    }
}

async fn connection(
    client: TcpStream,
    upstream: Arc<str>,
    Signals {
        mut cut,
        mut hung,
        mut epoch,
    }: Signals,
    (shared, id): (Arc<Shared>, u64),
) {
    let born = *hung.borrow_and_update();
    epoch.borrow_and_update();
    // Accepted during a cut: the upstream is unreachable, so nothing to dial.
    if *cut.borrow_and_update() {
        let _ = cut.wait_for(|c| !*c).await;
        return;
    }
    let Ok(server) = TcpStream::connect(&*upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    // Through a cut or a sprung trap: nothing passes until it closes.
    let mut broken = false;
    loop {
        tokio::select! {
            n = cr.read(&mut up) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    broken |= !shared.trap_passes(id, true);
                    if let Some(d) = shared.mode_delay() {
                        tokio::time::sleep(d).await;
                    }
                    if !broken && shared.mode_passes(true) {
                        if sw.write_all(&up[..n]).await.is_err() {
                            return;
                        }
                        shared.forwarded.fetch_add(n as u64, Ordering::SeqCst);
                    }
                }
            },
            n = sr.read(&mut down) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    broken |= !shared.trap_passes(id, false);
                    if let Some(d) = shared.mode_delay() {
                        tokio::time::sleep(d).await;
                    }
                    if !broken && shared.mode_passes(false) && cw.write_all(&down[..n]).await.is_err() {
                        return;
                    }
                }
            },
            changed = hung.changed() => {
                if changed.is_err() {
                    return;
                }
                if *hung.borrow_and_update() > born {
                    // Open for good, silent for good.
                    let _ = std::future::pending::<()>().await;
                }
            }
            changed = cut.changed() => {
                if changed.is_err() {
                    return;
                }
                if *cut.borrow_and_update() {
                    broken = true;
                } else if broken {
                    return; // dropping both halves closes both sockets
                }
            }
            _ = epoch.changed() => return,
        }
    }
}
