//! The convolution-prologue cases shared by the lowering tests (`tests/lower/conv_prologues.rs`,
//! on the CPU backend) and the CUDA tests (`tests/cuda/emu_prologues.rs`, on the emulated
//! device): a batch-norm-like apply of per-channel values (a random chain of them, sometimes
//! ending in a ReLU) that a convolution, its filter gradient and a residual add in an input
//! gradient's epilogue read — on random geometries ([`case`]) or on a fixed one, with the
//! filter a constant or fed ([`case_with`]). Also the graph builder both binaries'
//! channel-reduction and prologue cases use ([`Case`], [`BATCH`], [`random_conv`]).
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::Feed;
use towerpack::ir::*;
use towerpack::tensor::HostTensor;

/// The batch of the cases.
pub(crate) const BATCH: usize = 3;

/// A graph under construction with random feeds.
pub(crate) struct Case {
    pub(crate) g: Graph,
    pub(crate) feeds: Vec<Feed>,
    pub(crate) fetches: Vec<Value>,
    pub(crate) rng: ChaCha8Rng,
}

impl Case {
    pub(crate) fn add(&mut self, name: &str, op: Op, ins: &[Value]) -> Value {
        let name = self.g.unique_name(name);
        Value::first(self.g.add_node(&name, op, ins).expect(&name))
    }

    /// A batched f32 input of `dims`, fed with values uniform in [-2, 2).
    pub(crate) fn input(&mut self, dims: &[usize]) -> Value {
        let name = self.g.unique_name("in");
        let ty = TensorType::f32(Shape::batched(dims));
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
        let shape: Vec<usize> = std::iter::once(BATCH).chain(dims.iter().copied()).collect();
        let n: usize = shape.iter().product();
        let data = (0..n).map(|_| self.rng.random_range(-2.0..2.0)).collect();
        self.feeds
            .push((id, HostTensor::from_f32(&shape, data).expect("sized")));
        Value::first(id)
    }

    /// A constant of `dims`, uniform in [-1, 1).
    pub(crate) fn constant(&mut self, dims: &[usize]) -> Value {
        let n: usize = dims.iter().product();
        let data = (0..n).map(|_| self.rng.random_range(-1.0..1.0)).collect();
        let value = HostTensor::from_f32(dims, data).expect("sized");
        self.add("w", Op::Constant { value }, &[])
    }

    /// An input of exactly `dims` (no batch axis) fed with the values [`Case::constant`] would
    /// hold (the same draws): a tensor the program cannot fold, as it does not a variable.
    pub(crate) fn fed_constant(&mut self, dims: &[usize]) -> Value {
        let n: usize = dims.iter().product();
        let data = (0..n).map(|_| self.rng.random_range(-1.0..1.0)).collect();
        let name = self.g.unique_name("w");
        let ty = TensorType::f32(Shape::fixed(dims));
        let op = Op::Input {
            name: name.clone(),
            ty,
        };
        let id = self.g.add_node(&name, op, &[]).expect("input");
        self.feeds
            .push((id, HostTensor::from_f32(dims, data).expect("sized")));
        Value::first(id)
    }
}

/// A random square convolution of `groups` groups: its kernel size (1 to 3) and attributes
/// (stride 1 or 2, `SAME` or `VALID`, no dilation), drawn in that order.
pub(crate) fn random_conv(rng: &mut ChaCha8Rng, groups: usize) -> (usize, Conv2dAttrs) {
    let k = rng.random_range(1..4);
    let s = rng.random_range(1..3);
    let padding = if rng.random_bool(0.5) {
        Padding::Same
    } else {
        Padding::Valid
    };
    let attrs = Conv2dAttrs {
        strides: [s, s],
        padding,
        dilations: [1, 1],
        groups,
    };
    (k, attrs)
}

/// The geometry of a prologue case: `[h, w, channels]` images (batch [`BATCH`]) convolved with
/// a `k × k` filter of `groups` groups to `outs` channels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Geometry {
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) channels: usize,
    pub(crate) outs: usize,
    pub(crate) k: usize,
    pub(crate) attrs: Conv2dAttrs,
}

/// A prologue case: its graph, feeds and step (fetching, in this order, the convolution `y`,
/// the filter gradient `dw` and the residual sum; never the applied value itself, which would
/// have to be written out), and the values a test derives other quantities from.
pub(crate) struct PrologueCase {
    pub(crate) g: Graph,
    pub(crate) feeds: Vec<Feed>,
    pub(crate) step: Step,
    pub(crate) geometry: Geometry,
    /// The fed input the apply reads.
    pub(crate) x: Value,
    /// The applied value (the chain of per-channel operations, perhaps a ReLU).
    pub(crate) applied: Value,
    /// The convolution's filter.
    pub(crate) filter: Value,
    /// The fed gradient the filter gradient multiplies by.
    pub(crate) dy: Value,
    /// The convolution (fetch 0).
    pub(crate) y: Value,
}

