//! RESP2, the wire format: commands out, replies in.
//!
//! Only what the store sends and receives: commands are arrays of bulk
//! strings; replies are the five RESP2 types. The parser is incremental (it
//! says "need more bytes" instead of blocking) and bounded, so a confused or
//! hostile peer cannot make it allocate without limit or recurse deeply.

use super::error::{Error, Kind};

/// One reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `+OK`.
    Simple(String),
    /// `-ERR …`: the server refused or failed the command.
    Error(String),
    /// `:42`.
    Int(i64),
    /// `$3 abc`: bytes, not necessarily UTF-8.
    Bulk(Vec<u8>),
    /// `$-1` or `*-1`.
    Nil,
    /// `*2 …`.
    Array(Vec<Value>),
}

impl Value {
    /// The text of a simple, bulk or integer reply.
    pub fn text(&self) -> Option<String> {
        match self {
            Value::Simple(s) => Some(s.clone()),
            Value::Bulk(b) => String::from_utf8(b.clone()).ok(),
            Value::Int(i) => Some(i.to_string()),
            _ => None,
        }
    }

    /// The integer of an integer reply (or of a decimal string).
    pub fn int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            other => other.text()?.parse().ok(),
        }
    }
}

/// A command: its name and arguments, as bytes.
#[derive(Clone, Debug, Default)]
pub struct Cmd(Vec<Vec<u8>>);

impl Cmd {
    /// A command named `name`.
    pub fn new(name: &str) -> Self {
        Self(vec![name.as_bytes().to_vec()])
    }

    /// Appends an argument.
    pub fn arg(mut self, a: impl AsRef<[u8]>) -> Self {
        self.0.push(a.as_ref().to_vec());
        self
    }

    /// Appends arguments.
    pub fn args<A: AsRef<[u8]>>(mut self, all: impl IntoIterator<Item = A>) -> Self {
        self.0.extend(all.into_iter().map(|a| a.as_ref().to_vec()));
        self
    }

    /// The command name, for messages (never the arguments: they can be secret).
    pub fn name(&self) -> String {
        String::from_utf8_lossy(self.0.first().map(Vec::as_slice).unwrap_or_default()).into_owned()
    }

    /// Appends the wire form to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("*{}\r\n", self.0.len()).as_bytes());
        for a in &self.0 {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Longest bulk string accepted in a reply.
const MAX_BULK: usize = 64 * 1024 * 1024;
/// Longest line accepted (a simple string, an error, a number or a length
/// header): the store's replies never come close.
const MAX_LINE: usize = 64 * 1024;
/// Largest reply accepted as a whole (the largest bulk string plus framing).
const MAX_REPLY: usize = MAX_BULK + 1024 * 1024;
/// Most elements accepted in one reply array.
const MAX_ARRAY: usize = 1 << 20;
/// Deepest nesting accepted (the store's replies nest at most 3 deep).
const MAX_DEPTH: usize = 16;

/// The peer sent something that is not RESP2 within our bounds: a
/// [`Kind::Protocol`] error.
fn protocol(detail: impl Into<String>) -> Error {
    Error::new(Kind::Protocol, detail)
}

/// Replies from a byte stream, decoded as the bytes arrive.
///
/// Decoding resumes where it stopped: a line is searched for its CRLF only
/// in bytes not searched before, a long bulk string is looked at again only
/// once it can be complete, and array elements already decoded are kept. So
/// the work is linear in the bytes received, and a peer that never ends a
/// line or a reply is refused at the bounds above rather than buffered.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Start of the reply being decoded.
    start: usize,
    /// Next byte to decode.
    pos: usize,
    /// Where the search for the CRLF of the line at `pos` resumes (0: from `pos`).
    scanned: usize,
    /// Arrays being filled: (elements wanted, elements so far).
    open: Vec<(usize, Vec<Value>)>,
}

/// One decoding step: a frame with what it became, or a wait for more bytes.
enum Step {
    Value(Value),
    OpenArray(usize),
    More,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The buffer to read into (bytes appended at its end are decoded next).
    pub fn buffer(&mut self) -> &mut Vec<u8> {
        self.compact();
        &mut self.buf
    }

    /// Appends received bytes.
    #[cfg(test)]
    fn feed(&mut self, bytes: &[u8]) {
        self.compact();
        self.buf.extend_from_slice(bytes);
    }

