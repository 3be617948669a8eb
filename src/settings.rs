//! What every service's settings share: a TOML file read over the built-in
//! defaults (flags and environment variables are laid over it by each
//! service's `resolve`), and durations written as seconds.

use std::path::Path;
use std::time::Duration;

use config::ConfigError;
use serde::de::DeserializeOwned;

/// The defaults, or the file's settings over them when a file is given.
/// Settings types are `#[serde(default)]`, so the file names only what it
/// changes; an unknown key is an error when they deny unknown fields.
pub(crate) fn defaults_or_file<T: Default + DeserializeOwned>(
    file: Option<&Path>,
) -> Result<T, ConfigError> {
    match file {
        Some(path) => config::Config::builder()
            .add_source(config::File::from(path).required(true))
            .build()?
            .try_deserialize(),
        None => Ok(T::default()),
    }
}

/// A flag given in seconds, named in the error when it is no duration.
pub(crate) fn seconds_flag(flag: &str, secs: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(secs).map_err(|e| ConfigError::Message(format!("--{flag}: {e}")))
}

/// `#[serde(with = "seconds")]`: a duration written as (fractional) seconds.
pub(crate) mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}
