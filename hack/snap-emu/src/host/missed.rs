//! Disks the host missed (a fault a test switches on, see
//! [`Faults::miss_discovery`]): their attach is kept, not carried out, until
//! a rescan or their detach, whichever comes first in the function's line.
//!
//! [`Faults::miss_discovery`]: crate::faults::Faults::miss_discovery

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::tree::{DiskAttrs, DiskId};
use crate::datapath::volume::Source;

/// An attach the host missed, kept for a rescan.
#[derive(Debug)]
pub(super) struct MissedDisk {
    pub id: DiskId,
    pub attrs: DiskAttrs,
    pub source: Source,
}

/// The missed attaches, by record key.
#[derive(Debug, Default)]
pub(super) struct Missed(Mutex<HashMap<String, MissedDisk>>);

impl Missed {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, MissedDisk>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn insert(&self, disk: MissedDisk) {
        self.lock().insert(disk.id.key(), disk);
    }

    /// Forgets the attach of the disk at `key` and hands it back.
    pub(super) fn take(&self, key: &str) -> Option<MissedDisk> {
        self.lock().remove(key)
    }

    /// The keys and functions of the disks missed with `identity`.
    pub(super) fn with_identity(&self, identity: &str) -> Vec<(String, String)> {
        self.lock()
            .iter()
            .filter(|(_, m)| m.attrs.identity() == identity)
            .map(|(key, m)| (key.clone(), m.id.bdf().to_owned()))
            .collect()
    }
}
