//! Differential tests of lowering and the CPU backend: random graphs are run by the reference
//! executor (the oracle) and by compiled programs, with and without fusion, on fresh random
//! inputs. Outputs and updated variables must agree within `|a - b| <= 1e-4 + 1e-4·|b|`
//! (f32 sums are taken in different orders); NaN must match NaN. The random graphs are also
//! made training steps (every optimizer, every lowering option), and run on every SIMD level
//! the machine has.

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::cpu::{CpuOptions, CpuSession, SimdLevel};
use towerpack::backend::poison::PoisonScratch;
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{Feed, Session};
use towerpack::ir::*;
use towerpack::lower::LowerOptions;
use towerpack::optim::Optimizer;
use towerpack::tensor::{DType, HostTensor};

use crate::channel_reductions::random_conv;

const BATCH: usize = 3;

struct Gen {
    g: Graph,
    rng: ChaCha8Rng,
    /// Float values available as operands, with their shapes (batch resolved).
    values: Vec<Value>,
    feeds: Vec<(NodeId, HostTensor)>,
    assigns: Vec<NodeId>,
    n: usize,
}

impl Gen {
    fn name(&mut self, base: &str) -> String {
        self.n += 1;
        format!("{base}{}", self.n)
    }

    fn shape(&self, v: Value) -> Vec<usize> {
        self.g.value_type(v).shape.resolve(BATCH)
    }

    fn add(&mut self, op: Op, ins: &[Value]) -> Option<Value> {
        let name = self.name(op.kind_name());
        self.g.add_node(&name, op, ins).ok().map(Value::first)
    }

    fn random_data(&mut self, shape: &[usize], scale: f32) -> Vec<f32> {
        let n: usize = shape.iter().product();
        (0..n)
            .map(|_| self.rng.random_range(-scale..scale))
            .collect()
    }

    fn input(&mut self, shape: Shape) -> Value {
        let name = self.name("in");
        let ty = TensorType::f32(shape.clone());
        let id = self
            .g
            .add_node(
                &name,
                Op::Input {
                    name: name.clone(),
                    ty,
                },
                &[],
            )
            .expect("input");
        let data = self.random_data(&shape.resolve(BATCH), 2.0);
        let t = HostTensor::from_f32(&shape.resolve(BATCH), data).expect("sized");
        self.feeds.push((id, t));
        Value::first(id)
    }

    fn variable(&mut self, dims: &[usize]) -> Value {
        let name = self.name("var");
        let id = self
            .g
            .declare_variable(VariableDef {
                name: name.clone(),
                ty: TensorType::f32(Shape::fixed(dims)),
                init: Initializer::Uniform {
                    low: -1.0,
                    high: 1.0,
                },
                flags: VarFlags {
                    trainable: true,
                    ..VarFlags::default()
                },
            })
            .expect("var");
        let r = self
            .g
            .add_node(&format!("{name}/read"), Op::Variable { var: id }, &[])
            .expect("read");
        Value::first(r)
    }

    fn pick(&mut self) -> Value {
        *self.values.choose(&mut self.rng).expect("values")
    }

    /// A value broadcastable against `shape`: same shape, its last axis, or a scalar.
    fn partner(&mut self, shape: &[usize]) -> Value {
        let same: Vec<Value> = self
            .values
            .iter()
            .copied()
            .filter(|&v| self.shape(v) == shape)
            .collect();
        match self.rng.random_range(0..4) {
            0 if !same.is_empty() => *same.choose(&mut self.rng).expect("same"),
            1 => {
                let last = *shape.last().unwrap_or(&1);
                self.variable(&[last])
            }
            2 => {
                let c = self.rng.random_range(-1.5f32..1.5);
                let t = HostTensor::scalar_f32(c);
                self.add(Op::Constant { value: t }, &[]).expect("const")
            }
            _ => self.variable(&[]),
        }
    }

