//! Unit tests of the fault matrix's checker (`tests/faults/check/`): every
//! property on clean synthetic histories and on the synthetic positive
//! controls (a reissued token, an unguarded table, a lost write, a lying
//! store, a second Held status, two marked pods). The matrix itself runs as
//! the `faults` test target (`scripts/faults.sh`).

#[path = "faults/check/mod.rs"]
mod check;
#[path = "faults/history.rs"]
mod history;
