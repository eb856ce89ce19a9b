use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Serves `GET /livez` (and `GET /big`, 32 MiB) on 127.0.0.1 within
/// `limits`; the port.
pub(crate) async fn serve_plain(limits: Limits) -> u16 {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    let app = axum::Router::new()
        .route("/livez", axum::routing::get(|| async { "ok" }))
        .route(
            "/big",
            axum::routing::get(|| async { vec![b'x'; 32 << 20] }),
        );
    tokio::spawn(async move { axum::serve(Bounded::new(tcp, limits), app).await });
    port
}

/// A connection to 127.0.0.1:`port` from the address `from`.
pub(crate) async fn connect_from(from: &str, port: u16) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(([127, 0, 0, 1], port).into()).await.unwrap()
}

/// How long until the server closes `conn` (reads until EOF or an error).
pub(crate) async fn closed_within(conn: &mut TcpStream, bound: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut sink = Vec::new();
    tokio::time::timeout(bound, conn.read_to_end(&mut sink))
        .await
        .ok()
        .map(|_| start.elapsed())
}

async fn get_from(from: &str, port: u16) -> String {
    let mut c = connect_from(from, port).await;
    c.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    let _ = c.read_to_string(&mut reply).await;
    reply.lines().next().unwrap_or_default().to_owned()
}

/// Silent clients from one address: beyond its share they are closed at
/// once, within it they are closed after the idle time; meanwhile another
/// address (the kubelet's) is answered at once.
#[tokio::test]
async fn silent_clients_of_one_address_hold_up_no_other_and_are_closed() {
    let limits = Limits {
        connections: 4,
        per_peer: 2,
        reserve: 0,
        idle: Duration::from_millis(500),
        ..Limits::default()
    };
    let port = serve_plain(limits).await;
    // Each silent client notes when the server closed it, counted from its connect.
    let mut silent = Vec::new();
    for _ in 0..4 {
        let mut c = connect_from("127.0.0.1", port).await;
        silent.push(tokio::spawn(async move {
            closed_within(&mut c, Duration::from_secs(5)).await
        }));
    }
    // Give the server time to take them all in.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let probe = tokio::time::timeout(Duration::from_secs(2), get_from("127.0.0.2", port))
        .await
        .expect("another address is answered beside silent clients");
    assert_eq!(probe, "HTTP/1.1 200 OK");
    let mut closed = Vec::new();
    for c in silent {
        closed.push(c.await.unwrap());
    }
    let soon = closed
        .iter()
        .filter(|c| c.is_some_and(|d| d < Duration::from_millis(300)))
        .count();
    assert_eq!(soon, 2, "beyond its share, closed at once: {closed:?}");
    assert!(
        closed
            .iter()
            .all(|c| c.is_some_and(|d| d < Duration::from_secs(2))),
        "every silent client is closed after the idle time: {closed:?}"
    );
    // Their slots are given back: the address is served again.
    assert_eq!(get_from("127.0.0.1", port).await, "HTTP/1.1 200 OK");
}

/// A client that keeps talking is not cut off by the idle time.
#[tokio::test]
async fn a_client_that_keeps_asking_is_served_past_the_idle_time() {
    let limits = Limits {
        idle: Duration::from_millis(300),
        ..Limits::default()
    };
    let port = serve_plain(limits).await;
    let mut c = connect_from("127.0.0.1", port).await;
    for _ in 0..4 {
        c.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(2), c.read(&mut buf))
            .await
            .expect("answered")
            .unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// A client that trickles its request's headers, a line every 200 ms (never
/// idle), is cut off once the request time is up; a client beside it is
/// answered meanwhile.
#[tokio::test]
async fn a_client_that_trickles_its_headers_is_cut_off() {
    let limits = Limits {
        idle: Duration::from_millis(500),
        request: Duration::from_secs(1),
        ..Limits::default()
    };
    let port = serve_plain(limits).await;
    let mut slow = connect_from("127.0.0.1", port).await;
    slow.write_all(b"GET /livez HTTP/1.1\r\n").await.unwrap();
    let start = Instant::now();
    let mut cut = None;
    for i in 0..25 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let line = format!("X-Slow-{i}: {i}\r\n");
        if slow.write_all(line.as_bytes()).await.is_err() {
            cut = Some(start.elapsed());
            break;
        }
        let mut buf = [0u8; 64];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(1), slow.read(&mut buf)).await
        {
            cut = Some(start.elapsed());
            break;
        }
        if i == 2 {
            assert_eq!(get_from("127.0.0.2", port).await, "HTTP/1.1 200 OK");
        }
    }
    let cut = cut.expect("a trickling client is cut off within 5 s");
    assert!(
        cut >= Duration::from_millis(900) && cut < Duration::from_secs(3),
        "cut off after {cut:?}"
    );
}

/// A client that asks twice for a big answer (pipelined) and never reads
/// (its receive buffer shrunk) holds its slot only until a write has made
/// no progress for the request time: the only slot then serves another
/// address.
#[tokio::test]
async fn a_client_that_never_reads_its_answer_is_cut_off() {
    let limits = Limits {
        connections: 1,
        idle: Duration::from_secs(30),
        request: Duration::from_secs(1),
        ..Limits::default()
    };
    let port = serve_plain(limits).await;
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut hog = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
    let ask = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
    hog.write_all(&[&ask[..], &ask[..]].concat()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let probe = tokio::time::timeout(Duration::from_secs(5), get_from("127.0.0.2", port))
        .await
        .expect("the slot of a client that reads nothing is given back");
    assert_eq!(probe, "HTTP/1.1 200 OK");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "answered after {:?}",
        start.elapsed()
    );
    drop(hog);
}

/// Two busy addresses cannot take the last free connection: an address's
/// second connection is closed at once when only the reserve is free, and
/// a third address (the kubelet's) is answered in it.
#[tokio::test]
async fn the_last_free_connections_are_kept_for_another_address() {
    let limits = Limits {
        connections: 4,
        per_peer: 2,
        reserve: 1,
        idle: Duration::from_secs(30),
        ..Limits::default()
    };
    let port = serve_plain(limits).await;
    let mut held = Vec::new();
    for from in ["127.0.0.1", "127.0.0.1", "127.0.0.3"] {
        held.push(connect_from(from, port).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut refused = connect_from("127.0.0.3", port).await;
    assert!(
        closed_within(&mut refused, Duration::from_secs(2))
            .await
            .is_some(),
        "a second connection into the reserve is closed at once"
    );
    let probe = tokio::time::timeout(Duration::from_secs(2), get_from("127.0.0.2", port))
        .await
        .expect("another address finds the reserve free");
    assert_eq!(probe, "HTTP/1.1 200 OK");
    drop(held);
}
