//! The step of the random graph builder: one op family per step kind, with inputs that fit
//! (existing values or fresh inputs) and random valid attributes.

use super::random_graph::{Builder, FLOATS, INTS};
use rand::Rng;
use rand::seq::{IndexedRandom, SliceRandom};
use towerpack::ir::{BinaryOp, Dim, NodeId, Op, ReduceOp, Shape, TensorType, UnaryOp, Value};
use towerpack::tensor::DType;

impl Builder {
    /// Adds one op of family `kind` (below `KINDS`).
    pub(crate) fn step(&mut self, kind: u8) {
        let any_ty = |g: &mut Builder| {
            let dtype = *DType::ALL.choose(&mut g.rng).expect("non-empty");
            TensorType::new(dtype, g.shape())
        };
        match kind {
            0 => {
                let ty = any_ty(self);
                self.input(ty);
            }
            1 => {
                let dtype = *DType::ALL.choose(&mut self.rng).expect("non-empty");
                let rank = self.rng.random_range(0..=3);
                let dims = self.dims(rank, 0);
                let value = self.tensor(dtype, &dims);
                self.add("Const", Op::Constant { value }, &[]);
            }
            2 => {
                let dtype = *DType::ALL.choose(&mut self.rng).expect("non-empty");
                let rank = self.rng.random_range(0..=3);
                let dims = self.dims(rank, 1);
                self.read(TensorType::new(dtype, Shape::fixed(&dims)));
            }
            3 => {
                let dtype = *DType::ALL.choose(&mut self.rng).expect("non-empty");
                let rank = self.rng.random_range(0..=2);
                let dims = self.dims(rank, 1);
                let ty = TensorType::new(dtype, Shape::fixed(&dims));
                let var = self.variable(ty.clone());
                let value = if self.rng.random() {
                    Value::first(self.add("read", Op::Variable { var }, &[]))
                } else {
                    let t = self.tensor(dtype, &dims);
                    Value::first(self.add("new_value", Op::Constant { value: t }, &[]))
                };
                let a = self.add("assign", Op::Assign { var }, &[value]);
                if self.rng.random() {
                    self.g.add_to_collection("update_ops", Value::first(a));
                }
            }
            4 => {
                let ids: Vec<NodeId> = self.g.node_ids().collect();
                let n = self.rng.random_range(0..=ids.len().min(4));
                let deps: Vec<NodeId> = ids.choose_multiple(&mut self.rng, n).copied().collect();
                let name = self.name("train_op");
                self.g.add_group(&name, &deps).expect("group");
            }
            5 => {
                let ty = any_ty(self);
                let x = self.value(|_| true, ty);
                self.add("Identity", Op::Identity, &[x]);
            }
            6 => {
                let u = *UnaryOp::ALL.choose(&mut self.rng).expect("non-empty");
                let x = if u == UnaryOp::Not {
                    let x = self.float_value(0);
                    self.bool_like(x)
                } else if u.needs_float() {
                    self.float_value(0)
                } else {
                    let dtype = *INTS.choose(&mut self.rng).expect("non-empty");
                    let shape = self.shape();
                    self.value(|t| t.dtype != DType::Bool, TensorType::new(dtype, shape))
                };
                self.add(u.name(), Op::Unary(u), &[x]);
            }
            7 => {
                let b = *BinaryOp::ALL.choose(&mut self.rng).expect("non-empty");
                let x = self.float_value(0);
                let x = if b.is_logical() { self.bool_like(x) } else { x };
                let ty = self.ty(x);
                let y = if self.rng.random() {
                    x
                } else {
                    self.companion(&ty)
                };
                let ins = if self.rng.random() { [x, y] } else { [y, x] };
                self.add(b.name(), Op::Binary(b), &ins);
            }
            8 => {
                let x = self.float_value(0);
                let ty = self.ty(x);
                let cond = self.bool_like(x);
                let other = self.companion(&ty);
                self.add("Select", Op::Select, &[cond, x, other]);
            }
            9 => {
                let ty = any_ty(self);
                let x = self.value(|_| true, ty);
                let to = *DType::ALL.choose(&mut self.rng).expect("non-empty");
                self.add("Cast", Op::Cast { to }, &[x]);
            }
            10 => {
                let ty = any_ty(self);
                let x = self.value(|_| true, ty);
                let s = self.ty(x).shape;
                let n = s.fixed_product();
                let shape = match (s.has_batch(), self.rng.random::<bool>()) {
                    (true, true) => Shape::batched(&[n]),
                    (true, false) => Shape::batched(&[1, n, 1]),
                    (false, true) => Shape::fixed(&[n]),
                    (false, false) => Shape::fixed(&[n, 1]),
                };
                self.add("Reshape", Op::Reshape { shape }, &[x]);
            }
            11 => {
                let ty = any_ty(self);
                let x = self.value(|_| true, ty);
                let s = self.ty(x).shape;
                let first = usize::from(s.has_batch());
                let mut perm: Vec<usize> = (first..s.rank()).collect();
                perm.shuffle(&mut self.rng);
                let perm: Vec<usize> = (0..first).chain(perm).collect();
                self.add("transpose", Op::Transpose { perm }, &[x]);
            }
            12 => {
                let ty = any_ty(self);
                let x = self.value(|_| true, ty);
                let s = self.ty(x).shape;
                let mut dims: Vec<Dim> = s
                    .dims()
                    .iter()
                    .map(|&d| {
                        if d == Dim::Fixed(1) {
                            Dim::Fixed(self.rng.random_range(1..=3))
                        } else {
                            d
                        }
                    })
                    .collect();
                if !s.has_batch() {
                    dims.insert(0, Dim::Fixed(self.rng.random_range(1..=3)));
                }
                self.add(
                    "Broadcast",
                    Op::Broadcast {
                        shape: Shape::from_dims(dims),
                    },
                    &[x],
                );
            }
            13..=15 => {
                let x = self.float_value(2);
                let s = self.ty(x).shape;
                let axis = self.rng.random_range(1..s.rank());
                let n = s.dim(axis).fixed().expect("only the first dim may be N");
                let op = match kind {
                    13 => {
                        let start = self.rng.random_range(0..n);
                        Op::Slice {
                            axis,
                            start,
                            end: self.rng.random_range(start + 1..=n),
                        }
                    }
                    14 => Op::Concat { axis },
                    _ => Op::Pad {
                        pads: (0..s.rank())
                            .map(|i| {
                                if i == 0 {
                                    (0, 0)
                                } else {
                                    (self.rng.random_range(0..2), self.rng.random_range(0..2))
                                }
                            })
                            .collect(),
                    },
                };
                let copies = if kind == 14 {
                    self.rng.random_range(1..=3)
                } else {
                    1
                };
                self.add(op.kind_name(), op, &vec![x; copies]);
            }
            16 => {
                let op = *ReduceOp::ALL.choose(&mut self.rng).expect("non-empty");
                let x = self.float_value(0);
                let axes = self.axes(self.ty(x).rank());
                let keep_dims = self.rng.random();
                self.add(
                    op.name(),
                    Op::Reduce {
                        op,
                        axes,
                        keep_dims,
                    },
                    &[x],
                );
            }
            17 | 26 | 27 => {
                let x = self.float_value(1);
                let axis = self.rng.random_range(0..self.ty(x).rank());
                let op = match kind {
                    17 => Op::ArgMax { axis },
                    26 => Op::Softmax { axis },
                    _ if self.rng.random_bool(0.5) => Op::LogSoftmax { axis },
                    _ => Op::AllReduce {
                        op: ReduceOp::ALL[self.rng.random_range(0..ReduceOp::ALL.len())],
                    },
                };
                self.add(op.kind_name(), op, &[x]);
            }
            18 => {
                let x = self.float_value(0);
                let axes = self.axes(self.ty(x).rank());
                let keep_dims = self.rng.random();
                let id = self.add("moments", Op::Moments { axes, keep_dims }, &[x]);
                // Use the variance (port 1) downstream.
                self.add("std", Op::Unary(UnaryOp::Sqrt), &[Value::new(id, 1)]);
            }
            19 => {
                let a = self.float_value(2);
                let ta = self.ty(a);
                let r = ta.rank();
                let transpose_a: bool = self.rng.random();
                let k = if transpose_a {
                    ta.shape.dim(r - 2)
                } else {
                    ta.shape.dim(r - 1)
                };
                let n = self.rng.random_range(1..=4);
                let transpose_b = k != Dim::Batch && self.rng.random();
                let dims = if transpose_b {
                    [Dim::Fixed(n), k]
                } else {
                    [k, Dim::Fixed(n)]
                };
                let b_ty = TensorType::new(ta.dtype, Shape::from_dims(dims));
                let b = if b_ty.shape.is_static() {
                    self.read(b_ty)
                } else {
                    self.input(b_ty)
                };
                self.add(
                    "MatMul",
                    Op::MatMul {
                        transpose_a,
                        transpose_b,
                    },
                    &[a, b],
                );
            }
            20..=22 => {
                let x = self.image();
                let (attrs, filter_ty) = self.conv_setup(x);
                let x_ty = self.ty(x);
                let w = self.read(filter_ty.clone());
                let out = self.infer(&Op::Conv2d(attrs), &[&x_ty, &filter_ty]);
                let [h, wd, _] = self.hwc(x);
                match kind {
                    20 => self.add("Conv2D", Op::Conv2d(attrs), &[x, w]),
                    21 => {
                        let dy = self.input(out);
                        self.add(
                            "Conv2DBackpropInput",
                            Op::Conv2dBackpropInput {
                                attrs,
                                input_hw: [h, wd],
                            },
                            &[dy, w],
                        )
                    }
                    _ => {
                        let dy = self.input(out);
                        let filter_hw = [filter_ty.shape.dims()[0], filter_ty.shape.dims()[1]]
                            .map(|d| d.fixed().expect("static"));
                        self.add(
                            "Conv2DBackpropFilter",
                            Op::Conv2dBackpropFilter { attrs, filter_hw },
                            &[x, dy],
                        )
                    }
                };
            }
            23..=25 => {
                let x = self.image();
                let attrs = self.pool_setup(x);
                let pool = Value::first(self.add("pool", Op::Pool(attrs), &[x]));
                let [h, w, _] = self.hwc(x);
                // The gradient ops carry a pool kind too; other kinds than implied are legal.
                match kind {
                    24 => self.add("MaxPoolGrad", Op::MaxPoolGrad(attrs), &[x, pool]),
                    25 => self.add(
                        "AvgPoolGrad",
                        Op::AvgPoolGrad {
                            attrs,
                            input_hw: [h, w],
                        },
                        &[pool],
                    ),
                    _ => return,
                };
            }
            28 | 30 => {
                let dtype = *FLOATS.choose(&mut self.rng).expect("non-empty");
                let c = self.rng.random_range(1..=5);
                let batch = if self.rng.random() {
                    Dim::Batch
                } else {
                    Dim::Fixed(3)
                };
                let logits = self.input(TensorType::new(
                    dtype,
                    Shape::from_dims([batch, Dim::Fixed(c)]),
                ));
                let ldt = *INTS.choose(&mut self.rng).expect("non-empty");
                let labels = self.input(TensorType::new(ldt, Shape::from_dims([batch])));
                let op = if kind == 28 {
                    Op::SparseSoftmaxCrossEntropy
                } else {
                    Op::InTopK {
                        k: self.rng.random_range(1..=c + 1),
                    }
                };
                self.add(op.kind_name(), op, &[logits, labels]);
            }
            29 => {
                let dtype = *INTS.choose(&mut self.rng).expect("non-empty");
                let shape = self.shape();
                let x = self.value(|t| t.dtype.is_int(), TensorType::new(dtype, shape));
                let depth = self.rng.random_range(1..=5);
                self.add("OneHot", Op::OneHot { depth }, &[x]);
            }
            _ => {
                let ty = any_ty(self);
                let x = self.value(|_| true, ty);
                let cdt = if self.rng.random() {
                    DType::I32
                } else {
                    DType::I64
                };
                let counter = self.value(
                    |t| t.rank() == 0 && matches!(t.dtype, DType::I32 | DType::I64),
                    TensorType::scalar(cdt),
                );
                let seed = self.rng.random();
                self.add("RandomUniform", Op::RandomUniform { seed }, &[x, counter]);
            }
        }
    }
}
