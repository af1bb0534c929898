//! Poisoned scratch: compiled backends fill their scratch arenas with a signalling-NaN
//! pattern, so a kernel reading memory no kernel of the step wrote computes NaN (and fails
//! loudly: a non-finite loss, a test mismatch) instead of silently reusing whatever an earlier
//! kernel or step left there. [`crate::lower::verify`] proves the same statically; this catches
//! what a backend does beyond the program (a kernel reading past its view, say).

/// The 32-bit word scratch is filled with: an f32 signalling NaN (exponent all ones, quiet bit
/// clear, payload `0x25A5A5`), easy to spot in a hex dump.
pub const POISON_WORD: u32 = 0x7FA5_A5A5;

/// When a backend poisons its scratch arenas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoisonScratch {
    /// Once, when a program's arenas are allocated (free: the memory is touched anyway).
    /// Catches a read of memory unwritten in the first step.
    AtAllocation,
    /// Also before every step (a pass over the arenas per step: for tests and debugging).
    /// Catches a read of memory the same step did not write but an earlier step did.
    EveryStep,
}

impl Default for PoisonScratch {
    /// `EveryStep` in debug builds or when the environment variable `TOWERPACK_POISON_SCRATCH`
    /// is `1`; `AtAllocation` otherwise.
    fn default() -> PoisonScratch {
        let asked = std::env::var("TOWERPACK_POISON_SCRATCH").is_ok_and(|v| v == "1");
        if cfg!(debug_assertions) || asked {
            PoisonScratch::EveryStep
        } else {
            PoisonScratch::AtAllocation
        }
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
        let mut b = [0u8; 10];
        poison(&mut b);
        assert_eq!(
            f32::from_le_bytes([b[4], b[5], b[6], b[7]]).to_bits(),
            POISON_WORD
        );
        assert_eq!(&b[8..], &POISON_WORD.to_le_bytes()[..2]);
    }
}
