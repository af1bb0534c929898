//! Memory of the CPU backend: 64-byte aligned arenas and typed raw views into them.
//!
//! Kernels reach buffers through [`RawBuf`] (a pointer, a dtype and a length) rather than
//! references, because an elementwise kernel may legally write an output over the input it
//! reads at the same position; every access through a `RawBuf` is a short-lived slice or a raw
//! read/write, so no overlapping references are ever alive at once.

use super::access::Access;
use crate::tensor::{DType, HostTensor};
use half::{bf16, f16};

/// A zero-initialised, 64-byte aligned block of bytes.
pub struct Arena {
    words: Vec<Align64>,
    bytes: usize,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Align64([u8; 64]);

impl Arena {
    /// An arena of `bytes` zero bytes.
    pub fn new(bytes: usize) -> Arena {
        Arena {
            words: vec![Align64([0; 64]); bytes.div_ceil(64)],
            bytes,
        }
    }

    /// An arena of `bytes` bytes filled with the poison pattern ([`crate::backend::poison`]).
    pub fn poisoned(bytes: usize) -> Arena {
        let mut a = Arena::new(bytes);
        a.poison();
        a
    }

    /// Fills the arena with the poison pattern.
    pub fn poison(&mut self) {
        crate::backend::poison::poison(self.bytes_mut());
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True when the arena holds no byte.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Base pointer.
    pub fn ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast()
    }

    /// The bytes, read-only.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` owns at least `bytes` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.bytes) }
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.bytes) }
    }
}

/// A typed view of `len` elements at `ptr`.
#[derive(Clone, Copy, Debug)]
pub struct RawBuf {
    pub ptr: *mut u8,
    pub dtype: DType,
    pub len: usize,
}

// SAFETY: a RawBuf is a plain address; the executor guarantees that concurrent kernels' writes
// are disjoint and that buffers outlive the kernels using them.
unsafe impl Send for RawBuf {}
// SAFETY: as above.
unsafe impl Sync for RawBuf {}

macro_rules! convert_in {
    ($dst:expr, $get:expr) => {{
        match $dst {
            Lanes::F32(d) => d
                .iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = $get(j) as f32),
            Lanes::F64(d) => d.iter_mut().enumerate().for_each(|(j, x)| *x = $get(j)),
            Lanes::I64(d) => d
                .iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = $get(j) as i64),
            Lanes::Bool(d) => d
                .iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = $get(j) != 0.0),
            _ => {}
        }
    }};
}

impl RawBuf {
    /// Asks the CPU to bring elements `start..start + n` (clamped to the buffer) into the cache:
    /// a hint with no effect on values.
    #[inline]
    pub fn prefetch(&self, start: usize, n: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let size = self.dtype.size_bytes();
            let end = start.saturating_add(n).min(self.len) * size;
            let mut at = start.min(self.len) * size;
            while at < end {
                // SAFETY: SSE is part of x86_64; a prefetch never faults or changes memory (and
                // the address is inside the buffer).
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(self.ptr.wrapping_add(at).cast_const().cast())
                };
                at += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (start, n);
    }

    /// The element at `i`, widened to `f64`.
    ///
    /// # Safety
    /// `i < self.len` and the memory is valid.
    pub unsafe fn get_f64(&self, i: usize) -> f64 {
        // SAFETY: the caller guarantees `i` is in bounds; unaligned reads are used for types
        // whose alignment the arena does not promise at every offset.
        unsafe {
            let p = self.ptr;
            match self.dtype {
                DType::F32 => f64::from(p.cast::<f32>().add(i).read_unaligned()),
                DType::F64 => p.cast::<f64>().add(i).read_unaligned(),
                DType::F16 => p.cast::<f16>().add(i).read_unaligned().to_f64(),
                DType::BF16 => p.cast::<bf16>().add(i).read_unaligned().to_f64(),
                DType::I32 => f64::from(p.cast::<i32>().add(i).read_unaligned()),
                DType::I64 => p.cast::<i64>().add(i).read_unaligned() as f64,
                DType::U8 => f64::from(p.add(i).read()),
                DType::Bool => f64::from(u8::from(p.add(i).read() != 0)),
            }
        }
    }

    /// Writes `x` (converted as a cast to the buffer's dtype) at `i`.
    ///
    /// # Safety
    /// `i < self.len`, the memory is valid and nobody else accesses this element now.
    pub unsafe fn set_f64(&self, i: usize, x: f64) {
        let y = crate::ir::scalar::cast(x, self.dtype);
        // SAFETY: as `get_f64`.
        unsafe {
            let p = self.ptr;
            match self.dtype {
                DType::F32 => p.cast::<f32>().add(i).write_unaligned(y as f32),
                DType::F64 => p.cast::<f64>().add(i).write_unaligned(y),
                DType::F16 => p.cast::<f16>().add(i).write_unaligned(f16::from_f64(y)),
                DType::BF16 => p
                    .cast::<bf16>()
                    .add(i)
                    .write_unaligned(crate::tensor::bf16_from_f64(y)),
                DType::I32 => p.cast::<i32>().add(i).write_unaligned(y as i32),
                DType::I64 => p.cast::<i64>().add(i).write_unaligned(y as i64),
                DType::U8 => p.add(i).write(y as u8),
                DType::Bool => p.add(i).write(u8::from(y != 0.0)),
            }
        }
    }

