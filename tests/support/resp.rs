//! A tiny blocking RESP2 client for tests: raw commands against a real server
//! (to corrupt state on purpose, read counters, flush), independent of the
//! client library under test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One reply, as the server sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The reply as text (simple, bulk or integer), panicking otherwise.
    pub fn text(&self) -> String {
        match self {
            Resp::Simple(s) | Resp::Bulk(Some(s)) => s.clone(),
            Resp::Int(i) => i.to_string(),
            other => panic!("expected a text reply, got {other:?}"),
        }
    }

    /// The reply as an integer.
    pub fn int(&self) -> i64 {
        match self {
            Resp::Int(i) => *i,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// The reply as an array of integers (what HPTTL, HPERSIST and
    /// HPEXPIRE answer, one per field).
    pub fn ints(&self) -> Vec<i64> {
        match self {
            Resp::Array(Some(items)) => items.iter().map(Resp::int).collect(),
            other => panic!("expected an array of integers, got {other:?}"),
        }
    }

    /// The reply as an array of texts, `None` for each nil (HMGET, HGETALL).
    pub fn texts(&self) -> Vec<Option<String>> {
        match self {
            Resp::Array(Some(items)) => items
                .iter()
                .map(|r| match r {
                    Resp::Bulk(None) => None,
                    r => Some(r.text()),
                })
                .collect(),
            other => panic!("expected an array, got {other:?}"),
        }
    }
}

/// A blocking connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn connect(addr: &str) -> std::io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Self {
            reader: BufReader::new(stream),
        })
    }

    /// Sends one command and reads its reply.
    pub fn cmd(&mut self, args: &[&str]) -> Resp {
        self.try_cmd(args).expect("valkey connection failed")
    }

    pub fn try_cmd(&mut self, args: &[&str]) -> std::io::Result<Resp> {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.try_cmd_bytes(&bytes)
    }

    /// Sends one command whose arguments may be any bytes (e.g. invalid UTF-8).
    pub fn try_cmd_bytes(&mut self, args: &[&[u8]]) -> std::io::Result<Resp> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&buf)?;
        self.read()
    }

    fn read(&mut self) -> std::io::Result<Resp> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        if line.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed",
            ));
        }
        let body = line[1..].trim_end_matches("\r\n").to_string();
        Ok(match line.as_bytes()[0] {
            b'+' => Resp::Simple(body),
            b'-' => Resp::Error(body),
            b':' => Resp::Int(body.parse().unwrap()),
            b'$' => {
                let n: i64 = body.parse().unwrap();
                if n < 0 {
                    Resp::Bulk(None)
                } else {
                    let mut data = vec![0u8; n as usize + 2];
                    self.reader.read_exact(&mut data)?;
                    data.truncate(n as usize);
                    Resp::Bulk(Some(String::from_utf8_lossy(&data).into_owned()))
                }
            }
            b'*' => {
                let n: i64 = body.parse().unwrap();
                if n < 0 {
                    Resp::Array(None)
                } else {
                    let mut items = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        items.push(self.read()?);
                    }
                    Resp::Array(Some(items))
                }
            }
            other => panic!("unexpected RESP type byte {other}"),
        })
    }
}

/// A lease record as the scripts store it in a target's `lease` field
/// (`lua/lib.lua`), for tests that plant records by hand; the lease id's
/// hash is a placeholder no real id has.
pub fn lease_record(
    token: &str,
    acquired_ms: u64,
    expires_ms: u64,
    owner: &str,
    meta: &str,
) -> String {
    format!(
        "1:{token}:{acquired_ms}:{expires_ms}::{}:{}:{owner}{meta}",
        "0".repeat(40),
        owner.len()
    )
}

impl Conn {
    /// Plants a lease record in the target hash `key` as the scripts write
    /// one: the counter at its token, the `lease` field expiring at its
    /// stored expiry.
    pub fn plant_lease(&mut self, key: &str, token: &str, expires_ms: u64, owner: &str) {
        let record = lease_record(token, 1, expires_ms, owner, "");
        self.cmd(&["HSET", key, "fence", token]);
        let at = expires_ms.to_string();
        // 1, or 2 for an expiry already past (the field is gone at once).
        let r = self.cmd(&["HSETEX", key, "PXAT", &at, "FIELDS", "1", "lease", &record]);
        assert!(matches!(r, Resp::Int(1 | 2)), "HSETEX {key}: {r:?}");
    }
}
