//! Just enough RESP framing for the fault proxy: where one command or one
//! reply ends in a byte stream, and a command's name.

fn line(buf: &[u8], from: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(from..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], from + end + 2))
}

fn number(bytes: &[u8]) -> i64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1)
}

/// One complete command at the start of `buf`: its length and its first two
/// words (upper-cased), e.g. `FUNCTION LOAD`.
pub fn split_command(buf: &[u8]) -> Option<(usize, String)> {
    if buf.first() != Some(&b'*') {
        // An inline command: one line.
        let (l, end) = line(buf, 0)?;
        let words = String::from_utf8_lossy(l).to_uppercase();
        return Some((
            end,
            words
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" "),
        ));
    }
    let (head, mut at) = line(buf, 1)?;
    let count = number(head);
    let mut words = Vec::new();
    for _ in 0..count.max(0) {
        if buf.get(at) != Some(&b'$') {
            return None;
        }
        let (len, start) = line(buf, at + 1)?;
        let len = number(len).max(0) as usize;
        let end = start + len + 2;
        if buf.len() < end {
            return None;
        }
        if words.len() < 2 {
            words.push(String::from_utf8_lossy(&buf[start..start + len]).to_uppercase());
        }
        at = end;
    }
    Some((at, words.join(" ")))
}

/// The length of one complete reply at the start of `buf` (RESP2 and the
/// simple RESP3 types).
pub fn split_reply(buf: &[u8]) -> Option<usize> {
    split_reply_at(buf, 0)
}

fn split_reply_at(buf: &[u8], at: usize) -> Option<usize> {
    let kind = *buf.get(at)?;
    let (head, after) = line(buf, at + 1)?;
    match kind {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(after),
        b'$' | b'=' | b'!' => {
            let n = number(head);
            if n < 0 {
                return Some(after);
            }
            let end = after + n as usize + 2;
            (buf.len() >= end).then_some(end)
        }
        b'*' | b'~' | b'>' | b'%' => {
            let mut n = number(head);
            if kind == b'%' {
                n *= 2;
            }
            let mut at = after;
            for _ in 0..n.max(0) {
                at = split_reply_at(buf, at)?;
            }
            Some(at)
        }
        _ => Some(after),
    }
}
