//! Activations and gradients stored in bf16 on the CUDA backend
//! (`CudaOptions::half_activations`, `half_gradients`; `lower::half_storage`), on the emulated
//! device (or the GPU: `TOWERPACK_TEST_CUDA=gpu`): the convolutions load their input `x` and
//! their gradients' `dy` from bf16 storage (`kernels/gemm_core.cuh` tp_bf16) — through the
//! pipelined tiles (4 channels a load, or one; with stride phases), the forward and
//! input-gradient windows (`TP_WINDOW`), the filter-gradient windows (`TP_FWIN`) and the SIMT
//! tiles, with and without a prologue computing `x` from the stored value.
//!
//! Each case is `y1 = conv1x1(x, w1)`, `a = relu((y1 − mean(y1))·s + t)` per channel (batch
//! norm's apply: its mean over the batch keeps it out of y1's epilogue), then `y = conv(a, w)`,
//! `grad = 2·dy`, `dw = filter_gradient(a, grad)` and `dx = input_gradient(grad, w)` (all three
//! fetched), under [`Precision::Bf16`]. Its `x` is small integers and `w1` is −1, 0 or 1, so
//! `y1` is an integer below 256 in magnitude: exact in f32 in any summation order and in bf16,
//! so storing it in bf16 changes nothing; its mean is an exact sum divided by the count, the
//! same f32 in every run. `a` is then the same f32 values in every run, and the convolutions
//! round it to bf16 as they multiply it whatever its storage (the kernel that stores it in
//! bf16 rounds it the same way, to nearest even, once). `dy` holds bf16 values, so `grad` is
//! stored in bf16 exactly. So every run must fetch **bitwise** the same `y`, `dw` and `dx` as
//! the run storing everything in f32:
//!
//! - f32 storage, no prologues (the reference);
//! - bf16 storage, no prologues: `y1`, `a` and `grad` stored in bf16 (checked in the program),
//!   the convolutions reading `a` and `grad`;
//! - bf16 storage with prologues: the convolution and its filter gradient read `y1` from bf16
//!   and apply `s`, `t` and the ReLU as they load it.
//!
//! On the paths of `emu_prologues.rs`: a device with tensor cores, with convolution windows and
//! without, and one without (compute capability 7.5: the SIMT tiles), on 4 and 132 emulated
//! SMs. Which launches the convolutions reading bf16 take is printed; the windowed geometry
//! must take both windows from bf16 storage. Geometries: 3×3 stride 1 over 32 channels
//! (windows), 3×3 stride 2 over 16 (pipelined tiles, stride phases), 3 channels (loads of one
//! element), 2 groups, and a 1×1 convolution over 20 channels; every stored value has at
//! least `lower::half_storage::MIN_ELEMENTS` elements (smaller ones stay f32).

use crate::emu_prologues::{Path, device_session, launch_path, session_target};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::backend::{Feed, Session};
use towerpack::ir::*;
use towerpack::lower::{KernelKind, LowerOptions, Precision, Program, lower};
use towerpack::tensor::{DType, HostTensor};

/// One case's geometry: `batch` images of `[h, w, c]`, the second convolution's `k × k` filter
/// to `outs` channels.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    batch: usize,
    h: usize,
    w: usize,
    c: usize,
    outs: usize,
    k: usize,
    stride: usize,
    padding: Padding,
    groups: usize,
}

