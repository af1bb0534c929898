//! The executor of lowered programs on the CPU.
//!
//! [`Prepared`] is a `Program` made ready to run: fused expressions compiled to
//! [`FusedProgram`]s, geometries mapped onto the [`kernels`] library, and every
//! operand's reach checked against its buffer once, so running a step does no bounds work and
//! no allocation beyond the kernels' own scratch.

use super::bucket::BucketProgram;
use super::fused::{CHUNK, FusedProgram};
use super::fused_reduce::ReduceProgram;
use super::half_io::{self, Widened};
use super::kernels::pool::Pool2dGeometry;
use super::kernels::reduce::ShiftedColumnMoments;
use super::kernels::simd::carry;
use super::kernels::{self, Conv2dGeometry, ConvPass, Epilogue, KernelError, MatRef, Padding2d};
use super::memory::{Arena, RawBuf};
use crate::backend::{BackendError, Collective};
use crate::ir::PoolKind;
use crate::lower::{
    ChannelReduction, ConvGeom, HalfFormat, Kernel, KernelKind, PoolGeom, Precision, Program,
    Storage, View,
};
use crate::tensor::DType;
use rayon::prelude::*;
use smallvec::SmallVec;
use std::sync::Mutex;

/// Elementwise kernels smaller than this run on one thread.
const PARALLEL_POINTS: usize = 1 << 15;

/// Programs whose every kernel does less work than this (points or multiply-adds) run on the
/// calling thread.
const SMALL_WORK: usize = 1 << 14;

/// A rough size of a kernel's work: points of its space, or multiply-adds.
fn kernel_work(k: &Kernel, p: &Program) -> usize {
    let out = k
        .outputs
        .first()
        .map_or(0, |b| p.buffers[b.0 as usize].len());
    match &k.kind {
        KernelKind::Elementwise { shape, .. } | KernelKind::Reduce { shape, .. } => {
            shape.iter().product()
        }
        KernelKind::MatMul(g, _) => g.batch * g.m * g.n * g.k,
        KernelKind::Conv2d(g, ..)
        | KernelKind::Conv2dBackpropInput(g, _)
        | KernelKind::Conv2dBackpropFilter(g, ..) => {
            g.n * g.oh * g.ow * g.o * g.kh * g.kw * (g.c / g.groups.max(1))
        }
        _ => out.max(
            k.inputs
                .iter()
                .map(|v| p.buffers[v.buffer.0 as usize].len())
                .max()
                .unwrap_or(0),
        ),
    }
}

/// One kernel ready to run.
enum Step {
    Fused(FusedProgram, usize),
    /// A fused update kernel of [`Program::buckets`], on the streaming engine.
    Bucket(BucketProgram, usize),
    Reduce(ReduceProgram, Option<Box<FinishStep>>),
    /// A fixed-function kernel, with its epilogue and its prologue (a convolution's input
    /// computed as it is read) compiled where it has them.
    Fixed {
        epilogue: Option<Box<FusedProgram>>,
        prologue: Option<Box<FusedProgram>>,
        /// The epilogue's finish ([`Epilogue::finish`](crate::lower::Epilogue::finish)), run
        /// once its reductions are stored.
        finish: Option<Box<FinishStep>>,
    },
}

/// A reduction's [`ReduceFinish`](crate::lower::ReduceFinish) on the fused engine, run once the
/// reduction has stored its results: its operands are those results, then the kernel's inputs
/// from `first_input`; its outputs the kernel's after the results. (An epilogue's finish: the
/// same over the epilogue's per-channel results.)
struct FinishStep {
    program: FusedProgram,
    results: usize,
    first_input: usize,
    points: usize,
}

/// A program ready to run against a session's state.
pub struct Prepared {
    pub program: Program,
    steps: Vec<Step>,
    /// Per-kernel wall time and call count, when profiling.
    timings: Option<Vec<(std::time::Duration, u64)>>,
    /// Whether bf16 convolutions may run on AMX tiles (`kernels::conv::amx`) where the CPU has
    /// them.
    bf16_tiles: bool,
    /// How convolutions choose their algorithm: `Auto`, or `AutoDirect` (no Winograd) for bf16
    /// and fp16 programs, whose convolutions sum exact products, and where Winograd is off.
    conv_algorithm: kernels::ConvAlgorithm,
    /// Each kernel's input and output buffers, resolved once (arenas never move).
    bound: Vec<(Vec<RawBuf>, Vec<RawBuf>)>,
    /// True when every kernel is too small to parallelise: the program then runs on the
    /// caller's thread without a hand-off to the worker pool.
    small: bool,
    scratch: Vec<Arena>,
    constants: Arena,
    constant_offsets: Vec<usize>,
}

fn kernel_error(k: &Kernel, e: impl std::fmt::Display) -> BackendError {
    BackendError::Kernel {
        node: k.name.clone(),
        op: k.kind.name().to_string(),
        message: e.to_string(),
    }
}

/// Compiles the prologue `p` of convolution `k`: its expression over the input's `[N, H, W, C]`
/// space, operand `j` read through kernel input [`Prologue::input_of`]`(j)`.
fn prologue_program(k: &Kernel, p: &crate::lower::Prologue) -> Result<FusedProgram, BackendError> {
    let (KernelKind::Conv2d(g, ..) | KernelKind::Conv2dBackpropFilter(g, ..)) = &k.kind else {
        return Err(kernel_error(k, "only convolutions take a prologue"));
    };
    let mut views = Vec::new();
    for j in 0..p.expr.operand_count().max(1) {
        let input = p.input_of(j);
        let Some(v) = k.inputs.get(input) else {
            return Err(kernel_error(
                k,
                format!("prologue operand {j} reads input {input}, which the kernel does not have"),
            ));
        };
        views.push((v.offset, v.strides.as_slice()));
    }
    let f = FusedProgram::new(&p.expr, &prologue_space(g), &views);
    if !f.single_f32_output() {
        return Err(kernel_error(
            k,
            "a prologue computes one f32 value per point of x",
        ));
    }
    Ok(f)
}

/// The space a convolution's prologue runs over: its input `x`, `[N, H, W, C]`.
fn prologue_space(g: &ConvGeom) -> [usize; 4] {
    [g.n, g.h, g.w, g.c]
}

/// A convolution's input computed by its prologue as the kernel reads it.
struct PrologueInput<'a> {
    program: &'a FusedProgram,
    inputs: Vec<RawBuf>,
}

