//! Random well-typed graphs built through the `Graph` API, for the round-trip property and the
//! fuzzer's seeds. A graph is a list of steps `(kind, seed)`: each step adds one op of that
//! kind (with fresh inputs or existing values, random attributes, sometimes a device) and may add
//! a value to a collection. Every op kind, multi-output moments, shared variables, groups with
//! control edges and devices are reachable.

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::ir::{
    BinaryOp, Conv2dAttrs, Dim, Distribution, FanMode, Graph, Initializer, NodeId, Op, Padding,
    PoolAttrs, PoolKind, Shape, TensorType, Value, VarFlags, VarId, VariableDef, infer_types,
    window_output,
};
use towerpack::tensor::{DType, HostTensor, Storage};

/// Number of step kinds (one per op family).
pub const KINDS: u8 = 32;

pub(crate) const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
pub(crate) const INTS: [DType; 3] = [DType::I32, DType::I64, DType::U8];
const SCOPES: [&str; 6] = [
    "tower0",
    "tower1/conv0",
    "a.b-c/_d",
    "x",
    "tower0/bn.1",
    "Z-9",
];
const INPUT_NAMES: [&str; 6] = [
    "image",
    "label",
    "",
    "quote\"back\\slash",
    "new\nline\tab",
    "ünï €",
];
const COLLECTIONS: [&str; 5] = ["losses", "update_ops", "summaries", "with space", "q\"uote"];

/// Builds the graph of `steps`.
pub fn build(steps: &[(u8, u64)]) -> Graph {
    let mut b = Builder {
        g: Graph::new(),
        rng: ChaCha8Rng::seed_from_u64(0),
        values: Vec::new(),
    };
    for &(kind, seed) in steps {
        b.rng = ChaCha8Rng::seed_from_u64(seed);
        b.step(kind % KINDS);
        if !b.values.is_empty() && b.rng.random_bool(0.2) {
            let name = *COLLECTIONS.choose(&mut b.rng).expect("non-empty");
            let v = *b.values.choose(&mut b.rng).expect("non-empty");
            b.g.add_to_collection(name, v);
        }
    }
    b.g
}

/// True when no dimension is 0 (slices, pools and convolutions need elements).
fn non_empty(t: &TensorType) -> bool {
    t.shape.dims().iter().all(|d| *d != Dim::Fixed(0))
}

pub(crate) struct Builder {
    pub(crate) g: Graph,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) values: Vec<Value>,
}

impl Builder {
    pub(crate) fn name(&mut self, base: &str) -> String {
        let scope = SCOPES.choose(&mut self.rng).expect("non-empty");
        self.g.unique_name(&format!("{scope}/{base}"))
    }

    /// Adds a node (sometimes on a device); the generator only builds valid ops.
    pub(crate) fn add(&mut self, base: &str, op: Op, inputs: &[Value]) -> NodeId {
        let name = self.name(base);
        let device = self
            .rng
            .random_bool(0.3)
            .then(|| self.rng.random_range(0..3u16));
        let kind = op.kind_name();
        let id = self
            .g
            .add_node_on(&name, op, inputs, device)
            .unwrap_or_else(|e| panic!("generator built an invalid {kind}: {e}"));
        let outputs = self.g.node(id).outputs.len();
        self.values
            .extend((0..outputs).map(|p| Value::new(id, p as u16)));
        id
    }

    pub(crate) fn dims(&mut self, rank: usize, lo: usize) -> Vec<usize> {
        (0..rank).map(|_| self.rng.random_range(lo..=4)).collect()
    }

    pub(crate) fn shape(&mut self) -> Shape {
        let rank = self.rng.random_range(0..=4);
        let dims = self.dims(rank, 1);
        if rank > 0 && self.rng.random_bool(0.5) {
            Shape::batched(&dims[1..])
        } else {
            Shape::fixed(&dims)
        }
    }

    pub(crate) fn input(&mut self, ty: TensorType) -> Value {
        let name = INPUT_NAMES
            .choose(&mut self.rng)
            .expect("non-empty")
            .to_string();
        Value::first(self.add("input", Op::Input { name, ty }, &[]))
    }

    /// An existing value whose type passes `ok`, or a fresh input of type `make`.
    pub(crate) fn value(&mut self, ok: impl Fn(&TensorType) -> bool, make: TensorType) -> Value {
        let fits: Vec<Value> = self
            .values
            .iter()
            .copied()
            .filter(|v| ok(self.g.value_type(*v)))
            .collect();
        match fits.choose(&mut self.rng) {
            Some(&v) if self.rng.random_bool(0.7) => v,
            _ => self.input(make),
        }
    }