const GEOMETRIES: [Geometry; 5] = [
    // Forward and filter-gradient windows (stride 1, 16k channels, whole rows of 64k pixels).
    Geometry {
        batch: 4,
        h: 16,
        w: 16,
        c: 32,
        outs: 32,
        k: 3,
        stride: 1,
        padding: Padding::Same,
        groups: 1,
    },
    // Stride 2: the pipelined tiles.
    Geometry {
        batch: 8,
        h: 16,
        w: 16,
        c: 16,
        outs: 32,
        k: 3,
        stride: 2,
        padding: Padding::Same,
        groups: 1,
    },
    // 3 channels: loads of one element.
    Geometry {
        batch: 8,
        h: 32,
        w: 32,
        c: 3,
        outs: 16,
        k: 3,
        stride: 1,
        padding: Padding::Same,
        groups: 1,
    },
    // Two groups.
    Geometry {
        batch: 8,
        h: 12,
        w: 12,
        c: 32,
        outs: 16,
        k: 3,
        stride: 1,
        padding: Padding::Same,
        groups: 2,
    },
    // 1x1 over 20 channels: vectors of 4, K tiles across taps.
    Geometry {
        batch: 8,
        h: 12,
        w: 12,
        c: 20,
        outs: 16,
        k: 1,
        stride: 1,
        padding: Padding::Valid,
        groups: 1,
    },
];

/// A case: its graph, feeds and step (fetching `y`, `dw`).
struct Case {
    g: Graph,
    feeds: Vec<Feed>,
    step: Step,
    geometry: Geometry,
}

fn add(g: &mut Graph, name: &str, op: Op, ins: &[Value]) -> Value {
    let name = g.unique_name(name);
    Value::first(g.add_node(&name, op, ins).expect(&name))
}

/// A fed f32 input of `shape` (batched: its first extent is the batch) holding `data`.
fn fed(
    g: &mut Graph,
    feeds: &mut Vec<Feed>,
    name: &str,
    shape: &[usize],
    batched: bool,
    data: Vec<f32>,
) -> Value {
    let name = g.unique_name(name);
    let dims = if batched {
        Shape::batched(&shape[1..])
    } else {
        Shape::fixed(shape)
    };
    let op = Op::Input {
        name: name.clone(),
        ty: TensorType::f32(dims),
    };
    let id = g.add_node(&name, op, &[]).expect("input");
    feeds.push((id, HostTensor::from_f32(shape, data).expect("sized")));
    Value::first(id)
}

fn case(seed: u64, geometry: Geometry) -> Case {
    let Geometry {
        batch,
        h,
        w,
        c,
        outs,
        k,
        stride,
        padding,
        groups,
    } = geometry;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut g = Graph::new();
    let mut feeds = Vec::new();
    let n = batch * h * w * c;
    let xs = (0..n).map(|_| rng.random_range(-2i32..3) as f32).collect();
    let x = fed(&mut g, &mut feeds, "x", &[batch, h, w, c], true, xs);
    let w1s = (0..c * c)
        .map(|_| rng.random_range(-1i32..2) as f32)
        .collect();
    let w1 = fed(&mut g, &mut feeds, "w1", &[1, 1, c, c], false, w1s);
    let one = Conv2dAttrs {
        strides: [1, 1],
        padding: Padding::Valid,
        dilations: [1, 1],
        groups: 1,
    };
    let y1 = add(&mut g, "y1", Op::Conv2d(one), &[x, w1]);
    // The apply: batch norm's scale and shift per channel, then ReLU.
    let mut constant = |rng: &mut ChaCha8Rng, lo: f32, hi: f32| {
        let data = (0..c).map(|_| rng.random_range(lo..hi)).collect();
        let value = HostTensor::from_f32(&[c], data).expect("sized");
        add(&mut g, "bn", Op::Constant { value }, &[])
    };
    let (s, t) = (constant(&mut rng, 0.05, 0.5), constant(&mut rng, -1.0, 1.0));
    // Centred on its batch mean, as batch norm is: the apply then cannot be y1's epilogue,
    // it is an elementwise kernel or the prologues of the convolutions reading `a`.
    let mean_op = Op::Reduce {
        op: ReduceOp::Mean,
        axes: vec![0, 1, 2],
        keep_dims: false,
    };
    let mean = add(&mut g, "mean", mean_op, &[y1]);
    let centred = add(&mut g, "centred", Op::Binary(BinaryOp::Sub), &[y1, mean]);
    let scaled = add(&mut g, "scaled", Op::Binary(BinaryOp::Mul), &[centred, s]);
    let shifted = add(&mut g, "shifted", Op::Binary(BinaryOp::Add), &[scaled, t]);
    let a = add(&mut g, "a", Op::Unary(UnaryOp::Relu), &[shifted]);
    let attrs = Conv2dAttrs {
        strides: [stride, stride],
        padding,
        dilations: [1, 1],
        groups,
    };
    let ws = (0..k * k * (c / groups) * outs)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let wv = fed(
        &mut g,
        &mut feeds,
        "w",
        &[k, k, c / groups, outs],
        false,
        ws,
    );
    let y = add(&mut g, "y", Op::Conv2d(attrs), &[a, wv]);
    let y_dims = g.value_type(y).shape.resolve(batch);
    // dy's values are bf16 values (their low 16 bits cleared), so its double, the gradient
    // both gradient convolutions read, is stored in bf16 exactly.
    let dys = (0..y_dims.iter().product::<usize>())
        .map(|_| f32::from_bits(rng.random_range(-1.0f32..1.0).to_bits() & 0xffff_0000))
        .collect();
    let dy = fed(&mut g, &mut feeds, "dy", &y_dims, true, dys);
    let two = add(
        &mut g,
        "two",
        Op::Constant {
            value: HostTensor::scalar_f32(2.0),
        },
        &[],
    );
    let grad = add(&mut g, "grad", Op::Binary(BinaryOp::Mul), &[dy, two]);
    let filter_grad = Op::Conv2dBackpropFilter {
        attrs,
        filter_hw: [k, k],
    };
    let dw = add(&mut g, "dw", filter_grad, &[a, grad]);
    let input_grad = Op::Conv2dBackpropInput {
        attrs,
        input_hw: [h, w],
    };
    let dx = add(&mut g, "dx", input_grad, &[grad, wv]);
    Case {
        g,
        feeds,
        step: Step::new(vec![y, dw, dx], Vec::new()),
        geometry,
    }
}

