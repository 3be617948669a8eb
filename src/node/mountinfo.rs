//! The mount table, read from `/proc/self/mountinfo`: the truth about what is
//! mounted where, consulted every time rather than remembered.
//!
//! Reading the table makes the kernel render every mount on the host (two per
//! published volume), so "is anything mounted here?" asks `statx` first
//! (`STATX_ATTR_MOUNT_ROOT`, Linux 5.8+) and reads the table only when the
//! answer is yes and the details matter, or when the kernel cannot say.
//!
//! Line format (proc(5)):
//! `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
//! mount ID, parent ID, major:minor, root, mount point, per-mount options,
//! zero or more optional fields, a lone `-`, filesystem type, source,
//! superblock options. The kernel escapes space, tab, newline and backslash in
//! paths as three-digit octal (`\040`), so fields split on single spaces.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::error::NodeError;

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_id: u32,
    pub parent_id: u32,
    /// The device of the filesystem (`st_dev`): for ext4/xfs on a block
    /// device, that device's major:minor.
    pub major: u32,
    pub minor: u32,
    /// The directory of the filesystem mounted here: `/` for a whole
    /// filesystem, the source's path inside it for a bind mount.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (`ro`/`rw`, `nosuid`, `noatime`, ...).
    pub options: Vec<String>,
    /// Propagation fields (`shared:N`, `master:N`, `unbindable`).
    pub optional_fields: Vec<String>,
    pub fs_type: String,
    pub source: String,
    /// Superblock options: shared by every mount of the filesystem.
    pub super_options: Vec<String>,
}

impl MountEntry {
    /// Writes are refused through this mount: it is read-only itself, or its
    /// whole filesystem is (e.g. ext4 after `errors=remount-ro` struck).
    pub fn is_read_only(&self) -> bool {
        self.is_read_only_mount() || self.super_options.iter().any(|o| o == "ro")
    }

    /// The mount itself was made read-only (whatever its filesystem is now).
    pub fn is_read_only_mount(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// The current mount table of this process's mount namespace.
pub fn read() -> Result<Vec<MountEntry>, NodeError> {
    parse(&read_text()?)
}

fn read_text() -> Result<Vec<u8>, NodeError> {
    std::fs::read(MOUNTINFO).map_err(|err| NodeError::io(format!("read {MOUNTINFO}"), &err))
}

/// Whether something is mounted at `path` (resolved as [`at`] does).
pub fn is_mount_point(path: &Path) -> Result<bool, NodeError> {
    let Some(resolved) = resolve(path)? else {
        return Ok(false);
    };
    match is_mount_root(&resolved) {
        Some(answer) => Ok(answer),
        None => Ok(table_at(&resolved)?.is_some()),
    }
}

/// The top-most mount whose mount point is exactly `path` (after resolving
/// the links in its parent, as the kernel shows resolved paths), if any.
pub fn at(path: &Path) -> Result<Option<MountEntry>, NodeError> {
    let Some(resolved) = resolve(path)? else {
        return Ok(None);
    };
    if is_mount_root(&resolved) == Some(false) {
        return Ok(None);
    }
    table_at(&resolved)
}

/// `statx`'s word on whether `path` (not following a final link) is the
/// root of a mount; `None` when it has none (an old kernel) or the path
/// cannot be examined (a dead mount), and then the table decides. A missing
/// path is no mount point: the table shows a mount whose point was deleted
/// with a " (deleted)" suffix, which no lookup matches either.
fn is_mount_root(path: &Path) -> Option<bool> {
    use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags, statx};
    match statx(
        CWD,
        path,
        AtFlags::NO_AUTOMOUNT | AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::empty(),
    ) {
        Ok(found) => found
            .stx_attributes_mask
            .contains(StatxAttributes::MOUNT_ROOT)
            .then(|| found.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)),
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Some(false),
        Err(_) => None,
    }
}

fn table_at(resolved: &Path) -> Result<Option<MountEntry>, NodeError> {
    let text = read_text()?;
    let stacked = parse_lines(&text, |line| {
        mount_point_is(line, resolved.as_os_str().as_bytes())
    })?;
    Ok(top_most(&stacked, resolved).cloned())
}

