//! A fault-injecting TCP proxy for RESP servers, for tests of what a client
//! tells its caller when the network misbehaves.
//!
//! The proxy sits between a client and a real server (or in front of
//! nothing, as a server that accepts and never answers). It understands just
//! enough RESP to count commands and replies, so a fault can hit one exact
//! command: forward it and cut the connection before its reply, or after it,
//! or answer it with an error instead of forwarding it. Faults can be switched
//! while clients are connected; they apply to live and new connections.
//!
//! ```ignore
//! let proxy = FaultProxy::start(&server.addr());   // or FaultProxy::silent()
//! proxy.cut_before_reply("FCALL");  // the next FCALL runs, its reply is lost (RST)
//! proxy.cut_after_reply("FCALL");   // ... its reply arrives, then the connection closes
//! proxy.refuse("FCALL", "READONLY …", 3); // answered with an error, not forwarded
//! proxy.silence_from("FCALL");      // that connection goes silent from there on
//! proxy.drop_reply("FCALL");        // the next FCALL runs, its reply alone vanishes
//! proxy.hold_reply("FCALL");        // the next FCALL's reply (and, in order, every
//! proxy.release();                    //   later one on its connection) waits for release()
//! proxy.set(Fault::Delay(d));         // standing faults: Pass, Delay, DropReplies,
//! proxy.set(Fault::Silent);           //   Silent, Reset (live and new connections)
//! assert_eq!(proxy.forwarded("FCALL"), 1);
//! ```
//!
//! It runs on its own thread and runtime, so sync tests (which spawn the CLI)
//! and async tests use it alike. Dropping it closes every connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

pub mod frames;
mod relay;
use relay::accept_loop;

/// What happens to traffic until the next [`FaultProxy::set`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Hold every reply this long before relaying it.
    Delay(Duration),
    /// Discard every reply for this long from now (the requests still reach
    /// the server); then relay again. The client's reply stream is broken.
    DropReplies(Duration),
    /// Forward nothing either way, and answer nothing: new connections are
    /// accepted and never answered (not even connected upstream).
    Silent,
    /// Reset (RST) every connection now, and every new one on accept.
    Reset,
}

/// A one-shot trap, consumed by the first command it matches.
#[derive(Clone, Debug)]
enum Trap {
    /// Forward the command, then reset before its reply is relayed.
    CutBeforeReply(String),
    /// Forward the command, relay its reply, then reset.
    CutAfterReply(String),
    /// Do not forward; answer `-<error>` (up to `times` matching commands).
    Refuse(String, String, usize),
    /// From this command on, the connection forwards and answers nothing.
    Silence(String),
    /// Forward the command; discard its reply alone (later ones are relayed).
    DropReply(String),
    /// Forward the command; hold its reply (and every later one on that
    /// connection, to keep their order) until [`FaultProxy::release`].
    Hold(String),
}

#[derive(Default)]
struct State {
    fault: Option<(Fault, Instant)>,
    traps: Vec<Trap>,
    /// (connection number, command) of every command forwarded.
    forwarded: Vec<(usize, String)>,
    accepted: usize,
    /// Connections reset by a cut before a reply (`cut_before_reply`).
    cuts: usize,
    /// Replies held back by a `hold_reply`, not yet released.
    holding: usize,
    /// Bumped by every `release`.
    released: u64,
}

struct Shared {
    upstream: Option<String>,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn fault(&self) -> (Fault, Instant) {
        self.state
            .lock()
            .unwrap()
            .fault
            .unwrap_or((Fault::Pass, Instant::now()))
    }
}

