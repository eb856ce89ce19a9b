//! End to end on a real kube-apiserver + etcd and a real Valkey: the control
//! plane itself, the operator's promises, the invariants of what it publishes
//! under faults, and HA.

use targetlease_test_support as support;

mod controlplane;
mod faults;
mod fencing;
mod ha;
mod invariants;
mod operator;
mod playground;
mod startup;
mod tools;
