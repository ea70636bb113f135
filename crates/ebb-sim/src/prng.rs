//! The simulator's only source of randomness: xoshiro256** seeded through splitmix64.
//!
//! A run is reproduced from one `u64` seed, so every random draw in the simulator (device
//! jitter, workload offsets, fault injection) must come from a [`Prng`] derived from that seed,
//! never from the OS or a hash-ordered container. The generator is written here by hand rather
//! than taken from a crate so that its output sequence can never change under a dependency
//! upgrade: a seed recorded in a bug report must replay the same run years later.
//!
//! xoshiro256** (Blackman and Vigna, 2018) is small (32 bytes of state), fast (a few
//! nanoseconds per draw) and passes BigCrush; it is not cryptographic, which the simulator does
//! not need. Its state must not be all zeros, so the seed is expanded through splitmix64, the
//! seeding procedure its authors recommend, which also spreads nearby seeds (0, 1, 2...) into
//! unrelated states.
//!
//! Independent streams come from [`Prng::fork`], so that each component (each device, each
//! workload) owns a generator and adding draws in one component does not shift the sequence
//! another one sees.

/// A deterministic xoshiro256** pseudo-random generator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prng {
    state: [u64; 4],
}

/// One step of splitmix64: advances `state` and returns the next output.
///
/// Public so that other seed-derivation code can use the same mixing as [`Prng::new`].
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Prng {
    /// A generator whose whole sequence is determined by `seed`.
    pub fn new(seed: u64) -> Prng {
        let mut mix = seed;
        let state = [
            splitmix64(&mut mix),
            splitmix64(&mut mix),
            splitmix64(&mut mix),
            splitmix64(&mut mix),
        ];
        // splitmix64 is a bijection of its counter, so four consecutive outputs cannot all be
        // zero; the assertion documents the xoshiro precondition.
        assert!(state.iter().any(|&word| word != 0));
        Prng { state }
    }

    /// A generator with an explicit xoshiro state, for known-answer tests against the
    /// reference implementation. `state` must not be all zeros.
    pub fn from_state(state: [u64; 4]) -> Prng {
        assert!(state.iter().any(|&word| word != 0), "xoshiro state must not be all zeros");
        Prng { state }
    }

    /// The next 64 uniformly distributed bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform float in `[0, 1)` with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        // The top 53 bits fill the mantissa exactly, so every value is a multiple of 2^-53
        // and 1.0 is never returned.
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `[0, n)`, without modulo bias. `n` must be positive.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0) has no valid result");
        // Lemire's multiply-shift: the high word of x*n is uniform in [0, n) once the few low
        // words that would over-represent some results are rejected.
        let mut product = u128::from(self.next_u64()) * u128::from(n);
        let mut low = product as u64;
        if low < n {
            let threshold = n.wrapping_neg() % n;
            while low < threshold {
                product = u128::from(self.next_u64()) * u128::from(n);
                low = product as u64;
            }
        }
        (product >> 64) as u64
    }

    /// A uniform integer in the half-open range `[lo, hi)`. Requires `lo < hi`.
    #[inline]
    pub fn range_u64(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo < hi, "range_u64 needs lo < hi, got [{lo}, {hi})");
        lo + self.below(hi - lo)
    }

    /// True with probability `p` (clamped to `[0, 1]`).
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }

    /// An exponentially distributed sample with the given mean (same unit as `mean`).
    ///
    /// Used for Poisson arrivals and memoryless service jitter. `mean` must be non-negative.
    #[inline]
    pub fn exponential(&mut self, mean: f64) -> f64 {
        assert!(mean >= 0.0, "exponential mean must be non-negative, got {mean}");
        // 1 - u lies in (0, 1], so the logarithm is finite.
        -mean * (1.0 - self.next_f64()).ln()
    }

    /// Derives an independent generator and advances `self`.
    ///
    /// The child is seeded (through splitmix64) from one draw of the parent, so the split is
    /// deterministic, the child's sequence is unrelated to the parent's continuation, and
    /// forking twice gives two different children.
    pub fn fork(&mut self) -> Prng {
        Prng::new(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn splitmix64_known_answers() {
        // Goal: the seed expansion matches the published splitmix64 sequence for seed 0.
        let mut state = 0;
        assert_eq!(splitmix64(&mut state), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(&mut state), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(splitmix64(&mut state), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn xoshiro_known_answers() {
        // Goal: the generator matches the reference xoshiro256** output for state [1, 2, 3, 4].
        let mut prng = Prng::from_state([1, 2, 3, 4]);
        let expected: [u64; 10] = [
            11520,
            0,
            1509978240,
            1215971899390074240,
            1216172134540287360,
            607988272756665600,
            16172922978634559625,
            8476171486693032832,
            10595114339597558777,
            2904607092377533576,
        ];
        for value in expected {
            assert_eq!(prng.next_u64(), value);
        }
    }

    #[test]
    fn seeded_known_answers() {
        // Goal: pin the seed-42 sequence so that any change to seeding or output is caught,
        // because recorded seeds must replay identical runs.
        let mut prng = Prng::new(42);
        let first: Vec<u64> = (0..3).map(|_| prng.next_u64()).collect();
        let mut again = Prng::new(42);
        let second: Vec<u64> = (0..3).map(|_| again.next_u64()).collect();
        assert_eq!(first, second);
        assert_eq!(first, SEED_42_FIRST_THREE);
    }

    /// The first three outputs of `Prng::new(42)`, recorded from this implementation after it
    /// passed the reference known-answer tests above.
    const SEED_42_FIRST_THREE: [u64; 3] =
        [1546998764402558742, 6990951692964543102, 12544586762248559009];

    #[test]
    fn derived_draws_stay_in_range() {
        // Goal: below, range_u64, next_f64 and exponential respect their documented ranges
        // and have roughly the right means over many draws.
        let mut prng = Prng::new(7);
        let mut sum_below = 0u64;
        let mut sum_exponential = 0.0;
        let mut hits = 0u64;
        let draws = 100_000u64;
        for _ in 0..draws {
            let value = prng.below(10);
            assert!(value < 10);
            sum_below += value;
            let ranged = prng.range_u64(100, 103);
            assert!((100..103).contains(&ranged));
            let unit = prng.next_f64();
            assert!((0.0..1.0).contains(&unit));
            let sample = prng.exponential(2.0);
            assert!(sample >= 0.0);
            sum_exponential += sample;
            hits += u64::from(prng.chance(0.25));
        }
        let mean_below = sum_below as f64 / draws as f64;
        assert!((mean_below - 4.5).abs() < 0.05, "mean of below(10) was {mean_below}");
        let mean_exponential = sum_exponential / draws as f64;
        assert!((mean_exponential - 2.0).abs() < 0.05, "exponential mean {mean_exponential}");
        let rate = hits as f64 / draws as f64;
        assert!((rate - 0.25).abs() < 0.01, "chance(0.25) rate {rate}");
        assert_eq!(prng.below(1), 0);
        assert!(!prng.chance(0.0));
        assert!(prng.chance(1.0));
    }

    #[test]
    fn fork_is_deterministic_and_independent() {
        // Goal: forking is reproducible from the seed, and the child's stream shares no values
        // with the parent's continuation or with a sibling's stream.
        let mut parent = Prng::new(1);
        let mut child = parent.fork();
        let mut sibling = parent.fork();
        let mut parent_again = Prng::new(1);
        assert_eq!(parent_again.fork(), child);

        let parent_values: BTreeSet<u64> = (0..1000).map(|_| parent.next_u64()).collect();
        let child_values: BTreeSet<u64> = (0..1000).map(|_| child.next_u64()).collect();
        let sibling_values: BTreeSet<u64> = (0..1000).map(|_| sibling.next_u64()).collect();
        assert_eq!(parent_values.intersection(&child_values).count(), 0);
        assert_eq!(child_values.intersection(&sibling_values).count(), 0);
        assert_eq!(parent_values.intersection(&sibling_values).count(), 0);
    }
}
