//! End to end on a real kube-apiserver + etcd and a real Valkey: the control
//! plane itself, the operator's promises (and under the conditions
//! production brings: outages, restarts, races, `production/`), the
//! invariants of what it publishes, and HA.

use targetlease_test_support as support;

mod controlplane;
mod fencing;
mod ha;
mod invariants;
mod operator;
mod playground;
mod production;
mod startup;
mod tools;