    /// True when no byte of an unfinished reply is buffered.
    #[cfg(test)]
    fn is_idle(&self) -> bool {
        self.start == self.buf.len()
    }

    /// Bytes of complete replies taken so far (since the last compaction).
    #[cfg(test)]
    fn consumed(&self) -> usize {
        self.start
    }

    /// The next complete reply, `Ok(None)` when more bytes are needed. After
    /// an error the stream is unusable (the reply boundaries are lost).
    pub fn next(&mut self) -> Result<Option<Value>, Error> {
        loop {
            let mut value = match self.step()? {
                Step::More => {
                    if self.buf.len() - self.start > MAX_REPLY {
                        return Err(bad("reply too large"));
                    }
                    return Ok(None);
                }
                Step::OpenArray(n) => {
                    self.open.push((n, Vec::with_capacity(n.min(1024))));
                    continue;
                }
                Step::Value(v) => v,
            };
            loop {
                let Some((want, items)) = self.open.last_mut() else {
                    self.start = self.pos;
                    return Ok(Some(value));
                };
                items.push(value);
                if items.len() < *want {
                    break;
                }
                let (_, items) = self.open.pop().unwrap_or_default();
                value = Value::Array(items);
            }
        }
    }

    /// Decodes the frame at `pos`, advancing past it unless more bytes are needed.
    fn step(&mut self) -> Result<Step, Error> {
        if self.open.len() > MAX_DEPTH {
            return Err(protocol("reply nested too deeply"));
        }
        let Some(&kind) = self.buf.get(self.pos) else {
            return Ok(Step::More);
        };
        let Some(after) = self.line_end()? else {
            return Ok(Step::More);
        };
        let line = &self.buf[self.pos + 1..after - 2];
        let text = || String::from_utf8_lossy(line).into_owned();
        let (step, next) = match kind {
            b'+' => (Step::Value(Value::Simple(text())), after),
            b'-' => (Step::Value(Value::Error(text())), after),
            b':' => (Step::Value(Value::Int(number(line)?)), after),
            b'$' => match usize::try_from(number(line)?) {
                Err(_) => (Step::Value(Value::Nil), after),
                Ok(n) if n > MAX_BULK => return Err(bad("bulk string too long")),
                Ok(n) => {
                    let end = after + n;
                    if self.buf.len() < end + 2 {
                        // The header is found again (it is short) once all can be here.
                        self.scanned = 0;
                        return Ok(Step::More);
                    }
                    if &self.buf[end..end + 2] != b"\r\n" {
                        return Err(bad("bulk string not terminated"));
                    }
                    (
                        Step::Value(Value::Bulk(self.buf[after..end].to_vec())),
                        end + 2,
                    )
                }
            },
            b'*' => match usize::try_from(number(line)?) {
                Err(_) => (Step::Value(Value::Nil), after),
                Ok(n) if n > MAX_ARRAY => return Err(bad("array too long")),
                Ok(0) => (Step::Value(Value::Array(Vec::new())), after),
                Ok(n) => (Step::OpenArray(n), after),
            },
            other => return Err(protocol(format!("unexpected reply type byte {other}"))),
        };
        self.pos = next;
        self.scanned = 0;
        Ok(step)
    }

    /// The index after the CRLF ending the line at `pos`, searching only
    /// bytes not searched before; an error past [`MAX_LINE`].
    fn line_end(&mut self) -> Result<Option<usize>, Error> {
        let from = self.scanned.max(self.pos + 1);
        let found = self
            .buf
            .get(from..)
            .and_then(|rest| rest.windows(2).position(|w| w == b"\r\n"));
        let too_long = |len: usize| len > MAX_LINE;
        match found {
            Some(i) if too_long(from + i - (self.pos + 1)) => Err(bad("reply line too long")),
            Some(i) => Ok(Some(from + i + 2)),
            None if too_long(self.buf.len().saturating_sub(self.pos + 2)) => {
                Err(bad("reply line too long"))
            }
            None => {
                // The last byte may be the CR of a CRLF still on its way.
                self.scanned = self.buf.len().saturating_sub(1).max(self.pos + 1);
                Ok(None)
            }
        }
    }

