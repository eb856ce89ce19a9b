//! A fault proxy in front of one etcd member, for the clients' gRPC
//! traffic (HTTP/2 without TLS). It reads the client's side frame by frame,
//! just enough to see where a unary request ends (a DATA frame with
//! END_STREAM), so that a fault can hit a whole request:
//!
//! - a cut: the next guarded transaction (a lease decision's write, told
//!   from reads by its first bytes: [`is_guarded_txn`]) is forwarded
//!   whole, its reply is never relayed, and both connections are reset
//!   100 ms later (the member has most likely applied it by then; the
//!   client only sees its connection die: the outcome is unknown to it);
//!   a transaction reset by the client, or whose connection ends, before it
//!   is whole gives the cut back to the next one;
//! - a lost write: the next guarded transaction is never forwarded, so it never runs, and its connection goes silent both ways
//!   (the client gives up on it at its deadline);
//! - a blackhole: nothing passes either way, on live and new connections;
//!   when it ends, every connection that lived through it is closed (what
//!   went into the hole is lost, as after a partition long enough for both
//!   ends to give up), and new ones pass again.
//!
//! It runs on its own thread and runtime, so a harness that blocks its own
//! runtime never stalls the traffic it proxies. Every socket closes with a
//! reset (linger 0), as after a crash of the path between.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The HTTP/2 client connection preface.
const PREFACE: usize = 24;
/// How long a cut connection waits, its request forwarded, before the reset.
const APPLY: Duration = Duration::from_millis(100);

struct Shared {
    /// The next guarded transaction is forwarded and its connection cut.
    cut_next: AtomicBool,
    /// The next guarded transaction is lost, its connection silenced.
    lose_next: AtomicBool,
    /// Guarded transactions lost so far.
    lost: AtomicU64,
    blackhole: AtomicBool,
    /// Bumped when a blackhole ends: connections older than it close.
    epoch: watch::Sender<u64>,
    /// Connections cut after forwarding a request.
    cuts: AtomicU64,
}

/// A running proxy; it stops (resetting every connection) when dropped.
pub struct H2Proxy {
    pub port: u16,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl H2Proxy {
    /// Forwards `127.0.0.1:<port>` to `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().expect("its address").port();
        let shared = Arc::new(Shared {
            cut_next: AtomicBool::new(false),
            lose_next: AtomicBool::new(false),
            lost: AtomicU64::new(0),
            blackhole: AtomicBool::new(false),
            epoch: watch::channel(0).0,
            cuts: AtomicU64::new(0),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let s = shared.clone();
        std::thread::Builder::new()
            .name(format!("etcd-proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("tokio listener");
                    tokio::select! {
                        _ = accept(listener, upstream, s) => {}
                        _ = stopped => {}
                    }
                });
            })
            .expect("proxy thread");
        Self {
            port,
            shared,
            stop: Some(stop),
        }
    }

    /// The next guarded transaction (on any connection) is forwarded whole,
    /// and its connection reset before the reply.
    pub fn cut_next_write(&self) {
        self.shared.cut_next.store(true, Ordering::SeqCst);
    }

    /// The next guarded transaction (on any connection) never reaches the
    /// member, and its connection forwards nothing more either way.
    pub fn lose_next_write(&self) {
        self.shared.lose_next.store(true, Ordering::SeqCst);
    }

    /// Guarded transactions lost so far.
    pub fn lost(&self) -> u64 {
        self.shared.lost.load(Ordering::SeqCst)
    }

    /// Starts (true) or ends (false) a blackhole.
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.store(on, Ordering::SeqCst);
        if !on {
            self.shared.epoch.send_modify(|e| *e += 1);
        }
    }

    /// Connections cut after a forwarded transaction so far.
    pub fn cuts(&self) -> u64 {
        self.shared.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for H2Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(relay(client, upstream, shared.clone()));
    }
}

fn resetting(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    let _ = s.set_nodelay(true);
}

