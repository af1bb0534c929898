//! Counter-based randomness for data pipelines: every draw is a pure function of
//! `(seed, pass, index, slot)`, never a position in a sequential stream, so a pipeline restored
//! mid-pass (or split across prefetch workers) draws exactly what an uninterrupted run draws.

/// SplitMix64's finaliser: a bijective 64-bit mixer.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A key naming one independent random stream; draws are indexed by a `slot` number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RandomKey(u64);

impl RandomKey {
    /// The key of datapoint `index` of pass `pass` under `seed`.
    pub fn new(seed: u64, pass: u64, index: u64) -> RandomKey {
        let k = mix64(seed ^ 0x5DEE_CE66_D1CE_4E5B);
        let k = mix64(k ^ mix64(pass.wrapping_mul(GOLDEN).wrapping_add(1)));
        RandomKey(mix64(
            k ^ mix64(index.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 2),
        ))
    }

    /// The key of a whole pass (used for per-pass shuffles).
    pub fn for_pass(seed: u64, pass: u64) -> RandomKey {
        RandomKey::new(seed, pass, u64::MAX)
    }

    /// An independent sub-stream, e.g. one per augmentor of a chain.
    pub fn derive(self, salt: u64) -> RandomKey {
        RandomKey(mix64(self.0 ^ mix64(salt.wrapping_add(GOLDEN))))
    }

    /// 64 random bits at `slot`.
    pub fn bits(self, slot: u64) -> u64 {
        mix64(
            self.0
                ^ slot
                    .wrapping_mul(0xA24B_AED4_963E_E407)
                    .wrapping_add(GOLDEN),
        )
    }

    /// A uniform sample in `[0, 1)` with 53 random bits.
    pub fn uniform(self, slot: u64) -> f64 {
        (self.bits(slot) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `[0, n)` (0 when `n == 0`), by a 64×64→128 multiply; the bias is
    /// below `n / 2^64`.
    pub fn below(self, slot: u64, n: u64) -> u64 {
        ((u128::from(self.bits(slot)) * u128::from(n)) >> 64) as u64
    }
}

/// A permutation of `0..n` drawn from `key` (Fisher–Yates; draw `i` uses slot `i`).
pub fn permutation(n: usize, key: RandomKey) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = key.below(i as u64, i as u64 + 1) as usize;
        perm.swap(i, j);
    }
    perm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_depend_on_every_input_and_are_uniform() {
        let k = RandomKey::new(7, 3, 11);
        assert_eq!(k, RandomKey::new(7, 3, 11));
        assert_ne!(k.bits(0), RandomKey::new(8, 3, 11).bits(0));
        assert_ne!(k.bits(0), RandomKey::new(7, 4, 11).bits(0));
        assert_ne!(k.bits(0), RandomKey::new(7, 3, 12).bits(0));
        assert_ne!(k.bits(0), k.bits(1));
        assert_ne!(k.bits(0), k.derive(0).bits(0));
        let n = 200_000;
        let mean = (0..n).map(|s| k.uniform(s)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        let mut counts = [0usize; 10];
        for s in 0..n {
            counts[k.below(s, 10) as usize] += 1;
        }
        for c in counts {
            assert!((c as f64 / n as f64 - 0.1).abs() < 0.005, "{counts:?}");
        }
    }

    #[test]
    fn permutations_are_permutations_and_vary_with_the_key() {
        let a = permutation(1000, RandomKey::for_pass(1, 0));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(a, permutation(1000, RandomKey::for_pass(1, 1)));
        assert_eq!(a, permutation(1000, RandomKey::for_pass(1, 0)));
        assert!(permutation(0, RandomKey::for_pass(1, 0)).is_empty());
    }
}