impl kernels::ComputeInput for PrologueInput<'_> {
    fn compute(&self, start: usize, out: &mut [f32]) {
        // SAFETY: every operand's reach over the whole input was checked at preparation
        // (`check_bounds`), and the kernels ask for ranges inside the input.
        unsafe { self.program.run_into(start, &self.inputs, out) }
    }
}

/// The prologue input of convolution `k`, if it has a prologue.
fn prologue_input<'a>(step: &'a Step, k: &Kernel, ins: &[RawBuf]) -> Option<PrologueInput<'a>> {
    let (
        Step::Fixed {
            prologue: Some(program),
            ..
        },
        Some(p),
    ) = (step, k.kind.prologue())
    else {
        return None;
    };
    let inputs = (0..program.operands())
        .map(|j| ins[p.input_of(j)])
        .collect();
    Some(PrologueInput { program, inputs })
}

/// A convolution's input `x`: computed by its prologue, widened from bf16 storage
/// (`widened`, see [`bf16_input`]), or its input 0.
fn conv_input<'a>(
    computed: &'a Option<PrologueInput<'_>>,
    widened: &'a Option<Widened>,
    ins: &'a [RawBuf],
    k: &'a Kernel,
    len: usize,
    what: &'static str,
) -> Result<kernels::ConvInput<'a>, KernelError> {
    Ok(match (computed, widened) {
        (Some(c), _) => kernels::ConvInput::Computed { len, compute: c },
        (None, Some(w)) => kernels::ConvInput::Computed { len, compute: w },
        (None, None) => kernels::ConvInput::Tensor(slice(&ins[0], &k.inputs[0], len, what)?),
    })
}

/// Input 0 of a convolution stored in bf16 and read without a prologue: widened image by
/// image as the kernel copies it (`half_io`). `None` for an f32 input.
fn bf16_input(
    ins: &[RawBuf],
    k: &Kernel,
    len: usize,
    what: &'static str,
) -> Result<Option<Widened>, KernelError> {
    if ins[0].dtype != DType::BF16 {
        return Ok(None);
    }
    let offset = k.inputs[0].offset;
    if offset + len > ins[0].len {
        return Err(KernelError::Shape {
            kernel: what,
            message: format!(
                "operand is bf16 with {} elements, needs {offset}+{len}",
                ins[0].len
            ),
        });
    }
    Ok(Some(Widened {
        raw: ins[0],
        offset,
    }))
}

fn views_of(k: &Kernel, skip: usize) -> Vec<(usize, &[usize])> {
    k.inputs[skip..]
        .iter()
        .map(|v| (v.offset, v.strides.as_slice()))
        .collect()
}

impl Prepared {
    /// Prepares `program` (the state arenas are owned by the session).
    pub fn new(program: Program) -> Result<Prepared, BackendError> {
        let mut constant_offsets = Vec::with_capacity(program.constants.len());
        let mut total = 0;
        for c in &program.constants {
            constant_offsets.push(total);
            total += (c.len() * c.dtype().size_bytes()).div_ceil(64) * 64;
        }
        let mut constants = Arena::new(total);
        for (c, &off) in program.constants.iter().zip(&constant_offsets) {
            let bytes = c.to_le_bytes();
            constants.bytes_mut()[off..off + bytes.len()].copy_from_slice(&bytes);
        }
        // Poisoned: a read of bytes no kernel wrote computes NaN, never leftovers.
        let scratch = program
            .arena_bytes
            .iter()
            .map(|&b| Arena::poisoned(b))
            .collect();
        let buckets: std::collections::HashSet<usize> =
            program.buckets.iter().map(|b| b.kernel as usize).collect();
        let mut steps = Vec::with_capacity(program.kernels.len());
        for (i, k) in program.kernels.iter().enumerate() {
            let step = match &k.kind {
                KernelKind::Elementwise { shape, expr } => {
                    let views = views_of(k, 0);
                    // Operand and output buffers: the streaming engine takes f32 only.
                    let dtypes: Vec<DType> = k
                        .inputs
                        .iter()
                        .map(|v| v.buffer)
                        .chain(k.outputs.iter().copied())
                        .map(|b| program.buffer(b).dtype)
                        .collect();
                    let points = shape.iter().product();
                    match buckets
                        .contains(&i)
                        .then(|| BucketProgram::new(expr, shape, &views, &dtypes))
                        .flatten()
                    {
                        Some(b) => Step::Bucket(b, points),
                        None => Step::Fused(FusedProgram::new(expr, shape, &views), points),
                    }
                }
                KernelKind::Reduce {
                    shape,
                    axes,
                    prologue,
                    ops,
                    finish,
                } => {
                    let views = views_of(k, 0);
                    let first_input = finish
                        .as_ref()
                        .map_or(views.len(), |f| f.first_input.min(views.len()));
                    let (prologue_views, finish_views) = views.split_at(first_input);
                    let finish = finish.as_ref().map(|f| {
                        // The results, contiguous over the finish's space, then its inputs.
                        let own = crate::lower::program::contiguous_strides(&f.shape);
                        let mut operands: Vec<(usize, &[usize])> =
                            vec![(0, own.as_slice()); ops.len()];
                        operands.extend(finish_views.iter().copied());
                        Box::new(FinishStep {
                            program: FusedProgram::new(&f.expr, &f.shape, &operands),
                            results: ops.len(),
                            first_input,
                            points: f.shape.iter().product(),
                        })
                    });
                    Step::Reduce(
                        ReduceProgram::new(prologue, shape, axes, ops, prologue_views),
                        finish,
                    )
                }
                kind => {
                    if let Some(e) = kind.epilogue() {
                        check_variances(&program, k, e)?;
                    }
                    let epilogue = kind.epilogue().map(|e| {
                        let out_shape = &program.buffers[k.outputs[0].0 as usize].shape;
                        // Operand 0 is the kernel's own result, contiguous over the output.
                        let own = crate::lower::program::contiguous_strides(out_shape);
                        let mut views: Vec<(usize, &[usize])> = vec![(0, own.as_slice())];
                        views.extend(
                            k.inputs[kind.epilogue_inputs(k.inputs.len())]
                                .iter()
                                .map(|v| (v.offset, v.strides.as_slice())),
                        );
                        FusedProgram::new_epilogue(&e.expr, out_shape, &views, e.stored_outputs())
                    });
                    let prologue = match kind.prologue() {
                        Some(p) => Some(prologue_program(k, p)?),
                        None => None,
                    };
                    let finish = kind.epilogue().and_then(|e| {
                        let f = e.finish.as_ref()?;
                        let own = crate::lower::program::contiguous_strides(&f.shape);
                        let results = e.reductions.len();
                        let mut operands: Vec<(usize, &[usize])> =
                            vec![(0, own.as_slice()); results];
                        operands.extend(
                            k.inputs
                                .get(f.first_input..)
                                .unwrap_or_default()
                                .iter()
                                .map(|v| (v.offset, v.strides.as_slice())),
                        );
                        Some(Box::new(FinishStep {
                            program: FusedProgram::new(&f.expr, &f.shape, &operands),
                            results,
                            first_input: f.first_input,
                            points: f.shape.iter().product(),
                        }))
                    });
                    Step::Fixed {
                        epilogue: epilogue.map(Box::new),
                        prologue: prologue.map(Box::new),
                        finish,
                    }
                }
            };
            steps.push(step);
        }
        let small = program
            .kernels
            .iter()
            .all(|k| kernel_work(k, &program) < SMALL_WORK);
        let prepared = Prepared {
            timings: None,
            bf16_tiles: false,
            conv_algorithm: exact_products_or_auto(&program, true),
            bound: Vec::new(),
            small,
            program,
            steps,
            scratch,
            constants,
            constant_offsets,
        };
        prepared.check_bounds()?;
        Ok(prepared)
    }

