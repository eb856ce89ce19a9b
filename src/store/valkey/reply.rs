//! Decoding script replies into [`Reply`]: the one place that knows their shape.
//!
//! Shapes are documented at the top of `lua/lib.lua`. A reply that does not
//! decode is an error here; what it means depends on whether the script may
//! have written (the caller decides: `outcome_unknown` after a write,
//! `corrupt_state` for a read).

use super::wire::resp::Value;
use crate::store::{Committed, Lease, Outcome, ReadReply, Reply, Target, metadata_from_json};

/// A script's reply split into its fields (at most `max`, the last one
/// taking the rest), with its outcome, server time and message.
fn fields_of(raw: &Value, max: usize) -> Result<(Vec<String>, Outcome, u64, String), String> {
    let Value::Bulk(bytes) = raw else {
        return Err("the script did not return a string".into());
    };
    let text = std::str::from_utf8(bytes).map_err(|_| "the reply is not UTF-8")?;
    let fields: Vec<String> = text.splitn(max, '\0').map(str::to_owned).collect();
    let outcome = fields
        .first()
        .and_then(|o| Outcome::parse(o))
        .ok_or("unknown outcome")?;
    let server_time_ms = fields
        .get(1)
        .and_then(|s| s.parse().ok())
        .ok_or("unreadable server time")?;
    let message = fields.get(2).cloned().ok_or("no message")?;
    Ok((fields, outcome, server_time_ms, message))
}

/// Turns the read script's reply into a [`ReadReply`], or says why it cannot.
pub fn decode_read(key: &str, raw: &Value) -> Result<ReadReply, String> {
    let (fields, outcome, server_time_ms, message) = fields_of(raw, 6)?;
    let committed = match fields.len() {
        3 => None,
        6 => Some(Committed {
            key: key.to_owned(),
            fencing_token: fields[3].parse().map_err(|_| "unreadable token")?,
            committed_at_ms: fields[4].parse().map_err(|_| "unreadable commit time")?,
            value: fields[5].clone(),
        }),
        n => return Err(format!("{n} fields")),
    };
    Ok(ReadReply {
        outcome,
        committed,
        server_time_ms,
        message,
    })
}

/// Turns a script's reply into a typed reply, or says why it cannot.
pub fn decode(target: &Target, raw: &Value) -> Result<Reply, String> {
    let (fields, outcome, server_time_ms, message) = fields_of(raw, 10)?;
    let lease = match fields.len() {
        3 => None,
        10 => Some(decode_lease(target, &fields[3..])?),
        n => return Err(format!("{n} fields")),
    };
    Ok(Reply {
        outcome,
        lease,
        server_time_ms,
        message,
    })
}

fn decode_lease(target: &Target, f: &[String]) -> Result<Lease, String> {
    let num = |s: &String, what: &str| -> Result<u64, String> {
        s.parse().map_err(|_| format!("unreadable {what}"))
    };
    let metadata = match f[5].as_str() {
        "" => None,
        text => Some(metadata_from_json(text).ok_or("unreadable metadata")?),
    };
    Ok(Lease {
        target: target.name.clone(),
        lease_id: (!f[0].is_empty()).then(|| f[0].clone()),
        fencing_token: num(&f[1], "token")?,
        acquired_at_ms: num(&f[2], "acquisition time")?,
        expires_at_ms: num(&f[3], "expiry")?,
        max_expires_at_ms: match f[4].as_str() {
            "" => None,
            s => Some(num(&s.to_owned(), "maximum expiry")?),
        },
        metadata,
        owner: f[6].clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: &[&[u8]]) -> Value {
        Value::Bulk(v.join(&b"\0"[..]))
    }

    #[test]
    fn decodes_a_lease_with_a_token_beyond_2_pow_53() {
        let t = Target::new("ns", "t");
        let r = decode(
            &t,
            &raw(&[
                b"acquired",
                b"1000",
                b"ok",
                b"L",
                b"9007199254740993",
                b"1000",
                b"2000",
                b"",
                b"{\"a\":1}",
                b"o",
            ]),
        )
        .unwrap();
        assert_eq!(r.outcome, Outcome::Acquired);
        let lease = r.lease.unwrap();
        assert_eq!(lease.fencing_token, 9_007_199_254_740_993);
        assert_eq!(lease.lease_id.as_deref(), Some("L"));
        assert_eq!(lease.max_expires_at_ms, None);
        assert_eq!(lease.owner, "o");
    }

    /// The owner is the last field, so whatever it holds (a record written
    /// by hand may hold a NUL) is read whole, never taken for a separator.
    #[test]
    fn an_owner_holding_a_nul_is_read_whole() {
        let t = Target::new("ns", "t");
        let r = decode(
            &t,
            &raw(&[
                b"found", b"1", b"x", b"", b"7", b"1", b"2", b"", b"", b"a\0b",
            ]),
        )
        .unwrap();
        assert_eq!(r.lease.unwrap().owner, "a\0b");
    }

    #[test]
    fn a_commit_reads_back_with_its_token_time_and_value() {
        let r = decode_read("k", &raw(&[b"found", b"5", b"m", b"3", b"4", b"v\0w"])).unwrap();
        let c = r.committed.unwrap();
        assert_eq!((c.fencing_token, c.committed_at_ms), (3, 4));
        assert_eq!(c.value, "v\0w");
        assert!(decode_read("k", &raw(&[b"found", b"5", b"m", b"3"])).is_err());
    }

    #[test]
    fn anything_unexpected_is_an_error_not_a_guess() {
        let t = Target::new("ns", "t");
        assert!(decode(&t, &raw(&[b"granted", b"1", b"x"])).is_err());
        let lease = |meta: &[u8], owner: &[u8]| {
            raw(&[
                b"found", b"1", b"x", b"", b"1", b"1", b"2", b"", meta, owner,
            ])
        };
        assert!(decode(&t, &lease(b"{}", b"o")).is_ok());
        assert!(decode(&t, &lease(b"not json", b"o")).is_err());
        assert!(decode(&t, &lease(b"[1]", b"o")).is_err());
        assert!(decode(&t, &lease(b"{\"a\":\"\xff\"}", b"o")).is_err());
        assert!(decode(&t, &lease(b"{}", b"\xff")).is_err());
        let deep = format!("{}1{}", "{\"a\":".repeat(65), "}".repeat(65));
        assert!(decode(&t, &lease(deep.as_bytes(), b"o")).is_err());
        assert!(decode(&t, &Value::Error("ERR".into())).is_err());
        assert!(decode(&t, &raw(&[b"found", b"1", b"x", b"", b"1"])).is_err());
        let array = Value::Array(vec![Value::Bulk(b"not_found".to_vec())]);
        assert!(decode(&t, &array).is_err());
    }
}
