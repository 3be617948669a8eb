//! The inodes the kernel knows, as libfuse's passthrough_ll and virtiofsd
//! keep them: each holds an `O_PATH` descriptor of its backing file, so an
//! inode is that file whatever its names become (renamed by another host,
//! unlinked while open, a directory deleted under a bind mount), and one
//! FUSE inode stands for one backing inode, so hard links share it.
//!
//! Every reply that hands the kernel an entry counts one lookup; FORGET
//! takes back what the kernel says it dropped, and at zero the descriptor
//! is closed (once no operation in flight still holds it). The root is
//! never forgotten, and numbers are never reused (generation 0 holds), so
//! a number the kernel still has cannot come to name another file.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// A backing file's identity: `(st_dev, st_ino)`. The descriptor an inode
/// holds keeps the backing inode alive, so its number is not reused while
/// the kernel may ask for it.
pub(super) type BackingId = (u64, u64);

pub(super) const ROOT: u64 = 1;

/// One inode the kernel knows.
#[derive(Debug)]
pub(super) struct Node {
    /// `O_PATH | O_NOFOLLOW`: it names the file without opening it, so a
    /// FIFO, a device or a symlink is held as safely as a regular file.
    pub(super) fd: OwnedFd,
}

#[derive(Debug)]
struct Known {
    node: Arc<Node>,
    id: BackingId,
    lookups: u64,
}

#[derive(Debug)]
pub(super) struct Inodes {
    by_ino: HashMap<u64, Known>,
    by_id: HashMap<BackingId, u64>,
    next: u64,
}

impl Inodes {
    pub(super) fn new(root: OwnedFd, id: BackingId) -> Self {
        let node = Arc::new(Node { fd: root });
        let known = Known {
            node,
            id,
            lookups: 1,
        };
        Self {
            by_ino: HashMap::from([(ROOT, known)]),
            by_id: HashMap::from([(id, ROOT)]),
            next: ROOT + 1,
        }
    }

    pub(super) fn get(&self, ino: u64) -> Option<Arc<Node>> {
        self.by_ino.get(&ino).map(|k| Arc::clone(&k.node))
    }

    /// The FUSE inode of the backing file `id`, if the kernel knows it.
    pub(super) fn of(&self, id: BackingId) -> Option<u64> {
        self.by_id.get(&id).copied()
    }

    /// One more lookup of the backing file `id`, which `fd` holds: the inode
    /// already standing for it (and `fd` is closed), or a new one.
    pub(super) fn looked_up(&mut self, fd: OwnedFd, id: BackingId) -> u64 {
        if let Some(ino) = self.of(id)
            && let Some(known) = self.by_ino.get_mut(&ino)
        {
            known.lookups += 1;
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        let node = Arc::new(Node { fd });
        let known = Known {
            node,
            id,
            lookups: 1,
        };
        self.by_ino.insert(ino, known);
        self.by_id.insert(id, ino);
        ino
    }

    /// The kernel dropped `n` lookups of `ino`; answers the inode if that
    /// was its last, for the caller to drop once the table is unlocked
    /// (closing the last descriptor of a deleted file frees it, which can
    /// take a while).
    #[must_use]
    pub(super) fn forget(&mut self, ino: u64, n: u64) -> Option<Arc<Node>> {
        if ino == ROOT {
            return None;
        }
        let Entry::Occupied(mut known) = self.by_ino.entry(ino) else {
            return None;
        };
        let left = known.get().lookups.saturating_sub(n);
        known.get_mut().lookups = left;
        if left > 0 {
            return None;
        }
        let known = known.remove();
        self.by_id.remove(&known.id);
        Some(known.node)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_ino.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> OwnedFd {
        std::fs::File::open("/").unwrap().into()
    }

    #[test]
    fn one_inode_per_backing_file_until_every_lookup_is_forgotten() {
        let mut inodes = Inodes::new(fd(), (1, 1));
        let a = inodes.looked_up(fd(), (1, 2));
        assert_eq!(inodes.looked_up(fd(), (1, 2)), a, "a hard link");
        let b = inodes.looked_up(fd(), (2, 2));
        assert_ne!(a, b);
        assert!(inodes.forget(a, 1).is_none());
        assert_eq!(inodes.of((1, 2)), Some(a));
        assert!(inodes.forget(a, 1).is_some());
        assert!(inodes.get(a).is_none() && inodes.of((1, 2)).is_none());
        // Numbers are not reused: a stale one cannot name another file.
        assert_ne!(inodes.looked_up(fd(), (1, 2)), a);
        assert!(inodes.forget(ROOT, 10).is_none());
        assert!(inodes.get(ROOT).is_some());
        assert!(inodes.forget(b, 5).is_some());
        assert_eq!(inodes.len(), 2);
    }
}