    /// Checks that every elementwise operand stays inside its buffer.
    fn check_bounds(&self) -> Result<(), BackendError> {
        for (k, step) in self.program.kernels.iter().zip(&self.steps) {
            if let Step::Bucket(b, points) = step {
                self.check_bucket(k, b, *points)?;
                continue;
            }
            match step {
                Step::Fused(f, n) => self.check_operands(k, f, *n, Some)?,
                Step::Reduce(r, finish) => {
                    let KernelKind::Reduce { shape, .. } = &k.kind else {
                        continue;
                    };
                    self.check_operands(k, r.prologue(), shape.iter().product(), Some)?;
                    if let Some(f) = finish {
                        // Operands before `results` are the kernel's own results.
                        self.check_operands(k, &f.program, f.points, |i| {
                            (i >= f.results).then(|| f.first_input + i - f.results)
                        })?;
                    }
                }
                Step::Fixed {
                    epilogue,
                    prologue,
                    finish,
                } => {
                    if let Some(f) = epilogue {
                        self.check_epilogue_outputs(k)?;
                        let points = self.program.buffers[k.outputs[0].0 as usize].len();
                        // Operand 0 is the kernel's own result.
                        let main = k.kind.main_inputs();
                        self.check_operands(k, f, points, |i| (i > 0).then(|| main + i - 1))?;
                    }
                    if let Some(f) = finish {
                        // Operands before `results` are the epilogue's per-channel results.
                        self.check_operands(k, &f.program, f.points, |i| {
                            (i >= f.results).then(|| f.first_input + i - f.results)
                        })?;
                    }
                    if let (
                        Some(f),
                        Some(p),
                        KernelKind::Conv2d(g, ..) | KernelKind::Conv2dBackpropFilter(g, ..),
                    ) = (prologue, k.kind.prologue(), &k.kind)
                    {
                        let points = prologue_space(g).iter().product();
                        self.check_operands(k, f, points, |i| Some(p.input_of(i)))?;
                    }
                }
                Step::Bucket(..) => {}
            }
        }
        Ok(())
    }