    fn step(&mut self) {
        let x = self.pick();
        let shape = self.shape(x);
        let rank = shape.len();
        let choice = self.rng.random_range(0..20);
        let out = match choice {
            0..=3 => {
                let u = *[
                    UnaryOp::Neg,
                    UnaryOp::Abs,
                    UnaryOp::Exp,
                    UnaryOp::Relu,
                    UnaryOp::Sigmoid,
                    UnaryOp::Tanh,
                    UnaryOp::Square,
                    UnaryOp::Sign,
                    UnaryOp::Floor,
                    UnaryOp::Sqrt,
                    UnaryOp::Log,
                    UnaryOp::Rsqrt,
                ]
                .choose(&mut self.rng)
                .expect("op");
                // Keep exp's argument moderate.
                let arg = if u == UnaryOp::Exp {
                    self.add(Op::Unary(UnaryOp::Tanh), &[x])
                } else {
                    Some(x)
                };
                arg.and_then(|a| self.add(Op::Unary(u), &[a]))
            }
            4..=7 => {
                let b = *[
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Mul,
                    BinaryOp::Maximum,
                    BinaryOp::Minimum,
                    BinaryOp::Div,
                ]
                .choose(&mut self.rng)
                .expect("op");
                let y = self.partner(&shape);
                let (l, r) = if self.rng.random_bool(0.5) {
                    (x, y)
                } else {
                    (y, x)
                };
                self.add(Op::Binary(b), &[l, r])
            }
            8 => {
                // select(x > y, x, y * 0.5) — a relu-gradient-like mask.
                let y = self.partner(&shape);
                let c = self.add(Op::Binary(BinaryOp::Gt), &[x, y]);
                let half = self.add(
                    Op::Constant {
                        value: HostTensor::scalar_f32(0.5),
                    },
                    &[],
                );
                let yh = half.and_then(|h| self.add(Op::Binary(BinaryOp::Mul), &[y, h]));
                match (c, yh) {
                    (Some(c), Some(yh)) => self.add(Op::Select, &[c, x, yh]),
                    _ => None,
                }
            }
            9 => {
                // Layout: transpose (keeping a batch axis first), slice, reshape, broadcast.
                let has_batch = self.g.value_type(x).shape.has_batch();
                match self.rng.random_range(0..3) {
                    0 if rank >= 2 => {
                        let mut perm: Vec<usize> = (0..rank).collect();
                        let lo = usize::from(has_batch);
                        perm[lo..].reverse();
                        self.add(Op::Transpose { perm }, &[x])
                    }
                    1 if rank >= 1 && shape[rank - 1] >= 2 && !(has_batch && rank == 1) => {
                        let n = shape[rank - 1];
                        self.add(
                            Op::Slice {
                                axis: rank - 1,
                                start: 1,
                                end: n,
                            },
                            &[x],
                        )
                    }
                    _ => {
                        let dims = self.g.value_type(x).shape.clone();
                        if dims.has_batch() {
                            let rest: usize =
                                dims.dims()[1..].iter().filter_map(|d| d.fixed()).product();
                            self.add(
                                Op::Reshape {
                                    shape: Shape::batched(&[rest]),
                                },
                                &[x],
                            )
                        } else {
                            let mut d = vec![2usize];
                            d.extend(shape.iter());
                            self.add(
                                Op::Broadcast {
                                    shape: Shape::fixed(&d),
                                },
                                &[x],
                            )
                        }
                    }
                }
            }
            10 => {
                let k = self.rng.random_range(1..=rank.max(1));
                let mut axes: Vec<usize> = (0..rank).collect();
                axes.truncate(k);
                let op = *[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min]
                    .choose(&mut self.rng)
                    .expect("op");
                if rank == 0 {
                    None
                } else if self.rng.random_bool(0.5) {
                    // Reduce a fused product (prologue fusion).
                    let y = self.partner(&shape);
                    let p = self.add(Op::Binary(BinaryOp::Mul), &[x, y]);
                    let keep_dims = self.rng.random_bool(0.5);
                    p.and_then(|p| {
                        self.add(
                            Op::Reduce {
                                op,
                                axes,
                                keep_dims,
                            },
                            &[p],
                        )
                    })
                } else {
                    self.add(
                        Op::Reduce {
                            op,
                            axes,
                            keep_dims: false,
                        },
                        &[x],
                    )
                }
            }
            11 if rank >= 2 => {
                let axes: Vec<usize> = (0..rank - 1).collect();
                let name = self.name("moments");
                let m = self
                    .g
                    .add_node(
                        &name,
                        Op::Moments {
                            axes,
                            keep_dims: false,
                        },
                        &[x],
                    )
                    .ok();
                if let Some(m) = m {
                    let a = Value::new(m, 0);
                    let b = Value::new(m, 1);
                    self.values.push(a);
                    Some(b)
                } else {
                    None
                }
            }
            12 if rank == 2 => {
                // Dense layer with a fusable bias + activation.
                let units = self.rng.random_range(1..6);
                let w = self.variable(&[shape[1], units]);
                let y = self.add(
                    Op::MatMul {
                        transpose_a: false,
                        transpose_b: false,
                    },
                    &[x, w],
                );
                let b = self.variable(&[units]);
                let y = y.and_then(|y| self.add(Op::Binary(BinaryOp::Add), &[y, b]));
                y.and_then(|y| self.add(Op::Unary(UnaryOp::Relu), &[y]))
            }
            13 if rank == 4 => {
                let o = self.rng.random_range(1..5);
                let (k, attrs) = random_conv(&mut self.rng, 1);
                let w = self.variable(&[k, k, shape[3], o]);
                let y = self.add(Op::Conv2d(attrs), &[x, w]);
                if self.rng.random_bool(0.5) {
                    let b = self.variable(&[o]);
                    let y = y.and_then(|y| self.add(Op::Binary(BinaryOp::Add), &[y, b]));
                    y.and_then(|y| self.add(Op::Unary(UnaryOp::Relu), &[y]))
                } else {
                    y
                }
            }
            14 if rank == 4 => {
                let kind = if self.rng.random_bool(0.5) {
                    PoolKind::Max
                } else {
                    PoolKind::Avg
                };
                let attrs = PoolAttrs {
                    kind,
                    window: [2, 2],
                    strides: [2, 2],
                    padding: Padding::Same,
                };
                self.add(Op::Pool(attrs), &[x])
            }
            15 if rank == 2 => {
                let log = self.rng.random_bool(0.5);
                let op = if log {
                    Op::LogSoftmax { axis: 1 }
                } else {
                    Op::Softmax { axis: 1 }
                };
                self.add(op, &[x])
            }
            16 if rank == 2 && self.g.value_type(x).shape.has_batch() => {
                let classes = shape[1];
                let name = self.name("labels");
                let id = self
                    .g
                    .add_node(
                        &name,
                        Op::Input {
                            name: name.clone(),
                            ty: TensorType::new(DType::I64, Shape::batched(&[])),
                        },
                        &[],
                    )
                    .expect("labels");
                let labels: Vec<i64> = (0..BATCH)
                    .map(|_| self.rng.random_range(0..classes as i64))
                    .collect();
                self.feeds.push((
                    id,
                    HostTensor::from_i64(&[BATCH], labels.clone()).expect("sized"),
                ));
                let l = Value::first(id);
                let xent = self.add(Op::SparseSoftmaxCrossEntropy, &[x, l]);
                let hit = self
                    .add(Op::InTopK { k: 2 }, &[x, l])
                    .and_then(|h| self.add(Op::Cast { to: DType::F32 }, &[h]));
                let oh = self.add(Op::OneHot { depth: classes }, &[l]);
                if let (Some(h), Some(o)) = (hit, oh) {
                    self.values.push(h);
                    self.values.push(o);
                }
                let am = self
                    .add(Op::ArgMax { axis: 1 }, &[x])
                    .and_then(|a| self.add(Op::Cast { to: DType::F32 }, &[a]));
                if let Some(a) = am {
                    self.values.push(a);
                }
                xent
            }
            17 => {
                // Dropout-like mask from the counter-based generator.
                let counter = self.rng.random_range(0..100);
                let gs = self.add(
                    Op::Constant {
                        value: HostTensor::scalar_i64(counter),
                    },
                    &[],
                );
                let u = gs.and_then(|c| self.add(Op::RandomUniform { seed: 7 }, &[x, c]));
                let keep = self.add(
                    Op::Constant {
                        value: HostTensor::scalar_f32(0.3),
                    },
                    &[],
                );
                let m = match (u, keep) {
                    (Some(u), Some(k)) => self.add(Op::Binary(BinaryOp::Ge), &[u, k]),
                    _ => None,
                };
                let mf = m.and_then(|m| self.add(Op::Cast { to: DType::F32 }, &[m]));
                mf.and_then(|m| self.add(Op::Binary(BinaryOp::Mul), &[x, m]))
            }
            18 => {
                // Concat with itself along the last axis, or pad.
                if rank >= 1
                    && self.rng.random_bool(0.5)
                    && !(rank == 1 && self.g.value_type(x).shape.has_batch())
                {
                    self.add(Op::Concat { axis: rank - 1 }, &[x, x])
                } else if rank >= 1 && !(rank == 1 && self.g.value_type(x).shape.has_batch()) {
                    let mut pads = vec![(0, 0); rank];
                    pads[rank - 1] = (1, 2);
                    self.add(Op::Pad { pads }, &[x])
                } else {
                    None
                }
            }
            _ => {
                // An in-place style update of a fresh variable: v <- v - 0.1 * mean-ish(x).
                let v = self.variable(
                    &shape
                        .iter()
                        .copied()
                        .skip(usize::from(self.g.value_type(x).shape.has_batch()))
                        .collect::<Vec<_>>(),
                );
                let var = match self.g.node(v.node).op {
                    Op::Variable { var } => var,
                    _ => return,
                };
                let src = if self.g.value_type(x).shape.has_batch() {
                    self.add(
                        Op::Reduce {
                            op: ReduceOp::Mean,
                            axes: vec![0],
                            keep_dims: false,
                        },
                        &[x],
                    )
                } else {
                    Some(x)
                };
                let lr = self.add(
                    Op::Constant {
                        value: HostTensor::scalar_f32(0.1),
                    },
                    &[],
                );
                let d = match (src, lr) {
                    (Some(s), Some(l)) => self.add(Op::Binary(BinaryOp::Mul), &[s, l]),
                    _ => None,
                };
                let nv = d.and_then(|d| self.add(Op::Binary(BinaryOp::Sub), &[v, d]));
                let name = self.name("assign");
                if let Some(nv) = nv
                    && let Ok(a) = self.g.add_node(&name, Op::Assign { var }, &[nv])
                {
                    self.assigns.push(a);
                }
                nv
            }
        };
        if let Some(v) = out
            && self.g.value_type(v).dtype == DType::F32
        {
            self.values.push(v);
        }
    }
}