/// Whether the mount point field of `line` is `wanted`. Publish, unpublish
/// and unstage look up one path in a table that holds a line per staged and
/// published volume; parsing only the lines at that path keeps a lookup
/// from allocating for every other mount. Measured (hack/bench): lookups
/// were a third of the node's CPU in a publish/unpublish loop, and this cut
/// the node's own time per publish from 0.44 to 0.32 ms.
fn mount_point_is(line: &[u8], wanted: &[u8]) -> bool {
    let Some(field) = line.split(|&b| b == b' ').nth(4) else {
        // Malformed: let the full parse say so.
        return true;
    };
    if field.contains(&b'\\') {
        unescape(field) == wanted
    } else {
        field == wanted
    }
}

/// Of the mounts stacked at `mount_point`, the one on top: the one no other
/// mount there is mounted on. (Table order is not a promise about stacking.)
pub fn top_most<'a>(table: &'a [MountEntry], mount_point: &Path) -> Option<&'a MountEntry> {
    let stacked: Vec<&MountEntry> = table
        .iter()
        .filter(|m| m.mount_point == mount_point)
        .collect();
    stacked
        .iter()
        .rev()
        .find(|m| !stacked.iter().any(|other| other.parent_id == m.mount_id))
        .copied()
}

/// `path` with its parent canonicalized and its last component kept as is:
/// the mount point itself may be a dead mount that cannot be stat'ed, and a
/// link as last component is not followed (unmounting uses UMOUNT_NOFOLLOW).
/// `None` when the parent does not exist: then nothing is mounted there.
fn resolve(path: &Path) -> Result<Option<PathBuf>, NodeError> {
    let resolved = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            std::fs::canonicalize(parent).map(|p| p.join(name))
        }
        _ => std::fs::canonicalize(path),
    };
    match resolved {
        Ok(p) => Ok(Some(p)),
        Err(err)
            if matches!(
                err.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(None)
        }
        Err(err) => Err(NodeError::io(format!("resolve {}", path.display()), &err)),
    }
}

/// Parses the text of a mountinfo file.
pub fn parse(text: &[u8]) -> Result<Vec<MountEntry>, NodeError> {
    parse_lines(text, |_| true)
}

/// Parses the lines of a mountinfo file that `wanted` selects.
fn parse_lines(text: &[u8], wanted: impl Fn(&[u8]) -> bool) -> Result<Vec<MountEntry>, NodeError> {
    text.split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.is_empty() && wanted(line))
        .map(|(index, line)| {
            parse_line(line).map_err(|why| {
                NodeError::failed(
                    format!("parse {MOUNTINFO}"),
                    format!(
                        "line {}: {why}: {:?}",
                        index + 1,
                        String::from_utf8_lossy(line)
                    ),
                )
            })
        })
        .collect()
}

fn parse_line(line: &[u8]) -> Result<MountEntry, String> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let separator = fields
        .iter()
        .position(|f| *f == b"-")
        .ok_or("no \"-\" separator")?;
    if separator < 6 {
        return Err(format!(
            "{separator} fields before \"-\", expected at least 6"
        ));
    }
    if fields.len() != separator + 4 {
        return Err(format!(
            "{} fields after \"-\", expected 3",
            fields.len() - separator - 1
        ));
    }
    let number = |field: &[u8], name: &str| -> Result<u32, String> {
        std::str::from_utf8(field)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad {name} {:?}", String::from_utf8_lossy(field)))
    };
    let (major, minor) = {
        let dev = fields[2];
        let colon = dev
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| format!("bad major:minor {:?}", String::from_utf8_lossy(dev)))?;
        (
            number(&dev[..colon], "major")?,
            number(&dev[colon + 1..], "minor")?,
        )
    };
    Ok(MountEntry {
        mount_id: number(fields[0], "mount ID")?,
        parent_id: number(fields[1], "parent ID")?,
        major,
        minor,
        root: path(fields[3]),
        mount_point: path(fields[4]),
        options: list(fields[5]),
        optional_fields: fields[6..separator].iter().map(|f| text(f)).collect(),
        fs_type: text(fields[separator + 1]),
        source: text(fields[separator + 2]),
        super_options: list(fields[separator + 3]),
    })
}

