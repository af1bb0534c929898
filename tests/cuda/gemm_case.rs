//! The GEMM cases of the TF32 and BF16/FP16 tests: graphs of matrix products and convolutions
//! with random feeds, each GEMM fetched with the same GEMM of its operands' absolute values (the
//! S of the error bounds), and sessions on the CPU and on the test device in a precision.

use crate::cuda_common;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::backend::{Feed, Session};
use towerpack::ir::*;
use towerpack::lower::{LowerOptions, Precision};
use towerpack::tensor::{DType, HostTensor};

/// A graph under construction with random feeds.
pub(crate) struct Case {
    pub(crate) g: Graph,
    pub(crate) feeds: Vec<Feed>,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) batch: usize,
    /// (result, S = the same product of absolute values, K, name) of every GEMM under test.
    pub(crate) gemms: Vec<(Value, Value, usize, String)>,
}

impl Case {
    pub(crate) fn new(seed: u64, batch: usize) -> Case {
        Case {
            g: Graph::new(),
            feeds: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            batch,
            gemms: Vec::new(),
        }
    }

    pub(crate) fn add(&mut self, name: &str, op: Op, ins: &[Value]) -> Value {
        let name = self.g.unique_name(name);
        Value::first(self.g.add_node(&name, op, ins).expect(&name))
    }

    /// An f32 input of `shape` (its dims resolved at the case's batch) fed with values from
    /// `value`.
    fn fed_input(&mut self, shape: Shape, mut value: impl FnMut(&mut ChaCha8Rng) -> f32) -> Value {
        let name = self.g.unique_name("in");
        let dims = shape.resolve(self.batch);
        let op = Op::Input {
            name: name.clone(),
            ty: TensorType::new(DType::F32, shape),
        };
        let id = self.g.add_node(&name, op, &[]).expect("input");
        let n: usize = dims.iter().product();
        let data = (0..n).map(|_| value(&mut self.rng)).collect();
        self.feeds
            .push((id, HostTensor::from_f32(&dims, data).expect("sized")));
        Value::first(id)
    }

    /// A batched f32 input of `dims` with values from `value`.
    pub(crate) fn input_with(
        &mut self,
        dims: &[usize],
        value: impl FnMut(&mut ChaCha8Rng) -> f32,
    ) -> Value {
        self.fed_input(Shape::batched(dims), value)
    }

    /// A batched input of `dims`, uniform in [-2, 2).
    pub(crate) fn input(&mut self, dims: &[usize]) -> Value {
        self.input_with(dims, |r| r.random_range(-2.0f32..2.0))
    }

    /// An input of exactly `dims` (no batch axis), uniform in [-1, 1): a filter the program
    /// cannot fold, so a 16-bit GEMM rounds it itself as it does a variable.
    pub(crate) fn unbatched_input(&mut self, dims: &[usize]) -> Value {
        self.fed_input(Shape::fixed(dims), |r| r.random_range(-1.0f32..1.0))
    }

    /// A constant of `dims`, uniform in [-1, 1).
    pub(crate) fn constant(&mut self, dims: &[usize]) -> Value {
        let n: usize = dims.iter().product();
        let data = (0..n)
            .map(|_| self.rng.random_range(-1.0f32..1.0))
            .collect();
        let value = HostTensor::from_f32(dims, data).expect("sized");
        self.add("w", Op::Constant { value }, &[])
    }

    /// `op` over `ins` and over their absolute values (S), registered with its depth `k`.
    pub(crate) fn gemm(&mut self, what: &str, op: Op, ins: &[Value], k: usize) {
        let y = self.add(what, op.clone(), ins);
        let abs: Vec<Value> = ins
            .iter()
            .map(|&v| self.add("abs", Op::Unary(UnaryOp::Abs), &[v]))
            .collect();
        let s = self.add(&format!("{what}_abs"), op, &abs);
        self.gemms.push((y, s, k, what.to_string()));
    }

    pub(crate) fn step(&self) -> Step {
        let fetches = self.gemms.iter().flat_map(|&(y, s, ..)| [y, s]).collect();
        Step::new(fetches, Vec::new())
    }
}

