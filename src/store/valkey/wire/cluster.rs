//! Valkey Cluster routing: which slot a key is in, which primary serves a
//! slot (from `CLUSTER SLOTS`), and what a redirection says.

pub(super) mod routing;

use super::endpoint::Addr;
use super::resp::Value;

/// Number of hash slots.
pub const SLOTS: u16 = 16384;

/// The slot of `key`: CRC16 of its hash tag (the part in the first `{…}`,
/// when not empty), else of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % SLOTS
}

/// CRC16-XMODEM (polynomial 0x1021), as the cluster specification uses.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Which primary serves each slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotMap {
    /// `(first, last, primary)`, sorted by `first`.
    ranges: Vec<(u16, u16, Addr)>,
}

impl SlotMap {
    /// Reads a `CLUSTER SLOTS` reply; `asked` is the node that gave it. A
    /// NULL endpoint (`cluster-preferred-endpoint-type unknown-endpoint`), an
    /// empty one or `?` means "the host you asked, this port".
    pub fn from_cluster_slots(reply: &Value, asked: &Addr) -> Option<SlotMap> {
        let Value::Array(entries) = reply else {
            return None;
        };
        let mut ranges = Vec::new();
        for e in entries {
            let Value::Array(f) = e else { return None };
            let first = u16::try_from(f.first()?.int()?).ok()?;
            let last = u16::try_from(f.get(1)?.int()?).ok()?;
            let Value::Array(node) = f.get(2)? else {
                return None;
            };
            let host = match node.first()? {
                Value::Nil => String::new(),
                v => v.text()?,
            };
            let port = u16::try_from(node.get(1)?.int()?).ok()?;
            let host = if host.is_empty() || host == "?" {
                asked.host.clone()
            } else {
                host
            };
            ranges.push((first, last, Addr { host, port }));
        }
        ranges.sort_by_key(|r| r.0);
        Some(SlotMap { ranges })
    }

    /// The primary serving `slot`, if any.
    pub fn owner(&self, slot: u16) -> Option<&Addr> {
        self.ranges
            .iter()
            .find(|(a, b, _)| *a <= slot && slot <= *b)
            .map(|(_, _, n)| n)
    }

    /// Every primary, once each.
    pub fn primaries(&self) -> Vec<Addr> {
        let mut all: Vec<Addr> = Vec::new();
        for (_, _, n) in &self.ranges {
            if !all.contains(n) {
                all.push(n.clone());
            }
        }
        all
    }

    /// Records that `slot` moved to `to` (a MOVED reply), until the next refresh.
    pub fn moved(&mut self, slot: u16, to: Addr) {
        let mut next = Vec::with_capacity(self.ranges.len() + 2);
        for (a, b, n) in self.ranges.drain(..) {
            if a <= slot && slot <= b {
                if a < slot {
                    next.push((a, slot - 1, n.clone()));
                }
                if slot < b {
                    next.push((slot + 1, b, n));
                }
            } else {
                next.push((a, b, n));
            }
        }
        next.push((slot, slot, to));
        next.sort_by_key(|r| r.0);
        self.ranges = next;
    }
}

/// A redirection the server answered instead of running the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redirect {
    /// `MOVED slot host:port`: the slot lives there now.
    Moved(u16, Addr),
    /// `ASK slot host:port`: ask there once, after `ASKING` (slot migrating).
    Ask(u16, Addr),
}

/// Reads a `MOVED`/`ASK` error answered by the node at `from`; `None` for
/// any other error. An empty endpoint (`MOVED 3999 :6380`) means the host of
/// the node that answered, at that port.
pub fn redirect(error: &str, from: &Addr) -> Option<Redirect> {
    let mut words = error.split_whitespace();
    let kind = words.next()?;
    let slot = words.next()?.parse().ok()?;
    let to = words.next()?;
    let addr = match to.rsplit_once(':') {
        Some(("" | "?", port)) => Addr {
            host: from.host.clone(),
            port: port.parse().ok()?,
        },
        _ => Addr::parse(to)?,
    };
    match kind {
        "MOVED" => Some(Redirect::Moved(slot, addr)),
        "ASK" => Some(Redirect::Ask(slot, addr)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Reference values from the cluster specification / CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
    }

    #[test]
    fn slot_maps_and_redirections() {
        let node =
            |h: &str, p: i64| Value::Array(vec![Value::Bulk(h.as_bytes().to_vec()), Value::Int(p)]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("10.0.0.2", 7001),
            ]),
            Value::Array(vec![Value::Int(0), Value::Int(5460), node("", 7000)]),
        ]);
        let asked = Addr::parse("seed:7000").unwrap();
        let mut map = SlotMap::from_cluster_slots(&reply, &asked).unwrap();
        assert_eq!(map.owner(0), Some(&asked));
        // A NULL endpoint (unknown-endpoint): the host asked, the port given.
        let unknown = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            Value::Array(vec![
                Value::Nil,
                Value::Int(7003),
                Value::Bulk(b"id".to_vec()),
            ]),
        ])]);
        let m = SlotMap::from_cluster_slots(&unknown, &asked).unwrap();
        assert_eq!(m.owner(5).unwrap().to_string(), "seed:7003");
        assert_eq!(map.owner(16383).unwrap().to_string(), "10.0.0.2:7001");
        assert_eq!(map.primaries().len(), 2);
        map.moved(100, Addr::parse("10.0.0.3:7002").unwrap());
        assert_eq!(map.owner(100).unwrap().port, 7002);
        assert_eq!(map.owner(99), Some(&asked));
        assert_eq!(map.owner(101), Some(&asked));
        let from = Addr::parse("10.0.0.9:7000").unwrap();
        assert_eq!(
            redirect("MOVED 3999 127.0.0.1:6381", &from),
            Some(Redirect::Moved(
                3999,
                Addr::parse("127.0.0.1:6381").unwrap()
            ))
        );
        assert_eq!(
            redirect("MOVED 3999 :6380", &from),
            Some(Redirect::Moved(3999, Addr::parse("10.0.0.9:6380").unwrap()))
        );
        assert_eq!(
            redirect("ASK 12 [::1]:6380", &from),
            Some(Redirect::Ask(12, Addr::parse("[::1]:6380").unwrap()))
        );
        assert!(matches!(
            redirect("ASK 1 h:1", &from),
            Some(Redirect::Ask(1, _))
        ));
        assert_eq!(redirect("ERR nope", &from), None);
        assert_eq!(redirect("MOVED 1 :notaport", &from), None);
    }
}
