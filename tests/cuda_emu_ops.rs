//! The generated CUDA C follows the IR's scalar semantics op by op: every unary and binary op,
//! casts between every dtype, selects, counter-based random numbers, and the layout and
//! fixed-function ops around them run on the emulated device and agree with the reference
//! executor on inputs full of edge cases (NaN, infinities, signed zeros, huge and tiny values).
//! Exactly rounded ops must match bit for bit; transcendental functions within 4 ulp.

mod cuda_common;

use rand::{Rng, SeedableRng};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{Session, Step};
use towerpack::ir::{
    BinaryOp, Graph, Op, Padding, PoolAttrs, PoolKind, ReduceOp, Shape, TensorType, UnaryOp, Value,
};
use towerpack::tensor::{DType, HostTensor};

const N: usize = 3;
const C: usize = 24;

struct Case {
    graph: Graph,
    x: Value,
    y: Value,
    i: Value,
    j: Value,
    counter: Value,
    /// Fetched values with the ulp tolerance of each.
    fetches: Vec<(String, Value, u32)>,
}

impl Case {
    fn add(&mut self, name: &str, op: Op, ins: &[Value]) -> Value {
        Value::first(
            self.graph
                .add_node(name, op, ins)
                .unwrap_or_else(|e| panic!("{name}: {e}")),
        )
    }

    fn fetch(&mut self, name: &str, op: Op, ins: &[Value], ulps: u32) {
        let v = self.add(name, op, ins);
        self.fetches.push((name.to_string(), v, ulps));
    }
}

fn input(g: &mut Graph, name: &str, dtype: DType) -> Value {
    let ty = TensorType::new(dtype, Shape::batched(&[C]));
    Value::first(
        g.add_node(
            name,
            Op::Input {
                name: name.into(),
                ty,
            },
            &[],
        )
        .expect("input"),
    )
}

fn build() -> Case {
    let mut g = Graph::new();
    let (x, y) = (
        input(&mut g, "x", DType::F32),
        input(&mut g, "y", DType::F32),
    );
    let (i, j) = (
        input(&mut g, "i", DType::I32),
        input(&mut g, "j", DType::I32),
    );
    let counter = Value::first(
        g.add_node(
            "counter",
            Op::Input {
                name: "counter".into(),
                ty: TensorType::new(DType::I64, Shape::fixed(&[])),
            },
            &[],
        )
        .expect("counter"),
    );
    let mut c = Case {
        graph: g,
        x,
        y,
        i,
        j,
        counter,
        fetches: Vec::new(),
    };
    for op in UnaryOp::ALL {
        if op == UnaryOp::Not {
            continue;
        }
        let transcendental = matches!(
            op,
            UnaryOp::Exp | UnaryOp::Log | UnaryOp::Sigmoid | UnaryOp::Tanh | UnaryOp::Rsqrt
        );
        c.fetch(
            &format!("f32_{}", op.name()),
            Op::Unary(op),
            &[x],
            if transcendental { 4 } else { 0 },
        );
    }
    for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sign] {
        c.fetch(&format!("i32_{}", op.name()), Op::Unary(op), &[i], 0);
    }
    for op in BinaryOp::ALL {
        if matches!(op, BinaryOp::And | BinaryOp::Or) {
            continue;
        }
        let ulps = if op == BinaryOp::Pow { 4 } else { 0 };
        c.fetch(&format!("f32_{}", op.name()), Op::Binary(op), &[x, y], ulps);
        if op != BinaryOp::Pow {
            c.fetch(&format!("i32_{}", op.name()), Op::Binary(op), &[i, j], 0);
        }
    }
    let gt = c.add("gt", Op::Binary(BinaryOp::Gt), &[x, y]);
    let lt = c.add("lt", Op::Binary(BinaryOp::Lt), &[i, j]);
    c.fetch("and", Op::Binary(BinaryOp::And), &[gt, lt], 0);
    c.fetch("or", Op::Binary(BinaryOp::Or), &[gt, lt], 0);
    c.fetch("not", Op::Unary(UnaryOp::Not), &[gt], 0);
    c.fetch("select", Op::Select, &[gt, x, y], 0);
    for to in DType::ALL {
        c.fetch(&format!("cast_f32_{to}"), Op::Cast { to }, &[x], 0);
        c.fetch(&format!("cast_i32_{to}"), Op::Cast { to }, &[i], 0);
        let there = c.add(&format!("there_{to}"), Op::Cast { to }, &[y]);
        c.fetch(
            &format!("back_{to}_f32"),
            Op::Cast { to: DType::F32 },
            &[there],
            0,
        );
    }
    // f16 arithmetic rounds after every op.
    let h = c.add("half_x", Op::Cast { to: DType::F16 }, &[x]);
    let hy = c.add("half_y", Op::Cast { to: DType::F16 }, &[y]);
    c.fetch("f16_mul", Op::Binary(BinaryOp::Mul), &[h, hy], 0);
    c.fetch("f16_exp", Op::Unary(UnaryOp::Exp), &[h], 1);
    c.fetch("random", Op::RandomUniform { seed: 99 }, &[x, counter], 0);
    c.fetch("transpose", Op::Transpose { perm: vec![0, 1] }, &[x], 0);
    c.fetch(
        "slice",
        Op::Slice {
            axis: 1,
            start: 3,
            end: 17,
        },
        &[x],
        0,
    );
    c.fetch("concat", Op::Concat { axis: 1 }, &[x, y, x], 0);
    c.fetch(
        "pad",
        Op::Pad {
            pads: vec![(0, 0), (2, 3)],
        },
        &[i],
        0,
    );
    c.fetch("argmax", Op::ArgMax { axis: 1 }, &[x], 0);
    for (name, op) in [
        ("max", ReduceOp::Max),
        ("min", ReduceOp::Min),
        ("sum", ReduceOp::Sum),
    ] {
        let axes = vec![1];
        c.fetch(
            &format!("reduce_{name}"),
            Op::Reduce {
                op,
                axes,
                keep_dims: false,
            },
            &[y],
            8,
        );
    }
    c.fetch(
        "reduce_i32",
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0, 1],
            keep_dims: false,
        },
        &[i],
        0,
    );
    let logits = c.add("finite", Op::Unary(UnaryOp::Tanh), &[y]);
    c.fetch("softmax", Op::Softmax { axis: 1 }, &[logits], 8);
    c.fetch("log_softmax", Op::LogSoftmax { axis: 1 }, &[logits], 8);
    let targets = c.add("targets", Op::ArgMax { axis: 1 }, &[y]);
    c.fetch("in_top_k", Op::InTopK { k: 3 }, &[x, targets], 0);
    let image = c.add(
        "image",
        Op::Reshape {
            shape: Shape::batched(&[4, 3, 2]),
        },
        &[x],
    );
    let pool = |kind| PoolAttrs {
        kind,
        window: [2, 2],
        strides: [1, 1],
        padding: Padding::Same,
    };
    c.fetch("max_pool", Op::Pool(pool(PoolKind::Max)), &[image], 0);
    // The reference averages in f64, the kernels sum in f32 then scale: a few ulp apart.
    c.fetch("avg_pool", Op::Pool(pool(PoolKind::Avg)), &[image], 4);
    c
}