/// Runs `c` on a device of `sms` SMs in `precision` with convolution windows and without
/// (`CudaOptions::conv_windows`) and asserts the first `count` fetches (all with `None`) are
/// bitwise equal: a window changes where A is read from, never the products or their order.
pub(crate) fn assert_windows_bitwise(
    c: &Case,
    sms: u32,
    precision: Precision,
    count: Option<usize>,
    what: &str,
) {
    let step = c.step();
    let run = |windows: bool| {
        device_session_with(&c.g, sms, precision, windows)
            .run(&step, &c.feeds)
            .expect("device step")
    };
    let (windowed, pipelined) = (run(true), run(false));
    let count = count.unwrap_or(windowed.len());
    assert_bitwise(&windowed, &pipelined, count, what);
}

/// Asserts that fetches `0..count` of two runs (`a`, `b`) are bitwise equal; `what` says which
/// runs, for the message.
pub(crate) fn assert_bitwise(a: &[HostTensor], b: &[HostTensor], count: usize, what: &str) {
    assert!(
        a.len() >= count && b.len() >= count,
        "{what}: fewer than {count} fetches"
    );
    for (i, (x, y)) in a.iter().zip(b).enumerate().take(count) {
        assert!(
            x.to_le_bytes() == y.to_le_bytes(),
            "fetch {i}: {what} differ"
        );
    }
}

pub(crate) fn lowering(precision: Precision) -> LowerOptions {
    LowerOptions {
        precision,
        ..towerpack::backend::cuda::CudaOptions::default().lowering()
    }
}

/// A session on the test device (emulated: reporting `multiprocessors` SMs) in `precision`.
pub(crate) fn device_session(g: &Graph, multiprocessors: u32, precision: Precision) -> CudaSession {
    device_session_with(g, multiprocessors, precision, true)
}

/// [`device_session`] with convolution windows on or off (`CudaOptions::conv_windows`).
pub(crate) fn device_session_with(
    g: &Graph,
    multiprocessors: u32,
    precision: Precision,
    conv_windows: bool,
) -> CudaSession {
    cuda_common::require_nvrtc();
    let options = CudaOptions {
        cache_dir: None,
        lower: lowering(precision),
        conv_windows,
        ..CudaOptions::default()
    };
    match cuda_common::test_device() {
        cuda_common::TestDevice::Emulated => {
            cuda_common::emulated_session(g.clone(), multiprocessors, options)
        }
        cuda_common::TestDevice::Gpu => cuda_common::session(g.clone(), 1, options),
    }
}

/// A CPU session lowering as the device does ([`lowering`]) — except under BF16, where the
/// device stores convolution outputs and the gradients convolutions read as `dy` in bf16
/// (`CudaOptions::half_activations`, `half_gradients`): the CPU kernels take an epilogue's
/// variance only of an f32 output, and `dy` only in f32, so there the CPU takes batch norm's
/// variance in a reduction of its own (the same value up to f32 summation order) and keeps
/// `dy` in f32 (which the device rounds to bf16 where it stores it).
pub(crate) fn cpu_session(g: &Graph, precision: Precision) -> CpuSession {
    let lower = lowering(precision);
    CpuSession::new(
        g.clone(),
        CpuOptions {
            threads: 2,
            lower: LowerOptions {
                epilogue_variances: lower.epilogue_variances && precision != Precision::Bf16,
                half_gradients: false,
                ..lower
            },
            ..CpuOptions::default()
        },
    )
    .expect("cpu session")
}

