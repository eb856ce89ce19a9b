//! Property tests of the reply decoder, which reads whatever the network
//! brings: random bytes from a seed printed with the output (a new one every
//! run, so a failure replays with it), many iterations, a
//! few seconds in all. Arbitrary bytes never panic and never make the
//! decoder hold more than a bound over what it was fed; hostile length
//! prefixes are refused or waited on without allocating what they announce;
//! every value encoded decodes back to itself, however the bytes are split.

use super::*;

/// splitmix64: a tiny deterministic generator (the seed is in the failure).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// What a decoder holds on the heap: its buffer, its open arrays and the
/// values in them.
fn retained(d: &Decoder) -> usize {
    d.buf.capacity()
        + d.open.capacity() * std::mem::size_of::<(usize, Vec<Value>)>()
        + d.open
            .iter()
            .map(|(_, items)| {
                items.capacity() * std::mem::size_of::<Value>()
                    + items.iter().map(heap).sum::<usize>()
            })
            .sum::<usize>()
}

fn heap(v: &Value) -> usize {
    match v {
        Value::Simple(s) | Value::Error(s) => s.capacity(),
        Value::Bulk(b) => b.capacity(),
        Value::Array(a) => {
            a.capacity() * std::mem::size_of::<Value>() + a.iter().map(heap).sum::<usize>()
        }
        Value::Int(_) | Value::Nil => 0,
    }
}

/// Most a decoder fed `fed` bytes may hold: a small multiple of the bytes
/// (one value per 3 bytes at least, a buffer that doubles) plus one
/// preallocation of at most 1024 elements per open array.
fn bound(fed: usize) -> usize {
    let value = std::mem::size_of::<Value>();
    4096 + 2 * fed + fed / 3 * (value + 8) * 2 + (MAX_DEPTH + 2) * 1024 * value
}

/// Feeds `bytes` in chunks the generator picks; decodes after each chunk
/// until the decoder waits or refuses. Returns the values and whether it refused.
fn feed_in_chunks(rng: &mut Rng, bytes: &[u8]) -> (Vec<Value>, bool) {
    let mut d = Decoder::new();
    let mut got = Vec::new();
    let mut at = 0;
    let mut fed = 0;
    while at < bytes.len() {
        let n = 1 + rng.below(bytes.len() - at).min(rng.below(64) + 1);
        d.feed(&bytes[at..at + n]);
        at += n;
        fed += n;
        loop {
            match d.next() {
                Ok(Some(v)) => got.push(v),
                Ok(None) => break,
                Err(_) => return (got, true),
            }
            assert!(
                retained(&d) <= bound(fed),
                "holds {} after {fed} bytes",
                retained(&d)
            );
        }
        assert!(
            retained(&d) <= bound(fed),
            "holds {} after {fed} bytes",
            retained(&d)
        );
    }
    (got, false)
}

/// RESP2 of `v` (the decoder's inverse; `Nil` as the null bulk string).
fn encode(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
        Value::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
        Value::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
        Value::Bulk(b) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Value::Nil => out.extend_from_slice(b"$-1\r\n"),
        Value::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for i in items {
                encode(i, out);
            }
        }
    }
}

/// A random value within the decoder's bounds, nested at most `depth` more.
fn value(rng: &mut Rng, depth: usize) -> Value {
    let line = |rng: &mut Rng| -> String {
        let n = rng.below(24);
        (0..n)
            .map(|_| match rng.below(6) {
                0 => 'é',
                1 => '名',
                2 => ' ',
                _ => char::from(b'!' + rng.below(94) as u8),
            })
            .collect()
    };
    match rng.below(if depth == 0 { 5 } else { 7 }) {
        0 => Value::Simple(line(rng)),
        1 => Value::Error(line(rng)),
        2 => Value::Int(match rng.below(4) {
            0 => i64::MIN,
            1 => i64::MAX,
            _ => rng.next() as i64 >> rng.below(64),
        }),
        3 => {
            let n = rng.below(40);
            let mut b = rng.bytes(n);
            // CRLF inside a bulk string is data, not framing.
            if n > 2 && rng.below(2) == 0 {
                b[n / 2..n / 2 + 2].copy_from_slice(b"\r\n");
            }
            Value::Bulk(b)
        }
        4 => Value::Nil,
        _ => Value::Array((0..rng.below(6)).map(|_| value(rng, depth - 1)).collect()),
    }
}

/// Bytes that look like RESP often enough to reach deep into the decoder.
fn resp_like(rng: &mut Rng) -> Vec<u8> {
    const PIECES: &[&[u8]] = &[
        b"*",
        b"$",
        b":",
        b"+",
        b"-",
        b"\r\n",
        b"\r",
        b"\n",
        b"-1",
        b"0",
        b"1",
        b"2",
        b"3",
        b"9",
        b"*1\r\n",
        b"*2\r\n",
        b"$3\r\nabc\r\n",
        b"$0\r\n\r\n",
        b":-7\r\n",
        b"+OK\r\n",
        b"*2147483647\r\n",
        b"$999999999999\r\n",
        b"*1048576\r\n",
        b"$67108864\r\n",
        b"*-1\r\n",
        b"$-1\r\n",
        b"99999999999999999999",
    ];
    let n = rng.below(48);
    let mut out = Vec::new();
    for _ in 0..n {
        if rng.below(4) == 0 {
            let k = rng.below(8);
            out.extend(rng.bytes(k));
        } else {
            out.extend_from_slice(PIECES[rng.below(PIECES.len())]);
        }
    }
    out
}

