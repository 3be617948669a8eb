//! Reading `--help` texts and `docs/configuration.md`, for the tests that
//! keep that page true (this crate's and the sample plugin's).

#![allow(dead_code)]

/// `(--flag, ENV)` pairs from a `--help` text (clap prints `[env: NAME=]`).
pub fn settings(help: &str) -> Vec<(String, Option<String>)> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("--") {
            let flag = rest.split([' ', '<']).next().unwrap_or_default();
            if flag != "help" && flag != "version" {
                out.push((format!("--{flag}"), None));
            }
        }
        if let Some(start) = line.find("[env: ") {
            let name = line[start + 6..].split('=').next().unwrap_or_default();
            if let Some(last) = out.last_mut() {
                last.1 = Some(name.to_string());
            }
        }
    }
    out
}

/// The text under `heading`, up to the next `## ` heading.
pub fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no section {heading}"));
    let rest = &doc[start + heading.len()..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// Asserts that every flag of `help` is documented, with its environment
/// variable, under `heading` of `doc`.
pub fn assert_documented(doc: &str, heading: &str, what: &str, help: &str) {
    let section = section(doc, heading);
    let found = settings(help);
    assert!(found.len() >= 5, "{what}: parsed {found:?} from {help}");
    for (flag, env) in found {
        let env = env.unwrap_or_else(|| panic!("{what} {flag} has no environment variable"));
        assert!(
            section
                .lines()
                .any(|l| l.contains(&format!("`{flag}`")) && l.contains(&format!("`{env}`"))),
            "{what}: {flag} / {env} is not documented in docs/configuration.md"
        );
    }
}