/// The matrix products both precisions' tests multiply: per batch entry op(A)·op(B) with m, n, k
/// not multiples of any tile (37×29 over 45), all four transposes, batched on both sides and
/// against one shared matrix, and a long K (batch 3); and, rank 2 with no batch axes, aᵀ·b
/// over a batch of 700 (K = the batch).
pub(crate) fn matrix_product_cases() -> (Case, Case) {
    let mut c = Case::new(1, 3);
    let (m, n, k) = (37, 29, 45);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = c.input(&if ta { [k, m] } else { [m, k] });
        let b = c.input(&if tb { [n, k] } else { [k, n] });
        c.gemm(
            &format!("matmul_t{}{}", ta as u8, tb as u8),
            matmul(ta, tb),
            &[a, b],
            k,
        );
    }
    let a = c.input(&[m, k]);
    let shared = c.constant(&[k, n]);
    c.gemm("matmul_shared_b", matmul(false, false), &[a, shared], k);
    // 128-bit loads (extents multiples of 4) and a K long enough to split on a large GPU.
    let a = c.input(&[64, 1200]);
    let b = c.input(&[1200, 48]);
    c.gemm("matmul_long_k", matmul(false, false), &[a, b], 1200);
    // Rank 2 (no batch axes): aᵀ·b over the batch, K = the batch.
    let mut d = Case::new(2, 700);
    let a = d.input(&[24]);
    let b = d.input(&[20]);
    d.gemm("matmul_over_batch", matmul(true, false), &[a, b], 700);
    (c, d)
}

/// The three convolutions (forward, input and filter gradient) both precisions' tests run, of
/// 3×3 stride 1 and 2 (same padding), 1×1, explicit asymmetric padding; channel counts of 4k
/// (128-bit loads) and not (3, 5): 15 GEMMs, batch 2, 11×9 images.
pub(crate) fn convolution_cases() -> Case {
    let (batch, h, w) = (2, 11, 9);
    let mut c = Case::new(3, batch);
    for (kk, stride, padding, ci, co) in [
        (3, 1, Padding::Same, 8, 16),
        (3, 2, Padding::Same, 3, 8),
        (1, 1, Padding::Valid, 16, 12),
        (3, 1, Padding::Explicit([(2, 0), (1, 1)]), 5, 4),
        (1, 2, Padding::Valid, 8, 5),
    ] {
        let attrs = conv_attrs(stride, padding);
        let x = c.input(&[h, w, ci]);
        let filter = c.constant(&[kk, kk, ci, co]);
        let tag = format!("{kk}x{kk}s{stride}_{ci}to{co}");
        c.gemm(
            &format!("conv_{tag}"),
            Op::Conv2d(attrs),
            &[x, filter],
            kk * kk * ci,
        );
        let y = c.add("shape_probe", Op::Conv2d(attrs), &[x, filter]);
        let y_dims = c.g.value_type(y).shape.resolve(batch);
        let dy = c.input(&y_dims[1..]);
        let (oh, ow) = (y_dims[1], y_dims[2]);
        c.gemm(
            &format!("backprop_input_{tag}"),
            Op::Conv2dBackpropInput {
                attrs,
                input_hw: [h, w],
            },
            &[dy, filter],
            kk * kk * co,
        );
        c.gemm(
            &format!("backprop_filter_{tag}"),
            Op::Conv2dBackpropFilter {
                attrs,
                filter_hw: [kk, kk],
            },
            &[x, dy],
            batch * oh * ow,
        );
    }
    assert_eq!(c.gemms.len(), 15);
    assert_eq!(c.gemms.len(), 15);
    c
}

/// The convolutions of ResNet-20's first stage in small: 3×3 stride 1 (same padding), 16 to 16
/// channels over 16×16 images, batch 8 (M = 2,048 pixels): their forward and input-gradient
/// GEMMs take 256-row tiles, whose channels-fast operand the lanes of a warp load with
/// addresses traded (`tp_operand` QUAD, `kernels/gemm_core.cuh`) or through a window
/// (`tp_window`), depending on the SM count. The filter is an input, not a constant, so that
/// 16-bit GEMMs round both operands themselves. 3 GEMMs.
pub(crate) fn wide_convolution_cases() -> Case {
    let (batch, h, w, ch) = (8, 16, 16, 16);
    let mut c = Case::new(5, batch);
    let attrs = conv_attrs(1, Padding::Same);
    let x = c.input(&[h, w, ch]);
    let filter = c.unbatched_input(&[3, 3, ch, ch]);
    c.gemm("conv_16", Op::Conv2d(attrs), &[x, filter], 9 * ch);
    let dy = c.input(&[h, w, ch]);
    c.gemm(
        "backprop_input_16",
        Op::Conv2dBackpropInput {
            attrs,
            input_hw: [h, w],
        },
        &[dy, filter],
        9 * ch,
    );
    c.gemm(
        "backprop_filter_16",
        Op::Conv2dBackpropFilter {
            attrs,
            filter_hw: [3, 3],
        },
        &[x, dy],
        batch * h * w,
    );
    c
}

