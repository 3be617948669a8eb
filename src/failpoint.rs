//! Named steps of an operation, where tests crash the process or act.
//!
//! Production code marks a step once it has completed ([`step`]), or, for
//! a step about one object among several at once, with that object
//! ([`step_on`]: the path an unmount works on). Tests use steps two ways:
//! - `SNAP_CSI_CRASH_AFTER=<name>` makes the process kill itself with
//!   SIGKILL right after the step called `<name>` completes, so a test can
//!   prove that a retried call converges from exactly that state.
//! - [`once`]: a test in the same process runs a function of its own the
//!   next time a step is reached (blocking the operation until it returns),
//!   to change the world at exactly that point: end a holder when an
//!   unmount meets EBUSY, restart SNAP after a stage attached.
//!
//! Unset and without hooks (always, outside tests) a step is one comparison
//! against a value read once and one atomic load.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// The environment variable naming the step to crash after.
pub const ENV: &str = "SNAP_CSI_CRASH_AFTER";

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// A test's function for the next time a step is reached.
struct Hook {
    name: String,
    /// `None`: whatever the step is about.
    subject: Option<PathBuf>,
    run: Box<dyn FnOnce() + Send>,
}

static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());
/// How many hooks wait, so that a step without any takes no lock.
static WAITING: AtomicUsize = AtomicUsize::new(0);

fn hooks() -> std::sync::MutexGuard<'static, Vec<Hook>> {
    // Every change to the list is one push or remove: consistent whatever
    // panicked while holding it.
    HOOKS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks that the step `name` has completed.
pub fn step(name: &str) {
    reached(name, None);
}

/// Marks that the step `name` has completed on `subject`.
pub fn step_on(name: &str, subject: &Path) {
    reached(name, Some(subject));
}

fn reached(name: &str, subject: Option<&Path>) {
    if WAITING.load(Ordering::Acquire) > 0 {
        let hook = {
            let mut hooks = hooks();
            let found = hooks.iter().position(|h| {
                h.name == name && h.subject.as_deref().is_none_or(|s| Some(s) == subject)
            });
            found.map(|i| {
                WAITING.fetch_sub(1, Ordering::AcqRel);
                hooks.remove(i)
            })
        };
        // Run without the lock: the hook may take long, and other steps
        // (of other hooks) go on meanwhile.
        if let Some(hook) = hook {
            tracing::warn!(step = name, "test hook reached: running it");
            (hook.run)();
        }
    }
    if armed() == Some(name) {
        tracing::warn!(step = name, "crash point reached: killing this process");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// Runs `run` the next time the step `name` is reached (on `subject`, if
/// given), in the thread that reaches it, before the operation goes on.
/// For tests; hooks are per process and each runs once.
pub fn once(name: &str, subject: Option<&Path>, run: impl FnOnce() + Send + 'static) {
    hooks().push(Hook {
        name: name.to_string(),
        subject: subject.map(Path::to_path_buf),
        run: Box::new(run),
    });
    WAITING.fetch_add(1, Ordering::AcqRel);
}

/// Whether a hook set with [`once`] for `name` (and `subject`) has not run yet.
pub fn pending(name: &str, subject: Option<&Path>) -> bool {
    hooks()
        .iter()
        .any(|h| h.name == name && h.subject.as_deref() == subject)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    #[test]
    fn a_hook_runs_once_at_its_step_and_subject_only() {
        let ran = Arc::new(AtomicUsize::new(0));
        let (here, there) = (Path::new("/test/here"), Path::new("/test/there"));
        let counter = Arc::clone(&ran);
        once("test:subject", Some(here), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        step("test:subject");
        step_on("test:subject", there);
        step_on("test:other-step", here);
        assert_eq!(ran.load(Ordering::SeqCst), 0, "not its step or subject");
        assert!(pending("test:subject", Some(here)));
        step_on("test:subject", here);
        step_on("test:subject", here);
        assert_eq!(ran.load(Ordering::SeqCst), 1, "once");
        assert!(!pending("test:subject", Some(here)));
    }

    #[test]
    fn a_hook_without_subject_takes_the_step_on_anything() {
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        once("test:any", None, move || flag.store(true, Ordering::SeqCst));
        step_on("test:any", Path::new("/whatever"));
        assert!(ran.load(Ordering::SeqCst));
    }
}
