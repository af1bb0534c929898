//! The chunk engine's register file: per thread, one register of `CHUNK` lanes per value of
//! each class, every register on a cache line, the first `f32` ones holding the identities of
//! an affine chain's steps.

use super::CHUNK;

/// The first `f32` registers of every file hold the identities of an affine chain's steps:
/// `0` (of `x − a`), `1` (of `x·b`) and `−0` (of `x + d`: `−0 + −0` is `−0`).
pub(super) const IDENTITIES: [f32; 3] = [0.0, 1.0, -0.0];

/// A register file for one worker: `slot[value]` indexes the lanes of the value's class.
/// Every register starts on a cache line (see [`Lines`]).
#[derive(Default)]
pub(super) struct Regs {
    pub(super) f32: Lines<f32, 16>,
    pub(super) f64: Lines<f64, 8>,
    pub(super) i64: Lines<i64, 8>,
    pub(super) bool: Lines<bool, 64>,
    /// Scratch for element indices of general loads.
    pub(super) idx: Vec<usize>,
}

impl Regs {
    /// Grows the file to hold `counts` registers of each class (never shrinks).
    pub(super) fn ensure(&mut self, counts: &[usize; 4]) {
        self.f32.grow_to((IDENTITIES.len() + counts[0]) * CHUNK);
        for (i, &x) in IDENTITIES.iter().enumerate() {
            self.f32[i * CHUNK..(i + 1) * CHUNK].fill(x);
        }
        self.f64.grow_to(counts[1] * CHUNK);
        self.i64.grow_to(counts[2] * CHUNK);
        self.bool.grow_to(counts[3] * CHUNK);
        self.idx.resize(CHUNK, 0);
    }
}

/// One 64-byte cache line of `N` lanes.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line<T, const N: usize>([T; N]);

// Each register class fills its lines exactly (no padding between lanes).
const _: () = assert!(
    size_of::<Line<f32, 16>>() == 16 * 4
        && size_of::<Line<f64, 8>>() == 8 * 8
        && size_of::<Line<i64, 8>>() == 8 * 8
        && size_of::<Line<bool, 64>>() == 64
);

/// Lanes stored in whole cache lines, used as one slice: a register at a multiple of `CHUNK`
/// lanes starts on a line, so a 64-byte vector access never straddles two. (A `Vec<f32>` is
/// only 16-byte aligned: with AVX-512 every access of every instruction straddled two lines,
/// and the engine ran ~2× slower per instruction on ResNet-20's expressions.)
pub(super) struct Lines<T, const N: usize>(Vec<Line<T, N>>);

impl<T, const N: usize> Default for Lines<T, N> {
    fn default() -> Self {
        Lines(Vec::new())
    }
}

impl<T: Copy + Default, const N: usize> Lines<T, N> {
    /// Grows to at least `len` lanes (never shrinks).
    fn grow_to(&mut self, len: usize) {
        let lines = len.div_ceil(N);
        if lines > self.0.len() {
            self.0.resize(lines, Line([T::default(); N]));
        }
    }
}

impl<T, const N: usize> std::ops::Deref for Lines<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `Line` is `repr(C)` around `[T; N]`, and its size is a multiple of its
        // alignment, so the lines are `len · N` contiguous `T`s.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * N) }
    }
}

impl<T, const N: usize> std::ops::DerefMut for Lines<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and the borrow is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), self.0.len() * N) }
    }
}

thread_local! {
    /// Each thread keeps one register file, reused by every kernel it runs (no allocation per
    /// run; kernels never nest on one thread).
    pub(super) static REGISTERS: std::cell::RefCell<Regs> = std::cell::RefCell::new(Regs::default());
}
