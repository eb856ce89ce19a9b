//! Decoding script replies into [`Reply`]: the one place that knows their shape.
//!
//! Shapes are documented at the top of `lua/lib.lua`. A reply that does not
//! decode is an error here; what it means depends on whether the script may
//! have written (the caller decides: `outcome_unknown` after a write,
//! `corrupt_state` for a read).

use super::wire::resp::Value;
use crate::store::{Committed, Lease, Outcome, ReadReply, Reply, Target, metadata_from_json};

/// A script's flat array of strings, with its outcome, server time and message.
fn fields_of(raw: &Value) -> Result<(Vec<String>, Outcome, u64, String), String> {
    let Value::Array(items) = raw else {
        return Err("the script did not return an array".into());
    };
    let fields = items
        .iter()
        .map(|v| match v {
            Value::Bulk(b) => String::from_utf8(b.clone()).map_err(|_| "a field is not UTF-8"),
            Value::Simple(s) => Ok(s.clone()),
            _ => Err("a field is not a string"),
        })
        .collect::<Result<Vec<String>, _>>()?;
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
    let (fields, outcome, server_time_ms, message) = fields_of(raw)?;
    let committed = match fields.len() {
        3 => None,
        6 => Some(Committed {
            key: key.to_owned(),
            fencing_token: fields[3].parse().map_err(|_| "unreadable token")?,
            value: fields[4].clone(),
            committed_at_ms: fields[5].parse().map_err(|_| "unreadable commit time")?,
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

/// Turns a script's flat array of strings into a typed reply, or says why it cannot.
pub fn decode(target: &Target, raw: &Value) -> Result<Reply, String> {
    let (fields, outcome, server_time_ms, message) = fields_of(raw)?;
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
    let metadata = match f[6].as_str() {
        "" => None,
        text => Some(metadata_from_json(text).ok_or("unreadable metadata")?),
    };
    Ok(Lease {
        target: target.name.clone(),
        lease_id: (!f[0].is_empty()).then(|| f[0].clone()),
        owner: f[1].clone(),
        fencing_token: num(&f[2], "token")?,
        acquired_at_ms: num(&f[3], "acquisition time")?,
        expires_at_ms: num(&f[4], "expiry")?,
        max_expires_at_ms: match f[5].as_str() {
            "" => None,
            s => Some(num(&s.to_owned(), "maximum expiry")?),
        },
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: &[&[u8]]) -> Value {
        Value::Array(v.iter().map(|x| Value::Bulk(x.to_vec())).collect())
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
                b"o",
                b"9007199254740993",
                b"1000",
                b"2000",
                b"",
                b"{\"a\":1}",
            ]),
        )
        .unwrap();
        assert_eq!(r.outcome, Outcome::Acquired);
        let lease = r.lease.unwrap();
        assert_eq!(lease.fencing_token, 9_007_199_254_740_993);
        assert_eq!(lease.lease_id.as_deref(), Some("L"));
        assert_eq!(lease.max_expires_at_ms, None);
    }

    #[test]
    fn anything_unexpected_is_an_error_not_a_guess() {
        let t = Target::new("ns", "t");
        assert!(decode(&t, &raw(&[b"granted", b"1", b"x"])).is_err());
        let lease = |meta: &[u8], owner: &[u8]| {
            raw(&[
                b"found", b"1", b"x", b"", owner, b"1", b"1", b"2", b"", meta,
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
    }
}