/// Undoes the kernel's `\ooo` escapes; anything else is kept as written.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field.get(i + 1..i + 4).and_then(|digits| {
            digits
                .iter()
                .try_fold(0u32, |acc, &d| {
                    matches!(d, b'0'..=b'7').then(|| acc * 8 + u32::from(d - b'0'))
                })
                .and_then(|value| u8::try_from(value).ok())
        });
        match (field[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// Paths may hold any bytes but NUL and `/` in components: keep them exact.
fn path(field: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(&unescape(field)))
}

fn text(field: &[u8]) -> String {
    String::from_utf8_lossy(&unescape(field)).into_owned()
}

fn list(field: &[u8]) -> Vec<String> {
    text(field)
        .split(',')
        .filter(|o| !o.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,errors=remount-ro
36 22 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=10k,mode=755
100 22 7:3 / /var/lib/kubelet/plugins/staging\\040dir/vol\\0111 rw,noatime shared:40 master:3 - xfs /dev/loop3 rw,attr2,inode64,noquota
101 36 0:5 /loop3 /var/lib/kubelet/pods/p/block\\134x ro,nosuid,relatime - devtmpfs udev rw,size=10k
102 22 0:40 / /empty\\040source rw - tmpfs  rw
";

    #[test]
    fn parses_fields_escapes_optional_fields_and_separator() {
        let table = parse(SAMPLE.as_bytes()).unwrap();
        assert_eq!(table.len(), 5);

        let root = &table[0];
        assert_eq!(
            (root.mount_id, root.parent_id, root.major, root.minor),
            (22, 1, 252, 0)
        );
        assert_eq!(root.mount_point, Path::new("/"));
        assert_eq!(root.optional_fields, ["shared:1"]);
        assert_eq!(root.super_options, ["rw", "errors=remount-ro"]);

        let staged = &table[2];
        assert_eq!(
            staged.mount_point,
            Path::new("/var/lib/kubelet/plugins/staging dir/vol\t1")
        );
        assert_eq!(staged.options, ["rw", "noatime"]);
        assert_eq!(staged.optional_fields, ["shared:40", "master:3"]);
        assert_eq!((staged.major, staged.minor), (7, 3));
        assert_eq!(staged.fs_type, "xfs");
        assert_eq!(staged.source, "/dev/loop3");
        assert_eq!(staged.super_options, ["rw", "attr2", "inode64", "noquota"]);

        let block = &table[3];
        assert_eq!(block.root, Path::new("/loop3"));
        assert_eq!(
            block.mount_point,
            Path::new("/var/lib/kubelet/pods/p/block\\x")
        );
        assert!(block.optional_fields.is_empty());

        // An empty source is an empty field, not a missing one.
        let tmp = &table[4];
        assert_eq!(tmp.mount_point, Path::new("/empty source"));
        assert_eq!((tmp.fs_type.as_str(), tmp.source.as_str()), ("tmpfs", ""));
    }

    #[test]
    fn read_only_per_mount_or_per_superblock() {
        let table = parse(SAMPLE.as_bytes()).unwrap();
        assert!(!table[2].is_read_only());
        assert!(table[3].is_read_only());
        let broken = parse(b"5 1 8:1 / /data rw - ext4 /dev/sda1 ro,errors=remount-ro").unwrap();
        assert!(broken[0].is_read_only());
    }

    #[test]
    fn unescape_leaves_non_escapes_alone() {
        assert_eq!(unescape(b"a\\040b"), b"a b");
        assert_eq!(unescape(b"\\134"), b"\\");
        assert_eq!(unescape(b"tail\\04"), b"tail\\04");
        assert_eq!(unescape(b"\\9zz\\"), b"\\9zz\\");
        // 0o777 does not fit a byte: not an escape the kernel writes.
        assert_eq!(unescape(b"\\777"), b"\\777");
        // Non-UTF-8 bytes survive into the path.
        assert_eq!(path(b"/x\\377").as_os_str().as_bytes(), b"/x\xff");
    }

    #[test]
    fn malformed_lines_are_errors_not_panics() {
        for line in [
            "",
            "1 2 3",
            "1 2 8:1 / /x rw shared:1 ext4 /dev/x rw",
            "1 2 8:1 / /x - ext4 /dev/x rw",
            "1 2 8:1 / /x rw - ext4 /dev/x",
            "1 2 8:1 / /x rw - ext4 /dev/x rw extra",
            "a 2 8:1 / /x rw - ext4 /dev/x rw",
            "1 2 81 / /x rw - ext4 /dev/x rw",
            "1 2 8:x / /x rw - ext4 /dev/x rw",
            "-1 2 8:1 / /x rw - ext4 /dev/x rw",
            "- - - - - - - - - -",
        ] {
            let result = parse(format!("{line}\n").as_bytes());
            if line.is_empty() {
                assert_eq!(result, Ok(vec![]));
            } else {
                let err = result.unwrap_err();
                assert!(err.to_string().contains("line 1"), "{line:?}: {err}");
            }
        }
    }

    #[test]
    fn only_the_lines_at_a_mount_point_are_parsed() {
        let wanted = b"/var/lib/kubelet/plugins/staging dir/vol\t1";
        let at = parse_lines(SAMPLE.as_bytes(), |line| mount_point_is(line, wanted)).unwrap();
        assert_eq!(at.len(), 1);
        assert_eq!(at[0].mount_id, 100);
        let root = parse_lines(SAMPLE.as_bytes(), |line| mount_point_is(line, b"/")).unwrap();
        assert_eq!(root.len(), 1);
        assert_eq!(root[0].mount_id, 22);
        // A malformed line is still reported, not skipped.
        assert!(parse_lines(b"1 2 3\n", |line| mount_point_is(line, b"/")).is_err());
    }

    #[test]
    fn top_most_follows_stacking_not_order() {
        let table = parse(
            b"31 20 7:3 / /t rw - ext4 /dev/loop3 rw\n\
              20 22 7:2 / /t rw - ext4 /dev/loop2 rw\n\
              40 31 7:4 / /t/sub rw - ext4 /dev/loop4 rw\n",
        )
        .unwrap();
        // 31 is stacked on 20 although listed before it.
        let top = top_most(&table, Path::new("/t")).unwrap();
        assert_eq!(top.mount_id, 31);
        assert!(top_most(&table, Path::new("/nowhere")).is_none());
    }

    #[test]
    fn the_real_table_has_a_root_and_at_finds_it() {
        let table = read().unwrap();
        assert!(table.iter().any(|m| m.mount_point == Path::new("/")));
        assert!(at(Path::new("/")).unwrap().is_some());
        assert!(
            at(Path::new("/proc"))
                .unwrap()
                .is_some_and(|m| m.fs_type == "proc")
        );
        assert!(at(Path::new("/nonexistent-dir/x")).unwrap().is_none());
        let dir = tempfile::tempdir().unwrap();
        assert!(at(dir.path()).unwrap().is_none());
    }

    /// statx's answer agrees with the table for every kind of path a node
    /// asks about (runs as root: it bind-mounts).
    #[test]
    fn statx_and_the_table_agree_on_mount_points() {
        use nix::mount::{MntFlags, MsFlags, mount, umount2};
        let dir = tempfile::tempdir().unwrap();
        let (source, target, file, file_target, link) = (
            dir.path().join("source"),
            dir.path().join("target"),
            dir.path().join("file"),
            dir.path().join("file-target"),
            dir.path().join("link"),
        );
        for d in [&source, &target] {
            std::fs::create_dir(d).unwrap();
        }
        for f in [&file, &file_target] {
            std::fs::write(f, b"").unwrap();
        }
        let bind = |from: &Path, to: &Path| {
            mount(Some(from), to, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap()
        };
        bind(&source, &target);
        bind(&file, &file_target);
        std::os::unix::fs::symlink(&target, &link).unwrap();

        let cases = [
            (Path::new("/"), true),
            (Path::new("/proc"), true),
            (target.as_path(), true),
            (file_target.as_path(), true),
            (source.as_path(), false),
            (file.as_path(), false),
            // A link is not followed: unmounting uses UMOUNT_NOFOLLOW too.
            (link.as_path(), false),
            (&dir.path().join("missing"), false),
            (Path::new("/nonexistent-dir/x"), false),
        ];
        for (path, mounted) in cases {
            let resolved = resolve(path).unwrap();
            let in_table = match &resolved {
                Some(r) => table_at(r).unwrap().is_some(),
                None => false,
            };
            assert_eq!(in_table, mounted, "the table on {}", path.display());
            assert_eq!(is_mount_point(path).unwrap(), mounted, "{}", path.display());
            assert_eq!(at(path).unwrap().is_some(), mounted, "{}", path.display());
            if let Some(r) = resolved {
                // This kernel (6.1) answers: the table is only the fallback.
                assert_eq!(is_mount_root(&r), Some(mounted), "{}", path.display());
            }
        }
        for t in [&target, &file_target] {
            umount2(t.as_path(), MntFlags::UMOUNT_NOFOLLOW).unwrap();
        }
        assert!(!is_mount_point(&target).unwrap());
    }
}
