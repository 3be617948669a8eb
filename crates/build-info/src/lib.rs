//! For build scripts: tells the crate being built which git commit it is
//! built from, so that a binary in a container image can say what it is
//! (`--version`, and the line each service logs at start).
//!
//! A build script calls [`emit_version`]; the crate then reads
//! `env!("SNAP_CSI_VERSION")`: `VERSION (commit HASH)`, HASH the commit's
//! full hash or `unknown`, the one format every binary's `--version` and
//! start line show.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable that carries the commit into the build (an override).
pub const GIT_COMMIT_VAR: &str = "SNAP_CSI_GIT_COMMIT";

/// What the commit is when neither the variable nor git can say.
pub const UNKNOWN: &str = "unknown";

/// Sets `SNAP_CSI_VERSION` for the crate being built. Its commit is the
/// `SNAP_CSI_GIT_COMMIT` variable's own value when the build is given one (a
/// container build copies no `.git`, so the commit comes in as a build
/// argument), else `git rev-parse HEAD` in the crate's directory, else
/// `unknown` (no git, or not a checkout). It never fails the build.
///
/// Cargo runs the build script again when the variable changes, and when
/// the files change that move with the checked-out commit, so that a new
/// commit or checkout gives a new hash without `cargo clean`.
pub fn emit_version() {
    println!("cargo:rerun-if-env-changed={GIT_COMMIT_VAR}");
    let given = std::env::var(GIT_COMMIT_VAR).unwrap_or_default();
    let given = given.trim();
    let commit = if given.is_empty() || given == UNKNOWN {
        // An unset build argument (empty, or a Dockerfile's default): ask git.
        let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
        watch_head(&dir);
        git(&dir, &["rev-parse", "HEAD"])
            .filter(|hash| is_hash(hash))
            .unwrap_or_else(|| UNKNOWN.to_string())
    } else if is_printable_word(given) {
        given.to_string()
    } else {
        // It goes into a version line and a log line: no spaces or controls.
        println!("cargo:warning={GIT_COMMIT_VAR} is not one word; the commit shows as {UNKNOWN}");
        UNKNOWN.to_string()
    };
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=SNAP_CSI_VERSION={version} (commit {commit})");
}

/// Asks cargo to run the build script again when HEAD moves: `HEAD` itself
/// (a checkout), the ref it names (a commit on the branch), and, while that
/// ref is packed, `packed-refs` and HEAD's reflog, which a commit appends to
/// as it writes the ref loose again. `--git-path` finds each where git keeps
/// it, in a linked worktree too; only existing files are named, as cargo
/// reruns every build for a missing one.
fn watch_head(dir: &Path) {
    let watch = |name: &str| {
        if let Some(path) = git(dir, &["rev-parse", "--git-path", name]).map(|p| dir.join(p))
            && path.is_file()
        {
            println!("cargo:rerun-if-changed={}", path.display());
            return true;
        }
        false
    };
    watch("HEAD");
    // Fails on a detached HEAD, which names no ref: HEAD itself then changes.
    if let Some(reference) = git(dir, &["symbolic-ref", "-q", "HEAD"])
        && !watch(&reference)
    {
        watch("packed-refs");
        watch("logs/HEAD");
    }
}

/// `git ARGS` in `dir`: its first line of output, if it ran and succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let stdout = String::from_utf8(output.stdout).ok()?;
    let line = stdout.lines().next()?.trim();
    (output.status.success() && !line.is_empty()).then(|| line.to_string())
}

/// A SHA-1 or SHA-256 object name.
fn is_hash(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_printable_word(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_full_hex_object_names() {
        assert!(is_hash(&"a".repeat(40)));
        assert!(is_hash(&"0123456789abcdef".repeat(4)));
        assert!(!is_hash("abc123"));
        assert!(!is_hash(&"g".repeat(40)));
        assert!(is_printable_word("v1.2-rc1+abc"));
        assert!(!is_printable_word("two words"));
        assert!(!is_printable_word("line\nbreak"));
    }
}