fn random_case(seed: u64) -> (Graph, Step, Vec<Feed>) {
    let mut gen_ = Gen {
        g: Graph::new(),
        rng: ChaCha8Rng::seed_from_u64(seed),
        values: Vec::new(),
        feeds: Vec::new(),
        assigns: Vec::new(),
        n: 0,
    };
    let img = gen_.input(Shape::batched(&[6, 6, 3]));
    let feat = gen_.input(Shape::batched(&[5]));
    gen_.values.push(img);
    gen_.values.push(feat);
    let steps = gen_.rng.random_range(4..14);
    for _ in 0..steps {
        gen_.step();
    }
    let mut fetches: Vec<Value> = gen_.values.iter().rev().take(4).copied().collect();
    fetches.sort();
    fetches.dedup();
    let step = Step::new(fetches, gen_.assigns.clone());
    (gen_.g, step, gen_.feeds)
}

fn close(a: &HostTensor, b: &HostTensor) -> Result<(), String> {
    if a.shape() != b.shape() {
        return Err(format!("shapes {:?} vs {:?}", a.shape(), b.shape()));
    }
    for (i, (x, y)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || x == &y || (x - y).abs() <= 1e-4 + 1e-4 * y.abs();
        if !ok {
            return Err(format!("element {i}: {x} vs reference {y}"));
        }
    }
    Ok(())
}

