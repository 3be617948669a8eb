//! Confining the CO's staging and target paths to the directory they must
//! live in (kubelet's, by default).
//!
//! The paths are checked, not trusted: a path outside the root, or one that
//! reaches outside through `..` or a symbolic link planted below the root,
//! would make us mount over (or unmount) something of the host's. Symlinks in
//! the root itself are the administrator's (`/var/lib/kubelet` is a link on
//! some distributions) and are allowed.
//!
//! What this cannot close: a component replaced by a symlink between the check
//! and the mount. The directories below kubelet's root are created by kubelet
//! and writable only by root, so only a privileged process could race us.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::error::NodeError;

/// Linux's PATH_MAX counts the terminating NUL.
const PATH_MAX: usize = 4096;

/// Returns `requested` in normal form (no `.`, no repeated or trailing `/`)
/// after checking that it is absolute, has no `..`, lies strictly below
/// `root`, and that no existing component below `root` is a symbolic link.
pub fn confine(root: &Path, requested: &str) -> Result<PathBuf, NodeError> {
    let invalid = |why: &str| NodeError::InvalidArgument(format!("path {requested:?} {why}"));
    if requested.is_empty() {
        return Err(NodeError::InvalidArgument("path is empty".into()));
    }
    // Before anything that quotes it: a message must not carry a huge path.
    if requested.len() >= PATH_MAX {
        return Err(NodeError::InvalidArgument(format!(
            "path is {} bytes, longer than {}",
            requested.len(),
            PATH_MAX - 1
        )));
    }
    if requested.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    if !requested.starts_with('/') {
        return Err(invalid("is not absolute"));
    }
    let path = normalize(Path::new(requested)).ok_or_else(|| invalid("contains '..'"))?;
    let root = normalize(root).filter(|r| r.is_absolute()).ok_or_else(|| {
        NodeError::failed(
            "confine a path",
            format!(
                "the configured root {:?} must be absolute and free of '..'",
                root
            ),
        )
    })?;
    let below = match path.strip_prefix(&root) {
        Ok(below) if below.as_os_str().is_empty() => {
            return Err(invalid(&format!("is the root {} itself", root.display())));
        }
        Ok(below) => below,
        Err(_) => return Err(invalid(&format!("is not under {}", root.display()))),
    };

    let mut walked = root.clone();
    for component in below.components() {
        walked.push(component);
        match std::fs::symlink_metadata(&walked) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(invalid(&format!(
                    "goes through the symbolic link {}; refused",
                    walked.display()
                )));
            }
            Ok(_) => {}
            // Nothing below a missing component exists either.
            Err(err) if err.kind() == io::ErrorKind::NotFound => break,
            Err(err) if err.kind() == io::ErrorKind::NotADirectory => {
                return Err(invalid(&format!(
                    "goes through {}, which is not a directory",
                    walked.parent().unwrap_or(&walked).display()
                )));
            }
            Err(err) => return Err(NodeError::io(format!("check {}", walked.display()), &err)),
        }
    }
    Ok(path)
}

/// The path without `.` and redundant separators; `None` if it has `..`,
/// which cannot be resolved lexically once links are in play.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => return None,
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    Some(normal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(result: Result<PathBuf, NodeError>) -> String {
        match result {
            Err(NodeError::InvalidArgument(message)) => message,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn accepts_and_normalizes_paths_below_the_root() {
        let root = Path::new("/nonexistent-kubelet");
        assert_eq!(
            confine(root, "/nonexistent-kubelet/pods/a/volumes/m").unwrap(),
            Path::new("/nonexistent-kubelet/pods/a/volumes/m")
        );
        assert_eq!(
            confine(root, "/nonexistent-kubelet//pods/./a/").unwrap(),
            Path::new("/nonexistent-kubelet/pods/a")
        );
        // A root given with a trailing slash or dots means the same.
        assert_eq!(
            confine(
                Path::new("/nonexistent-kubelet/./"),
                "/nonexistent-kubelet/x"
            )
            .unwrap(),
            Path::new("/nonexistent-kubelet/x")
        );
    }

    #[test]
    fn refuses_empty_relative_and_nul() {
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(code(confine(root, "")), "path is empty");
        assert!(code(confine(root, "var/lib/kubelet/x")).contains("not absolute"));
        assert!(code(confine(root, "./x")).contains("not absolute"));
        assert!(code(confine(root, "/var/lib/kubelet/x\0y")).contains("NUL"));
        let long = format!("/var/lib/kubelet/{}", "a/".repeat(PATH_MAX / 2));
        assert!(code(confine(root, &long)).contains("longer"));
    }

    #[test]
    fn refuses_dot_dot_even_when_it_would_stay_inside() {
        let root = Path::new("/var/lib/kubelet");
        assert!(code(confine(root, "/var/lib/kubelet/../../etc")).contains("'..'"));
        assert!(code(confine(root, "/var/lib/kubelet/pods/../pods/x")).contains("'..'"));
    }

    #[test]
    fn refuses_paths_outside_the_root_or_the_root_itself() {
        let root = Path::new("/var/lib/kubelet");
        assert!(code(confine(root, "/etc/passwd")).contains("not under /var/lib/kubelet"));
        // A sibling sharing the prefix as a string is still outside.
        assert!(code(confine(root, "/var/lib/kubelet-evil/x")).contains("not under"));
        assert!(code(confine(root, "/var/lib/kubelet/")).contains("root"));
        assert!(code(confine(root, "/var/lib/kubelet/.")).contains("root"));
    }

    #[test]
    fn a_relative_root_is_a_configuration_error() {
        let err = confine(Path::new("kubelet"), "/kubelet/x").unwrap_err();
        assert!(matches!(err, NodeError::Failed { .. }), "{err:?}");
    }

    #[test]
    fn refuses_a_symlink_component_below_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("pods/a")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("pods/evil")).unwrap();
        std::os::unix::fs::symlink(root.join("pods/a"), root.join("pods/a/self")).unwrap();
        let under = |p: &str| format!("{}/{p}", root.display());

        assert!(code(confine(root, &under("pods/evil/x"))).contains("symbolic link"));
        // The last component counts too: mounting onto a link mounts onto its target.
        assert!(code(confine(root, &under("pods/evil"))).contains("symbolic link"));
        assert!(code(confine(root, &under("pods/a/self/m"))).contains("symbolic link"));
        // Existing directories and a missing tail are fine.
        assert_eq!(
            confine(root, &under("pods/a/new/mount")).unwrap(),
            root.join("pods/a/new/mount")
        );
    }

    #[test]
    fn a_symlink_in_the_root_itself_is_the_administrators() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        let link = dir.path().join("kubelet");
        std::os::unix::fs::symlink(dir.path().join("real"), &link).unwrap();
        let requested = format!("{}/pods/x", link.display());
        assert_eq!(confine(&link, &requested).unwrap(), link.join("pods/x"));
    }

    #[test]
    fn refuses_a_file_used_as_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let requested = format!("{}/file/x", dir.path().display());
        assert!(code(confine(dir.path(), &requested)).contains("not a directory"));
    }
}