/// A running proxy on a free loopback port; stopped (every connection closed) on drop.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy to `upstream` (`host:port`), forwarding everything until told otherwise.
    pub fn start(upstream: &str) -> Self {
        Self::spawn(Some(upstream.to_owned()))
    }

    /// A listener that accepts connections and never answers (a silent server).
    pub fn silent() -> Self {
        let p = Self::spawn(None);
        p.set(Fault::Silent);
        p
    }

    fn spawn(upstream: Option<String>) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
        });
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let sh = shared.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                tokio::select! {
                    _ = accept_loop(listener, sh) => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime cancels every relay and closes its sockets.
        });
        Self {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Switches the standing fault; live connections see it at once.
    pub fn set(&self, fault: Fault) {
        self.shared.state.lock().unwrap().fault = Some((fault, Instant::now()));
        self.shared.changed.send_modify(|g| *g += 1);
    }

    /// The next command named `name` (e.g. `FCALL`, `FUNCTION LOAD`) reaches the
    /// server; the client's connection is reset before the reply comes back.
    pub fn cut_before_reply(&self, name: &str) {
        self.trap(Trap::CutBeforeReply(name.to_owned()));
    }

    /// The next command named `name` runs and its reply is relayed together
    /// with the end of the stream (FIN): the connection closes right after it.
    pub fn cut_after_reply(&self, name: &str) {
        self.trap(Trap::CutAfterReply(name.to_owned()));
    }

    /// The next `times` commands named `name` are not forwarded: the proxy
    /// answers each with `-<error>`. Use with commands sent on their own (no
    /// other reply pending on the connection), or the replies reorder.
    pub fn refuse(&self, name: &str, error: &str, times: usize) {
        self.trap(Trap::Refuse(name.to_owned(), error.to_owned(), times));
    }

    /// From the next command named `name` on, that connection goes silent:
    /// neither it nor anything after it is forwarded, nothing is answered.
    pub fn silence_from(&self, name: &str) {
        self.trap(Trap::Silence(name.to_owned()));
    }

    /// The next command named `name` is forwarded and runs; its reply is held
    /// back, with every later reply on the same connection (replies keep
    /// their order), until [`FaultProxy::release`].
    pub fn hold_reply(&self, name: &str) {
        self.trap(Trap::Hold(name.to_owned()));
    }

    /// The next command named `name` is forwarded and runs; its reply alone is
    /// discarded, the replies after it relayed: the client's stream loses one
    /// reply (what no TCP connection does, but a broken middlebox might).
    pub fn drop_reply(&self, name: &str) {
        self.trap(Trap::DropReply(name.to_owned()));
    }

    /// Relays every held reply, in order, and stops holding.
    pub fn release(&self) {
        self.shared.state.lock().unwrap().released += 1;
        self.shared.changed.send_modify(|g| *g += 1);
    }

    /// How many replies are held back right now.
    pub fn holding(&self) -> usize {
        self.shared.state.lock().unwrap().holding
    }

    /// Whether a `hold_reply` has caught its command (forwarded, reply not released).
    pub fn hold_caught(&self) -> bool {
        let st = self.shared.state.lock().unwrap();
        !st.traps.iter().any(|t| matches!(t, Trap::Hold(_)))
    }

    fn trap(&self, trap: Trap) {
        self.shared.state.lock().unwrap().traps.push(trap);
    }

    /// How many commands named `name` were forwarded to the server.
    pub fn forwarded(&self, name: &str) -> usize {
        let st = self.shared.state.lock().unwrap();
        st.forwarded.iter().filter(|(_, c)| named(c, name)).count()
    }

    /// How many commands named `name` each connection forwarded (connections
    /// that forwarded none left out), in the order they were accepted.
    pub fn forwarded_per_connection(&self, name: &str) -> Vec<usize> {
        let st = self.shared.state.lock().unwrap();
        let mut counts = vec![0; st.accepted];
        for (conn, c) in &st.forwarded {
            if named(c, name) {
                counts[*conn] += 1;
            }
        }
        counts.retain(|n| *n > 0);
        counts
    }

    /// How many connections a `cut_before_reply` has reset so far.
    pub fn cuts(&self) -> usize {
        self.shared.state.lock().unwrap().cuts
    }

    /// How many connections were accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.state.lock().unwrap().accepted
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `name` is one word (`FCALL`) or two (`FUNCTION LOAD`), compared case-insensitively.
fn named(command: &str, name: &str) -> bool {
    let words: Vec<&str> = command.split(' ').collect();
    let want: Vec<&str> = name.split(' ').collect();
    words.len() >= want.len()
        && words
            .iter()
            .zip(&want)
            .all(|(a, b)| a.eq_ignore_ascii_case(b))
}
