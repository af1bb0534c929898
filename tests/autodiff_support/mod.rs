//! Finite-difference gradient checks against the reference executor in `f64`.
//!
//! A case builds a small graph on `f32` inputs fed with `f64` values (the reference executor's
//! `Precision::F64` computes every float op in `f64` without rounding), applies the op under
//! test, and uses a random-projection cost `sum_k sum(y_k * r_k)` so every output element
//! matters. The symbolic gradient of each input is compared with central differences:
//!
//!   error = max_j |g_sym[j] - g_fd[j]| / max(1e-6, max_j (|g_sym[j]| + |g_fd[j]|))
//!
//! and must stay below [`TOLERANCE`].

#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use towerpack::autodiff::gradients_of_values;
use towerpack::backend::reference::{Precision, evaluate};
use towerpack::ir::{Graph, NodeId, Op, ReduceOp, Shape, TensorType, Value};
use towerpack::tensor::{DType, HostTensor};

/// The bound on the relative error of every gradient check (in `f64`).
pub const TOLERANCE: f64 = 1e-6;
/// The central-difference step.
pub const STEP: f64 = 1e-5;

/// One gradient-check case: a graph, its feeds, and an RNG for its random values.
pub struct Case {
    pub graph: Graph,
    pub rng: ChaCha8Rng,
    pub seed: u64,
    feeds: Vec<(NodeId, HostTensor)>,
    batch: Option<usize>,
}

impl Case {
    /// A case seeded with `seed`.
    pub fn new(seed: u64) -> Case {
        Case {
            graph: Graph::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            seed,
            feeds: Vec::new(),
            batch: None,
        }
    }

    /// A random size in `lo..=hi`.
    pub fn size(&mut self, lo: usize, hi: usize) -> usize {
        self.rng.random_range(lo..=hi)
    }

    /// True with probability 1/2.
    pub fn coin(&mut self) -> bool {
        self.rng.random_bool(0.5)
    }