fn check(seed: u64, opts: LowerOptions, threads: usize) -> Result<(), String> {
    check_on(seed, opts, threads, 1, None)
}

/// [`check`] with every node placed on one of `devices` logical devices at random: the CPU
/// backend then runs one thread per device, synchronised only where the program says.
/// `simd` forces the CPU kernels' instruction set (`None`: the machine's best).
fn check_on(
    seed: u64,
    opts: LowerOptions,
    threads: usize,
    devices: u16,
    simd: Option<SimdLevel>,
) -> Result<(), String> {
    let (mut g, step, feeds) = random_case(seed);
    if devices > 1 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xD3);
        let ids: Vec<NodeId> = g.node_ids().collect();
        for id in ids {
            g.set_device(id, Some(rng.random_range(0..devices)));
        }
    }
    let text = towerpack::ir::text::print(&g);
    let mut reference = ReferenceSession::new(g.clone()).expect("reference");
    reference.initialize_variables(seed).expect("init");
    let mut cpu = CpuSession::new(
        g.clone(),
        CpuOptions {
            threads,
            lower: opts,
            simd,
            ..CpuOptions::default()
        },
    )
    .expect("cpu");
    cpu.initialize_variables(seed).expect("init");
    let want = reference.run(&step, &feeds);
    let got = cpu.run(&step, &feeds);
    let (want, got) = match (want, got) {
        (Ok(w), Ok(g)) => (w, g),
        // Both reject the step (e.g. a label out of range): nothing more to compare.
        (Err(_), Err(_)) => return Ok(()),
        (w, g) => {
            return Err(format!(
                "seed {seed}: reference {:?} vs cpu {:?}\n{text}",
                w.err(),
                g.err()
            ));
        }
    };
    let program = cpu
        .program(&step, BATCH)
        .map(|p| p.to_string())
        .unwrap_or_default();
    for (i, (w, c)) in want.iter().zip(&got).enumerate() {
        if let Err(e) = close(c, w) {
            return Err(format!(
                "seed {seed} ({opts:?}): fetch {i}: {e}\n{text}\n{program}"
            ));
        }
    }
    for (id, _) in g.variable_ids() {
        let (w, c) = (
            reference.read_variable(id).expect("ref var"),
            cpu.read_variable(id).expect("cpu var"),
        );
        if let Err(e) = close(&c, &w) {
            return Err(format!(
                "seed {seed} ({opts:?}): variable {}: {e}\n{text}\n{program}",
                g.variable(id).name
            ));
        }
    }
    Ok(())
}

