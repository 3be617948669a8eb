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

/// A time against its floor, sampled in turns (floor, measured, floor,
/// measured, ...): each measured sample is divided by the floor sample
/// taken just before it, so that load from outside the bench (other builds
/// on the same cores) falls on both sides of each quotient alike.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Paired {
    pub pairs: usize,
    /// The median quotient.
    pub ratio: f64,
    /// A distribution-free 95% confidence interval of that median: the
    /// quotients at the ranks the binomial distribution gives (order
    /// statistics; no assumption about the shape of the distribution).
    pub low: f64,
    pub high: f64,
    pub measured_p50_ms: f64,
    pub floor_p50_ms: f64,
}

/// A run whose ratios could move more than this from one run to the next
/// (see [`Paired::run_to_run`]) is too noisy to judge a target by its
/// median alone.
pub const NOISE: f64 = 0.10;

/// A figure measured once per repeat is judged only over at least this
/// many repeats, all on one side of its target: the range of n repeats
/// covers their median with probability 1 - 2^(1-n), 97% at 6 (at 2, a
/// coin's toss).
pub const JUDGED_REPEATS: usize = 6;

/// Fewer pairs than this never count as steady: the interval of a median
/// of n samples covers it with probability 1 - 2^(1-n) at best (the whole
/// range; 97% at 6), so a few close quotients say nothing about the next run.
pub const STEADY_PAIRS: usize = 8;

impl Paired {
    /// `floor[i]` is the floor sample taken just before `measured[i]`.
    pub fn of(floor_ms: &[f64], measured_ms: &[f64]) -> Paired {
        let mut quotients: Vec<f64> = floor_ms
            .iter()
            .zip(measured_ms)
            .filter(|(floor, _)| **floor > 0.0)
            .map(|(floor, measured)| measured / floor)
            .collect();
        if quotients.is_empty() {
            return Paired::default();
        }
        quotients.sort_by(f64::total_cmp);
        let (low, high) = median_interval(&quotients);
        Paired {
            pairs: quotients.len(),
            ratio: percentile(&quotients, 0.5),
            low,
            high,
            measured_p50_ms: percentile_of(measured_ms, 0.5),
            floor_p50_ms: percentile_of(floor_ms, 0.5),
        }
    }

    /// How far another run like this one may put the ratio, relative (95%):
    /// two medians each within +-h of the truth differ by up to h * sqrt(2).
    pub fn run_to_run(&self) -> f64 {
        if self.ratio <= 0.0 {
            return f64::INFINITY;
        }
        (self.high - self.low) / 2.0 * std::f64::consts::SQRT_2 / self.ratio
    }

    /// Whether the run is steady enough to judge by the median alone.
    pub fn steady(&self) -> bool {
        self.pairs >= STEADY_PAIRS && self.run_to_run() <= NOISE
    }

    /// Whether this run can say if the ratio is at most `most`: by the
    /// median while the run is [steady](Self::steady); otherwise only when
    /// the whole interval is on one side of it.
    pub fn at_most(&self, most: f64) -> Verdict {
        if self.pairs == 0 {
            Verdict::Noisy
        } else if self.steady() {
            Verdict::of(self.ratio <= most)
        } else if self.high <= most {
            Verdict::Met
        } else if self.low > most {
            Verdict::Missed
        } else {
            Verdict::Noisy
        }
    }

    /// "1.23x (+-4%)": the ratio and how far another run may put it.
    pub fn show(&self) -> String {
        format!(
            "{:.2}x (+-{:.0}%)",
            self.ratio,
            (self.run_to_run() * 100.0).min(999.0)
        )
    }
}

/// A distribution-free 95% confidence interval of the median of `sorted`
/// (non-empty): the values at the ranks n/2 -+ 1.96 * sqrt(n)/2 (the normal
/// approximation of the binomial), widened outward and clamped to the
/// samples. No assumption about the shape of the distribution.
fn median_interval(sorted: &[f64]) -> (f64, f64) {
    let n = sorted.len();
    let half = 0.98 * (n as f64).sqrt();
    let low = ((n as f64 / 2.0 - half).floor() as usize).max(1);
    let high = ((n as f64 / 2.0 + half).ceil() as usize + 1).min(n);
    (sorted[low - 1], sorted[high - 1])
}

/// Whether the median of `measured` is at most `most` times the median of
/// `base`, two sets of samples taken apart (not in turns): judged only when
/// each has [`JUDGED_REPEATS`] samples or more and the quotient of their 95%
/// intervals lies whole on one side of `most`.
/// Returns the verdict and that quotient's interval.
pub fn medians_at_most(base: &[f64], measured: &[f64], most: f64) -> (Verdict, f64, f64) {
    let sorted = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v
    };
    let (base, measured) = (sorted(base), sorted(measured));
    if base.len().min(measured.len()) < JUDGED_REPEATS || base[0] <= 0.0 {
        return (Verdict::Noisy, 0.0, f64::INFINITY);
    }
    let (base_low, base_high) = median_interval(&base);
    let (low, high) = median_interval(&measured);
    let (low, high) = (low / base_high, high / base_low);
    let verdict = if high <= most {
        Verdict::Met
    } else if low > most {
        Verdict::Missed
    } else {
        Verdict::Noisy
    };
    (verdict, low, high)
}

/// Whether a run met a target, missed it, or was too noisy to tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Met,
    Missed,
    /// Neither: the run's own spread is over [`NOISE`] and its interval
    /// straddles the target. Not a pass, not a failure.
    Noisy,
    /// A figure this build does not judge (the heap and the JSON-RPC
    /// client of a debug build are not the product's): whether it met its
    /// target, shown.
    Shown(bool),
}

