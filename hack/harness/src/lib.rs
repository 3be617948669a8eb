//! What the programs that drive a whole stack share (`hack/bench`,
//! `hack/chaos`): [`stack`] starts `hack/local-up.sh` and finds what it left
//! behind, [`csi`] plays external-provisioner and kubelet over real gRPC.

pub mod csi;
pub mod stack;
