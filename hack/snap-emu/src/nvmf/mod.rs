//! The NVMe-oF target (`target`: subsystems, namespaces, hosts and
//! listeners) and what travels between emulators: the handshake (`wire`,
//! whose initiator's side `crate::bdev::nvme` uses), the target's listeners
//! (`listener`) and the target's side of the data path's I/O (`io`).

pub(crate) mod io;
pub(crate) mod listener;
pub(crate) mod params;
pub(crate) mod target;
pub(crate) mod wire;
