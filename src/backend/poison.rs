//! Poisoned scratch: compiled backends fill their scratch arenas with a signalling-NaN
//! pattern, so a kernel reading memory no kernel of the step wrote computes NaN (and fails
//! loudly: a non-finite loss, a test mismatch) instead of silently reusing whatever an earlier
//! kernel or step left there. [`mod@crate::lower::verify`] proves the same statically; this catches
//! what a backend does beyond the program (a kernel reading past its view, say).

/// The 32-bit word scratch is filled with: an f32 signalling NaN (exponent all ones, quiet bit
/// clear, payload `0x257FA5`) whose two halves are each a bf16 signalling NaN (`0x7FA5`; also an
/// f16 NaN), so a 16-bit buffer (an activation stored in bf16, `lower::half_storage`) is
/// poisoned as well as an f32 one; easy to spot in a hex dump.
pub const POISON_WORD: u32 = 0x7FA5_7FA5;

/// When a backend poisons its scratch memory (its arena of intermediate values, and on a GPU
/// its staging buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PoisonScratch {
    /// Never (emulated CUDA devices still poison at allocation).
    Never,
    /// Once, when a program's memory is allocated (nearly free: the memory is touched anyway).
    /// Catches a read of memory unwritten in the first step.
    AtAllocation,
    /// Also before every step (a pass over the memory per step: for tests and debugging).
    /// Catches a read of memory the same step did not write but an earlier step did.
    EveryStep,
}

impl PoisonScratch {
    /// From the environment variable `TOWERPACK_POISON_SCRATCH`: `1` or `step` every step,
    /// `once` at allocation, `0` never; unset (or anything else): every step in debug builds,
    /// at allocation otherwise.
    pub fn from_environment() -> PoisonScratch {
        match std::env::var("TOWERPACK_POISON_SCRATCH").as_deref() {
            Ok("1" | "step") => PoisonScratch::EveryStep,
            Ok("once") => PoisonScratch::AtAllocation,
            Ok("0") => PoisonScratch::Never,
            _ if cfg!(debug_assertions) => PoisonScratch::EveryStep,
            _ => PoisonScratch::AtAllocation,
        }
    }
}

impl Default for PoisonScratch {
    /// [`PoisonScratch::from_environment`].
    fn default() -> PoisonScratch {
        PoisonScratch::from_environment()
    }
}

/// Fills `bytes` with [`POISON_WORD`] (little-endian; a trailing partial word gets its first
/// bytes).
pub fn poison(bytes: &mut [u8]) {
    let word = POISON_WORD.to_le_bytes();
    let mut chunks = bytes.chunks_exact_mut(4);
    for c in &mut chunks {
        c.copy_from_slice(&word);
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&word[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poison_is_a_signalling_nan() {
        let x = f32::from_bits(POISON_WORD);
        assert!(x.is_nan());
        // The quiet bit (the mantissa's top bit) is clear.
        assert_eq!(POISON_WORD & 0x0040_0000, 0);
        // Each 16-bit half is a bf16 signalling NaN and an f16 NaN.
        for half in [POISON_WORD as u16, (POISON_WORD >> 16) as u16] {
            let b = half::bf16::from_bits(half);
            assert!(b.is_nan() && half & 0x0040 == 0, "bf16 {half:#x}");
            assert!(half::f16::from_bits(half).is_nan(), "f16 {half:#x}");
        }
        let mut b = [0u8; 10];
        poison(&mut b);
        assert_eq!(
            f32::from_le_bytes([b[4], b[5], b[6], b[7]]).to_bits(),
            POISON_WORD
        );
        assert_eq!(&b[8..], &POISON_WORD.to_le_bytes()[..2]);
    }
}
