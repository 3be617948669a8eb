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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin_check::calls::one_line;
    use crate::plugin_check::checks;

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