/// Edge cases first, then random values of every magnitude.
fn floats(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -2.5,
        1e-30,
        -1e30,
        3e9,
        -3e9,
        300.7,
        -0.99,
        f32::MIN_POSITIVE,
    ];
    (0..n)
        .map(|k| {
            if k < special.len() {
                special[k]
            } else {
                let m: f32 = rng.random_range(-3.0..3.0);
                m * 10f32.powi(rng.random_range(-3..4))
            }
        })
        .collect()
}

fn ints(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<i32> {
    let special = [
        0,
        1,
        -1,
        7,
        -7,
        i32::MAX,
        i32::MIN,
        46341,
        -46341,
        300,
        -300,
        2,
    ];
    (0..n)
        .map(|k| {
            special
                .get(k)
                .copied()
                .unwrap_or_else(|| rng.random_range(-50..50))
        })
        .collect()
}

fn ulp_key(x: f32) -> i64 {
    let b = x.to_bits() as i32;
    i64::from(if b < 0 { i32::MIN.wrapping_sub(b) } else { b })
}

fn agree(got: &HostTensor, want: &HostTensor, ulps: u32) -> Result<(), String> {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Err(format!(
            "{}{:?} vs {}{:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        ));
    }
    for (k, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
        let close = got.dtype() == DType::F32
            && a.is_finite()
            && b.is_finite()
            && (ulp_key(*a as f32) - ulp_key(b as f32)).unsigned_abs() <= u64::from(ulps);
        if !same && !close {
            return Err(format!("element {k}: {a:e} vs reference {b:e}"));
        }
    }
    Ok(())
}

#[test]
fn generated_kernels_follow_the_scalar_semantics_of_every_op() {
    cuda_common::require_nvrtc();
    let c = build();
    let step = Step::new(c.fetches.iter().map(|f| f.1).collect(), Vec::new());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let n = N * C;
    let feeds = vec![
        (
            c.x.node,
            HostTensor::from_f32(&[N, C], floats(&mut rng, n)).expect("x"),
        ),
        (
            c.y.node,
            HostTensor::from_f32(&[N, C], floats(&mut rng, n)).expect("y"),
        ),
        (
            c.i.node,
            HostTensor::from_i32(&[N, C], ints(&mut rng, n)).expect("i"),
        ),
        (
            c.j.node,
            HostTensor::from_i32(&[N, C], ints(&mut rng, n)).expect("j"),
        ),
        (c.counter.node, HostTensor::scalar_i64(12345)),
    ];
    let options = CudaOptions {
        cache_dir: None,
        ..CudaOptions::default()
    };
    let mut emu = CudaSession::emulated(c.graph.clone(), 1, options).expect("emu");
    let mut reference = ReferenceSession::new(c.graph.clone()).expect("reference");
    let got = emu.run(&step, &feeds).expect("emulated step");
    let want = reference.run(&step, &feeds).expect("reference step");
    let failures: Vec<String> = c
        .fetches
        .iter()
        .zip(got.iter().zip(&want))
        .filter_map(|((name, _, ulps), (g, w))| {
            agree(g, w, *ulps).err().map(|e| format!("{name}: {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
