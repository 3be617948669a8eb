//! The CO's mount flags as mount(2) arguments.

use nix::mount::MsFlags;

use crate::node::error::NodeError;
use crate::node::format::FsType;

/// CSI mount flags turned into mount(2) arguments: the generic options
/// become MsFlags, the rest is the filesystem's data string.
///
/// No `Debug`: mount flags may carry secrets (the CSI spec says so), and the
/// data string holds their values.
pub(super) struct MountOptions {
    pub(super) flags: MsFlags,
    data: Vec<String>,
}

/// What one generic option does to MsFlags.
enum Generic {
    /// Sets `set`, then clears `clear` (later options win, as in mount(8)).
    Flags { set: MsFlags, clear: MsFlags },
    /// Meaningful to mount(8) or fstab only; the kernel would reject it.
    Ignored,
    /// Would change what kind of mount this is; the driver decides that.
    Refused,
}

fn generic(option: &str) -> Option<Generic> {
    use MsFlags as M;
    let set = |set: MsFlags| Generic::Flags {
        set,
        clear: M::empty(),
    };
    let clear = |clear: MsFlags| Generic::Flags {
        set: M::empty(),
        clear,
    };
    let atime = M::MS_NOATIME | M::MS_RELATIME | M::MS_STRICTATIME;
    let only = |one: MsFlags| Generic::Flags {
        set: one,
        clear: atime.difference(one),
    };
    Some(match option {
        "ro" => set(M::MS_RDONLY),
        "rw" => clear(M::MS_RDONLY),
        "nosuid" => set(M::MS_NOSUID),
        "suid" => clear(M::MS_NOSUID),
        "nodev" => set(M::MS_NODEV),
        "dev" => clear(M::MS_NODEV),
        "noexec" => set(M::MS_NOEXEC),
        "exec" => clear(M::MS_NOEXEC),
        "sync" => set(M::MS_SYNCHRONOUS),
        "async" => clear(M::MS_SYNCHRONOUS),
        "dirsync" => set(M::MS_DIRSYNC),
        "mand" => set(M::MS_MANDLOCK),
        "nomand" => clear(M::MS_MANDLOCK),
        "noatime" => only(M::MS_NOATIME),
        "relatime" => only(M::MS_RELATIME),
        "strictatime" => only(M::MS_STRICTATIME),
        "atime" => clear(M::MS_NOATIME),
        "norelatime" => clear(M::MS_RELATIME),
        "nostrictatime" => clear(M::MS_STRICTATIME),
        "nodiratime" => set(M::MS_NODIRATIME),
        "diratime" => clear(M::MS_NODIRATIME),
        "lazytime" => set(M::MS_LAZYTIME),
        "nolazytime" => clear(M::MS_LAZYTIME),
        "iversion" => set(M::MS_I_VERSION),
        "noiversion" => clear(M::MS_I_VERSION),
        "silent" => set(M::MS_SILENT),
        "loud" => clear(M::MS_SILENT),
        "defaults" | "auto" | "noauto" | "nofail" | "_netdev" => Generic::Ignored,
        o if o.starts_with("x-") || o.starts_with("X-") => Generic::Ignored,
        "bind" | "rbind" | "move" | "remount" | "shared" | "rshared" | "private" | "rprivate"
        | "slave" | "rslave" | "unbindable" | "runbindable" => Generic::Refused,
        _ => return None,
    })
}

impl MountOptions {
    /// Each CSI flag may itself hold a comma-separated list, as in fstab.
    pub(super) fn parse(flags: &[String], read_only: bool) -> Result<MountOptions, NodeError> {
        let mut options = MountOptions {
            flags: MsFlags::empty(),
            data: Vec::new(),
        };
        for option in flags.iter().flat_map(|f| f.split(',')).map(str::trim) {
            if option.is_empty() {
                continue;
            }
            if option.contains('\0') {
                return Err(NodeError::InvalidArgument(
                    "a mount flag contains a NUL byte".into(),
                ));
            }
            match generic(option) {
                Some(Generic::Flags { set, clear }) => {
                    options.flags.insert(set);
                    options.flags.remove(clear);
                }
                Some(Generic::Ignored) => {}
                Some(Generic::Refused) => {
                    return Err(NodeError::InvalidArgument(format!(
                        "mount flag {option:?} is not allowed: the driver decides how the volume is mounted"
                    )));
                }
                None => options.data.push(option.to_owned()),
            }
        }
        if read_only {
            options.flags.insert(MsFlags::MS_RDONLY);
        }
        Ok(options)
    }

    pub(super) fn data_string(&self) -> Option<String> {
        (!self.data.is_empty()).then(|| self.data.join(","))
    }

    /// The data string with what every mount of `fs` needs.
    ///
    /// xfs always gets `nouuid`. XFS refuses to mount a filesystem whose
    /// UUID a mounted one already has, and every clone of a volume (a
    /// snapshot restored, a volume cloned, a copy of the backing file) has
    /// its source's UUID, so without it a pod cannot use a clone on a node
    /// where the source is mounted. The option only skips that check: a
    /// volume is identified by its device (found from SNAP's names and
    /// sysfs), never by its filesystem UUID, and log recovery is unaffected.
    /// Rewriting the clone's UUID instead (`xfs_admin -U generate`) would
    /// change the user's data and needs a clean log, which a clone of a
    /// mounted volume does not have. (The EBS and GCE PD drivers do the same.)
    pub(super) fn data_string_for(mut self, fs: FsType) -> Option<String> {
        if fs == FsType::Xfs && !self.data.iter().any(|o| o == "nouuid") {
            self.data.push("nouuid".into());
        }
        self.data_string()
    }

    /// The data options' names without their values, for messages.
    pub(super) fn data_names(&self) -> Vec<String> {
        self.data
            .iter()
            .map(|o| o.split('=').next().unwrap_or_default().to_owned())
            .collect()
    }
}