fn report(failures: Vec<String>, cases: usize) {
    if let Some(first) = failures.first() {
        let seeds: Vec<&str> = failures
            .iter()
            .filter_map(|f| f.split(':').next())
            .collect();
        panic!(
            "{} of {cases} cases differ ({seeds:?}); the first:\n{first}",
            failures.len()
        );
    }
}

#[test]
fn compiled_programs_match_the_reference_on_random_graphs() {
    let fused = LowerOptions::default();
    let unfused = LowerOptions {
        fuse: false,
        simplify: false,
        ..LowerOptions::default()
    };
    let mut failures = Vec::new();
    for seed in 0..300 {
        failures.extend(check(seed, fused, 1).err());
        failures.extend(check(seed, unfused, 1).err());
    }
    report(failures, 600);
}

/// The random graphs above exercise reductions' finishes (`ReduceFinish`): an elementwise op on
/// a reduction's result becomes the reduction's own in a good share of the fused programs, so
/// the comparison with the reference covers them.
#[test]
fn random_graphs_give_reductions_finishes() {
    let finished = (0..300)
        .filter(|&seed| {
            let (g, step, _) = random_case(seed);
            towerpack::lower::lower(&g, &step, BATCH, &LowerOptions::default()).is_ok_and(|p| {
                p.kernels.iter().any(|k| {
                    matches!(
                        k.kind,
                        towerpack::lower::KernelKind::Reduce {
                            finish: Some(_),
                            ..
                        }
                    )
                })
            })
        })
        .count();
    assert!(finished >= 10, "{finished} of 300 programs have a finish");
}

