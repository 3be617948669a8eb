//! The NVMe-oF initiator (`bdev_nvme_*`): attaching a remote subsystem turns
//! each of its namespaces into a `<name>n<nsid>` bdev backed by the target's
//! bytes (see [`crate::nvmf::wire`] for what travels over the wire), whose
//! I/O through the data path goes to the target. A name may have several
//! controllers, one per path to the subsystem (SPDK's multipath), whose
//! namespaces' bdevs send their I/O on the path their policy picks and on
//! another when one is lost (see [`crate::datapath::remote`]).
//!
//! - `family`: the methods and the registration of an attached controller;
//!   `attach`: the checks before connecting and the connection; `detach`;
//!   `multipath`: `bdev_nvme_get_io_paths` and
//!   `bdev_nvme_set_multipath_policy`; `options`: `bdev_nvme_set_options`
//!   (the sockets' `transport_ack_timeout`, the default reconnect policy).
//! - `ctrlr`: what is kept of a name, its controllers and bdevs, and their
//!   JSON; `monitor`: each controller's connection, lost and reconnected
//!   as SPDK's reset does.

mod attach;
mod ctrlr;
mod detach;
mod family;
mod monitor;
mod multipath;
mod options;

pub(crate) use family::NvmeInitiator;
