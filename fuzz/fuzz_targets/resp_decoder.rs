//! The RESP decoder (src/store/valkey/wire/resp.rs, compiled in as it is) fed
//! arbitrary bytes in arbitrary pieces, as a server or anything between us
//! and it could send them: it must never panic, never loop, and never
//! allocate what a hostile length prefix announces (libFuzzer's
//! `-malloc_limit_mb`, set by scripts/test.sh, fails any allocation past it).
#![no_main]

use libfuzzer_sys::fuzz_target;

// The decoder's error type, where resp.rs finds it (`super::error`).
#[allow(dead_code)]
#[path = "../../src/store/valkey/wire/error.rs"]
mod error;
#[allow(dead_code)]
#[path = "../../src/store/valkey/wire/resp.rs"]
mod resp;

fuzz_target!(|data: &[u8]| {
    // The first byte says how the rest arrives: in pieces of 1 to 64 bytes.
    let Some((&piece, bytes)) = data.split_first() else {
        return;
    };
    let piece = usize::from(piece % 64) + 1;
    let mut decoder = resp::Decoder::new();
    for chunk in bytes.chunks(piece) {
        decoder.buffer().extend_from_slice(chunk);
        loop {
            match decoder.next() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                // The stream is unusable after an error: a caller closes it.
                Err(_) => return,
            }
        }
    }
});