#[test]
fn results_do_not_depend_on_parallel_splitting_beyond_tolerance() {
    let failures = (300..360)
        .filter_map(|seed| check(seed, LowerOptions::default(), 2).err())
        .collect();
    report(failures, 60);
}

#[test]
fn programs_spread_over_devices_match_the_reference() {
    let failures = (400..600)
        .filter_map(|seed| check_on(seed, LowerOptions::default(), 2, 2, None).err())
        .collect();
    report(failures, 200);
}

/// A random graph made a training step: its cost is the mean square of one of its float
/// values; every trainable variable reaching it is updated by `optimizer` (the graph's own
/// assigns are dropped: they would assign the same variables twice). `None` when the cost
/// does not depend differentiably on any variable.
fn random_training_case(seed: u64, optimizer: &Optimizer) -> Option<(Graph, Step, Vec<Feed>)> {
    let (mut g, step, feeds) = random_case(seed);
    let target = *step.fetches.first()?;
    let rank = g.value_type(target).shape.rank();
    let sq = g
        .add_node("cost/square", Op::Unary(UnaryOp::Square), &[target])
        .ok()?;
    let cost = g
        .add_node(
            "cost",
            Op::Reduce {
                op: ReduceOp::Mean,
                axes: (0..rank).collect(),
                keep_dims: false,
            },
            &[Value::first(sq)],
        )
        .ok()?;
    let cost = Value::first(cost);
    let vars: Vec<VarId> = g
        .variable_ids()
        .filter(|(_, d)| d.flags.trainable)
        .map(|(id, _)| id)
        .collect();
    let grads = towerpack::autodiff::gradients(&mut g, cost, &vars, "gradients").ok()?;
    if grads.grads.is_empty() {
        return None;
    }
    let op = optimizer
        .apply_gradients(&mut g, &grads.grads, "train_op")
        .ok()?;
    Some((g, Step::new(vec![cost], vec![op.train_op]), feeds))
}