    /// Checks that each operand `i` of `prog`, run over `points`, stays inside the buffer of
    /// the kernel input `input_of(i)` (`None`: an operand that is no kernel input).
    fn check_operands(
        &self,
        k: &Kernel,
        prog: &FusedProgram,
        points: usize,
        input_of: impl Fn(usize) -> Option<usize>,
    ) -> Result<(), BackendError> {
        for i in 0..prog.operands() {
            let Some(input) = input_of(i) else { continue };
            let Some(v) = k.inputs.get(input) else {
                return Err(kernel_error(
                    k,
                    format!("operand {i} reads input {input}, which the kernel does not have"),
                ));
            };
            let len = self.program.buffers[v.buffer.0 as usize].len();
            if prog.access(i).extent(points) > len {
                return Err(kernel_error(
                    k,
                    format!(
                        "operand {input} reads past the end of buffer {} ({len} elements)",
                        v.buffer
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that an epilogue's stored outputs hold the kernel's output points and its
    /// reductions one value per channel (the output's last axis).
    fn check_epilogue_outputs(&self, k: &Kernel) -> Result<(), BackendError> {
        let Some(e) = k.kind.epilogue() else {
            return Ok(());
        };
        let out = self.program.buffer(k.outputs[0]);
        let channels = out.shape.last().copied().unwrap_or(1);
        let finished = e.finish.as_ref().map_or(0, |f| f.expr.outputs.len());
        for (j, b) in k.outputs.iter().enumerate() {
            let want = if j < e.stored_outputs() {
                out.len()
            } else {
                channels
            };
            let got = self.program.buffer(*b).len();
            if got != want || k.outputs.len() != e.expr.outputs.len() + finished {
                return Err(kernel_error(
                    k,
                    format!("epilogue output {j} ({b}) has {got} elements, expected {want}"),
                ));
            }
        }
        Ok(())
    }

    /// Checks that every operand of a fused update kernel stays inside its buffer and every
    /// output holds the kernel's points.
    fn check_bucket(
        &self,
        k: &Kernel,
        b: &BucketProgram,
        points: usize,
    ) -> Result<(), BackendError> {
        for (i, v) in k.inputs.iter().enumerate().take(b.operands()) {
            let len = self.program.buffer(v.buffer).len();
            if b.extent(i, points) > len {
                return Err(kernel_error(
                    k,
                    format!(
                        "operand {i} reads past the end of buffer {} ({len} elements)",
                        v.buffer
                    ),
                ));
            }
        }
        if let Some(o) = k
            .outputs
            .iter()
            .find(|o| self.program.buffer(**o).len() < points)
        {
            return Err(kernel_error(
                k,
                format!("output {o} is shorter than {points}"),
            ));
        }
        Ok(())
    }

    /// The raw buffer behind `b`, given the session's state arenas.
    pub fn raw(
        &mut self,
        state: &mut [Arena],
        b: crate::lower::BufferId,
    ) -> Result<RawBuf, BackendError> {
        let buf = &self.program.buffers[b.0 as usize];
        let base = match buf.storage {
            Storage::Scratch { device, offset } => {
                self.scratch[usize::from(device)].ptr().wrapping_add(offset)
            }
            Storage::State { device, offset } => {
                let arena = state.get_mut(usize::from(device)).ok_or_else(|| {
                    BackendError::Unavailable {
                        backend: "cpu".into(),
                        reason: format!("no state arena for device {device}"),
                    }
                })?;
                arena.ptr().wrapping_add(offset)
            }
            Storage::Constant(i) => self
                .constants
                .ptr()
                .wrapping_add(self.constant_offsets[i as usize]),
        };
        Ok(RawBuf {
            ptr: base,
            dtype: buf.dtype,
            len: buf.len(),
        })
    }

    /// Fills the scratch arenas with the poison pattern (before a step's feeds).
    pub fn poison_scratch(&mut self) {
        for a in &mut self.scratch {
            a.poison();
        }
    }

    /// Starts (or stops) timing each kernel.
    pub fn set_profiling(&mut self, on: bool) {
        self.timings = on.then(|| vec![(std::time::Duration::ZERO, 0); self.program.kernels.len()]);
    }

    /// Lets bf16 convolutions run on AMX tiles where the CPU has them (off by default).
    pub fn set_bf16_tiles(&mut self, on: bool) {
        self.bf16_tiles = on;
    }

    /// Lets f32 convolutions run Winograd where it pays off (on by default; never in a bf16 or
    /// fp16 program).
    pub fn set_winograd(&mut self, on: bool) {
        self.conv_algorithm = exact_products_or_auto(&self.program, on);
    }

    /// Per kernel: its total wall time and number of runs, if profiling.
    pub fn timings(&self) -> Option<&[(std::time::Duration, u64)]> {
        self.timings.as_deref()
    }

    /// True when every kernel is small enough to run on the calling thread.
    pub fn is_small(&self) -> bool {
        self.small
    }

    /// Resolves every kernel's buffers against the session's state arenas (once).
    pub(super) fn bind(&mut self, state: &mut [Arena]) -> Result<(), BackendError> {
        if !self.bound.is_empty() || self.program.kernels.is_empty() {
            return Ok(());
        }
        let mut bound = Vec::with_capacity(self.program.kernels.len());
        for i in 0..self.program.kernels.len() {
            let ins: Vec<crate::lower::BufferId> = self.program.kernels[i]
                .inputs
                .iter()
                .map(|v| v.buffer)
                .collect();
            let outs = self.program.kernels[i].outputs.clone();
            let ins = ins
                .into_iter()
                .map(|b| self.raw(state, b))
                .collect::<Result<Vec<_>, _>>()?;
            let outs = outs
                .into_iter()
                .map(|b| self.raw(state, b))
                .collect::<Result<Vec<_>, _>>()?;
            bound.push((ins, outs));
        }
        self.bound = bound;
        Ok(())
    }

    /// Runs every kernel in order.
    pub fn run_kernels(
        &mut self,
        state: &mut [Arena],
        threads: usize,
        collective: Option<&dyn Collective>,
    ) -> Result<(), BackendError> {
        self.bind(state)?;
        for i in 0..self.program.kernels.len() {
            let start = self.timings.is_some().then(std::time::Instant::now);
            self.run_one(i, threads, collective)?;
            if let (Some(t), Some(start)) = (self.timings.as_mut(), start) {
                t[i].0 += start.elapsed();
                t[i].1 += 1;
            }
        }
        Ok(())
    }

    /// Runs kernel `i` on its bound buffers (after [`Self::bind`]) with `threads` workers.
    pub(super) fn run_one(
        &self,
        i: usize,
        threads: usize,
        collective: Option<&dyn Collective>,
    ) -> Result<(), BackendError> {
        let (ins, outs) = &self.bound[i];
        let k = &self.program.kernels[i];
        if let KernelKind::AllReduce { op, len } = &k.kind {
            all_reduce(k, &ins[0], &outs[0], *op, *len, collective)
        } else {
            let conv = ConvChoice {
                algorithm: self.conv_algorithm,
                bf16_tiles: self.bf16_tiles,
            };
            run_kernel(k, &self.steps[i], ins, outs, threads, conv).map_err(|e| kernel_error(k, e))
        }
    }

    /// Adds one run of kernel `i` taking `elapsed` to the profile, when profiling.
    pub(super) fn record_time(&mut self, i: usize, elapsed: std::time::Duration) {
        if let Some(t) = self.timings.as_mut() {
            t[i].0 += elapsed;
            t[i].1 += 1;
        }
    }

    /// True when profiling.
    pub(super) fn profiling(&self) -> bool {
        self.timings.is_some()
    }
}

/// `y = all_reduce(x)`: a copy (none when `y` is `x` itself: a bucket reduced in place),
/// reduced across the participants when a collective is set.
fn all_reduce(
    k: &Kernel,
    x: &RawBuf,
    y: &RawBuf,
    op: crate::ir::ReduceOp,
    len: usize,
    collective: Option<&dyn Collective>,
) -> Result<(), BackendError> {
    let offset = k.inputs[0].offset;
    if x.dtype != DType::F32 || y.dtype != DType::F32 || offset + len > x.len || len > y.len {
        return Err(kernel_error(
            k,
            format!(
                "all-reduce of {len} f32 elements from {} and {}",
                x.dtype, y.dtype
            ),
        ));
    }
    let in_place = k.inputs[0].buffer == k.outputs[0];
    if in_place && offset != 0 {
        return Err(kernel_error(
            k,
            format!("in-place all-reduce from element {offset} of its own buffer"),
        ));
    }
    // SAFETY: bounds checked above; the output is this kernel's own buffer, and either the
    // input itself (in place) or a buffer the planner never overlaps with the input.
    let out = unsafe { y.f32_slice_mut(0, len) };
    if !in_place {
        // SAFETY: as above.
        out.copy_from_slice(unsafe { x.f32_slice(offset, len) });
    }
    if let Some(c) = collective.filter(|c| c.size() > 1) {
        c.all_reduce(out, op)?;
    }
    Ok(())
}

/// Element offset of a view as a contiguous slice of `len` elements of `raw`.
fn slice<'a>(
    raw: &RawBuf,
    view: &View,
    len: usize,
    what: &'static str,
) -> Result<&'a [f32], KernelError> {
    if raw.dtype != DType::F32 || view.offset + len > raw.len {
        return Err(KernelError::Shape {
            kernel: what,
            message: format!(
                "operand is {} with {} elements, needs f32 {}+{len}",
                raw.dtype, raw.len, view.offset
            ),
        });
    }
    // SAFETY: bounds just checked; the planner never overlaps a kernel's inputs and outputs
    // except for elementwise kernels, which do not come here.
    Ok(unsafe { raw.f32_slice(view.offset, len) })
}

fn slice_mut<'a>(raw: &RawBuf, what: &'static str) -> Result<&'a mut [f32], KernelError> {
    if raw.dtype != DType::F32 {
        return Err(KernelError::Shape {
            kernel: what,
            message: format!("output is {}, expected f32", raw.dtype),
        });
    }
    // SAFETY: outputs of fixed-function kernels never alias their inputs (memory planner).
    Ok(unsafe { raw.f32_slice_mut(0, raw.len) })
}

fn conv_geometry(g: &ConvGeom) -> Conv2dGeometry {
    Conv2dGeometry {
        batch: g.n,
        in_hw: [g.h, g.w],
        in_channels: g.c,
        out_channels: g.o,
        kernel_hw: [g.kh, g.kw],
        strides: g.stride,
        dilations: g.dilation,
        padding: Padding2d {
            top: g.pad[0],
            bottom: g.pad[1],
            left: g.pad[2],
            right: g.pad[3],
        },
        groups: g.groups,
    }
}

fn pool_geometry(g: &PoolGeom) -> Pool2dGeometry {
    Pool2dGeometry {
        batch: g.n,
        in_hw: [g.h, g.w],
        channels: g.c,
        window: g.window,
        strides: g.stride,
        padding: Padding2d {
            top: g.pad[0],
            bottom: g.pad[1],
            left: g.pad[2],
            right: g.pad[3],
        },
    }
}

/// A block's share of an epilogue's reductions: its first row, its column sums (one `cols` run
/// per reduction), and its sums of each variance.
type BlockPartial = (usize, Vec<f64>, Vec<ShiftedColumnMoments>);

/// A fused epilogue as a kernel-library [`Epilogue`].
struct FusedEpilogue<'a> {
    program: &'a FusedProgram,
    inputs: Vec<RawBuf>,
    outputs: Vec<RawBuf>,
    /// Flat position of row 0 of the block the kernel hands over.
    base: usize,
    /// Outputs stored per point; the rest are per-channel reductions (`ops`).
    stored: usize,
    ops: &'a [ChannelReduction],
    /// Per-block column sums of the reductions, keyed by the block's first row.
    partials: Mutex<Vec<BlockPartial>>,
    /// The epilogue's finish and its operands (the per-channel results, then its inputs).
    finish: Option<(&'a FinishStep, Vec<RawBuf>)>,
}

impl Epilogue for FusedEpilogue<'_> {
    fn apply(&self, rows: &mut [f32], first_row: usize, cols: usize) {
        self.run(rows, first_row, cols, None);
    }

    fn apply_to_bf16(&self, rows: &mut [f32], first_row: usize, cols: usize, bits: &mut [u16]) {
        self.run(rows, first_row, cols, Some(bits));
    }

    /// Blocks of whole [`CHUNK`]s of values when there are reductions: the chunks' f32 partial
    /// sums are then the reduction kernel's (which sums the same chunks of the whole output).
    /// The fewest rows of `cols` values that make whole chunks: `CHUNK / gcd(CHUNK, cols)`,
    /// which for a power-of-two `CHUNK` drops the factors of two `cols` brings.
    fn block_rows_multiple(&self, cols: usize) -> usize {
        if self.ops.is_empty() || cols == 0 {
            1
        } else {
            CHUNK >> cols.trailing_zeros().min(CHUNK.trailing_zeros())
        }
    }
}

impl FusedEpilogue<'_> {
    /// Runs the program on a finished block of rows: output 0 back into the rows, or rounded
    /// into `bf16`; the block's column sums kept for [`FusedEpilogue::finish`].
    fn run(&self, rows: &mut [f32], first_row: usize, cols: usize, bf16: Option<&mut [u16]>) {
        let mut sums = vec![0.0; self.ops.len() * cols];
        let first = self.base + first_row * cols;
        let (inputs, outputs, stored) = (&self.inputs, &self.outputs, self.stored);
        // SAFETY: operand extents were checked when the program was prepared; the kernel hands
        // out disjoint row blocks, so the extra outputs' positions are disjoint too.
        unsafe {
            match bf16 {
                None => self
                    .program
                    .run_epilogue(rows, first, inputs, outputs, stored, cols, &mut sums),
                Some(bits) => self.program.run_epilogue_to_bf16(
                    rows, first, inputs, outputs, stored, cols, &mut sums, bits,
                ),
            }
        };
        if !self.ops.is_empty() {
            // Variances of output 0, now in the rows (`check_variances`): the block's sums
            // about its first row.
            let variances = self
                .ops
                .iter()
                .filter(|&&o| o == ChannelReduction::Variance);
            let moments = variances
                .map(|_| ShiftedColumnMoments::of_rows(rows, cols))
                .collect();
            // A poisoned lock means another block panicked; its partial is simply missing.
            let mut partials = self.partials.lock().unwrap_or_else(|e| e.into_inner());
            partials.push((first_row, sums, moments));
        }
    }

