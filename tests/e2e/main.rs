//! End to end on a real kube-apiserver + etcd and a real Valkey: the control
//! plane itself, the operator's promises, attacks on them, faults and HA.

#[allow(dead_code)] // each binary uses a part of the shared support
#[path = "../support/mod.rs"]
mod support;

mod attack;
mod controlplane;
mod faults;
mod fencing;
mod ha;
mod operator;
mod playground;
mod startup;
mod tools;
