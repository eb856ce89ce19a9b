//! End to end on a real kube-apiserver + etcd and a real Valkey: the control
//! plane itself, the operator's promises, attacks on them, faults and HA.

use targetlease_test_support as support;

mod attack;
mod controlplane;
mod faults;
mod fencing;
mod ha;
mod operator;
mod playground;
mod startup;
mod tools;
