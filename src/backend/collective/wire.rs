//! Wire formats of reductions: f32 as is, or bf16 compression (half the bytes; each value
//! rounded to 8 significant bits, as Horovod's fp16 compression but with f32's range).

use half::bf16;
use half::slice::HalfFloatSliceExt;

/// How the values of an all-reduce travel between participants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WireFormat {
    /// Exact f32.
    #[default]
    F32 = 0,
    /// bf16: half the bytes; values rounded to nearest even on the way out and after every
    /// partial sum.
    Bf16 = 1,
}

impl WireFormat {
    /// Bytes per element on the wire.
    pub fn bytes(self) -> usize {
        match self {
            WireFormat::F32 => 4,
            WireFormat::Bf16 => 2,
        }
    }

    /// The format stored as `self as u8` (unknown values read as f32).
    pub fn from_u8(v: u8) -> WireFormat {
        if v == WireFormat::Bf16 as u8 {
            WireFormat::Bf16
        } else {
            WireFormat::F32
        }
    }
}

/// `values` rounded to bf16, as raw bits.
pub fn to_bf16_bits(values: &[f32], out: &mut [u16]) {
    let out: &mut [bf16] = bytemuck_bf16_mut(out);
    out.convert_from_f32_slice(values);
}

/// bf16 bits widened back to f32.
pub fn from_bf16_bits(bits: &[u16], out: &mut [f32]) {
    let bits: &[bf16] = bytemuck_bf16(bits);
    bits.convert_to_f32_slice(out);
}

/// `acc[i] ← bf16(acc[i] + x[i])` on bf16 bits: one partial sum of a bf16 reduction.
pub fn add_bf16_bits(acc: &mut [u16], x: &[u16]) {
    for (a, b) in acc.iter_mut().zip(x) {
        let s = bf16::from_bits(*a).to_f32() + bf16::from_bits(*b).to_f32();
        *a = bf16::from_f32(s).to_bits();
    }
}

fn bytemuck_bf16(bits: &[u16]) -> &[bf16] {
    // SAFETY: `bf16` is `#[repr(transparent)]` over `u16`: same size, alignment and validity.
    unsafe { std::slice::from_raw_parts(bits.as_ptr().cast::<bf16>(), bits.len()) }
}

fn bytemuck_bf16_mut(bits: &mut [u16]) -> &mut [bf16] {
    // SAFETY: as in `bytemuck_bf16`; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(bits.as_mut_ptr().cast::<bf16>(), bits.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_trip_keeps_eight_significant_bits() {
        let x = [1.0f32, -2.5, 1.0 + 1.0 / 256.0, 3.0e38, 1.0e-3, 0.0];
        let mut bits = [0u16; 6];
        to_bf16_bits(&x, &mut bits);
        let mut back = [0f32; 6];
        from_bf16_bits(&bits, &mut back);
        assert_eq!(&back[..2], &[1.0, -2.5]);
        // 1 + 2⁻⁸ is halfway between two bf16 values: ties go to even (1.0).
        assert_eq!(back[2], 1.0);
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() / 128.0, "{a} vs {b}");
        }
    }

    #[test]
    fn bf16_partial_sums_round_after_each_add() {
        let mut acc = [0u16; 2];
        let mut x = [0u16; 2];
        to_bf16_bits(&[1.0, 256.0], &mut acc);
        to_bf16_bits(&[0.5, 1.0], &mut x);
        add_bf16_bits(&mut acc, &x);
        let mut out = [0f32; 2];
        from_bf16_bits(&acc, &mut out);
        // 256 + 1 is not representable with 8 significant bits: it rounds back to 256.
        assert_eq!(out, [1.5, 256.0]);
    }
}