    /// `n` f32 elements from `start`, as a slice.
    ///
    /// # Safety
    /// The buffer is f32, `start + n <= len`, and nothing writes them while the slice lives.
    pub unsafe fn f32_slice<'a>(&self, start: usize, n: usize) -> &'a [f32] {
        // SAFETY: forwarded from the caller; the arena is 64-byte aligned and f32 buffers sit at
        // multiples of 4 bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<f32>().add(start), n) }
    }

    /// `n` f32 elements from `start`, writable.
    ///
    /// # Safety
    /// As [`RawBuf::f32_slice`], and nothing else reads or writes them while the slice lives.
    #[allow(clippy::mut_from_ref)] // A raw view: exclusivity is the caller's contract.
    pub unsafe fn f32_slice_mut<'a>(&self, start: usize, n: usize) -> &'a mut [f32] {
        // SAFETY: forwarded from the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<f32>().add(start), n) }
    }

    /// Loads the elements of flat positions `start..start + n` under `access` into `dst`
    /// (converting to the lanes' class). `idx` is scratch of at least `n` entries.
    ///
    /// # Safety
    /// Every index of `access` over these positions is `< len`.
    #[inline(always)]
    pub unsafe fn load(&self, access: &Access, start: usize, idx: &mut [usize], dst: Lanes<'_>) {
        if let (DType::Bool, Access::Contiguous { offset }, Lanes::Bool(d)) =
            (self.dtype, access, &dst)
        {
            let n = d.len();
            // SAFETY: bounds checked by the caller; bool buffers hold one byte per element.
            let bytes = unsafe { std::slice::from_raw_parts(self.ptr.add(offset + start), n) };
            if let Lanes::Bool(d) = dst {
                for (x, &b) in d.iter_mut().zip(bytes) {
                    *x = b != 0;
                }
            }
            return;
        }
        if let (DType::BF16, Access::Contiguous { offset }, Lanes::F32(d)) =
            (self.dtype, access, &dst)
        {
            let n = d.len();
            // SAFETY: bounds checked by the caller; bf16 buffers hold two bytes per element at
            // even offsets of the 64-byte aligned arena.
            let bits = unsafe {
                std::slice::from_raw_parts(self.ptr.cast::<u16>().add(offset + start), n)
            };
            if let Lanes::F32(d) = dst {
                super::kernels::round::from_bf16_bits(bits, d);
            }
            return;
        }
        let d = match dst {
            Lanes::F32(d)
                if self.dtype == DType::F32 && !matches!(access, Access::General { .. }) =>
            {
                d
            }
            // A strided view whose rows are contiguous (a slice of channels): row by row.
            Lanes::F32(d)
                if matches!(self.dtype, DType::F32 | DType::BF16)
                    && access.has_contiguous_rows() =>
            {
                let n = d.len();
                access.contiguous_runs(start, n, |position, at, len| {
                    let out = &mut d[at..at + len];
                    // SAFETY: bounds checked by the caller for every index this access yields;
                    // a run's elements are such indices.
                    unsafe {
                        if self.dtype == DType::F32 {
                            out.copy_from_slice(self.f32_slice(position, len));
                        } else {
                            let bits = std::slice::from_raw_parts(
                                self.ptr.cast::<u16>().add(position),
                                len,
                            );
                            // Runs are short (a row of channels): widened inline (no SIMD
                            // dispatch per run), exactly.
                            for (o, &b) in out.iter_mut().zip(bits) {
                                *o = super::kernels::round::bf16_to_f32(b);
                            }
                        }
                    }
                });
                return;
            }
            other => {
                let n = match &other {
                    Lanes::F32(d) => d.len(),
                    Lanes::F64(d) => d.len(),
                    Lanes::I64(d) => d.len(),
                    Lanes::Bool(d) => d.len(),
                    _ => 0,
                };
                let idx = &mut idx[..n];
                access.indices(start, idx);
                // SAFETY: every index was checked by the caller.
                unsafe { self.gather(idx, other) };
                return;
            }
        };
        let n = d.len();
        // SAFETY: bounds checked by the caller for every index this access yields.
        unsafe {
            match access {
                Access::Contiguous { offset } => {
                    d.copy_from_slice(self.f32_slice(offset + start, n))
                }
                Access::Scalar { offset } => d.fill(self.f32_slice(*offset, 1)[0]),
                Access::Periodic { offset, period } => {
                    let src = self.f32_slice(*offset, *period);
                    let mut p = start % period;
                    let mut j = 0;
                    while j < n {
                        let m = (period - p).min(n - j);
                        d[j..j + m].copy_from_slice(&src[p..p + m]);
                        j += m;
                        p = 0;
                    }
                }
                Access::Repeat { offset, inner } => {
                    let (mut q, mut r) = (start / inner, start % inner);
                    let mut j = 0;
                    while j < n {
                        let m = (inner - r).min(n - j);
                        d[j..j + m].fill(self.f32_slice(offset + q, 1)[0]);
                        j += m;
                        r = 0;
                        q += 1;
                    }
                }
                Access::General { .. } => {}
            }
        }
    }