/// A run's storage and prologues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Variant {
    half: bool,
    prologues: bool,
}

const VARIANTS: [Variant; 3] = [
    Variant {
        half: false,
        prologues: false,
    },
    Variant {
        half: true,
        prologues: false,
    },
    Variant {
        half: true,
        prologues: true,
    },
];

fn options(v: Variant, path: Path, cache: &std::path::Path) -> CudaOptions {
    CudaOptions {
        lower: LowerOptions {
            conv_prologues: v.prologues,
            precision: Precision::Bf16,
            ..LowerOptions::default()
        },
        cache_dir: Some(cache.to_path_buf()),
        conv_windows: path.windows(),
        conv_prologues: v.prologues,
        half_activations: v.half,
        ..CudaOptions::default()
    }
}

/// The convolutions of `program` reading an operand (`x`, `dy`) from bf16 storage, and the
/// launches (which operands, core and window) those take on `dev`'s target.
fn bf16_reads(program: &Program, dev: &CudaSession, path: Path) -> Result<Vec<String>, String> {
    let target = session_target(dev, path.windows());
    let mut launches = Vec::new();
    for (i, k) in program.kernels.iter().enumerate() {
        let operands: &[(usize, &str)] = match k.kind {
            KernelKind::Conv2d(..) => &[(0, "x")],
            KernelKind::Conv2dBackpropFilter(..) => &[(0, "x"), (1, "dy")],
            KernelKind::Conv2dBackpropInput(..) => &[(0, "dy")],
            _ => continue,
        };
        let half: Vec<&str> = operands
            .iter()
            .filter(|(slot, _)| program.buffer(k.inputs[*slot].buffer).dtype == DType::BF16)
            .map(|(_, name)| *name)
            .collect();
        if half.is_empty() {
            continue;
        }
        let Some((core, window)) = launch_path(program, i, &target)? else {
            continue;
        };
        let prologue = if k.kind.prologue().is_some() {
            ", prologue"
        } else {
            ""
        };
        launches.push(format!(
            "{} {} ({core}, {window}{prologue})",
            k.kind.name(),
            half.join("+")
        ));
    }
    Ok(launches)
}

