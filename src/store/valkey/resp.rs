//! RESP2, the wire format: commands out, replies in.
//!
//! Only what the store sends and receives: commands are arrays of bulk
//! strings; replies are the five RESP2 types. The parser is incremental (it
//! says "need more bytes" instead of blocking) and bounded, so a confused or
//! hostile peer cannot make it allocate without limit or recurse deeply.

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
/// Most elements accepted in one reply array.
const MAX_ARRAY: usize = 1 << 20;
/// Deepest nesting accepted (the store's replies nest at most 3 deep).
const MAX_DEPTH: usize = 16;

/// The peer sent something that is not RESP2 within our bounds.
#[derive(Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

/// Parses one reply from the start of `buf`: `Ok(None)` when more bytes are
/// needed, `Ok(Some((value, consumed)))` otherwise.
pub fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, ProtocolError> {
    parse_at(buf, 0, 0)
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, ProtocolError> {
    if depth > MAX_DEPTH {
        return Err(ProtocolError("reply nested too deeply".into()));
    }
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some((line, after)) = line(buf, at + 1) else {
        return Ok(None);
    };
    let text = || String::from_utf8_lossy(line).into_owned();
    Ok(Some(match kind {
        b'+' => (Value::Simple(text()), after),
        b'-' => (Value::Error(text()), after),
        b':' => (Value::Int(number(line)?), after),
        b'$' => {
            let n = number(line)?;
            if n < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            let n = usize::try_from(n).map_err(|_| bad("bulk length"))?;
            if n > MAX_BULK {
                return Err(bad("bulk string too long"));
            }
            let end = after + n;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(bad("bulk string not terminated"));
            }
            (Value::Bulk(buf[after..end].to_vec()), end + 2)
        }
        b'*' => {
            let n = number(line)?;
            if n < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            let n = usize::try_from(n).map_err(|_| bad("array length"))?;
            if n > MAX_ARRAY {
                return Err(bad("array too long"));
            }
            let mut items = Vec::with_capacity(n.min(1024));
            let mut at = after;
            for _ in 0..n {
                match parse_at(buf, at, depth + 1)? {
                    Some((v, next)) => {
                        items.push(v);
                        at = next;
                    }
                    None => return Ok(None),
                }
            }
            (Value::Array(items), at)
        }
        other => return Err(ProtocolError(format!("unexpected reply type byte {other}"))),
    }))
}

fn bad(what: &str) -> ProtocolError {
    ProtocolError(format!("malformed reply: {what}"))
}

/// The line starting at `from` (without CRLF) and the index after its CRLF.
fn line(buf: &[u8], from: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(from..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], from + end + 2))
}

fn number(line: &[u8]) -> Result<i64, ProtocolError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("not a number"))
}

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
}
