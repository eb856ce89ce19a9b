//! Decoding script replies into [`Reply`]: the one place that knows their shape.
//!
//! Shapes are documented at the top of `lua/lib.lua`.

use crate::store::{Lease, Outcome, Reply, Target};

/// Turns a script's flat string array into a typed reply.
///
/// Anything unexpected (an unknown outcome, a bad number, unparsable
/// metadata) becomes `corrupt_state`: we never guess at what happened.
pub fn decode(target: &Target, raw: &[String]) -> Reply {
    match try_decode(target, raw) {
        Some(reply) => reply,
        None => Reply {
            outcome: Outcome::CorruptState,
            lease: None,
            server_time_ms: raw.get(1).and_then(|s| s.parse().ok()).unwrap_or(0),
            message: "unexpected reply from the lease script".into(),
        },
    }
}

fn try_decode(target: &Target, raw: &[String]) -> Option<Reply> {
    let outcome = Outcome::parse(raw.first()?)?;
    let server_time_ms = raw.get(1)?.parse().ok()?;
    let message = raw.get(2)?.clone();
    let lease = match raw.len() {
        3 => None,
        10 => Some(decode_lease(target, &raw[3..])?),
        _ => return None,
    };
    Some(Reply {
        outcome,
        lease,
        server_time_ms,
        message,
    })
}

fn decode_lease(target: &Target, f: &[String]) -> Option<Lease> {
    let optional_num = |s: &String| -> Option<Option<u64>> {
        if s.is_empty() {
            Some(None)
        } else {
            s.parse().ok().map(Some)
        }
    };
    let metadata = if f[6].is_empty() {
        None
    } else {
        match serde_json::from_str::<serde_json::Value>(&f[6]).ok()? {
            serde_json::Value::Object(m) => Some(m),
            _ => return None,
        }
    };
    Some(Lease {
        target: target.name.clone(),
        lease_id: (!f[0].is_empty()).then(|| f[0].clone()),
        owner: f[1].clone(),
        fencing_token: f[2].parse().ok()?,
        acquired_at_ms: f[3].parse().ok()?,
        expires_at_ms: f[4].parse().ok()?,
        max_expires_at_ms: optional_num(&f[5])?,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn decodes_a_lease_with_a_token_beyond_2_pow_53() {
        let t = Target::new("ns", "t");
        let r = decode(
            &t,
            &s(&[
                "acquired",
                "1000",
                "ok",
                "L",
                "o",
                "9007199254740993",
                "1000",
                "2000",
                "",
                "{\"a\":1}",
            ]),
        );
        assert_eq!(r.outcome, Outcome::Acquired);
        let lease = r.lease.unwrap();
        assert_eq!(lease.fencing_token, 9_007_199_254_740_993);
        assert_eq!(lease.lease_id.as_deref(), Some("L"));
        assert_eq!(lease.max_expires_at_ms, None);
    }

    #[test]
    fn unknown_outcomes_and_bad_metadata_fail_closed() {
        let t = Target::new("ns", "t");
        assert_eq!(
            decode(&t, &s(&["granted", "1", "x"])).outcome,
            Outcome::CorruptState
        );
        let bad = s(&["found", "1", "x", "", "o", "1", "1", "2", "", "not json"]);
        assert_eq!(decode(&t, &bad).outcome, Outcome::CorruptState);
    }
}
