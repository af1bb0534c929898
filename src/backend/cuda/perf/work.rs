//! The work of one kernel of a lowered program, from its geometry alone: arithmetic, the
//! minimum DRAM traffic, and *lane-iterations* — how many independent per-element steps the
//! kernel's computation has (points of an elementwise kernel, input points of a reduction,
//! multiply-adds of a product or convolution), the measure of how much parallelism a launch
//! could use whatever its body does.

use crate::lower::{ConvGeom, Kernel, KernelKind, PoolGeom, Program, Storage};

/// What one kernel computes and moves, independent of how its body is written.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// Floating-point operations (an FMA counts two).
    pub flops: f64,
    /// Bytes every operand is read and every result written once (constants excluded):
    /// the least DRAM traffic the kernel can have.
    pub dram_bytes: f64,
    /// Independent per-element steps of the computation.
    pub lane_iterations: f64,
}

fn conv_macs(g: &ConvGeom) -> f64 {
    (g.n * g.oh * g.ow * g.o * g.kh * g.kw) as f64 * (g.c / g.groups.max(1)) as f64
}

fn pool_cells(g: &PoolGeom) -> f64 {
    (g.n * g.oh * g.ow * g.c * g.window[0] * g.window[1]) as f64
}

/// The work of kernel `k` of `program`.
pub fn kernel_work(program: &Program, k: &Kernel) -> Work {
    let (flops, lane_iterations) = match &k.kind {
        KernelKind::Elementwise { shape, expr } => {
            let points = shape.iter().product::<usize>() as f64;
            (points * expr.ops.len().max(1) as f64, points)
        }
        KernelKind::Reduce {
            shape,
            prologue,
            ops,
            finish,
            ..
        } => {
            let points = shape.iter().product::<usize>() as f64;
            // A finish runs once per output point.
            let finished = finish.as_ref().map_or(0.0, |f| {
                f.shape.iter().product::<usize>() as f64 * f.expr.ops.len() as f64
            });
            (
                points * (prologue.ops.len() + ops.len()).max(1) as f64 + finished,
                points,
            )
        }
        KernelKind::MatMul(g, _) => {
            let macs = (g.batch * g.m * g.n) as f64 * g.k as f64;
            (2.0 * macs, macs)
        }
        KernelKind::Conv2d(g, ..)
        | KernelKind::Conv2dBackpropInput(g, _)
        | KernelKind::Conv2dBackpropFilter(g, ..) => {
            let macs = conv_macs(g);
            (2.0 * macs, macs)
        }
        KernelKind::Pool(g) | KernelKind::MaxPoolGrad(g) | KernelKind::AvgPoolGrad(g) => {
            let cells = pool_cells(g);
            (cells, cells)
        }
        KernelKind::Softmax { rows, cols, .. } => {
            let points = (rows * cols) as f64;
            (4.0 * points, points)
        }
        KernelKind::SparseSoftmaxCrossEntropy { rows, classes } => {
            let points = (rows * classes) as f64;
            (4.0 * points, points)
        }
        KernelKind::ArgMax { outer, len, inner } => {
            let points = (outer * len * inner) as f64;
            (points, points)
        }
        KernelKind::InTopK { rows, classes, .. } => {
            let points = (rows * classes) as f64;
            (points, points)
        }
        KernelKind::Concat {
            outer,
            sizes,
            inner,
        } => (0.0, (outer * sizes.iter().sum::<usize>() * inner) as f64),
        KernelKind::Pad { shape, pads } => {
            let out: usize = shape
                .iter()
                .zip(pads)
                .map(|(d, (a, b))| d + a + b)
                .product();
            (0.0, out as f64)
        }
        KernelKind::AllReduce { len, .. } => (0.0, *len as f64),
    };
    Work {
        flops,
        dram_bytes: dram_bytes(program, k),
        lane_iterations,
    }
}

/// Distinct bytes of every non-constant input view and every output.
fn dram_bytes(program: &Program, k: &Kernel) -> f64 {
    let space = match &k.kind {
        KernelKind::Elementwise { shape, .. } | KernelKind::Reduce { shape, .. } => {
            Some(shape.as_slice())
        }
        _ => None,
    };
    let mut total = 0usize;
    let mut seen = Vec::new();
    for v in &k.inputs {
        let buf = program.buffer(v.buffer);
        if matches!(buf.storage, Storage::Constant(_)) {
            continue;
        }
        // A view over the iteration space touches the extents of its non-broadcast axes.
        let elements = match space {
            Some(shape) if v.strides.len() == shape.len() => shape
                .iter()
                .zip(&v.strides)
                .filter(|(_, s)| **s != 0)
                .map(|(d, _)| *d)
                .product::<usize>()
                .min(buf.len()),
            _ => buf.len(),
        };
        let key = (v.buffer, v.offset, v.strides.clone());
        if !seen.contains(&key) {
            seen.push(key);
            total += elements * buf.dtype.size_bytes();
        }
    }
    for &b in &k.outputs {
        total += program.buffer(b).bytes();
    }
    total as f64
}