/// The convolutions of ResNet-20's second stage in small: 3×3 stride 1 (same padding), 32 to 32
/// channels over 16×16 images, batch 4 (M = 1,024 pixels; K = 288, 18 K tiles of 16 channels
/// of one tap): forward and input gradient. Their launches split K on small devices, in chunks
/// that may start in the middle of a tap (K = 288 in two: taps 0–4.5 and 4.5–9), and read A
/// through a window where the tile is whole rows of one image (`tp_window`, each split
/// multiplying its chunk's K tiles). Filters are inputs. 2 GEMMs.
pub(crate) fn split_window_convolution_cases() -> Case {
    let (batch, h, w, ch) = (4, 16, 16, 32);
    let mut c = Case::new(11, batch);
    let attrs = conv_attrs(1, Padding::Same);
    let x = c.input(&[h, w, ch]);
    let filter = c.unbatched_input(&[3, 3, ch, ch]);
    c.gemm("conv_32", Op::Conv2d(attrs), &[x, filter], 9 * ch);
    let dy = c.input(&[h, w, ch]);
    c.gemm(
        "backprop_input_32",
        Op::Conv2dBackpropInput {
            attrs,
            input_hw: [h, w],
        },
        &[dy, filter],
        9 * ch,
    );
    c
}

/// The convolutions of ResNet-20's third stage in small: 3×3 stride 1 (same padding), 64 to 64
/// channels over 8×8 images, batch 8 (M = 512 pixels, K = 576): forward and input gradient.
/// Where the tile chooser's launch spans several images (256 rows) or a part of the channels,
/// the renderer takes a launch whose tiles are one whole image by all 64 channels, to read A
/// through a window (`render/fixed.rs window_launch`). Filters are inputs. 2 GEMMs.
pub(crate) fn whole_image_window_cases() -> Case {
    let (batch, h, w, ch) = (8, 8, 8, 64);
    let mut c = Case::new(13, batch);
    let attrs = conv_attrs(1, Padding::Same);
    let x = c.input(&[h, w, ch]);
    let filter = c.unbatched_input(&[3, 3, ch, ch]);
    c.gemm("conv_64", Op::Conv2d(attrs), &[x, filter], 9 * ch);
    let dy = c.input(&[h, w, ch]);
    c.gemm(
        "backprop_input_64",
        Op::Conv2dBackpropInput {
            attrs,
            input_hw: [h, w],
        },
        &[dy, filter],
        9 * ch,
    );
    c
}