/// Runs two steps of `random_training_case(seed, optimizer)` on the reference and the CPU
/// backend lowered with `opts`; compares the costs and every variable (slots included).
fn check_training(
    seed: u64,
    optimizer: &Optimizer,
    opts: LowerOptions,
    simd: Option<SimdLevel>,
) -> Result<(), String> {
    let Some((g, step, feeds)) = random_training_case(seed, optimizer) else {
        return Ok(());
    };
    let text = towerpack::ir::text::print(&g);
    let mut reference = ReferenceSession::new(g.clone()).expect("reference");
    reference.initialize_variables(seed).expect("init");
    let mut cpu = CpuSession::new(
        g.clone(),
        CpuOptions {
            threads: 1,
            lower: opts,
            poison_scratch: PoisonScratch::EveryStep,
            simd,
            ..CpuOptions::default()
        },
    )
    .expect("cpu");
    cpu.initialize_variables(seed).expect("init");
    for s in 0..2 {
        let (want, got) = match (reference.run(&step, &feeds), cpu.run(&step, &feeds)) {
            (Ok(w), Ok(c)) => (w, c),
            (Err(_), Err(_)) => return Ok(()),
            (w, c) => {
                return Err(format!(
                    "seed {seed} ({optimizer:?}): step {s}: reference {:?} vs cpu {:?}\n{text}",
                    w.err(),
                    c.err()
                ));
            }
        };
        if let Err(e) = close(&got[0], &want[0]) {
            return Err(format!(
                "seed {seed} ({optimizer:?}, {opts:?}): step {s} cost: {e}\n{text}"
            ));
        }
    }
    for (id, def) in g.variable_ids() {
        let (w, c) = (
            reference.read_variable(id).expect("ref var"),
            cpu.read_variable(id).expect("cpu var"),
        );
        if let Err(e) = close(&c, &w) {
            let program = cpu
                .program(&step, BATCH)
                .map(|p| p.to_string())
                .unwrap_or_default();
            return Err(format!(
                "seed {seed} ({optimizer:?}, {opts:?}): variable {}: {e}\n{text}\n{program}",
                def.name
            ));
        }
    }
    Ok(())
}

#[test]
fn optimizer_updates_of_random_graphs_match_the_reference_with_every_lowering_option() {
    // Adam's learning rate is small: where a gradient is ~0, f32 and f64 may round it to
    // either sign, and Adam's first steps move by ±lr whatever the gradient's size.
    let optimizers = [
        Optimizer::sgd(0.05),
        Optimizer::momentum(0.05, 0.9),
        Optimizer::Momentum {
            learning_rate: 0.05,
            momentum: 0.9,
            nesterov: true,
        },
        Optimizer::adam(1e-5),
        Optimizer::adam(1e-5).accumulate(2),
        Optimizer::momentum(0.05, 0.9).accumulate(2),
    ];
    let options = [
        LowerOptions::default(),
        LowerOptions {
            arena_fusion: false,
            ..LowerOptions::default()
        },
        LowerOptions {
            in_place_assigns: false,
            ..LowerOptions::default()
        },
        LowerOptions {
            fuse: false,
            simplify: false,
            ..LowerOptions::default()
        },
    ];
    let mut failures = Vec::new();
    let mut cases = 0;
    for seed in 700..760 {
        let optimizer = &optimizers[seed as usize % optimizers.len()];
        for opts in options {
            cases += 1;
            failures.extend(check_training(seed, optimizer, opts, None).err());
        }
    }
    report(failures, cases);
}

#[test]
fn every_simd_level_of_this_machine_matches_the_reference() {
    // Each level the CPU supports (scalar, AVX2, AVX-512), forced per session: random graphs,
    // fused and unfused, on one and two threads, and random training steps.
    let unfused = LowerOptions {
        fuse: false,
        simplify: false,
        ..LowerOptions::default()
    };
    let optimizers = [
        Optimizer::momentum(0.05, 0.9),
        Optimizer::adam(1e-5),
        Optimizer::sgd(0.05).accumulate(2),
    ];
    let mut failures = Vec::new();
    let mut cases = 0;
    for level in SimdLevel::available() {
        for seed in 800..880 {
            for (opts, threads) in [(LowerOptions::default(), 1), (unfused, 2)] {
                cases += 1;
                failures.extend(
                    check_on(seed, opts, threads, 1, Some(level))
                        .map_err(|e| format!("{level:?}: {e}"))
                        .err(),
                );
            }
        }
        for seed in 880..900 {
            cases += 1;
            let optimizer = &optimizers[seed as usize % optimizers.len()];
            failures.extend(
                check_training(seed, optimizer, LowerOptions::default(), Some(level))
                    .map_err(|e| format!("{level:?}: {e}"))
                    .err(),
            );
        }
    }
    report(failures, cases);
}