    /// Loads the elements at `idx` into `dst`, converting to the lanes' class.
    ///
    /// # Safety
    /// Every index is `< len`.
    #[inline(always)]
    pub unsafe fn gather(&self, idx: &[usize], dst: Lanes<'_>) {
        match dst {
            Lanes::Bool(d) if self.dtype == DType::Bool => {
                for (x, &i) in d.iter_mut().zip(idx) {
                    // SAFETY: `i < len` by the caller's contract.
                    *x = unsafe { self.ptr.add(i).read() } != 0;
                }
            }
            Lanes::I64(d) if self.dtype == DType::I32 => {
                let p = self.ptr.cast::<i32>();
                for (x, &i) in d.iter_mut().zip(idx) {
                    // SAFETY: as above.
                    *x = i64::from(unsafe { p.add(i).read_unaligned() });
                }
            }
            Lanes::I64(d) if self.dtype == DType::I64 => {
                let p = self.ptr.cast::<i64>();
                for (x, &i) in d.iter_mut().zip(idx) {
                    // SAFETY: as above.
                    *x = unsafe { p.add(i).read_unaligned() };
                }
            }
            Lanes::F32(d) if self.dtype == DType::F32 => {
                let p = self.ptr.cast::<f32>();
                for (x, &i) in d.iter_mut().zip(idx) {
                    // SAFETY: `i < len` by the caller's contract.
                    *x = unsafe { p.add(i).read() };
                }
            }
            other => {
                // SAFETY: every index is in bounds by the caller's contract.
                let get = |j: usize| unsafe { self.get_f64(idx[j]) };
                convert_in!(other, get);
            }
        }
    }

    /// Stores `src` at flat positions `start..start + src.len()` (contiguous).
    ///
    /// # Safety
    /// `start + n <= len` and no one else accesses these elements now.
    #[inline(always)]
    pub unsafe fn scatter_contiguous(&self, start: usize, src: Lanes<'_>) {
        // SAFETY: bounds and exclusivity are the caller's contract.
        unsafe {
            match (self.dtype, src) {
                (DType::F32, Lanes::F32Ref(s)) => {
                    self.f32_slice_mut(start, s.len()).copy_from_slice(s);
                }
                (DType::BF16, Lanes::F32Ref(s)) => {
                    let out =
                        std::slice::from_raw_parts_mut(self.ptr.cast::<u16>().add(start), s.len());
                    super::kernels::round::to_bf16_bits(s, out);
                }
                (_, Lanes::F32Ref(s)) => {
                    for (j, &x) in s.iter().enumerate() {
                        self.set_f64(start + j, f64::from(x));
                    }
                }
                (_, Lanes::F64Ref(s)) => {
                    for (j, &x) in s.iter().enumerate() {
                        self.set_f64(start + j, x);
                    }
                }
                (DType::I64, Lanes::I64Ref(s)) => {
                    let p = self.ptr.cast::<i64>().add(start);
                    for (j, &x) in s.iter().enumerate() {
                        p.add(j).write_unaligned(x);
                    }
                }
                (_, Lanes::I64Ref(s)) => {
                    for (j, &x) in s.iter().enumerate() {
                        self.set_f64(start + j, x as f64);
                    }
                }
                (DType::Bool, Lanes::BoolRef(s)) => {
                    let p = self.ptr.add(start);
                    for (j, &x) in s.iter().enumerate() {
                        p.add(j).write(u8::from(x));
                    }
                }
                (_, Lanes::BoolRef(s)) => {
                    for (j, &x) in s.iter().enumerate() {
                        self.set_f64(start + j, f64::from(u8::from(x)));
                    }
                }
                _ => {}
            }
        }
    }

    /// Copies the buffer's `shape` elements from element `offset` into a host tensor.
    ///
    /// # Safety
    /// `offset + Π shape <= len` and nothing writes them meanwhile.
    pub unsafe fn to_host(&self, offset: usize, shape: &[usize]) -> HostTensor {
        let n: usize = shape.iter().product();
        let size = self.dtype.size_bytes();
        // SAFETY: forwarded from the caller.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.add(offset * size), n * size) };
        HostTensor::from_le_bytes(self.dtype, shape, bytes)
            .unwrap_or_else(|_| HostTensor::zeros(self.dtype, shape))
    }

