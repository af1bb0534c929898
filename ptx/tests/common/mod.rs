//! Shared helpers of the integration tests: fixture loading, typed uploads and downloads,
//! argument packing, seeded random data and tolerance checks.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack_ptx::{Device, DevicePtr, EmuError, KernelArgs, LaunchConfig, LaunchStats, Module};

/// Loads `tests/kernels/<name>.ptx` (committed NVRTC output).
pub fn fixture(name: &str) -> Module {
    let path = format!("{}/tests/kernels/{name}.ptx", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Module::load(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The execution error inside `err` (fails the test on any other error).
pub fn exec_error(err: EmuError) -> Box<towerpack_ptx::ExecError> {
    match err {
        EmuError::Exec(e) => e,
        other => panic!("expected an execution error, got {other}"),
    }
}

/// The 1-based line of `tests/kernels/<fixture>.ptx` holding `needle`, the first after the
/// line holding `after`.
pub fn line_of(fixture: &str, needle: &str, after: &str) -> u32 {
    let path = format!("{}/tests/kernels/{fixture}.ptx", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let from = text
        .lines()
        .position(|l| l.contains(after))
        .unwrap_or_else(|| panic!("no `{after}` in {path}"));
    let idx = text
        .lines()
        .skip(from)
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no `{needle}` after `{after}` in {path}"));
    (from + idx + 1) as u32
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn uniform(rng: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// Plain-old-data values that upload as little-endian bytes.
pub trait Pod: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

macro_rules! pod {
    ($($t:ty),*) => {$(
        impl Pod for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
        }
    )*};
}
pod!(f32, f64, i32, u32, i64, u64, u16, u8);

pub fn bytes_of<T: Pod>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    v.iter().for_each(|x| x.put(&mut out));
    out
}

pub fn upload<T: Pod>(dev: &Device, v: &[T]) -> DevicePtr {
    let ptr = dev.alloc(v.len() * T::SIZE).unwrap();
    dev.copy_htod(ptr, &bytes_of(v)).unwrap();
    ptr
}

pub fn zeros<T: Pod>(dev: &Device, n: usize) -> DevicePtr {
    dev.alloc(n * T::SIZE).unwrap()
}

pub fn download<T: Pod>(dev: &Device, ptr: DevicePtr, n: usize) -> Vec<T> {
    let mut b = vec![0u8; n * T::SIZE];
    dev.copy_dtoh(&mut b, ptr).unwrap();
    b.chunks_exact(T::SIZE).map(T::get).collect()
}

/// Kernel arguments built one parameter at a time.
#[derive(Default)]
pub struct Args(Vec<Vec<u8>>);

impl Args {
    pub fn ptr(mut self, p: DevicePtr) -> Self {
        self.0.push(p.0.to_le_bytes().to_vec());
        self
    }
    pub fn val<T: Pod>(mut self, v: T) -> Self {
        let mut b = Vec::new();
        v.put(&mut b);
        self.0.push(b);
        self
    }
    pub fn raw(mut self, b: Vec<u8>) -> Self {
        self.0.push(b);
        self
    }
    pub fn launch(
        &self,
        dev: &Device,
        m: &Module,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
    ) -> Result<LaunchStats, EmuError> {
        let slices: Vec<&[u8]> = self.0.iter().map(|v| v.as_slice()).collect();
        let cfg = LaunchConfig {
            grid,
            block,
            shared_bytes: shared,
        };
        dev.launch(m, kernel, cfg, KernelArgs::PerParam(&slices))
    }
}

/// Asserts |got − want| ≤ abs + rel·|want| elementwise, reporting the worst index.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], abs: f64, rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        let tol = abs + rel * w.abs();
        assert!(
            err <= tol && !g.is_nan(),
            "{what}[{i}]: got {g}, want {w} (err {err:e} > tol {tol:e})"
        );
        if err > worst.1 {
            worst = (i, err);
        }
    }
}

/// Asserts bit-exact equality of f32 results (NaNs compare by being NaN).
pub fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: got {g:e} ({:#x}), want {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// Distance in units in the last place between two finite f32 values.
pub fn ulps(a: f32, b: f32) -> u32 {
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 { i32::MIN.wrapping_sub(i) } else { i }
    };
    key(a).abs_diff(key(b))
}

/// A one-instruction test kernel. Each thread loads operands a, b, c from 8-byte slots (into
/// `%ha..` 16-bit, `%ra..` 32-bit and `%xa..` 64-bit registers, all from the same bits), runs
/// `body`, and stores `%ho`/`%ro`/`%xo` (chosen by `out_bits`) into its 8-byte output slot.
pub fn op_kernel(body: &str, out_bits: u32) -> String {
    let store = match out_bits {
        16 => "st.global.u16 [%rd9], %ho;",
        32 => "st.global.u32 [%rd9], %ro;",
        _ => "st.global.u64 [%rd9], %xo;",
    };
    format!(
        r#".version 8.8
.target sm_80
.address_size 64
.visible .entry op(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 po)
{{
    .reg .pred %p<4>;
    .reg .b16 %ha, %hb, %hc, %ho;
    .reg .b32 %ra, %rb, %rc, %ro, %t<4>;
    .reg .b64 %xa, %xb, %xc, %xo, %rd<10>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u64 %rd4, [po];
    mov.u32 %t1, %tid.x;
    mov.u32 %t2, %ctaid.x;
    mov.u32 %t3, %ntid.x;
    mad.lo.s32 %t0, %t2, %t3, %t1;
    mul.wide.u32 %rd5, %t0, 8;
    add.s64 %rd6, %rd1, %rd5;
    add.s64 %rd7, %rd2, %rd5;
    add.s64 %rd8, %rd3, %rd5;
    add.s64 %rd9, %rd4, %rd5;
    ld.global.u64 %xa, [%rd6];
    ld.global.u64 %xb, [%rd7];
    ld.global.u64 %xc, [%rd8];
    cvt.u32.u64 %ra, %xa;
    cvt.u32.u64 %rb, %xb;
    cvt.u32.u64 %rc, %xc;
    cvt.u16.u64 %ha, %xa;
    cvt.u16.u64 %hb, %xb;
    cvt.u16.u64 %hc, %xc;
    {body}
    {store}
    ret;
}}"#
    )
}

/// Runs `body` (see [`op_kernel`]) once per element of `a`, `b`, `c` (equal lengths).
pub fn run_op(body: &str, out_bits: u32, a: &[u64], b: &[u64], c: &[u64]) -> Vec<u64> {
    let dev = Device::new(0);
    let m = Module::load(&op_kernel(body, out_bits)).unwrap_or_else(|e| panic!("{body}: {e}"));
    let n = a.len();
    // Pad to whole blocks of 64 threads (padding lanes compute on zeros).
    let padded = n.div_ceil(64) * 64;
    let pad = |v: &[u64]| {
        let mut v = v.to_vec();
        v.resize(padded, 0);
        v
    };
    let (pa, pb, pc) = (
        upload(&dev, &pad(a)),
        upload(&dev, &pad(b)),
        upload(&dev, &pad(c)),
    );
    let po = zeros::<u64>(&dev, padded);
    Args::default()
        .ptr(pa)
        .ptr(pb)
        .ptr(pc)
        .ptr(po)
        .launch(&dev, &m, "op", [(padded / 64) as u32, 1, 1], [64, 1, 1], 0)
        .unwrap_or_else(|e| panic!("{body}: {e}"));
    let mut out = download::<u64>(&dev, po, padded);
    out.truncate(n);
    out
}

pub fn f32s(v: &[f32]) -> Vec<u64> {
    v.iter().map(|x| u64::from(x.to_bits())).collect()
}
