//! A graph of every elementwise op, cast and small fixed-function op over `[N, C]` inputs
//! (`x`, `y` f32, `i`, `j` i32, an i64 counter), each result fetched with its ulp tolerance
//! against the reference executor.

use towerpack::ir::{
    BinaryOp, Graph, Op, Padding, PoolAttrs, PoolKind, ReduceOp, Shape, TensorType, UnaryOp, Value,
};
use towerpack::tensor::DType;

pub const N: usize = 3;
pub const C: usize = 24;

pub struct Case {
    pub graph: Graph,
    pub x: Value,
    pub y: Value,
    pub i: Value,
    pub j: Value,
    pub counter: Value,
    /// Fetched values with the ulp tolerance of each.
    pub fetches: Vec<(String, Value, u32)>,
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

/// A `[N, C]` input of `dtype`.
fn input(g: &mut Graph, name: &str, dtype: DType) -> Value {
    typed_input(g, name, TensorType::new(dtype, Shape::batched(&[C])))
}

fn typed_input(g: &mut Graph, name: &str, ty: TensorType) -> Value {
    Value::first(
        g.add_node(
            name,
            Op::Input {
                name: name.into(),
                ty,
            },
            &[],
        )
        .unwrap_or_else(|e| panic!("{name}: {e}")),
    )
}

pub fn build() -> Case {
    let mut g = Graph::new();
    let (x, y) = (
        input(&mut g, "x", DType::F32),
        input(&mut g, "y", DType::F32),
    );
    let (i, j) = (
        input(&mut g, "i", DType::I32),
        input(&mut g, "j", DType::I32),
    );
    let counter = typed_input(
        &mut g,
        "counter",
        TensorType::new(DType::I64, Shape::fixed(&[])),
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