    /// Copies a host tensor of this buffer's dtype into it from element `offset`.
    ///
    /// # Safety
    /// `offset + t.len() <= len` and nobody else accesses those elements now.
    pub unsafe fn write_host(&self, offset: usize, t: &HostTensor) {
        use crate::tensor::Storage;
        let size = self.dtype.size_bytes();
        // SAFETY: forwarded from the caller. Typed buffers are copied as their bytes (the
        // platform is little-endian, as the checkpoint format assumes); bools become 0/1.
        unsafe {
            let dst = self.ptr.add(offset * size);
            let copy =
                |src: *const u8, bytes: usize| std::ptr::copy_nonoverlapping(src, dst, bytes);
            match t.storage() {
                Storage::F32(v) => copy(v.as_ptr().cast(), v.len() * 4),
                Storage::F64(v) => copy(v.as_ptr().cast(), v.len() * 8),
                Storage::I32(v) => copy(v.as_ptr().cast(), v.len() * 4),
                Storage::I64(v) => copy(v.as_ptr().cast(), v.len() * 8),
                Storage::U8(v) => copy(v.as_ptr(), v.len()),
                Storage::F16(v) => copy(v.as_ptr().cast(), v.len() * 2),
                Storage::BF16(v) => copy(v.as_ptr().cast(), v.len() * 2),
                Storage::Bool(v) => {
                    for (i, &b) in v.iter().enumerate() {
                        dst.add(i).write(u8::from(b));
                    }
                }
            }
        }
    }

    /// Copies `n` elements from element `from` of `src` to element `to` of `self` (same dtype).
    ///
    /// # Safety
    /// Both ranges lie inside their buffers and do not overlap.
    pub unsafe fn copy_from(&self, to: usize, src: &RawBuf, from: usize, n: usize) {
        let size = self.dtype.size_bytes();
        // SAFETY: forwarded from the caller.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.ptr.add(from * size),
                self.ptr.add(to * size),
                n * size,
            )
        };
    }
}

/// The lanes a gather fills or a scatter drains, by register class (the fused engine's
/// registers; `…Ref` for the read-only side).
pub enum Lanes<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    I64(&'a mut [i64]),
    Bool(&'a mut [bool]),
    F32Ref(&'a [f32]),
    F64Ref(&'a [f64]),
    I64Ref(&'a [i64]),
    BoolRef(&'a [bool]),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contiguous bf16 load and store (activations kept in bf16) give what the element
    /// accessors give — a cast to bf16 as the IR defines it — on random bit patterns, NaNs,
    /// infinities, ties and subnormals included, from an odd element offset.
    #[test]
    fn bf16_loads_and_stores_are_the_casts_of_the_ir() {
        let mut xs = super::super::kernels::round::random_bit_patterns(0x9E37_79B9, 997);
        xs.extend([
            f32::NAN,
            f32::INFINITY,
            -0.0,
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            1e-40,
        ]);
        let n = xs.len();
        let (mut fast, mut slow) = (vec![0u16; n + 1], vec![0u16; n + 1]);
        let buf = |v: &mut Vec<u16>| RawBuf {
            ptr: v.as_mut_ptr().cast(),
            dtype: DType::BF16,
            len: v.len(),
        };
        let (f, sl) = (buf(&mut fast), buf(&mut slow));
        // SAFETY: both buffers hold n + 1 elements; nothing else touches them.
        unsafe {
            f.scatter_contiguous(1, Lanes::F32Ref(&xs));
            for (i, &x) in xs.iter().enumerate() {
                sl.set_f64(1 + i, f64::from(x));
            }
        }
        for (i, (a, b)) in fast.iter().zip(&slow).enumerate().skip(1) {
            let nan = |h: u16| half::bf16::from_bits(h).is_nan();
            assert!(
                a == b || (nan(*a) && nan(*b)),
                "{:e}: {a:#x} vs {b:#x}",
                xs[i - 1]
            );
        }
        let mut loaded = vec![0.0f32; n];
        let mut idx = vec![0; n];
        // SAFETY: elements 1..=n of the buffer.
        unsafe {
            f.load(
                &Access::Contiguous { offset: 1 },
                0,
                &mut idx,
                Lanes::F32(&mut loaded),
            )
        };
        for (i, y) in loaded.iter().enumerate() {
            // SAFETY: in bounds.
            let want = unsafe { f.get_f64(1 + i) };
            assert!(
                f64::from(*y) == want || (y.is_nan() && want.is_nan()),
                "{i}: {y} vs {want}"
            );
        }
    }
}