    /// Writes the reductions after the kernel ran over `rows × cols` outputs: the blocks' sums
    /// are added in row order (so results depend only on the block boundaries, which depend on
    /// the shapes and the thread count), means divided by `rows`.
    fn finish(self, rows: usize, cols: usize) {
        if self.ops.is_empty() {
            return;
        }
        let mut partials = self
            .partials
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        partials.sort_by_key(|(first_row, ..)| *first_row);
        let mut variance = 0;
        for (j, op) in self.ops.iter().enumerate() {
            if *op == ChannelReduction::Variance {
                // The blocks' sums merged in row order.
                let mut total = ShiftedColumnMoments::of_rows(&[], cols);
                for (_, _, moments) in &partials {
                    if let Some(m) = moments.get(variance) {
                        total.merge(m);
                    }
                }
                variance += 1;
                for (c, v) in total.variances().into_iter().enumerate() {
                    // SAFETY: as below.
                    unsafe { self.outputs[self.stored + j].set_f64(c, v) };
                }
                continue;
            }
            let mut total = vec![0.0f64; cols];
            for (_, sums, _) in &partials {
                for (t, x) in total.iter_mut().zip(&sums[j * cols..(j + 1) * cols]) {
                    *t += x;
                }
            }
            let scale = match op {
                ChannelReduction::Mean => 1.0 / rows.max(1) as f64,
                // Variances are merged above: sums and means only reach here.
                ChannelReduction::Sum | ChannelReduction::Variance => 1.0,
            };
            for (c, t) in total.iter().enumerate() {
                // SAFETY: a reduction output holds `cols` elements (checked at preparation)
                // and belongs to this kernel.
                unsafe { self.outputs[self.stored + j].set_f64(c, t * scale) };
            }
        }
        if let Some((f, operands)) = &self.finish {
            let results = self.stored + f.results;
            // SAFETY: extents checked at preparation; the results were stored just now, and the
            // finish's outputs are the kernel's own, distinct from them.
            unsafe {
                f.program
                    .run(0, f.points, operands, &self.outputs[results..])
            };
        }
    }
}

