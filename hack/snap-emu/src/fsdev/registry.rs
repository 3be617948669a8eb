//! SPDK's fsdev layer as the families see it: the registered filesystem
//! devices by name (`lib/fsdev`'s name tree), each a directory tree on this
//! machine. A module registers its fsdevs here; a user (SNAP's virtio-fs
//! devices) opens one by name and serves its tree.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::rpc::{EEXIST, RpcError};

/// One registered fsdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fsdev {
    pub name: String,
    /// `root_path` as the module was given it.
    pub root_path: String,
    /// The tree it serves, resolved when it was registered (SPDK opens it
    /// with `O_PATH` then and keeps the descriptor).
    pub root: PathBuf,
}

/// The registry of fsdevs.
#[derive(Debug, Default)]
pub(crate) struct Fsdevs {
    by_name: BTreeMap<String, Fsdev>,
}

impl Fsdevs {
    pub(crate) fn get(&self, name: &str) -> Option<&Fsdev> {
        self.by_name.get(name)
    }

    /// `spdk_fsdev_register`: -EEXIST for a name that is taken.
    pub(crate) fn register(&mut self, fsdev: Fsdev) -> Result<(), RpcError> {
        if self.by_name.contains_key(&fsdev.name) {
            return Err(RpcError::errno(EEXIST));
        }
        self.by_name.insert(fsdev.name.clone(), fsdev);
        Ok(())
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<Fsdev> {
        self.by_name.remove(name)
    }
}