/// Where a case's filter comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Filter {
    /// A constant ([`Case::constant`]).
    Constant,
    /// A fed input of the same values ([`Case::fed_constant`]), which the lowering cannot fold
    /// (as a variable): under BF16/FP16 a folded filter's rounding is folded with it, so the
    /// forward convolution's operands are no pair of round trips its kernel can absorb, and
    /// x's rounding stays an elementwise cast beside the apply, which is then written out.
    Fed,
}

/// Case `seed`: a random geometry (1, 3, 4, 16, 17 or 32 channels, 3 to 8 pixels a side, 1 or
/// 2 groups, a random [`random_conv`]), a random apply and a constant filter.
pub(crate) fn case(seed: u64) -> PrologueCase {
    build(seed, None, Filter::Constant)
}

/// Case `seed` on `geometry` (`None`: [`case`]'s random one), with a random apply and `filter`.
pub(crate) fn case_with(seed: u64, geometry: Option<Geometry>, filter: Filter) -> PrologueCase {
    build(seed, geometry, filter)
}

/// The random draws of [`case`] (where `fixed` is `None`) in their order: the geometry's first
/// half, the apply, the convolution's, then its filter's values and dy's.
fn build(seed: u64, fixed: Option<Geometry>, filter: Filter) -> PrologueCase {
    let mut c = Case {
        g: Graph::new(),
        feeds: Vec::new(),
        fetches: Vec::new(),
        rng: ChaCha8Rng::seed_from_u64(seed),
    };
    let (channels, h, w) = match fixed {
        Some(f) => (f.channels, f.h, f.w),
        None => {
            let channels = [1, 3, 4, 16, 17, 32][c.rng.random_range(0..6)];
            (channels, c.rng.random_range(3..9), c.rng.random_range(3..9))
        }
    };
    let x = c.input(&[h, w, channels]);
    // The apply: a chain of per-channel operations (batch norm's is sub, mul, mul, add, relu).
    let mut a = x;
    for _ in 0..c.rng.random_range(1..5) {
        let op = [BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Add][c.rng.random_range(0..3)];
        let v = c.constant(&[channels]);
        a = c.add("apply", Op::Binary(op), &[a, v]);
    }
    if c.rng.random_bool(0.7) {
        a = c.add("relu", Op::Unary(UnaryOp::Relu), &[a]);
    }
    let geometry = match fixed {
        Some(f) => f,
        None => {
            let groups = if channels % 2 == 0 && c.rng.random_bool(0.25) {
                2
            } else {
                1
            };
            let outs = groups * c.rng.random_range(1..9);
            let (k, attrs) = random_conv(&mut c.rng, groups);
            Geometry {
                h,
                w,
                channels,
                outs,
                k,
                attrs,
            }
        }
    };
    let (k, attrs, groups, outs) = (
        geometry.k,
        geometry.attrs,
        geometry.attrs.groups,
        geometry.outs,
    );
    let filter_dims = [k, k, channels / groups, outs];
    let filter = match filter {
        Filter::Constant => c.constant(&filter_dims),
        Filter::Fed => c.fed_constant(&filter_dims),
    };
    let y = c.add("conv", Op::Conv2d(attrs), &[a, filter]);
    let y_dims = c.g.value_type(y).shape.resolve(BATCH);
    let dy = c.input(&y_dims[1..]);
    let dw = c.add(
        "filter_grad",
        Op::Conv2dBackpropFilter {
            attrs,
            filter_hw: [k, k],
        },
        &[a, dy],
    );
    // A residual add of `a` in the epilogue of the input gradient of `y` (which depends on
    // `a`, so the add cannot join the apply's group as it can a value computed beside it).
    let dx = c.add(
        "input_grad",
        Op::Conv2dBackpropInput {
            attrs,
            input_hw: [h, w],
        },
        &[y, filter],
    );
    let residual = c.add("residual", Op::Binary(BinaryOp::Add), &[dx, a]);
    let step = Step::new(vec![y, dw, residual], Vec::new());
    PrologueCase {
        g: c.g,
        feeds: c.feeds,
        step,
        geometry,
        x,
        applied: a,
        filter,
        dy,
        y,
    }
}