    /// `n` uniform values in `[lo, hi)`.
    pub fn uniform(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.rng.random_range(lo..hi)).collect()
    }

    /// `n` values in `[lo, hi)` that differ pairwise by at least `(hi - lo) / (2n)`: a shuffled
    /// grid with jitter, so max/min/relu decisions never flip under a finite-difference step.
    pub fn distinct(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        let cell = (hi - lo) / n as f64;
        let mut v: Vec<f64> = (0..n)
            .map(|i| lo + cell * (i as f64 + 0.25 + 0.5 * self.rng.random::<f64>()))
            .collect();
        for i in (1..n).rev() {
            let j = self.rng.random_range(0..=i);
            v.swap(i, j);
        }
        v
    }

    /// Adds an `f32` input of symbolic shape `shape` fed with `values` of concrete shape `dims`
    /// (a leading `N` binds the batch size to `dims[0]`).
    pub fn input(&mut self, name: &str, shape: Shape, dims: &[usize], values: Vec<f64>) -> Value {
        self.typed_input(name, TensorType::f32(shape), dims, values)
    }

    /// An input of any type (e.g. integer labels).
    pub fn typed_input(
        &mut self,
        name: &str,
        ty: TensorType,
        dims: &[usize],
        values: Vec<f64>,
    ) -> Value {
        if ty.shape.has_batch() {
            self.batch = Some(dims[0]);
        }
        let host_dtype = if ty.dtype.is_float() {
            DType::F64
        } else {
            ty.dtype
        };
        let tensor = HostTensor::from_f64_values(host_dtype, dims, values).expect("feed shape");
        let id = self
            .graph
            .add_node(
                name,
                Op::Input {
                    name: name.into(),
                    ty,
                },
                &[],
            )
            .expect("input");
        self.feeds.push((id, tensor));
        Value::first(id)
    }

    /// An input of shape `dims` (batched when `batched`) with uniform values in `[lo, hi)`.
    pub fn random_input(
        &mut self,
        name: &str,
        dims: &[usize],
        batched: bool,
        lo: f64,
        hi: f64,
    ) -> Value {
        let n = dims.iter().product();
        let values = self.uniform(n, lo, hi);
        let shape = symbolic(dims, batched);
        self.input(name, shape, dims, values)
    }

    /// Adds a node; panics with the IR error (a test bug) when it does not type-check.
    pub fn node(&mut self, name: &str, op: Op, inputs: &[Value]) -> Value {
        let id = self
            .graph
            .add_node(name, op, inputs)
            .unwrap_or_else(|e| panic!("{e}"));
        Value::first(id)
    }

    /// Evaluates `values` in `f64`.
    pub fn eval(&self, values: &[Value]) -> Vec<HostTensor> {
        evaluate(
            &self.graph,
            &HashMap::new(),
            &self.feeds,
            values,
            Precision::F64,
        )
        .unwrap_or_else(|e| panic!("seed {}: {e}", self.seed))
    }

    /// Builds the random-projection cost of `outputs`, its symbolic gradients w.r.t. `wrt` (the
    /// values of inputs added by this case), compares them with central differences and returns
    /// the largest relative error. Panics when it exceeds [`TOLERANCE`] or when a gradient the
    /// differences show to be nonzero is missing.
    pub fn check(&mut self, outputs: &[Value], wrt: &[Value]) -> f64 {
        let cost = self.projection_cost(outputs);
        let grads = gradients_of_values(&mut self.graph, cost, wrt, "gradients")
            .unwrap_or_else(|e| panic!("seed {}: {e}", self.seed));
        let mut worst: f64 = 0.0;
        for (k, (&x, g)) in wrt.iter().zip(&grads).enumerate() {
            let fd = self.finite_differences(cost, x);
            let sym = match g {
                Some(g) => self.eval(&[*g])[0].to_f64_vec(),
                None => vec![0.0; fd.len()],
            };
            let err = relative_error(&sym, &fd);
            let name = self.graph.value_name(x);
            assert!(
                err <= TOLERANCE,
                "seed {}: gradient of input {k} (`{name}`): relative error {err:e}\n sym {sym:?}\n fd  {fd:?}",
                self.seed
            );
            let scale = fd.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            assert!(
                g.is_some() || scale == 0.0,
                "seed {}: no symbolic gradient for `{name}`, finite differences {fd:?}",
                self.seed
            );
            worst = worst.max(err);
        }
        worst
    }

    /// `sum_k reduce_sum(y_k * r_k)` with fresh random `r_k` inputs of each output's shape.
    pub fn projection_cost(&mut self, outputs: &[Value]) -> Value {
        let shapes: Vec<Vec<usize>> = self
            .eval(outputs)
            .iter()
            .map(|t| t.shape().to_vec())
            .collect();
        let mut total: Option<Value> = None;
        for (k, (&y, dims)) in outputs.iter().zip(shapes).enumerate() {
            let ty = self.graph.value_type(y).clone();
            let n = dims.iter().product();
            let r = self.uniform(n, -1.0, 1.0);
            let r = self.typed_input(&format!("projection{k}"), ty.clone(), &dims, r);
            let p = self.node(
                &format!("projected{k}"),
                Op::Binary(towerpack::ir::BinaryOp::Mul),
                &[y, r],
            );
            let s = self.node(
                &format!("projected_sum{k}"),
                Op::Reduce {
                    op: ReduceOp::Sum,
                    axes: (0..ty.rank()).collect(),
                    keep_dims: false,
                },
                &[p],
            );
            let s = if ty.dtype == DType::F32 {
                s
            } else {
                self.node(
                    &format!("projected_cast{k}"),
                    Op::Cast { to: DType::F32 },
                    &[s],
                )
            };
            total = Some(match total {
                None => s,
                Some(t) => self.node(
                    &format!("cost{k}"),
                    Op::Binary(towerpack::ir::BinaryOp::Add),
                    &[t, s],
                ),
            });
        }
        total.expect("at least one output")
    }

    /// Central differences of `cost` with respect to every element of the input `x`.
    pub fn finite_differences(&mut self, cost: Value, x: Value) -> Vec<f64> {
        let slot = self
            .feeds
            .iter()
            .position(|(id, _)| *id == x.node)
            .expect("wrt values must be inputs of the case");
        let original = self.feeds[slot].1.clone();
        let base = original.to_f64_vec();
        let mut out = Vec::with_capacity(base.len());
        for j in 0..base.len() {
            let mut at = |delta: f64| {
                let mut v = base.clone();
                v[j] += delta;
                self.feeds[slot].1 =
                    HostTensor::from_f64_values(DType::F64, original.shape(), v).expect("shape");
                self.eval(&[cost])[0].to_f64_vec()[0]
            };
            let (plus, minus) = (at(STEP), at(-STEP));
            out.push((plus - minus) / (2.0 * STEP));
        }
        self.feeds[slot].1 = original;
        out
    }

    /// The batch size bound by a batched input, if any.
    pub fn batch(&self) -> Option<usize> {
        self.batch
    }
}

/// `[N, dims[1..]]` when batched, else `dims`.
pub fn symbolic(dims: &[usize], batched: bool) -> Shape {
    if batched {
        Shape::batched(&dims[1..])
    } else {
        Shape::fixed(dims)
    }
}

/// `max |a - b| / max(1e-6, max (|a| + |b|))`.
pub fn relative_error(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "gradient sizes differ");
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    let scale = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max(x.abs() + y.abs()));
    diff / scale.max(1e-6)
}

/// Records the worst error of a family of checks and prints it (for the report).
pub struct Worst(pub &'static str, pub f64);

impl Worst {
    pub fn see(&mut self, e: f64) {
        self.1 = self.1.max(e);
    }
}

impl Drop for Worst {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            eprintln!(
                "gradient check `{}`: worst relative error {:e}",
                self.0, self.1
            );
        }
    }
}
