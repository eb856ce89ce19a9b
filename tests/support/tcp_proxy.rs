//! A loopback TCP proxy a test can cut, to partition one process from a server
//! (e.g. one operator replica from kube-apiserver) while everything else still
//! reaches it.
//!
//! A cut is a black hole, not a refusal: connections stay open and new ones
//! are accepted, but no byte is forwarded either way, so the client sees
//! requests hang (the hard case: it must give up by itself). Restoring closes
//! every connection that lived through the cut — bytes sent into the hole are
//! lost, as after a partition long enough for both ends to reset — and
//! forwards new connections again.
//!
//! A trap ([`TcpProxy::trap`]) is a black hole that falls at the next request:
//! everything passes until a client next sends a byte, then nothing passes
//! any more, either way, on any connection — except (if asked) that one
//! request on its way in, so it reaches the server and its reply is lost.
//!
//! The proxy runs on its own thread and runtime, so a test that blocks its
//! own runtime never stalls the traffic it proxies.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; stops (closing every connection) on drop.
pub struct TcpProxy {
    pub port: u16,
    cut: watch::Sender<bool>,
    /// Connections accepted before the latest `hang_open` forward nothing.
    hung: watch::Sender<u64>,
    trap: Arc<Mutex<Trap>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
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
    /// Forwards `127.0.0.1:<port>` to `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, cut_rx) = watch::channel(false);
        let (hung, hung_rx) = watch::channel(0u64);
        let trap = Arc::new(Mutex::new(Trap::Off));
        let trap_in = trap.clone();
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("proxy listener");
                tokio::select! {
                    _ = accept_loop(listener, upstream, cut_rx, hung_rx, trap_in) => {},
                    _ = stop_rx => {},
                }
            });
        });
        Self {
            port,
            cut,
            hung,
            trap,
            stop: Some(stop),
        }
    }

    /// Everything passes until a client next sends a byte (a request); from
    /// then on nothing passes, either way, on any connection, old or new —
    /// except, with `let_it_through`, the rest of that request (for a moment),
    /// which reaches the server while its reply is lost. `restore` ends it.
    pub fn trap(&self, let_it_through: bool) {
        *self.trap.lock().unwrap() = Trap::Armed {
            pass: let_it_through,
        };
    }

    /// Whether a trap has sprung.
    pub fn sprung(&self) -> bool {
        matches!(*self.trap.lock().unwrap(), Trap::Sprung { .. })
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
        *self.trap.lock().unwrap() = Trap::Off;
        self.cut.send_replace(false);
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
    upstream: SocketAddr,
    cut: watch::Receiver<bool>,
    hung: watch::Receiver<u64>,
    trap: Arc<Mutex<Trap>>,
) {
    let mut id = 0;
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        id += 1;
        tokio::spawn(connection(
            client,
            upstream,
            cut.clone(),
            hung.clone(),
            (trap.clone(), id),
        ));
    }
}

/// Whether bytes read now pass (`up`: from the client): always unless a trap
/// is set, which a client's bytes spring.
fn passes(trap: &Mutex<Trap>, conn: u64, up: bool) -> bool {
    let mut trap = trap.lock().unwrap();
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

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut cut: watch::Receiver<bool>,
    mut hung: watch::Receiver<u64>,
    (trap, id): (Arc<Mutex<Trap>>, u64),
) {
    let born = *hung.borrow_and_update();
    // Accepted during a cut: the upstream is unreachable, so nothing to dial.
    if *cut.borrow_and_update() {
        let _ = cut.wait_for(|c| !*c).await;
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let mut broken = false;
    loop {
        tokio::select! {
            n = cr.read(&mut up) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    broken |= !passes(&trap, id, true);
                    if !broken && sw.write_all(&up[..n]).await.is_err() {
                        return;
                    }
                }
            },
            n = sr.read(&mut down) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    broken |= !passes(&trap, id, false);
                    if !broken && cw.write_all(&down[..n]).await.is_err() {
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
        }
    }
}
