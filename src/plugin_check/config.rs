//! What a run is told: the plugin's socket, the volume context its devices
//! need, and how long each check may take; and the subcommand around a run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// What a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The plugin's UNIX socket.
    pub socket: PathBuf,
    /// The volume_context CreateDevice gets; the plugin needs it to find the
    /// storage (e.g. `backend=aio`, `path=/tmp/x.img`).
    pub volume_context: HashMap<String, String>,
    /// The volume_context of a filesystem device (volume_mode "Filesystem");
    /// empty: [`Config::volume_context`] serves it too.
    pub fs_volume_context: HashMap<String, String>,
    /// How long each check may take, all its calls together.
    pub timeout: Duration,
}

impl Config {
    /// What a filesystem device's CreateDevice gets.
    pub(super) fn fs_context(&self) -> &HashMap<String, String> {
        if self.fs_volume_context.is_empty() {
            &self.volume_context
        } else {
            &self.fs_volume_context
        }
    }
}

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("invalid arguments: {0}")]
    Usage(String),
    #[error("cannot connect to the plugin at {socket}: {reason}")]
    Unreachable { socket: String, reason: String },
}

/// `snap-csi plugin-check`.
#[derive(Debug, clap::Args)]
pub struct PluginCheckArgs {
    /// The plugin's socket: `unix:///path/to/plugin.sock`.
    #[arg(long)]
    pub endpoint: String,
    /// A volume_context entry the plugin needs to create a device; repeat for more.
    #[arg(long = "volume-context", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub volume_context: Vec<(String, String)>,
    /// A volume_context entry for a filesystem device (volume_mode
    /// "Filesystem"), when it needs another than --volume-context's; repeat for more.
    #[arg(long = "fs-volume-context", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub fs_volume_context: Vec<(String, String)>,
    /// Seconds each check may take, all its calls together.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
}

impl PluginCheckArgs {
    pub fn resolve(&self) -> Result<Config, CheckError> {
        let socket = parse_endpoint(&self.endpoint)?;
        let timeout = crate::settings::duration_from_secs(self.timeout)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or_else(|| {
                CheckError::Usage(format!(
                    "--timeout {} is not a positive number of seconds up to {} (a year)",
                    self.timeout,
                    crate::settings::MAX_SECONDS
                ))
            })?;
        Ok(Config {
            socket,
            volume_context: context("--volume-context", &self.volume_context)?,
            fs_volume_context: context("--fs-volume-context", &self.fs_volume_context)?,
            timeout,
        })
    }
}

/// The entries of a repeated `flag`, each key once.
fn context(flag: &str, pairs: &[(String, String)]) -> Result<HashMap<String, String>, CheckError> {
    let mut context = HashMap::new();
    for (key, value) in pairs {
        if context.insert(key.clone(), value.clone()).is_some() {
            return Err(CheckError::Usage(format!("{flag} {key} is given twice")));
        }
    }
    Ok(context)
}

/// `unix:///abs/path` or `unix:path`, as gRPC names UNIX sockets.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, CheckError> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .filter(|p| !p.is_empty())
        .ok_or_else(|| {
            CheckError::Usage(format!(
                "--endpoint {endpoint:?}: expected unix:///path/to/plugin.sock \
                 (plugins serve nvidia.storage.plugins.v1 on a UNIX socket)"
            ))
        })?;
    Ok(PathBuf::from(path))
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_sockets() {
        assert_eq!(
            parse_endpoint("unix:///run/plugin.sock").unwrap(),
            PathBuf::from("/run/plugin.sock")
        );
        assert_eq!(
            parse_endpoint("unix:plugin.sock").unwrap(),
            PathBuf::from("plugin.sock")
        );
        for bad in ["/run/plugin.sock", "tcp://1.2.3.4:5", "unix://", ""] {
            assert!(parse_endpoint(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn volume_context_entries_are_key_value() {
        assert_eq!(
            parse_key_value("path=/tmp/x=y.img").unwrap(),
            ("path".to_string(), "/tmp/x=y.img".to_string())
        );
        assert_eq!(
            parse_key_value("empty=").unwrap(),
            ("empty".to_string(), String::new())
        );
        assert!(parse_key_value("novalue").is_err());
        assert!(parse_key_value("=value").is_err());
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        let args = PluginCheckArgs {
            endpoint: "unix:///x.sock".into(),
            volume_context: vec![("a".into(), "1".into()), ("a".into(), "2".into())],
            fs_volume_context: vec![],
            timeout: 5.0,
        };
        assert!(matches!(args.resolve(), Err(CheckError::Usage(_))));
        let args = PluginCheckArgs {
            endpoint: "unix:///x.sock".into(),
            volume_context: vec![],
            fs_volume_context: vec![("a".into(), "1".into()), ("a".into(), "2".into())],
            timeout: 5.0,
        };
        match args.resolve() {
            Err(CheckError::Usage(why)) => assert!(why.contains("--fs-volume-context a"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_timeout_must_be_positive() {
        for timeout in [0.0, -1.0, f64::NAN] {
            let args = PluginCheckArgs {
                endpoint: "unix:///x.sock".into(),
                volume_context: vec![],
                fs_volume_context: vec![],
                timeout,
            };
            assert!(
                matches!(args.resolve(), Err(CheckError::Usage(_))),
                "{timeout}"
            );
        }
    }
}