impl Verdict {
    /// An exact count's verdict (round trips, link calls): no noise.
    pub fn of(met: bool) -> Verdict {
        if met { Verdict::Met } else { Verdict::Missed }
    }

    /// A figure measured once per repeat (a round, a restart): met or
    /// missed when every repeat says so, of at least [`JUDGED_REPEATS`];
    /// otherwise the run cannot tell its noise from the target.
    pub fn by_repeats(met: impl IntoIterator<Item = bool>) -> Verdict {
        let met: Vec<bool> = met.into_iter().collect();
        if met.len() < JUDGED_REPEATS {
            Verdict::Noisy
        } else if met.iter().all(|&m| m) {
            Verdict::Met
        } else if met.iter().all(|&m| !m) {
            Verdict::Missed
        } else {
            Verdict::Noisy
        }
    }

    /// A figure judged in a release build only, shown in any other.
    pub fn in_release(release: bool, met: bool) -> Verdict {
        if release {
            Verdict::of(met)
        } else {
            Verdict::Shown(met)
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

/// Nearest-rank percentile of unsorted values.
pub fn percentile_of(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, q)
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
    fn a_ratio_is_judged_by_its_median_only_when_the_run_is_steady() {
        // Floors that wander 4x with the load, a measured side that moves
        // with them: every quotient is 1.4, and so is the verdict.
        let floor: Vec<f64> = (0..400).map(|i| 1.0 + f64::from(i % 4)).collect();
        let steady: Vec<f64> = floor.iter().map(|f| 1.4 * f).collect();
        let p = Paired::of(&floor, &steady);
        assert_eq!((p.pairs, p.ratio, p.low, p.high), (400, 1.4, 1.4, 1.4));
        assert_eq!(p.at_most(1.5), Verdict::Met);
        assert_eq!(p.at_most(1.3), Verdict::Missed);

        // Quotients spread 1..2 evenly: the median 1.5 is known to about
        // +-0.05 on 400 pairs (run to run +-7%), to +-0.25 on 16.
        let spread = |n: usize| -> Paired {
            let q: Vec<f64> = (0..n).map(|i| 1.0 + i as f64 / n as f64).collect();
            Paired::of(&vec![1.0; n], &q)
        };
        let many = spread(400);
        assert!(many.run_to_run() < NOISE, "{many:?}");
        assert_eq!(many.at_most(1.45), Verdict::Missed);
        let few = spread(16);
        assert!(few.run_to_run() > NOISE, "{few:?}");
        assert_eq!(few.at_most(1.5), Verdict::Noisy, "{few:?}");
        // Too noisy for the median, yet on one side of it whole.
        assert_eq!(few.at_most(2.5), Verdict::Met);
        assert_eq!(few.at_most(0.9), Verdict::Missed);
        // Nothing measured is no pass; two close pairs are no steady run.
        assert_eq!(Paired::of(&[], &[]).at_most(10.0), Verdict::Noisy);
        let two = Paired::of(&[1.0, 1.0], &[1.50, 1.51]);
        assert!(!two.steady() && two.run_to_run() < NOISE, "{two:?}");
        assert_eq!(two.at_most(1.505), Verdict::Noisy);
        assert_eq!(two.at_most(1.6), Verdict::Met);
    }

    #[test]
    fn samples_taken_apart_are_judged_by_their_medians_intervals() {
        let base: Vec<f64> = (0..100).map(|i| 10.0 + f64::from(i % 5) * 0.1).collect();
        let near: Vec<f64> = base.iter().map(|b| b * 1.05).collect();
        let far: Vec<f64> = base.iter().map(|b| b * 1.5).collect();
        assert_eq!(medians_at_most(&base, &near, 1.1).0, Verdict::Met);
        assert_eq!(medians_at_most(&base, &far, 1.1).0, Verdict::Missed);
        // Six samples a side: the intervals are the whole ranges.
        let spread = [1.0, 2.0, 3.0, 1.0, 2.0, 3.0];
        let (verdict, low, high) = medians_at_most(&spread, &[2.0; 6], 1.1);
        assert_eq!((verdict, low, high), (Verdict::Noisy, 2.0 / 3.0, 2.0));
        // One call a side says nothing of the next run.
        assert_eq!(medians_at_most(&[1.0], &[2.0], 1.1).0, Verdict::Noisy);
    }

    #[test]
    fn a_repeated_figure_is_judged_only_when_every_repeat_agrees() {
        assert_eq!(Verdict::by_repeats([true; 6]), Verdict::Met);
        assert_eq!(Verdict::by_repeats([false; 7]), Verdict::Missed);
        let mut mixed = [false; 8];
        mixed[3] = true;
        assert_eq!(Verdict::by_repeats(mixed), Verdict::Noisy);
        // Two repeats agree by chance one time in two.
        assert_eq!(Verdict::by_repeats([false, false]), Verdict::Noisy);
        assert_eq!(Verdict::in_release(false, false), Verdict::Shown(false));
        assert_eq!(Verdict::in_release(true, false), Verdict::Missed);
    }

    #[test]
    fn spread_of_counts() {
        let s = Spread::of(&[1.0, 1.0, 2.0, 0.0]);
        assert_eq!((s.min, s.mean, s.max), (0.0, 1.0, 2.0));
        let none = Spread::of(&[]);
        assert_eq!((none.min, none.mean, none.max), (0.0, 0.0, 0.0));
    }
}