/// Epilogue variances are computed from the kernel's first output as stored in f32 (the rows the
/// kernel hands over): each must be the variance of that value (as lowering makes them).
fn check_variances(
    program: &Program,
    k: &Kernel,
    e: &crate::lower::Epilogue,
) -> Result<(), BackendError> {
    let stored = e.stored_outputs();
    for (j, r) in e.reductions.iter().enumerate() {
        let first = e.expr.outputs.first();
        let of_first = stored > 0 && e.expr.outputs.get(stored + j) == first;
        let f32_rows = k
            .outputs
            .first()
            .is_some_and(|&b| program.buffer(b).dtype == DType::F32);
        if *r == ChannelReduction::Variance && !(of_first && f32_rows) {
            return Err(kernel_error(
                k,
                "an epilogue variance the CPU kernels compute only of the first output, in f32",
            ));
        }
    }
    Ok(())
}

fn epilogue<'a>(
    step: &'a Step,
    k: &'a Kernel,
    ins: &[RawBuf],
    outs: &[RawBuf],
    base: usize,
) -> Option<FusedEpilogue<'a>> {
    match (step, k.kind.epilogue()) {
        (
            Step::Fixed {
                epilogue: Some(program),
                finish,
                ..
            },
            Some(e),
        ) => {
            // Operand 0 is the rows themselves; the placeholder is never read.
            let mut inputs = vec![outs[0]];
            inputs.extend_from_slice(&ins[k.kind.epilogue_inputs(ins.len())]);
            let finish = finish.as_deref().map(|f| {
                let stored = e.stored_outputs();
                let operands = outs[stored..stored + f.results]
                    .iter()
                    .chain(ins.get(f.first_input..).unwrap_or_default())
                    .copied()
                    .collect();
                (f, operands)
            });
            Some(FusedEpilogue {
                program,
                inputs,
                outputs: outs.to_vec(),
                base,
                stored: e.stored_outputs(),
                ops: &e.reductions,
                partials: Mutex::new(Vec::new()),
                finish,
            })
        }
        _ => None,
    }
}

/// The two operands of a matrix product as it multiplies them: themselves, or copies rounded to the
/// 16-bit format of the kernel's `round_operands`.
enum Operands<'a> {
    Plain(&'a [f32], &'a [f32]),
    Rounded(RoundedOperand, RoundedOperand),
}

impl<'a> Operands<'a> {
    fn new(a: &'a [f32], b: &'a [f32], round: Option<HalfFormat>, threads: usize) -> Self {
        match round {
            Some(f) => Operands::Rounded(rounded(a, f, threads), rounded(b, f, threads)),
            None => Operands::Plain(a, b),
        }
    }

    fn get(&self) -> (&[f32], &[f32]) {
        match self {
            Operands::Plain(a, b) => (a, b),
            Operands::Rounded(a, b) => (a, b),
        }
    }
}

/// A copy of a GEMM operand rounded to `format` ([`HalfFormat::round`]), made in parallel
/// chunks when it is large: the kernel then multiplies exactly the 16-bit values. The copy's
/// buffer comes from, and returns to, a per-thread pool, so steady-state steps allocate
/// nothing and touch no fresh pages.
fn rounded(x: &[f32], format: HalfFormat, threads: usize) -> RoundedOperand {
    const CHUNK_LEN: usize = 1 << 16;
    let mut buf = ROUNDED_POOL
        .with(|p| p.borrow_mut().pop())
        .unwrap_or_default();
    buf.clear();
    buf.resize(x.len(), 0.0);
    if x.len() > CHUNK_LEN && threads > 1 {
        buf.par_chunks_mut(CHUNK_LEN)
            .zip(x.par_chunks(CHUNK_LEN))
            .for_each(|(o, x)| kernels::round::round_operand(format, x, o));
    } else {
        kernels::round::round_operand(format, x, &mut buf);
    }
    RoundedOperand(buf)
}