/// Filter gradients that run through windows (`kernels/conv2d_backprop_filter.cu` `TP_FWIN`,
/// tensor cores), batch 3: 3×3 same padding with several 16-channel tiles each way (32 → 48
/// over 8×8, whose 16-pixel K tiles span two output rows); an asymmetric explicit padding over
/// a window of the whole 16×12 image (16 → 16); a 1×1 filter (16 → 32, one tap); a valid 3×3
/// whose window is the whole input (10×10 → 8×8, 16 → 16); stride 2 (32×32 → 16×16, 16 → 16,
/// several windows an image);
/// input channels short of a tile of 16, copied one at a time (3, as ResNet's first layer) and
/// four at a time (8); a 1×1 projection of stride 2 (16×16 → 8×8, 32 → 16). Filters are inputs.
/// 8 GEMMs.
pub(crate) fn filter_window_cases() -> Case {
    let batch = 3;
    let mut c = Case::new(7, batch);
    for (kk, stride, padding, [h, w], ci, co) in [
        (3, 1, Padding::Same, [8, 8], 32, 48),
        (3, 1, Padding::Explicit([(2, 0), (1, 1)]), [16, 12], 16, 16),
        (1, 1, Padding::Valid, [8, 8], 16, 32),
        (3, 1, Padding::Valid, [10, 10], 16, 16),
        (3, 2, Padding::Same, [32, 32], 16, 16),
        (3, 1, Padding::Same, [8, 8], 3, 16),
        (3, 1, Padding::Same, [8, 8], 8, 16),
        (1, 2, Padding::Valid, [16, 16], 32, 16),
    ] {
        let attrs = conv_attrs(stride, padding);
        let x = c.input(&[h, w, ci]);
        let filter = c.unbatched_input(&[kk, kk, ci, co]);
        let y = c.add("shape_probe", Op::Conv2d(attrs), &[x, filter]);
        let y_dims = c.g.value_type(y).shape.resolve(batch);
        let dy = c.input(&y_dims[1..]);
        c.gemm(
            &format!("backprop_filter_{kk}x{kk}s{stride}_{h}x{w}_{ci}to{co}"),
            Op::Conv2dBackpropFilter {
                attrs,
                filter_hw: [kk, kk],
            },
            &[x, dy],
            batch * y_dims[1] * y_dims[2],
        );
    }
    c
}

/// How many of `generated` (rendered GEMM launches) are filter gradients through windows
/// (`TP_FWIN`).
pub(crate) fn filter_window_launches<'a>(generated: impl IntoIterator<Item = &'a str>) -> usize {
    generated
        .into_iter()
        .filter(|g| g.contains("#define TP_FWIN 1"))
        .count()
}

/// How many of `generated` (rendered GEMM launches) have 256-row tiles with 128-bit loads of A
/// through the pipelined stages: the launches whose A stage the lanes of a warp fill with
/// traded addresses.
pub(crate) fn quad_launches<'a>(generated: impl IntoIterator<Item = &'a str>) -> usize {
    generated
        .into_iter()
        .filter(|g| {
            g.contains("#define TP_BM ((int)256)")
                && g.contains("#define TP_VEC_A ((int)4)")
                && !g.contains("#define TP_WINDOW 1")
        })
        .count()
}

/// How many of `generated` (rendered GEMM launches) read A through a shared-memory window
/// (`TP_WINDOW`, `kernels/gemm_core.cuh` tp_window).
pub(crate) fn window_launches<'a>(generated: impl IntoIterator<Item = &'a str>) -> usize {
    generated
        .into_iter()
        .filter(|g| g.contains("#define TP_WINDOW 1"))
        .count()
}

/// How many of `generated` (rendered GEMM launches) read A through a window with K split
/// across blocks (`TP_WINDOW` and `TP_SPLIT_K` above 1: each block multiplies its chunk).
pub(crate) fn split_window_launches<'a>(generated: impl IntoIterator<Item = &'a str>) -> usize {
    generated
        .into_iter()
        .filter(|g| {
            let mut lines = g.lines();
            g.contains("#define TP_WINDOW 1") && !lines.any(|l| l == "#define TP_SPLIT_K 1")
        })
        .count()
}

/// The tile `(TP_BM, TP_BN)` of a rendered GEMM launch.
pub(crate) fn tile_of(generated: &str) -> (usize, usize) {
    let value = |name: &str| -> usize {
        let line = generated
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("no {name} in the launch"));
        line.trim_end_matches(')')
            .rsplit(')')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{line}"))
    };
    (value("TP_BM"), value("TP_BN"))
}

/// A matrix product with the given transposes.
pub(crate) fn matmul(transpose_a: bool, transpose_b: bool) -> Op {
    Op::MatMul {
        transpose_a,
        transpose_b,
    }
}

/// One group, no dilation, square strides.
pub(crate) fn conv_attrs(stride: usize, padding: Padding) -> Conv2dAttrs {
    Conv2dAttrs {
        strides: [stride, stride],
        padding,
        dilations: [1, 1],
        groups: 1,
    }
}
