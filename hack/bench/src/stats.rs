//! Percentiles of a set of timings.

use std::time::Duration;

use serde::Serialize;

/// A distribution in milliseconds. Percentiles are nearest-rank, so with 32
/// samples p99 is the largest one.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    pub fn of(times: &[Duration]) -> Summary {
        Summary::of_ms(
            &times
                .iter()
                .map(|d| d.as_secs_f64() * 1e3)
                .collect::<Vec<_>>(),
        )
    }

    pub fn of_ms(values: &[f64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Summary {
            samples: sorted.len(),
            p50_ms: percentile(&sorted, 0.50),
            p99_ms: percentile(&sorted, 0.99),
            mean_ms: sorted.iter().sum::<f64>() / sorted.len() as f64,
            min_ms: sorted[0],
            max_ms: sorted[sorted.len() - 1],
        }
    }
}

/// The least, the mean and the most of a count taken once per call.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        Spread {
            min: values.iter().copied().reduce(f64::min).unwrap_or(0.0),
            mean: mean(values),
            max: values.iter().copied().reduce(f64::max).unwrap_or(0.0),
        }
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The mean of `values`, 0 for none.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        let s = Summary::of_ms(&[3.0, 1.0, 2.0]);
        assert_eq!(
            (s.p50_ms, s.p99_ms, s.min_ms, s.max_ms),
            (2.0, 3.0, 1.0, 3.0)
        );
    }

    #[test]
    fn spread_of_counts() {
        let s = Spread::of(&[1.0, 1.0, 2.0, 0.0]);
        assert_eq!((s.min, s.mean, s.max), (0.0, 1.0, 2.0));
        let none = Spread::of(&[]);
        assert_eq!((none.min, none.mean, none.max), (0.0, 0.0, 0.0));
    }
}
