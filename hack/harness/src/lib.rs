//! What the programs that drive a whole stack share (`hack/bench`,
//! `hack/chaos`, `hack/player`): [`stack`] starts `hack/local-up.sh` and
//! finds what it left behind, [`csi`] plays external-provisioner and kubelet
//! over real gRPC, [`kubelet`] is kubelet's rules for those calls (which
//! failures it retries, when it unstages) and [`kubelet_fs`] what it does to
//! a volume's mounts and files itself, [`paths`] cuts a remote volume's
//! network path while it writes and reads it back, [`dpus`] looks at a
//! host's DPUs from outside (where the node put a volume, what a DPU holds
//! of one) and stops one, [`guest`] boots a real Linux kernel as the host
//! and hot-plugs PCI functions into it, and [`prom`] reads our Prometheus
//! pages.

pub mod csi;
pub mod dpus;
pub mod guest;
pub mod kills;
pub mod kubelet;
pub mod kubelet_fs;
pub mod paths;
pub mod prom;
pub mod stack;
