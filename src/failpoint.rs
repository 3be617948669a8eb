//! Crash points for crash-safety tests.
//!
//! `SNAP_CSI_CRASH_AFTER=<name>` makes the process kill itself with SIGKILL
//! right after the step called `<name>` completes, so a test can prove that a
//! retried call converges from exactly that state. Unset (always, outside
//! tests) a crash point is one comparison against a value read once.

use std::sync::OnceLock;

/// The environment variable naming the step to crash after.
pub const ENV: &str = "SNAP_CSI_CRASH_AFTER";

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Marks that the step `name` has completed; dies here if it is the armed one.
pub fn step(name: &str) {
    if armed() == Some(name) {
        tracing::warn!(step = name, "crash point reached: killing this process");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