    /// Drops bytes of replies already returned, once they are worth moving.
    fn compact(&mut self) {
        if self.start == 0 {
            return;
        }
        if self.start == self.buf.len() {
            self.buf.clear();
        } else if self.start >= 64 * 1024 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
        } else {
            return;
        }
        self.pos -= self.start;
        self.scanned = self.scanned.saturating_sub(self.start);
        self.start = 0;
    }
}

/// Parses one reply from the start of `buf`: `Ok(None)` when more bytes are
/// needed, `Ok(Some((value, consumed)))` otherwise.
#[cfg(test)]
fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, Error> {
    let mut d = Decoder::new();
    d.feed(buf);
    Ok(d.next()?.map(|v| (v, d.consumed())))
}

fn bad(what: &str) -> Error {
    protocol(format!("malformed reply: {what}"))
}

fn number(line: &[u8]) -> Result<i64, Error> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("not a number"))
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands_as_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        Cmd::new("GET").arg("k\r\n").encode(&mut out);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$3\r\nk\r\n\r\n");
    }

    #[test]
    fn parses_every_type_and_waits_for_more_bytes() {
        let wire = b"*5\r\n+OK\r\n-ERR no\r\n:-7\r\n$3\r\n\xffab\r\n$-1\r\n";
        for cut in 0..wire.len() {
            assert_eq!(parse(&wire[..cut]), Ok(None), "cut at {cut}");
        }
        let (v, used) = parse(wire).unwrap().unwrap();
        assert_eq!(used, wire.len());
        assert_eq!(
            v,
            Value::Array(vec![
                Value::Simple("OK".into()),
                Value::Error("ERR no".into()),
                Value::Int(-7),
                Value::Bulk(vec![0xff, b'a', b'b']),
                Value::Nil,
            ])
        );
    }

    #[test]
    fn refuses_what_is_not_resp2_or_out_of_bounds() {
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b":12x\r\n").is_err());
        assert!(parse(b"$3\r\nabcde").is_err());
        assert!(parse(format!("${}\r\n", MAX_BULK + 1).as_bytes()).is_err());
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2);
        assert!(parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn a_line_without_end_is_refused_at_the_bound() {
        let mut d = Decoder::new();
        d.feed(b"+");
        let chunk = vec![b'a'; 4096];
        let mut fed = 1;
        let refused = loop {
            match d.next() {
                Ok(None) => {}
                Ok(Some(v)) => panic!("{v:?}"),
                Err(e) => break e,
            }
            d.feed(&chunk);
            fed += chunk.len();
            assert!(fed < 4 * MAX_LINE, "still buffering after {fed} bytes");
        };
        assert!(refused.detail.contains("line too long"), "{refused:?}");
        assert!(fed <= MAX_LINE + 2 * chunk.len(), "{fed}");
        // A line at the bound is fine.
        let mut at = b"-".to_vec();
        at.extend(vec![b'E'; MAX_LINE]);
        at.extend_from_slice(b"\r\n");
        assert!(matches!(parse(&at), Ok(Some((Value::Error(_), _)))));
    }

    #[test]
    fn replies_fed_a_byte_at_a_time_and_pipelined_decode_the_same() {
        let one = b"*3\r\n$5\r\nhello\r\n*2\r\n:1\r\n$-1\r\n+OK\r\n".to_vec();
        let (expected, _) = parse(&one).unwrap().unwrap();
        let mut d = Decoder::new();
        let mut got = Vec::new();
        for _ in 0..3 {
            for b in &one {
                d.feed(std::slice::from_ref(b));
                while let Some(v) = d.next().unwrap() {
                    got.push(v);
                }
            }
        }
        assert_eq!(got, vec![expected.clone(), expected.clone(), expected]);
        assert!(d.is_idle());
    }

    #[test]
    fn a_large_bulk_string_in_small_reads_is_linear() {
        // 16 MiB in 16 KiB reads: the body is looked at once, not on every read.
        let n = 16 << 20;
        let mut d = Decoder::new();
        d.feed(format!("${n}\r\n").as_bytes());
        let chunk = vec![b'x'; 16 << 10];
        let started = std::time::Instant::now();
        for _ in 0..n / chunk.len() {
            d.feed(&chunk);
            assert_eq!(d.next(), Ok(None));
        }
        d.feed(b"\r\n");
        assert!(matches!(d.next(), Ok(Some(Value::Bulk(b))) if b.len() == n));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}
