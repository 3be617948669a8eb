//! SPDK's fsdev layer as the families see it: the registered filesystem
//! devices by name (`lib/fsdev`'s name tree), each a directory tree on this
//! machine. A module registers its fsdevs here; a user (SNAP's virtio-fs
//! devices) opens one by name and serves its tree.

use std::path::PathBuf;

use serde_json::Value;

use crate::rpc::{EEXIST, RpcError};

/// One registered fsdev.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fsdev {
    pub name: String,
    /// The tree it serves, resolved when it was registered (SPDK opens it
    /// then and keeps the descriptor).
    pub root: PathBuf,
    /// The module's create method and its parameters as the module writes
    /// them back in the `fsdev` subsystem's configuration; the method also
    /// says which module's delete removes it.
    pub method: &'static str,
    pub params: Value,
}

/// The registry of fsdevs, in the order they were registered (SPDK's
/// list, which its configuration walks).
#[derive(Debug, Default)]
pub(crate) struct Fsdevs {
    registered: Vec<Fsdev>,
}

impl Fsdevs {
    pub(crate) fn get(&self, name: &str) -> Option<&Fsdev> {
        self.registered.iter().find(|f| f.name == name)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Fsdev> {
        self.registered.iter()
    }

    /// `spdk_fsdev_register`: -EEXIST for a name that is taken.
    pub(crate) fn register(&mut self, fsdev: Fsdev) -> Result<(), RpcError> {
        if self.get(&fsdev.name).is_some() {
            return Err(RpcError::errno(EEXIST));
        }
        self.registered.push(fsdev);
        Ok(())
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<Fsdev> {
        let at = self.registered.iter().position(|f| f.name == name)?;
        Some(self.registered.remove(at))
    }
}
