//! What the checks found: one result per check, printed one line each,
//! then `N passed, M failed`.

use std::fmt;

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
}

/// One printed line: `PASS <name>: <detail>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub name: &'static str,
    pub verdict: Verdict,
    pub detail: String,
}

impl fmt::Display for CheckResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        };
        write!(f, "{verdict} {}: {}", self.name, self.detail)
    }
}

/// Every check's result, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub results: Vec<CheckResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.count(Verdict::Pass)
    }

    pub fn failed(&self) -> usize {
        self.count(Verdict::Fail)
    }

    /// The names of the checks with `verdict`, in order.
    pub fn names(&self, verdict: Verdict) -> Vec<&'static str> {
        self.results
            .iter()
            .filter(|r| r.verdict == verdict)
            .map(|r| r.name)
            .collect()
    }

    /// `N passed, M failed`.
    pub fn summary(&self) -> String {
        format!("{} passed, {} failed", self.passed(), self.failed())
    }

    fn count(&self, verdict: Verdict) -> usize {
        self.results.iter().filter(|r| r.verdict == verdict).count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for result in &self.results {
            writeln!(f, "{result}")?;
        }
        write!(f, "{}", self.summary())
    }
}

/// The checks, in the order they run and print.
pub mod checks {
    pub const PLUGIN_INFO: &str = "plugin-info";
    pub const PROBE: &str = "probe";
    pub const CAPABILITIES: &str = "capabilities";
    pub const SNAP_PROVIDER: &str = "snap-provider";
    pub const CREATE_DELETE_UNIMPLEMENTED: &str = "create-delete-unimplemented";
    pub const GET_DEVICE_UNIMPLEMENTED: &str = "get-device-unimplemented";
    pub const LIST_DEVICES_UNIMPLEMENTED: &str = "list-devices-unimplemented";
    pub const GET_DEVICE_NOT_FOUND: &str = "get-device-not-found";
    pub const DELETE_DEVICE_ABSENT: &str = "delete-device-absent";
    pub const LIST_DEVICES_BAD_TOKEN: &str = "list-devices-bad-token";
    pub const CREATE_DEVICE: &str = "create-device";
    pub const CREATE_DEVICE_IDEMPOTENT: &str = "create-device-idempotent";
    pub const GET_DEVICE: &str = "get-device";
    pub const LIST_DEVICES: &str = "list-devices";
    pub const LIST_DEVICES_PAGING: &str = "list-devices-paging";
    pub const DELETE_DEVICE: &str = "delete-device";
    pub const DELETE_DEVICE_IDEMPOTENT: &str = "delete-device-idempotent";
    pub const GET_DEVICE_AFTER_DELETE: &str = "get-device-after-delete";
    pub const LIST_DEVICES_AFTER_DELETE: &str = "list-devices-after-delete";
    pub const FS_DEVICE: &str = "fs-device";
    pub const UNOFFERED_KIND_REFUSED: &str = "unoffered-kind-refused";
    pub const CLEANUP: &str = "cleanup";

    pub const ALL: [&str; 22] = [
        PLUGIN_INFO,
        PROBE,
        CAPABILITIES,
        SNAP_PROVIDER,
        CREATE_DELETE_UNIMPLEMENTED,
        GET_DEVICE_UNIMPLEMENTED,
        LIST_DEVICES_UNIMPLEMENTED,
        GET_DEVICE_NOT_FOUND,
        DELETE_DEVICE_ABSENT,
        LIST_DEVICES_BAD_TOKEN,
        CREATE_DEVICE,
        CREATE_DEVICE_IDEMPOTENT,
        GET_DEVICE,
        LIST_DEVICES,
        LIST_DEVICES_PAGING,
        DELETE_DEVICE,
        DELETE_DEVICE_IDEMPOTENT,
        GET_DEVICE_AFTER_DELETE,
        LIST_DEVICES_AFTER_DELETE,
        FS_DEVICE,
        UNOFFERED_KIND_REFUSED,
        CLEANUP,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin_check::show::one_line;

    #[test]
    fn results_print_one_line_each_and_the_summary_alone() {
        let report = Report {
            results: vec![
                CheckResult {
                    name: checks::PROBE,
                    verdict: Verdict::Pass,
                    detail: "ok".into(),
                },
                CheckResult {
                    name: checks::CLEANUP,
                    verdict: Verdict::Fail,
                    detail: one_line("a\nb"),
                },
                CheckResult {
                    name: checks::LIST_DEVICES,
                    verdict: Verdict::Skip,
                    detail: "why".into(),
                },
            ],
        };
        assert_eq!(
            report.to_string(),
            "PASS probe: ok\nFAIL cleanup: a b\nSKIP list-devices: why\n1 passed, 1 failed"
        );
    }
}
