//! What every service's settings share: a TOML file read over the built-in
//! defaults, flags (and their environment variables) laid over that by each
//! service's `resolve`, and durations written as seconds.

use std::path::Path;
use std::time::Duration;

use config::ConfigError;
use serde::de::DeserializeOwned;

/// The CSI driver name the node and the controller proxy report unless told
/// otherwise (`--driver-name`); the CSIDriver object carries the same.
pub const DRIVER_NAME: &str = "csi.snap-csi.io";

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

/// The longest duration a seconds setting takes: a year, far beyond any
/// timeout or wait, and near enough that a deadline `now + it` is always a
/// time the clocks and timers can hold (`1e19` seconds fits a `Duration` but
/// panics when added to an `Instant`).
pub const MAX_SECONDS: u64 = 365 * 24 * 60 * 60;

/// A duration given as (fractional) seconds: a number from 0 to
/// [`MAX_SECONDS`]; NaN, negative, infinite and larger values are refused
/// with a message saying so.
pub fn duration_from_secs(secs: f64) -> Result<Duration, String> {
    #[allow(clippy::cast_precision_loss)] // a year in seconds is exact in f64
    let max = MAX_SECONDS as f64;
    if secs.is_nan() || !(0.0..=max).contains(&secs) {
        return Err(format!(
            "{secs} is not a number of seconds from 0 to {MAX_SECONDS} (a year)"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// [`duration_from_secs`] for a command-line value (clap's `value_parser`).
pub fn parse_seconds(value: &str) -> Result<Duration, String> {
    let secs: f64 = value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not a number of seconds"))?;
    duration_from_secs(secs)
}

/// Lays the flag `--{flag}`, given in seconds, over `setting` when it was
/// given; the error names the flag when the value is no duration.
pub(crate) fn seconds_flag(
    setting: &mut Duration,
    flag: &str,
    given: Option<f64>,
) -> Result<(), ConfigError> {
    if let Some(secs) = given {
        *setting =
            duration_from_secs(secs).map_err(|e| ConfigError::Message(format!("--{flag}: {e}")))?;
    }
    Ok(())
}

/// `#[serde(with = "seconds")]`: a duration written as (fractional) seconds.
pub(crate) mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        super::duration_from_secs(secs).map_err(serde::de::Error::custom)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_outside_zero_to_a_year_are_refused() {
        assert_eq!(duration_from_secs(0.0), Ok(Duration::ZERO));
        assert_eq!(duration_from_secs(1.5), Ok(Duration::from_millis(1500)));
        assert_eq!(
            duration_from_secs(31_536_000.0),
            Ok(Duration::from_secs(MAX_SECONDS))
        );
        for bad in [
            f64::NAN,
            -1.0,
            -0.001,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e19,
            31_536_000.5,
        ] {
            let error = duration_from_secs(bad).unwrap_err();
            assert!(error.contains("from 0 to 31536000"), "{bad}: {error}");
        }
        assert_eq!(parse_seconds(" 2 "), Ok(Duration::from_secs(2)));
        assert!(parse_seconds("1e19").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("soon").unwrap_err().contains("\"soon\""));
    }

    #[test]
    fn flags_and_files_refuse_a_huge_duration_by_name() {
        let mut setting = Duration::from_secs(1);
        let error = seconds_flag(&mut setting, "call-timeout", Some(1e19)).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("--call-timeout: 10000000000000000000 is not"),
            "{error}"
        );
        assert_eq!(
            setting,
            Duration::from_secs(1),
            "a refused flag changes nothing"
        );
        #[derive(Debug, serde::Deserialize)]
        struct File {
            #[serde(with = "seconds")]
            wait: Duration,
        }
        let file: File = serde_json::from_str(r#"{"wait": 2.5}"#).unwrap();
        assert_eq!(file.wait, Duration::from_millis(2500));
        let error = serde_json::from_str::<File>(r#"{"wait": 1e19}"#).unwrap_err();
        assert!(error.to_string().contains("from 0 to"), "{error}");
    }
}