    pub(crate) fn float_value(&mut self, min_rank: usize) -> Value {
        let dtype = *FLOATS.choose(&mut self.rng).expect("non-empty");
        let rank = self.rng.random_range(min_rank.max(1)..=4);
        let dims = self.dims(rank, 1);
        let make = TensorType::new(dtype, Shape::batched(&dims[1..]));
        self.value(
            |t| t.dtype.is_float() && t.rank() >= min_rank && non_empty(t),
            make,
        )
    }

    pub(crate) fn ty(&self, v: Value) -> TensorType {
        self.g.value_type(v).clone()
    }

    pub(crate) fn element(&mut self, dtype: DType) -> f64 {
        const SPECIAL: [f64; 10] = [
            0.0,
            -0.0,
            1.0,
            -1.5,
            0.1,
            1e-300,
            5e-324,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        match dtype {
            DType::Bool => f64::from(u8::from(self.rng.random_bool(0.5))),
            DType::U8 => f64::from(self.rng.random::<u8>()),
            DType::I32 => f64::from(self.rng.random::<i32>()),
            DType::I64 => self.rng.random_range(-1e15..1e15f64).trunc(),
            _ if self.rng.random_bool(0.3) => *SPECIAL.choose(&mut self.rng).expect("non-empty"),
            _ => self.rng.random_range(-1e3..1e3),
        }
    }

    /// A random tensor; floats include random bit patterns (NaN payloads, subnormals).
    pub(crate) fn tensor(&mut self, dtype: DType, dims: &[usize]) -> HostTensor {
        let n: usize = dims.iter().product();
        let values: Vec<f64> = (0..n).map(|_| self.element(dtype)).collect();
        let mut t = HostTensor::from_f64_values(dtype, dims, values).expect("count matches");
        if self.rng.random_bool(0.3) {
            let rng = &mut self.rng;
            match t.storage_mut() {
                Storage::F32(v) => v.iter_mut().for_each(|x| *x = f32::from_bits(rng.random())),
                Storage::F64(v) => v.iter_mut().for_each(|x| *x = f64::from_bits(rng.random())),
                Storage::F16(v) => v
                    .iter_mut()
                    .for_each(|x| *x = half::f16::from_bits(rng.random())),
                Storage::BF16(v) => v
                    .iter_mut()
                    .for_each(|x| *x = half::bf16::from_bits(rng.random())),
                Storage::I64(v) => v.iter_mut().for_each(|x| *x = rng.random()),
                _ => {}
            }
        }
        t
    }

    pub(crate) fn initializer(&mut self, ty: &TensorType) -> Initializer {
        let f = |r: &mut ChaCha8Rng| r.random_range(-2.0..2.0f64);
        match self.rng.random_range(0..8) {
            0 => Initializer::Zeros,
            1 => Initializer::Ones,
            2 => Initializer::Constant(self.element(DType::F64)),
            3 => Initializer::Uniform {
                low: f(&mut self.rng),
                high: f(&mut self.rng),
            },
            4 => Initializer::Normal {
                mean: f(&mut self.rng),
                stddev: f(&mut self.rng),
            },
            5 => Initializer::TruncatedNormal {
                mean: f(&mut self.rng),
                stddev: 1e-7,
            },
            6 => Initializer::VarianceScaling {
                scale: f(&mut self.rng),
                mode: *[FanMode::FanIn, FanMode::FanOut, FanMode::FanAvg]
                    .choose(&mut self.rng)
                    .expect("non-empty"),
                distribution: *[
                    Distribution::Normal,
                    Distribution::TruncatedNormal,
                    Distribution::Uniform,
                ]
                .choose(&mut self.rng)
                .expect("non-empty"),
            },
            _ => {
                let dims = ty.shape.to_static().expect("variables are static");
                Initializer::Value(self.tensor(ty.dtype, &dims))
            }
        }
    }

    /// A variable of type `ty` (an existing one when the type matches: shared variables).
    pub(crate) fn variable(&mut self, ty: TensorType) -> VarId {
        let existing: Vec<VarId> = self
            .g
            .variable_ids()
            .filter(|(_, d)| d.ty == ty)
            .map(|(id, _)| id)
            .collect();
        if let Some(&id) = existing
            .choose(&mut self.rng)
            .filter(|_| self.rng.random_bool(0.5))
        {
            return id;
        }
        let scope = SCOPES.choose(&mut self.rng).expect("non-empty");
        let name = format!("{scope}/W{}", self.g.variables().len());
        let flags = VarFlags {
            trainable: self.rng.random(),
            model: self.rng.random(),
            local: self.rng.random(),
        };
        let init = self.initializer(&ty);
        self.g
            .declare_variable(VariableDef {
                name,
                ty,
                init,
                flags,
            })
            .expect("fresh variable")
    }

    pub(crate) fn read(&mut self, ty: TensorType) -> Value {
        let var = self.variable(ty);
        Value::first(self.add("read", Op::Variable { var }, &[]))
    }

    pub(crate) fn padding(&mut self) -> Padding {
        match self.rng.random_range(0..3) {
            0 => Padding::Same,
            1 => Padding::Valid,
            _ => {
                let mut p = || (self.rng.random_range(0..3), self.rng.random_range(0..3));
                Padding::Explicit([p(), p()])
            }
        }
    }

    /// `[N or 2, H, W, C]` with H, W in 3..=6.
    pub(crate) fn image(&mut self) -> Value {
        let dtype = *FLOATS.choose(&mut self.rng).expect("non-empty");
        let hwc = [
            self.rng.random_range(3..=6),
            self.rng.random_range(3..=6),
            self.rng.random_range(1..=4),
        ];
        let make = TensorType::new(dtype, Shape::batched(&hwc));
        self.value(
            |t| {
                t.dtype.is_float()
                    && t.rank() == 4
                    && t.shape.dims()[1..]
                        .iter()
                        .all(|d| d.fixed().is_some_and(|n| n > 0))
            },
            make,
        )
    }

    pub(crate) fn hwc(&self, x: Value) -> [usize; 3] {
        let d = self.g.value_type(x).shape.dims().to_vec();
        [1, 2, 3].map(|i| d[i].fixed().expect("checked by image()"))
    }

    /// Conv attributes and a filter type that fit `x`, with a valid output.
    pub(crate) fn conv_setup(&mut self, x: Value) -> (Conv2dAttrs, TensorType) {
        let [h, w, c] = self.hwc(x);
        let groups = *(1..=c)
            .filter(|g| c % g == 0)
            .collect::<Vec<_>>()
            .choose(&mut self.rng)
            .expect("1 divides");
        let mut attrs = Conv2dAttrs {
            strides: [self.rng.random_range(1..=2), self.rng.random_range(1..=2)],
            padding: self.padding(),
            dilations: [self.rng.random_range(1..=2), self.rng.random_range(1..=2)],
            groups,
        };
        let k = [self.rng.random_range(1..=3), self.rng.random_range(1..=3)];
        let fits = |a: &Conv2dAttrs| {
            window_output(h, k[0], a.strides[0], a.dilations[0], a.padding, 0).is_ok()
                && window_output(w, k[1], a.strides[1], a.dilations[1], a.padding, 1).is_ok()
        };
        if !fits(&attrs) {
            attrs.padding = Padding::Same;
        }
        let out = groups * self.rng.random_range(1..=2);
        (
            attrs,
            TensorType::new(
                self.g.value_type(x).dtype,
                Shape::fixed(&[k[0], k[1], c / groups, out]),
            ),
        )
    }

    pub(crate) fn pool_setup(&mut self, x: Value) -> PoolAttrs {
        let [h, w, _] = self.hwc(x);
        let mut attrs = PoolAttrs {
            kind: if self.rng.random() {
                PoolKind::Max
            } else {
                PoolKind::Avg
            },
            window: [self.rng.random_range(1..=3), self.rng.random_range(1..=3)],
            strides: [self.rng.random_range(1..=2), self.rng.random_range(1..=2)],
            padding: self.padding(),
        };
        let fits = |a: &PoolAttrs| {
            window_output(h, a.window[0], a.strides[0], 1, a.padding, 0).is_ok()
                && window_output(w, a.window[1], a.strides[1], 1, a.padding, 1).is_ok()
        };
        if !fits(&attrs) {
            attrs.padding = Padding::Same;
        }
        attrs
    }

    pub(crate) fn infer(&self, op: &Op, inputs: &[&TensorType]) -> TensorType {
        infer_types(op, inputs, self.g.variables()).expect("valid setup")[0].clone()
    }

    pub(crate) fn axes(&mut self, rank: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..rank).collect();
        all.shuffle(&mut self.rng);
        let n = self.rng.random_range(0..=rank);
        all.truncate(n);
        all
    }

    pub(crate) fn bool_like(&mut self, x: Value) -> Value {
        let ty = self.ty(x);
        if ty.dtype == DType::Bool {
            return x;
        }
        Value::first(self.add("cmp", Op::Binary(BinaryOp::Lt), &[x, x]))
    }

    /// A fresh input that broadcasts against `ty`: a suffix of its shape with some 1s.
    pub(crate) fn companion(&mut self, ty: &TensorType) -> Value {
        let keep = self.rng.random_range(0..=ty.rank());
        let dims: Vec<Dim> = ty.shape.dims()[ty.rank() - keep..]
            .iter()
            .map(|&d| {
                if self.rng.random_bool(0.3) {
                    Dim::Fixed(1)
                } else {
                    d
                }
            })
            .collect();
        self.input(TensorType::new(ty.dtype, Shape::from_dims(dims)))
    }
}
