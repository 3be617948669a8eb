//! What every service's settings share: a TOML file read over the built-in
//! defaults, flags (and their environment variables) laid over that by each
//! service's `resolve`, and durations written as seconds.

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

/// Lays the flags that were given over the settings read so far: each listed
/// field of `$flags` that is `Some` replaces the field of the same name in
/// `$settings`; those listed after `optional` are settings that may stay
/// unset, so the flag's value is kept as `Some`. A listed `flag => setting`
/// lays the flag over a setting of another name.
macro_rules! flags_over {
    (@one $flags:expr, $settings:expr, $field:ident) => {
        flags_over!(@one $flags, $settings, $field => $field)
    };
    (@one $flags:expr, $settings:expr, $field:ident => $target:ident) => {
        if let Some(value) = &$flags.$field {
            $settings.$target = value.clone();
        }
    };
    ($flags:expr => $settings:expr, [$($field:ident $(=> $target:ident)?),* $(,)?] $(, optional [$($optional:ident),* $(,)?])?) => {
        $(
            flags_over!(@one $flags, $settings, $field $(=> $target)?);
        )*
        $($(
            if let Some(value) = &$flags.$optional {
                $settings.$optional = Some(value.clone());
            }
        )*)?
    };
}
pub(crate) use flags_over;

/// Lays the flag `--{flag}`, given in seconds, over `setting` when it was
/// given; the error names the flag when the value is no duration.
pub(crate) fn seconds_flag(
    setting: &mut Duration,
    flag: &str,
    given: Option<f64>,
) -> Result<(), ConfigError> {
    if let Some(secs) = given {
        *setting = Duration::try_from_secs_f64(secs)
            .map_err(|e| ConfigError::Message(format!("--{flag}: {e}")))?;
    }
    Ok(())
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

/// A config file `name` holding `contents`, in a directory that lives as long
/// as the returned handle.
#[cfg(test)]
pub(crate) fn test_file(name: &str, contents: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, contents).unwrap();
    (dir, file)
}