/// One client connection, until either side ends it, a cut, or the end of
/// a blackhole it lived through; then both sockets are reset.
async fn relay(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    let mut epoch = shared.epoch.subscribe();
    epoch.borrow_and_update();
    let Ok(server) = TcpStream::connect(upstream).await else {
        resetting(&client);
        return;
    };
    resetting(&client);
    resetting(&server);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let dead = Arc::new(AtomicBool::new(false));
    let mut up = tokio::spawn(upward(cr, sw, shared.clone(), dead.clone()));
    let mut down = tokio::spawn(downward(sr, cw, shared.clone(), dead));
    tokio::select! {
        _ = &mut up => {}
        _ = &mut down => {}
        _ = epoch.changed() => {}
    }
    // Dropping the halves (inside the tasks) resets both connections.
    up.abort();
    down.abort();
}

/// Client to member, frame by frame.
async fn upward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    s: Arc<Shared>,
    dead: Arc<AtomicBool>,
) {
    let mut preface = [0_u8; PREFACE];
    if from.read_exact(&mut preface).await.is_err() {
        return;
    }
    if !s.blackhole.load(Ordering::SeqCst) && to.write_all(&preface).await.is_err() {
        return;
    }
    let mut cutting = Cutting {
        stream: None,
        s: &s,
    };
    loop {
        let mut header = [0_u8; 9];
        if from.read_exact(&mut header).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut frame = header.to_vec();
        frame.resize(9 + len, 0);
        if from.read_exact(&mut frame[9..]).await.is_err() {
            return;
        }
        if s.blackhole.load(Ordering::SeqCst) || dead.load(Ordering::SeqCst) {
            continue;
        }
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & !(1 << 31);
        let write = kind == 0 && flags & 0x8 == 0 && is_guarded_txn(&frame[9..]);
        if write && s.lose_next.swap(false, Ordering::SeqCst) {
            dead.store(true, Ordering::SeqCst);
            s.lost.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        if write && cutting.stream.is_none() && s.cut_next.swap(false, Ordering::SeqCst) {
            cutting.stream = Some(stream);
        }
        // RST_STREAM: the client gave the transaction up (its deadline).
        if kind == 3 && cutting.stream == Some(stream) {
            cutting.give_back();
        }
        let ends_request = kind == 0 && flags & 1 == 1;
        if ends_request && cutting.stream == Some(stream) {
            // Nothing more comes back: the reply is lost.
            cutting.stream = None;
            dead.store(true, Ordering::SeqCst);
            let _ = to.write_all(&frame).await;
            tokio::time::sleep(APPLY).await;
            s.cuts.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if to.write_all(&frame).await.is_err() {
            return;
        }
    }
}

/// The transaction a connection took the cut for, to cut once it is whole
/// (its stream): the cut goes back to the next write if the stream is
/// reset, or the connection ends, first.
struct Cutting<'a> {
    stream: Option<u32>,
    s: &'a Shared,
}

impl Cutting<'_> {
    fn give_back(&mut self) {
        if self.stream.take().is_some() {
            self.s.cut_next.store(true, Ordering::SeqCst);
        }
    }
}

impl Drop for Cutting<'_> {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// Whether a DATA frame's payload is one whole gRPC message (a 5-byte
/// prefix, then the protobuf) holding a transaction with compares: a
/// `TxnRequest` opens with its field 1, `compare` (tag `0x0a`), and a
/// `Compare` on a key's revision with its field 2, `target` (tag `0x10`;
/// `result` EQUAL is proto3's default, left out). The store's reads are
/// transactions without compares (field 2 first) or range requests (field
/// 1, a key: its first byte is the key prefix's, not `0x10`); lease grants
/// and revokes open with a varint (tag `0x08`). Padded frames (h2 never
/// pads) are not passed in.
fn is_guarded_txn(payload: &[u8]) -> bool {
    let Some(msg) = payload.get(5..) else {
        return false;
    };
    if msg.first() != Some(&0x0a) {
        return false;
    }
    // Skip the compare's length (a varint) to its first field.
    let mut i = 1;
    while msg.get(i).is_some_and(|b| b & 0x80 != 0) {
        i += 1;
    }
    msg.get(i + 1) == Some(&0x10)
}

/// Member to client, as it comes (nothing while dead or in a blackhole).
async fn downward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    s: Arc<Shared>,
    dead: Arc<AtomicBool>,
) {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if dead.load(Ordering::SeqCst) || s.blackhole.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