thread_local! {
    /// Buffers of rounded operands not in use (at most two are taken at once).
    static ROUNDED_POOL: std::cell::RefCell<Vec<Vec<f32>>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

/// A rounded operand; its buffer goes back to the pool when dropped.
struct RoundedOperand(Vec<f32>);

impl std::ops::Deref for RoundedOperand {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl Drop for RoundedOperand {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        ROUNDED_POOL.with(|p| p.borrow_mut().push(buf));
    }
}

/// Whether a convolution pass whose operands round to `round` runs on the bf16 AMX tiles: bf16
/// operands and a geometry the tile kernels take at the SIMD level in force, and run faster.
fn on_tiles(round: Option<HalfFormat>, g: &Conv2dGeometry, pass: ConvPass) -> bool {
    round == Some(HalfFormat::Bf16) && kernels::bf16_tiles_preferred(g, pass)
}

/// How a program's convolutions run: the algorithm choice and whether bf16 ones may take the
/// AMX tiles.
#[derive(Clone, Copy)]
struct ConvChoice {
    algorithm: kernels::ConvAlgorithm,
    bf16_tiles: bool,
}

/// The automatic convolution choice for `program`: without Winograd in bf16 and fp16 programs
/// (their convolutions sum the exact products of 16-bit operands, whether the kernel rounds
/// them or explicit casts did) and where `winograd` is off.
fn exact_products_or_auto(program: &Program, winograd: bool) -> kernels::ConvAlgorithm {
    let half = matches!(program.precision, Precision::Bf16 | Precision::Fp16);
    if winograd && !half {
        kernels::ConvAlgorithm::Auto
    } else {
        kernels::ConvAlgorithm::AutoDirect
    }
}

fn run_kernel(
    k: &Kernel,
    step: &Step,
    ins: &[RawBuf],
    outs: &[RawBuf],
    threads: usize,
    conv: ConvChoice,
) -> Result<(), KernelError> {
    let (auto, bf16_tiles) = (conv.algorithm, conv.bf16_tiles);
    match (&k.kind, step) {
        (KernelKind::Elementwise { .. }, Step::Fused(f, points)) => {
            let points = *points;
            if points < PARALLEL_POINTS || threads <= 1 {
                // SAFETY: extents checked at preparation; one thread owns the outputs.
                unsafe { f.run(0, points, ins, outs) };
            } else {
                let chunks = points.div_ceil(CHUNK);
                let blocks = (threads * 4).min(chunks);
                let per = chunks.div_ceil(blocks) * CHUNK;
                (0..blocks).into_par_iter().for_each(carry(|b: usize| {
                    let (s, e) = ((b * per).min(points), ((b + 1) * per).min(points));
                    // SAFETY: as above; blocks write disjoint output ranges.
                    unsafe { f.run(s, e, ins, outs) };
                }));
            }
            Ok(())
        }
        (KernelKind::Elementwise { .. }, Step::Bucket(b, points)) => {
            let points = *points;
            if points < PARALLEL_POINTS || threads <= 1 {
                // SAFETY: extents checked at preparation; one thread owns the outputs.
                unsafe { b.run(0, points, ins, outs) };
            } else {
                let per = points.div_ceil(threads * 4).div_ceil(CHUNK) * CHUNK;
                (0..points.div_ceil(per))
                    .into_par_iter()
                    .for_each(carry(|i: usize| {
                        let (s, e) = (i * per, ((i + 1) * per).min(points));
                        // SAFETY: as above; blocks write disjoint output ranges.
                        unsafe { b.run(s, e, ins, outs) };
                    }));
            }
            Ok(())
        }
        (KernelKind::Reduce { .. }, Step::Reduce(r, finish)) => {
            // SAFETY: extents checked at preparation; outputs are this kernel's own.
            unsafe { r.run(ins, outs, threads) };
            if let Some(f) = finish {
                let operands: SmallVec<[RawBuf; 8]> = outs[..f.results]
                    .iter()
                    .chain(ins.get(f.first_input..).unwrap_or_default())
                    .copied()
                    .collect();
                // SAFETY: as above; the results were stored by the reduction just now, and the
                // finish's outputs are the kernel's own, distinct from them.
                unsafe { f.program.run(0, f.points, &operands, &outs[f.results..]) };
            }
            Ok(())
        }
        (KernelKind::MatMul(g, _), _) => {
            let (a_len, b_len) = (g.m * g.k, g.k * g.n);
            let a_all = slice(&ins[0], &k.inputs[0], g.batch * a_len, "matmul")?;
            let b_all = slice(
                &ins[1],
                &k.inputs[1],
                if g.rhs_batched { g.batch } else { 1 } * b_len,
                "matmul",
            )?;
            let operands = Operands::new(a_all, b_all, g.round_operands, threads);
            let (a_all, b_all) = operands.get();
            let c_all = slice_mut(&outs[0], "matmul")?;
            for i in 0..g.batch {
                let a = &a_all[i * a_len..(i + 1) * a_len];
                let b = if g.rhs_batched {
                    &b_all[i * b_len..(i + 1) * b_len]
                } else {
                    b_all
                };
                let a = if g.transpose_a {
                    MatRef::transposed(a, g.m)
                } else {
                    MatRef::row_major(a, g.k)
                };
                let b = if g.transpose_b {
                    MatRef::transposed(b, g.k)
                } else {
                    MatRef::row_major(b, g.n)
                };
                let c = &mut c_all[i * g.m * g.n..(i + 1) * g.m * g.n];
                match epilogue(step, k, ins, outs, i * g.m * g.n) {
                    Some(e) => kernels::sgemm_with_epilogue(g.m, g.n, g.k, 1.0, a, b, 0.0, c, &e)?,
                    None => kernels::sgemm(g.m, g.n, g.k, 1.0, a, b, 0.0, c, g.n)?,
                }
            }
            Ok(())
        }
        (KernelKind::Conv2d(g, ..), _) => {
            let cg = conv_geometry(g);
            let computed = prologue_input(step, k, ins);
            let widened = bf16_input(ins, k, cg.input_len(), "conv2d")?;
            let x = conv_input(&computed, &widened, ins, k, cg.input_len(), "conv2d")?;
            let w = slice(&ins[1], &k.inputs[1], cg.filter_len(), "conv2d")?;
            let tiles = bf16_tiles && on_tiles(g.round_operands, &cg, ConvPass::Forward);
            // The vector kernels round the operands themselves as they copy them; the tiles
            // take bf16 as they pack.
            let forward = |cg: &Conv2dGeometry,
                           x: kernels::ConvInput<'_>,
                           y: &mut [f32],
                           e: &dyn kernels::Epilogue| {
                if tiles {
                    kernels::conv2d_forward_bf16(cg, x, w, y, e)
                } else {
                    kernels::conv2d_forward_with(auto, cg, x, w, y, e, g.round_operands)
                }
            };
            let image_in = cg.input_len() / cg.batch.max(1);
            let image_out = cg.output_len() / cg.batch.max(1);
            let shape = (cg.batch, image_out, g.o);
            conv_output(step, k, (ins, outs), shape, "conv2d", |images, y, e| {
                let part = Conv2dGeometry {
                    batch: images.len(),
                    ..cg
                };
                let range = images.start * image_in..images.end * image_in;
                half_io::with_part(&x, range, |x| forward(&part, x, y, e))
            })
        }
        (KernelKind::Conv2dBackpropInput(g, _), _) => {
            let cg = conv_geometry(g);
            let dy = slice(
                &ins[0],
                &k.inputs[0],
                cg.output_len(),
                "conv2d_backprop_input",
            )?;
            let w = slice(
                &ins[1],
                &k.inputs[1],
                cg.filter_len(),
                "conv2d_backprop_input",
            )?;
            let tiles = bf16_tiles && on_tiles(g.round_operands, &cg, ConvPass::InputGradient);
            let backward = |cg: &Conv2dGeometry,
                            dy: &[f32],
                            dx: &mut [f32],
                            e: &dyn kernels::Epilogue| {
                if tiles {
                    kernels::conv2d_backward_input_bf16(cg, dy, w, dx, e)
                } else {
                    kernels::conv2d_backward_input_with(auto, cg, dy, w, dx, e, g.round_operands)
                }
            };
            let image_dy = cg.output_len() / cg.batch.max(1);
            let image_dx = cg.input_len() / cg.batch.max(1);
            let shape = (cg.batch, image_dx, g.c);
            let what = "conv2d_backprop_input";
            conv_output(step, k, (ins, outs), shape, what, |images, dx, e| {
                let part = Conv2dGeometry {
                    batch: images.len(),
                    ..cg
                };
                let dy = &dy[images.start * image_dy..images.end * image_dy];
                backward(&part, dy, dx, e)
            })
        }
        (KernelKind::Conv2dBackpropFilter(g, ..), _) => {
            let cg = conv_geometry(g);
            let computed = prologue_input(step, k, ins);
            let widened = bf16_input(ins, k, cg.input_len(), "conv2d_backprop_filter")?;
            let x = conv_input(
                &computed,
                &widened,
                ins,
                k,
                cg.input_len(),
                "conv2d_backprop_filter",
            )?;
            let dy = slice(
                &ins[1],
                &k.inputs[1],
                cg.output_len(),
                "conv2d_backprop_filter",
            )?;
            let dw = slice_mut(&outs[0], "conv2d_backprop_filter")?;
            let e = epilogue(step, k, ins, outs, 0);
            let cols = g.o.max(1);
            if let Some(e) = &e {
                e.check(dw.len() / cols, cols)?;
            }
            if bf16_tiles && on_tiles(g.round_operands, &cg, ConvPass::FilterGradient) {
                kernels::conv2d_backward_filter_bf16(&cg, x, dy, dw)?;
            } else {
                kernels::conv2d_backward_filter_with(auto, &cg, x, dy, dw, g.round_operands)?;
            }
            // The epilogue (a weight decay's term) over the whole filter at once: it is small.
            if let Some(e) = e {
                e.apply(dw, 0, cols);
            }
            Ok(())
        }
        (KernelKind::Pool(g), _) => {
            let pg = pool_geometry(g);
            let x = slice(&ins[0], &k.inputs[0], pg.input_len(), "pool")?;
            let y = slice_mut(&outs[0], "pool")?;
            match g.kind {
                PoolKind::Max => kernels::pool::max_pool_forward(&pg, x, y),
                PoolKind::Avg => kernels::pool::avg_pool_forward(&pg, x, y),
            }
        }
        (KernelKind::MaxPoolGrad(g), _) => {
            let pg = pool_geometry(g);
            let x = slice(&ins[0], &k.inputs[0], pg.input_len(), "max_pool_grad")?;
            let dy = slice(&ins[1], &k.inputs[1], pg.output_len(), "max_pool_grad")?;
            kernels::pool::max_pool_backward(&pg, x, dy, slice_mut(&outs[0], "max_pool_grad")?)
        }
        (KernelKind::AvgPoolGrad(g), _) => {
            let pg = pool_geometry(g);
            let dy = slice(&ins[0], &k.inputs[0], pg.output_len(), "avg_pool_grad")?;
            kernels::pool::avg_pool_backward(&pg, dy, slice_mut(&outs[0], "avg_pool_grad")?)
        }
        (KernelKind::Softmax { rows, cols, log }, _) => {
            let x = slice(&ins[0], &k.inputs[0], rows * cols, "softmax")?;
            let y = slice_mut(&outs[0], "softmax")?;
            if *log {
                kernels::softmax::log_softmax(x, *cols, y)
            } else {
                kernels::softmax::softmax(x, *cols, y)
            }
        }
        (KernelKind::SparseSoftmaxCrossEntropy { rows, classes }, _) => {
            let logits = slice(
                &ins[0],
                &k.inputs[0],
                rows * classes,
                "sparse_softmax_cross_entropy",
            )?;
            let loss = slice_mut(&outs[0], "sparse_softmax_cross_entropy")?;
            let labels = labels(&ins[1], &k.inputs[1], *rows)?;
            kernels::softmax::sparse_softmax_cross_entropy(logits, &labels, *classes, loss)
        }
        (KernelKind::ArgMax { outer, len, inner }, _) => crate::backend::cpu::small::argmax(
            &ins[0],
            &k.inputs[0],
            &outs[0],
            *outer,
            *len,
            *inner,
        ),
        (
            KernelKind::InTopK {
                rows,
                classes,
                k: top,
            },
            _,
        ) => {
            let preds = slice(&ins[0], &k.inputs[0], rows * classes, "in_top_k")?;
            let targets = labels(&ins[1], &k.inputs[1], *rows)?;
            crate::backend::cpu::small::in_top_k(preds, &targets, *classes, *top, &outs[0])
        }
        (
            KernelKind::Concat {
                outer,
                sizes,
                inner: _,
            },
            _,
        ) => crate::backend::cpu::small::concat(ins, &k.inputs, &outs[0], *outer, sizes),
        (KernelKind::Pad { shape, pads }, _) => {
            crate::backend::cpu::small::pad(&ins[0], &k.inputs[0], &outs[0], shape, pads)
        }
        (kind, _) => Err(KernelError::Shape {
            kernel: "cpu",
            message: format!("kernel kind {} was prepared inconsistently", kind.name()),
        }),
    }
}

/// Runs a convolution of `batch` images whose output (`outs[0]`, `image_len` elements per
/// image in rows of `cols`) `run(images, y, e)` computes for `images` into `y` with the
/// epilogue `e`: an f32 output whole and in place, a bf16 one (`lower::half_storage`) a group
/// of images at a time (`half_io::by_images`); then the epilogue's reductions are written.
fn conv_output(
    step: &Step,
    k: &Kernel,
    (ins, outs): (&[RawBuf], &[RawBuf]),
    (batch, image_len, cols): (usize, usize, usize),
    what: &'static str,
    run: impl Fn(std::ops::Range<usize>, &mut [f32], &dyn Epilogue) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    let e = epilogue(step, k, ins, outs, 0);
    let none = kernels::NoEpilogue;
    let e_ref: &dyn Epilogue = match &e {
        Some(e) => e,
        None => &none,
    };
    if outs[0].dtype == DType::BF16 {
        half_io::by_images(&outs[0], (batch, image_len, cols), e_ref, run)?;
    } else {
        run(0..batch, slice_mut(&outs[0], what)?, e_ref)?;
    }
    if let Some(e) = e {
        e.finish(batch * image_len / cols.max(1), cols);
    }
    Ok(())
}

/// Integer labels as `i64`, whatever their stored integer type.
fn labels(raw: &RawBuf, view: &View, rows: usize) -> Result<Vec<i64>, KernelError> {
    if view.offset + rows > raw.len || !raw.dtype.is_int() {
        return Err(KernelError::Shape {
            kernel: "labels",
            message: format!(
                "labels are {} with {} elements, need {rows} integers",
                raw.dtype, raw.len
            ),
        });
    }
    // SAFETY: bounds checked above.
    Ok((0..rows)
        .map(|i| unsafe { raw.get_f64(view.offset + i) } as i64)
        .collect())
}
