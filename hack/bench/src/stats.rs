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

/// A figure measured once per repeat (a round, a restart, a failover) is
/// judged over at least this many repeats: the range of n repeats covers
/// their median with probability 1 - 2^(1-n), 97% at 6 (at 2, a coin's
/// toss).
pub const JUDGED_REPEATS: usize = 6;

/// A ratio sampled in turns is judged by its median over at least this many
/// pairs: the 95% interval of a median needs 8 samples to fall inside their
/// range at all.
pub const JUDGED_PAIRS: usize = 8;

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

    /// Whether the median quotient is at most `most`, over at least
    /// [`JUDGED_PAIRS`] pairs. The median, not the interval: pairing puts
    /// the machine's load on both sides of each quotient, so the median
    /// holds still where a bound on every pair or the interval's edge would
    /// follow one descheduled call; its run-to-run spread is shown beside it.
    pub fn at_most(&self, most: f64) -> Verdict {
        if self.pairs < JUDGED_PAIRS {
            Verdict::NotJudged
        } else {
            Verdict::of(self.ratio <= most)
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
/// `base`, two sets of samples taken apart (not in turns): judged by that
/// quotient of medians when each side has [`JUDGED_REPEATS`] samples or more.
/// Returns the verdict and the quotient's 95% interval (shown: how far
/// another run may put it).
pub fn medians_at_most(base: &[f64], measured: &[f64], most: f64) -> (Verdict, f64, f64) {
    let sorted = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v
    };
    let (base, measured) = (sorted(base), sorted(measured));
    if base.len().min(measured.len()) < JUDGED_REPEATS || base[0] <= 0.0 {
        return (Verdict::NotJudged, 0.0, f64::INFINITY);
    }
    let (base_low, base_high) = median_interval(&base);
    let (low, high) = median_interval(&measured);
    let ratio = percentile(&measured, 0.5) / percentile(&base, 0.5);
    (Verdict::of(ratio <= most), low / base_high, high / base_low)
}

/// Whether a run met a target, missed it, or was too short to judge it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Met,
    Missed,
    /// Too few samples or repeats for the target's statistic: not met,
    /// and said so (a run that judges it needs more repeats).
    NotJudged,
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

    /// A bound on every sample ("each restart ready within ..."): missed
    /// when any sample misses it, however few; met when every one of at
    /// least [`JUDGED_REPEATS`] holds it.
    pub fn each(met: impl IntoIterator<Item = bool>) -> Verdict {
        let met: Vec<bool> = met.into_iter().collect();
        if met.contains(&false) {
            Verdict::Missed
        } else if met.len() < JUDGED_REPEATS {
            Verdict::NotJudged
        } else {
            Verdict::Met
        }
    }

    /// A ratio measured once per repeat, each repeat a pair taken back to
    /// back (one rate against another): judged by the median of the
    /// repeats' ratios over at least [`JUDGED_REPEATS`], so that one repeat
    /// a neighbour's burst fell on neither passes nor fails the run.
    pub fn by_median(ratios: &[f64], met: impl Fn(f64) -> bool) -> Verdict {
        if ratios.len() < JUDGED_REPEATS {
            Verdict::NotJudged
        } else {
            Verdict::of(met(percentile_of(ratios, 0.5)))
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
    fn a_ratio_sampled_in_turns_is_judged_by_its_median_over_enough_pairs() {
        // Floors that wander 4x with the load, a measured side that moves
        // with them: every quotient is 1.4, and so is the verdict.
        let floor: Vec<f64> = (0..400).map(|i| 1.0 + f64::from(i % 4)).collect();
        let steady: Vec<f64> = floor.iter().map(|f| 1.4 * f).collect();
        let p = Paired::of(&floor, &steady);
        assert_eq!((p.pairs, p.ratio, p.low, p.high), (400, 1.4, 1.4, 1.4));
        assert_eq!(p.at_most(1.5), Verdict::Met);
        assert_eq!(p.at_most(1.3), Verdict::Missed);

        // Quotients spread 1..2 evenly, a few far out: the median decides,
        // and a target just under it is missed, not excused as noise.
        let mut q: Vec<f64> = (0..16).map(|i| 1.0 + f64::from(i) / 16.0).collect();
        q[0] = 40.0;
        let spread = Paired::of(&[1.0; 16], &q);
        assert_eq!(spread.ratio, 1.5);
        assert_eq!(spread.at_most(1.5), Verdict::Met);
        assert_eq!(spread.at_most(1.45), Verdict::Missed);
        // Too few pairs are not judged, either way.
        assert_eq!(Paired::of(&[], &[]).at_most(10.0), Verdict::NotJudged);
        let few = Paired::of(&[1.0; 7], &[1.0; 7]);
        assert_eq!(few.at_most(1.5), Verdict::NotJudged);
        assert_eq!(
            Paired::of(&[1.0; 7], &[9.0; 7]).at_most(1.5),
            Verdict::NotJudged
        );
    }

    #[test]
    fn samples_taken_apart_are_judged_by_the_quotient_of_their_medians() {
        let base: Vec<f64> = (0..100).map(|i| 10.0 + f64::from(i % 5) * 0.1).collect();
        let near: Vec<f64> = base.iter().map(|b| b * 1.05).collect();
        let far: Vec<f64> = base.iter().map(|b| b * 1.5).collect();
        assert_eq!(medians_at_most(&base, &near, 1.1).0, Verdict::Met);
        assert_eq!(medians_at_most(&base, &far, 1.1).0, Verdict::Missed);
        // Six samples a side: judged, the interval the whole ranges.
        let spread = [1.0, 2.0, 3.0, 1.0, 2.0, 3.0];
        let (verdict, low, high) = medians_at_most(&spread, &[2.0; 6], 1.1);
        assert_eq!((verdict, low, high), (Verdict::Met, 2.0 / 3.0, 2.0));
        assert_eq!(medians_at_most(&spread, &[2.5; 6], 1.1).0, Verdict::Missed);
        // One call a side says nothing of the next run.
        assert_eq!(medians_at_most(&[1.0], &[2.0], 1.1).0, Verdict::NotJudged);
    }

    #[test]
    fn a_bound_on_every_sample_fails_on_any_and_passes_only_over_enough() {
        assert_eq!(Verdict::each([true; 6]), Verdict::Met);
        let mut one_over = [true; 8];
        one_over[3] = false;
        assert_eq!(Verdict::each(one_over), Verdict::Missed);
        // A miss is a miss however few the samples; a pass needs six.
        assert_eq!(Verdict::each([false]), Verdict::Missed);
        assert_eq!(Verdict::each([true, true]), Verdict::NotJudged);
        assert_eq!(Verdict::each([]), Verdict::NotJudged);
    }

    #[test]
    fn repeated_ratios_are_judged_by_their_median_over_enough_repeats() {
        let at_least = |r: f64| r >= 1.8;
        // One repeat a burst fell on neither passes nor fails the run.
        assert_eq!(
            Verdict::by_median(&[2.1, 0.9, 2.0, 2.2, 1.9, 2.3], at_least),
            Verdict::Met
        );
        assert_eq!(
            Verdict::by_median(&[1.7, 2.5, 1.6, 1.7, 1.9, 1.5], at_least),
            Verdict::Missed
        );
        assert_eq!(Verdict::by_median(&[2.0; 5], at_least), Verdict::NotJudged);
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
