//! The run's random choices: SplitMix64, seeded, so that `--seed` repeats
//! every choice (which volume kind, which fault, how long) in the same order.
//! Timing still differs from run to run (two shared cores, the kernel), so a
//! seed reproduces the script, not the exact interleaving.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator for one part of the run (a worker, the fault injector),
    /// independent of how many numbers the others draw.
    pub fn fork(seed: u64, stream: u64) -> Rng {
        let mut mixer = Rng(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        Rng(mixer.next())
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let index = self.next() % items.len() as u64;
        &items[usize::try_from(index).unwrap_or(0)]
    }

    /// Puts `items` in a random order (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.range(0, i as u64);
            items.swap(i, usize::try_from(j).unwrap_or(0));
        }
    }

    /// Uniform between `low` and `high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.range(low, high))
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn a_seed_repeats_its_choices_and_streams_differ() {
        let draw = |seed, stream| {
            let mut rng = Rng::fork(seed, stream);
            (0..8).map(|_| rng.range(0, 1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7, 1), draw(7, 1));
        assert_ne!(draw(7, 1), draw(7, 2));
        assert_ne!(draw(7, 1), draw(8, 1));
        let mut rng = Rng::new(3);
        assert!((0..1000).all(|_| (5..=9).contains(&rng.range(5, 9))));
    }
}