#[test]
fn convolutions_reading_bf16_storage_fetch_bitwise_what_f32_storage_fetches() {
    let cache = tempfile::tempdir().expect("cache dir");
    let mut failures = Vec::new();
    let mut launches: BTreeMap<String, usize> = BTreeMap::new();
    let mut runs = 0;
    for (i, &geometry) in GEOMETRIES.iter().enumerate() {
        let c = case(7 + i as u64, geometry);
        for path in Path::of(Precision::Bf16) {
            for sms in [4, 132] {
                let what = format!("case {i} {geometry:?} {path:?} {sms} SMs");
                let mut reference: Option<Vec<HostTensor>> = None;
                for v in VARIANTS {
                    let what = format!("{what} {v:?}");
                    let opts = options(v, path, cache.path());
                    let program = match lower(&c.g, &c.step, c.geometry.batch, &opts.lowering()) {
                        Ok(p) => p,
                        Err(e) => {
                            failures.push(format!("{what}: lower: {e}"));
                            continue;
                        }
                    };
                    let mut dev = device_session(&c.g, sms, path, opts);
                    match bf16_reads(&program, &dev, path) {
                        Ok(reads) => {
                            // The second convolution reads `a` (or `y1` through its
                            // prologue) in bf16, its filter gradient that and `grad`, the
                            // input gradient `grad`; the first convolution reads fed x.
                            let want = [
                                "conv2d x ",
                                "conv2d_backprop_filter x+dy ",
                                "conv2d_backprop_input dy ",
                            ];
                            let mut kinds: Vec<&str> = reads
                                .iter()
                                .filter_map(|r| want.iter().find(|w| r.starts_with(**w)).copied())
                                .collect();
                            kinds.sort();
                            if v.half && (kinds != want || reads.len() != 3) {
                                failures.push(format!(
                                    "{what}: convolutions reading bf16 storage: {reads:?}, \
                                     want one each of {want:?}"
                                ));
                            }
                            let prologues = reads.iter().filter(|r| r.ends_with(", prologue)"));
                            if v.prologues && prologues.count() != 2 {
                                failures.push(format!(
                                    "{what}: not 2 convolutions with their prologue: {reads:?}"
                                ));
                            }
                            if !v.half && !reads.is_empty() {
                                failures
                                    .push(format!("{what}: bf16 storage without it: {reads:?}"));
                            }
                            for r in reads {
                                *launches
                                    .entry(format!("case {i} {path:?}: {r}"))
                                    .or_default() += 1;
                            }
                        }
                        Err(e) => failures.push(format!("{what}: {e}")),
                    }
                    runs += 1;
                    let got = match dev.run(&c.step, &c.feeds) {
                        Ok(got) => got,
                        Err(e) => {
                            failures.push(format!("{what}: run: {e}"));
                            continue;
                        }
                    };
                    match &reference {
                        None => reference = Some(got),
                        Some(want) => {
                            for (j, fetch) in ["y", "dw", "dx"].iter().enumerate() {
                                if got[j].to_le_bytes() != want[j].to_le_bytes() {
                                    let differ = got[j]
                                        .to_f64_vec()
                                        .iter()
                                        .zip(want[j].to_f64_vec())
                                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                                        .count();
                                    failures.push(format!(
                                        "{what}: {fetch} not bitwise the f32-storage run's \
                                         ({differ} elements differ)"
                                    ));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for (l, n) in &launches {
        println!("{n:3} × {l}");
    }
    println!("{runs} runs");
    // The windowed geometry takes both windows from bf16 storage on the tensor cores, with
    // prologues and without.
    for window in ["TP_WINDOW", "TP_FWIN"] {
        for prologue in [true, false] {
            let taken = launches.keys().any(|l| {
                l.starts_with("case 0 Windows")
                    && l.contains(window)
                    && l.ends_with(", prologue)") == prologue
            });
            if !taken {
                failures.push(format!(
                    "case 0 never took {window} from bf16 storage {} a prologue",
                    if prologue { "with" } else { "without" }
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
