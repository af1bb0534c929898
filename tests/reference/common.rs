//! Helpers shared by the reference-executor tests: graph building, one-op evaluation, random data.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use towerpack::backend::reference::{Precision, evaluate};
use towerpack::backend::{BackendError, Feed};
use towerpack::ir::{Graph, NodeId, Op, Shape, TensorType, Value};
use towerpack::tensor::{DType, HostTensor};

/// A graph under construction with automatic node names.
#[derive(Default)]
pub struct Builder {
    pub g: Graph,
    count: usize,
}

impl Builder {
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Adds a node named `n<i>`.
    pub fn node(&mut self, op: Op, inputs: &[Value]) -> NodeId {
        let name = format!("n{}", self.count);
        self.count += 1;
        self.g
            .add_node(&name, op, inputs)
            .unwrap_or_else(|e| panic!("test graph node {name}: {e}"))
    }

    pub fn op(&mut self, op: Op, inputs: &[Value]) -> Value {
        Value::first(self.node(op, inputs))
    }

    pub fn constant(&mut self, value: HostTensor) -> Value {
        self.op(Op::Constant { value }, &[])
    }

    pub fn input(&mut self, name: &str, dtype: DType, shape: Shape) -> Value {
        let op = Op::Input {
            name: name.into(),
            ty: TensorType::new(dtype, shape),
        };
        Value::first(self.g.add_node(name, op, &[]).expect("input node"))
    }
}

/// Evaluates `values` of `g` (no variables) at precision `p`.
pub fn eval(
    g: &Graph,
    feeds: &[Feed],
    values: &[Value],
    p: Precision,
) -> Result<Vec<HostTensor>, BackendError> {
    evaluate(g, &HashMap::new(), feeds, values, p)
}

/// Applies `op` to constant `inputs` and returns every output, at precision `p`.
pub fn try_run_op(
    op: Op,
    inputs: Vec<HostTensor>,
    p: Precision,
) -> Result<Vec<HostTensor>, BackendError> {
    let mut b = Builder::new();
    let ins: Vec<Value> = inputs.into_iter().map(|t| b.constant(t)).collect();
    let id = b.node(op, &ins);
    let outs: Vec<Value> = (0..b.g.node(id).outputs.len())
        .map(|port| Value::new(id, port as u16))
        .collect();
    eval(&b.g, &[], &outs, p)
}

/// [`try_run_op`] with one output, which must succeed.
pub fn run_op(op: Op, inputs: Vec<HostTensor>, p: Precision) -> HostTensor {
    let mut outs = try_run_op(op.clone(), inputs, p).unwrap_or_else(|e| panic!("{op}: {e}"));
    outs.remove(0)
}

pub fn f32s(shape: &[usize], data: &[f32]) -> HostTensor {
    HostTensor::from_f32(shape, data.to_vec()).expect("element count")
}

pub fn f64s(shape: &[usize], data: &[f64]) -> HostTensor {
    HostTensor::from_f64_values(DType::F64, shape, data.to_vec()).expect("element count")
}

pub fn i64s(shape: &[usize], data: &[i64]) -> HostTensor {
    HostTensor::from_i64(shape, data.to_vec()).expect("element count")
}

pub fn i32s(shape: &[usize], data: &[i32]) -> HostTensor {
    HostTensor::from_i32(shape, data.to_vec()).expect("element count")
}

pub fn bools(shape: &[usize], data: &[bool]) -> HostTensor {
    let t = HostTensor::from_f64_values(
        DType::Bool,
        shape,
        data.iter().map(|&b| f64::from(u8::from(b))).collect(),
    );
    t.expect("element count")
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// A tensor of `dtype` with elements uniform in `[-1, 1)`.
pub fn random(rng: &mut ChaCha8Rng, dtype: DType, shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    let values = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    HostTensor::from_f64_values(dtype, shape, values).expect("element count")
}

/// Asserts `got` matches `want` elementwise within `tol` (absolute, plus relative to `|want|`),
/// treating NaN as equal to NaN.
pub fn assert_close(got: &HostTensor, want: &[f64], tol: f64) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "length of {g:?} vs {want:?}");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * (1.0 + b.abs());
        assert!(ok, "element {i}: got {a}, want {b} (tol {tol}); all: {g:?}");
    }
}

/// The dot product of two tensors' elements, in f64.
pub fn dot(a: &HostTensor, b: &HostTensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| x * y)
        .sum()
}
