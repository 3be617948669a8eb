//! What the programs that drive a whole stack share (`hack/bench`,
//! `hack/chaos`): [`stack`] starts `hack/local-up.sh` and finds what it left
//! behind, [`csi`] plays external-provisioner and kubelet over real gRPC, and
//! [`kubelet`] is kubelet's rules for those calls (which failures it retries,
//! when it unstages).

pub mod csi;
pub mod kills;
pub mod kubelet;
pub mod stack;
