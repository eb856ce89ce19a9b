//! The fault proxy's traffic: each accepted connection relayed both ways,
//! its commands and replies framed, and the standing fault and the traps
//! applied to them as they pass.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::frames::{split_command, split_reply};
use super::{Fault, Shared, Trap, named};

pub(super) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let id = {
            let mut st = shared.state.lock().unwrap();
            st.accepted += 1;
            st.accepted - 1
        };
        let _ = client.set_nodelay(true);
        tokio::spawn(relay(client, id, shared.clone()));
    }
}

/// Closes with RST (linger 0: nothing is flushed, the peer sees a reset).
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// One client connection: commands up, replies down, faults in between.
async fn relay(mut client: TcpStream, id: usize, shared: Arc<Shared>) {
    let mut changed = shared.changed.subscribe();
    let (fault, _) = shared.fault();
    if fault == Fault::Reset {
        return reset(client);
    }
    let mut server = match (&shared.upstream, fault) {
        (Some(up), f) if f != Fault::Silent => match TcpStream::connect(up).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                Some(s)
            }
            Err(_) => return reset(client),
        },
        _ => None,
    };
    let mut up_buf: Vec<u8> = Vec::new();
    let mut down_buf: Vec<u8> = Vec::new();
    let (mut sent, mut replies) = (0u64, 0u64);
    // Reset when reply number `n` arrives: before relaying it, or right after.
    let mut cut_before: Option<u64> = None;
    let mut cut_after: Option<u64> = None;
    // A cut waits for the reply at most this long, then happens anyway.
    let mut cut_by: Option<Instant> = None;
    let mut delayed: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    // Set by a `silence_from` trap: this connection forwards and answers nothing more.
    let mut silenced = false;
    // Set by a `hold_reply` trap: from reply `n` on, replies wait in `held`
    // until the release counter moves past `since`.
    let mut hold_from: Option<(u64, u64)> = None;
    let mut held: Vec<u8> = Vec::new();
    // Replies to discard, by number (`drop_reply`).
    let mut drop_replies: Vec<u64> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut schunk = vec![0u8; 64 * 1024];
    loop {
        let next_delayed = delayed.front().map(|(t, _)| *t);
        tokio::select! {
            n = client.read(&mut chunk) => {
                let n = match n { Ok(0) | Err(_) => return, Ok(n) => n };
                up_buf.extend_from_slice(&chunk[..n]);
                while let Some((len, command)) = split_command(&up_buf) {
                    let bytes: Vec<u8> = up_buf.drain(..len).collect();
                    if silenced {
                        continue;
                    }
                    let action = decide(&shared, &command);
                    match action {
                        Up::Drop => {}
                        Up::Silence => silenced = true,
                        Up::Answer(err) => {
                            if client.write_all(format!("-{err}\r\n").as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        Up::Forward(then) => {
                            let Some(s) = server.as_mut() else { continue };
                            if s.write_all(&bytes).await.is_err() {
                                return reset(client);
                            }
                            sent += 1;
                            shared.state.lock().unwrap().forwarded.push((id, command));
                            match then {
                                Then::Nothing => {}
                                Then::CutBefore => {
                                    cut_before = Some(sent);
                                    cut_by = Some(Instant::now() + Duration::from_secs(2));
                                }
                                Then::CutAfter => cut_after = Some(sent),
                                Then::DropReply => drop_replies.push(sent),
                                Then::Hold => {
                                    let since = shared.state.lock().unwrap().released;
                                    hold_from = Some((sent, since));
                                }
                            }
                        }
                    }
                }
            }
            n = read_opt(&mut server, &mut schunk) => {
                let n = match n { Some(Ok(n)) if n > 0 => n, _ => return reset(client) };
                down_buf.extend_from_slice(&schunk[..n]);
                while let Some(len) = split_reply(&down_buf) {
                    let bytes: Vec<u8> = down_buf.drain(..len).collect();
                    replies += 1;
                    if silenced {
                        continue;
                    }
                    if cut_before.is_some_and(|c| replies >= c) {
                        shared.state.lock().unwrap().cuts += 1;
                        return reset(client);
                    }
                    if cut_after.is_some_and(|c| replies >= c) {
                        // The reply and the end of the stream arrive together, so
                        // the client sees the close before it can send anything else.
                        let _ = client.write_all(&bytes).await;
                        let _ = client.shutdown().await;
                        return;
                    }
                    if drop_replies.contains(&replies) {
                        continue;
                    }
                    if hold_from.is_some_and(|(n, _)| replies >= n) {
                        shared.state.lock().unwrap().holding += 1;
                        held.extend_from_slice(&bytes);
                        continue;
                    }
                    let (fault, since) = shared.fault();
                    match fault {
                        Fault::Silent => {}
                        Fault::DropReplies(d) if since.elapsed() < d => {}
                        Fault::Delay(d) => delayed.push_back((Instant::now() + d, bytes)),
                        _ if !delayed.is_empty() => delayed.push_back((Instant::now(), bytes)),
                        _ => {
                            if client.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(next_delayed.unwrap_or_else(Instant::now)), if next_delayed.is_some() => {
                if let Some((_, bytes)) = delayed.pop_front()
                    && client.write_all(&bytes).await.is_err()
                {
                    return;
                }
            }
            _ = tokio::time::sleep_until(cut_by.unwrap_or_else(Instant::now)), if cut_by.is_some() => {
                return reset(client);
            }
            r = changed.changed() => {
                if r.is_err() || shared.fault().0 == Fault::Reset {
                    return reset(client);
                }
                let released = shared.state.lock().unwrap().released;
                if let Some((_, since)) = hold_from
                    && released > since
                {
                    hold_from = None;
                    shared.state.lock().unwrap().holding = 0;
                    if client.write_all(&std::mem::take(&mut held)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

async fn read_opt(
    server: &mut Option<TcpStream>,
    buf: &mut [u8],
) -> Option<std::io::Result<usize>> {
    match server {
        Some(s) => Some(s.read(buf).await),
        None => std::future::pending().await,
    }
}

enum Up {
    Forward(Then),
    Answer(String),
    Drop,
    Silence,
}

enum Then {
    Nothing,
    CutBefore,
    CutAfter,
    DropReply,
    Hold,
}

fn decide(shared: &Shared, command: &str) -> Up {
    let mut st = shared.state.lock().unwrap();
    if matches!(st.fault, Some((Fault::Silent, _))) {
        return Up::Drop;
    }
    let hit = st.traps.iter().position(|t| match t {
        Trap::CutBeforeReply(n)
        | Trap::CutAfterReply(n)
        | Trap::Refuse(n, _, _)
        | Trap::Silence(n)
        | Trap::DropReply(n)
        | Trap::Hold(n) => named(command, n),
    });
    let Some(i) = hit else {
        return Up::Forward(Then::Nothing);
    };
    match st.traps[i].clone() {
        Trap::CutBeforeReply(_) => {
            st.traps.remove(i);
            Up::Forward(Then::CutBefore)
        }
        Trap::CutAfterReply(_) => {
            st.traps.remove(i);
            Up::Forward(Then::CutAfter)
        }
        Trap::Silence(_) => {
            st.traps.remove(i);
            Up::Silence
        }
        Trap::Hold(_) => {
            st.traps.remove(i);
            Up::Forward(Then::Hold)
        }
        Trap::DropReply(_) => {
            st.traps.remove(i);
            Up::Forward(Then::DropReply)
        }
        Trap::Refuse(n, err, times) => {
            if times <= 1 {
                st.traps.remove(i);
            } else {
                st.traps[i] = Trap::Refuse(n, err.clone(), times - 1);
            }
            Up::Answer(err)
        }
    }
}
