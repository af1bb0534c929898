//! The counter-based generator that defines `Op::RandomUniform`.
//!
//! Every backend (reference, CPU, CUDA C, the PTX emulator) must produce exactly these bits:
//! the sample at flat index `i` is a pure function of `(seed, counter, i)`, so masks are identical
//! across backends and thread counts, and a resumed run redraws the same masks.

/// SplitMix64's finaliser: a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The per-step key: mixes the op's seed with the counter (e.g. the global step).
pub fn step_key(seed: u64, counter: i64) -> u64 {
    mix64(seed.wrapping_add((counter as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

/// Sample `index` under `key`: the top 24 bits of a mixed word, scaled to `[0, 1)` exactly.
pub fn uniform_at(key: u64, index: u64) -> f32 {
    let bits = mix64(key ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03));
    (bits >> 40) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_uniform_and_depend_on_every_input() {
        let key = step_key(42, 7);
        let xs: Vec<f32> = (0..100_000).map(|i| uniform_at(key, i)).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().map(|&x| f64::from(x)).sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        let below = xs.iter().filter(|&&x| x < 0.25).count() as f64 / xs.len() as f64;
        assert!((below - 0.25).abs() < 0.01, "P(x<0.25) = {below}");
        assert_ne!(uniform_at(step_key(42, 8), 0), uniform_at(key, 0));
        assert_ne!(uniform_at(step_key(43, 7), 0), uniform_at(key, 0));
        assert_ne!(uniform_at(key, 1), uniform_at(key, 0));
    }
}