/// A new seed every run (so every CI run tries other inputs), printed with
/// the test's output so that a failure replays: `TARGETLEASE_FUZZ_SEED=<n>`.
fn seed() -> u64 {
    let seed = std::env::var("TARGETLEASE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x7a72_6573_7026_2026, |d| d.as_nanos() as u64)
        });
    eprintln!("RESP property test seed: TARGETLEASE_FUZZ_SEED={seed}");
    seed
}
/// The whole test stays within a few seconds even in a debug build.
const BUDGET: std::time::Duration = std::time::Duration::from_secs(4);

#[test]
fn arbitrary_bytes_never_panic_nor_make_the_decoder_hold_more_than_a_bound() {
    let mut rng = Rng(seed());
    let started = std::time::Instant::now();
    let mut runs = 0;
    while runs < 20_000 && started.elapsed() < BUDGET {
        let bytes = if runs % 2 == 0 {
            let n = rng.below(256);
            rng.bytes(n)
        } else {
            resp_like(&mut rng)
        };
        let (values, _) = feed_in_chunks(&mut rng, &bytes);
        // Whatever it returned, it had the bytes for.
        let held: usize = values.iter().map(heap).sum();
        assert!(
            held <= bound(bytes.len()),
            "run {runs}: {held} bytes of values"
        );
        runs += 1;
    }
    assert!(runs >= 2_000, "only {runs} runs in {BUDGET:?}");
}

#[test]
fn hostile_length_prefixes_are_refused_or_waited_on_without_allocating() {
    let refused: &[&[u8]] = &[
        b"$999999999999\r\n",
        b"$9223372036854775807\r\n",
        b"*2147483647\r\n",
        b"*9223372036854775807\r\n",
        b":99999999999999999999\r\n",
        b"$-\r\n",
    ];
    for wire in refused {
        let mut d = Decoder::new();
        d.feed(wire);
        assert!(d.next().is_err(), "{:?}", String::from_utf8_lossy(wire));
        assert!(
            retained(&d) <= bound(wire.len()),
            "{:?}",
            String::from_utf8_lossy(wire)
        );
    }
    // At the bounds: accepted, and nothing announced is allocated up front.
    let waited = [
        format!("${MAX_BULK}\r\n"),
        format!("*{MAX_ARRAY}\r\n"),
        format!("*{MAX_ARRAY}\r\n").repeat(MAX_DEPTH),
        format!("*{MAX_ARRAY}\r\n:1\r\n$5\r\nab"),
    ];
    for wire in &waited {
        let mut d = Decoder::new();
        d.feed(wire.as_bytes());
        assert_eq!(d.next(), Ok(None), "{wire:?}");
        assert!(
            retained(&d) <= bound(wire.len()),
            "{wire:?}: holds {} bytes",
            retained(&d)
        );
    }
    // Nil forms are values, not lengths.
    for wire in [&b"$-1\r\n"[..], b"*-1\r\n", b"$-999\r\n"] {
        assert_eq!(parse(wire), Ok(Some((Value::Nil, wire.len()))));
    }
}

#[test]
fn every_encoded_value_decodes_back_to_itself_however_it_is_split() {
    let mut rng = Rng(seed() ^ 1);
    let started = std::time::Instant::now();
    let mut runs = 0;
    while runs < 5_000 && started.elapsed() < BUDGET {
        // A pipeline of a few replies.
        let sent: Vec<Value> = (0..1 + rng.below(4)).map(|_| value(&mut rng, 3)).collect();
        let mut wire = Vec::new();
        for v in &sent {
            encode(v, &mut wire);
        }
        let (got, refused) = feed_in_chunks(&mut rng, &wire);
        assert!(!refused, "run {runs}: refused {sent:?}");
        assert_eq!(got, sent, "run {runs}");
        // A command is an array of bulk strings.
        let args: Vec<Vec<u8>> = (0..rng.below(5))
            .map(|_| {
                let n = rng.below(20);
                rng.bytes(n)
            })
            .collect();
        let cmd = Cmd::new("EVALSHA").args(&args);
        let mut wire = Vec::new();
        cmd.encode(&mut wire);
        let mut expected = vec![Value::Bulk(b"EVALSHA".to_vec())];
        expected.extend(args.into_iter().map(Value::Bulk));
        assert_eq!(parse(&wire), Ok(Some((Value::Array(expected), wire.len()))));
        runs += 1;
    }
    assert!(runs >= 500, "only {runs} runs in {BUDGET:?}");
}
