//! The NVMe-oF target (`target`: subsystems, namespaces, hosts and
//! listeners) and what travels between emulators: the handshake (`wire`,
//! whose initiator's side `crate::bdev::nvme` uses), the target's listeners
//! (`listener`) and what the target answers them (`admit`), the
//! connections each subsystem serves (`conns`), and the target's side of
//! the data path's I/O (`io`).

mod admit;
pub(crate) mod conns;
pub(crate) mod io;
pub(crate) mod listener;
pub(crate) mod params;
pub(crate) mod target;
pub(crate) mod wire;
