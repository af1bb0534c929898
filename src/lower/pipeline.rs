//! Lowering as a list of named passes, run by one [`Pipeline`] that can verify the IR after
//! every pass, time each pass and print the IR after any of them (as MLIR's
//! `--verify-each`, `--mlir-timing` and `--print-ir-after-all` do).
//!
//! The IR a pass sees is one of three forms, in order ([`Lowered`]): the step's graph
//! ([`StepGraph`]: graph-to-graph rewrites), its kernels ([`KernelStage`]: fusion decisions
//! over drafts), and the [`Program`]. A pass takes one form and returns the same or the next.
//! The standard pipeline ([`Pipeline::standard`]) is:
//!
//! | pass | form | does |
//! |---|---|---|
//! | `extract` | → graph | the subgraph the step needs ([`passes::extract`]) |
//! | `expand` | graph | composite ops into primitives |
//! | `autocast` | graph | GEMM operands read through casts to bf16/fp16 and back (with a 16-bit `precision`, [`autocast`]) |
//! | `fold` | graph | constant folding and algebraic simplification (with `simplify`) |
//! | `cse` | graph | common subexpressions (with `simplify`) |
//! | `dce` | graph | dead code |
//! | `absorb-casts` | graph | GEMMs round their operands themselves, their casts go (with a 16-bit `precision` and `fuse`) |
//! | `kernelize` | graph → kernels | fusion groups, reductions absorbing producers, epilogues, convolution prologues (with `conv_prologues`) |
//! | `fuse-updates` | kernels | identical variable updates into one kernel per bucket (with `arena_fusion`) |
//! | `fuse-all-reduces` | kernels | a distributed step's all-reduces into one per bucket (with `arena_fusion`) |
//! | `half-storage` | kernels | activations stored in bf16 where their writers and readers can (with `precision` bf16 and `half_activations`, [`super::half_storage`]) |
//! | `emit` | kernels → program | scheduling, in-place assigns, buffers, memory plan, waits |
//! | `verify` | program | [`mod@super::verify`] (with `verify`) |
//!
//! Environment: `TOWERPACK_DUMP=after-all` (or a comma-separated list of pass names) prints
//! the IR after those passes on standard error; `TOWERPACK_TIME_PASSES=1` prints each pass's
//! time; `TOWERPACK_VERIFY_EACH=1` checks the IR after every pass (on in debug builds).

use super::arena::{self, ArenaKernel, ArenaOperand};
use super::autocast;
use super::collectives::{self, CollectiveBucket, CollectivePlan};
use super::kernelize::{self, Kernelized};
use super::layout::StateLayout;
use super::passes::{self, StepGraph};
use super::program::Program;
use super::{LowerError, LowerOptions, emit};
use crate::ir::{Graph, Step, Value};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// The kernels of a step between kernel formation and emission.
#[derive(Debug)]
pub struct KernelStage {
    /// The step's graph, as the graph passes left it.
    pub step_graph: StepGraph,
    pub kernels: Kernelized,
    /// Fused updates over contiguous variables ([`super::arena`]).
    pub arenas: Vec<ArenaKernel>,
    /// Bucket all-reduces of a distributed step ([`super::collectives`]).
    pub collectives: Vec<CollectiveBucket>,
    /// Where the graph's variables live.
    pub layout: StateLayout,
    /// The whole graph's plan of bucketed all-reduces.
    pub plan: CollectivePlan,
}

/// The IR between passes.
#[derive(Debug, Default)]
pub enum Lowered {
    /// Before `extract`.
    #[default]
    Start,
    Graph(StepGraph),
    Kernels(Box<KernelStage>),
    Program(Program),
}

impl Lowered {
    /// The form's name, for errors and dumps.
    pub fn form(&self) -> &'static str {
        match self {
            Lowered::Start => "nothing",
            Lowered::Graph(_) => "graph",
            Lowered::Kernels(_) => "kernels",
            Lowered::Program(_) => "program",
        }
    }

    /// The IR as text: the textual IR of the step's graph, a list of the kernels, or the
    /// printed program.
    pub fn print(&self) -> String {
        match self {
            Lowered::Start => String::new(),
            Lowered::Graph(sg) => {
                let mut text = crate::ir::text::print(&sg.graph);
                let mut rounded: Vec<String> = sg
                    .round_operands
                    .iter()
                    .map(|(&id, f)| {
                        format!(
                            "# `{}` rounds its operands to {f}\n",
                            sg.graph.node(id).name
                        )
                    })
                    .collect();
                rounded.sort();
                text.extend(rounded);
                text
            }
            Lowered::Kernels(k) => print_kernels(k),
            Lowered::Program(p) => p.to_string(),
        }
    }

    /// Checks the IR's invariants: the graph verifies; every kernel operand is computed by a
    /// kernel or is a graph leaf; the program passes [`mod@super::verify`].
    pub fn check(&self) -> Result<(), LowerError> {
        match self {
            Lowered::Start => Ok(()),
            Lowered::Graph(sg) => {
                crate::ir::verify(&sg.graph)?;
                Ok(())
            }
            Lowered::Kernels(k) => check_kernels(k),
            Lowered::Program(p) => Ok(super::verify::verify(p)?),
        }
    }
}

/// What every pass may read: the whole graph, the step, the batch size and the options.
pub struct PassContext<'a> {
    pub graph: &'a Graph,
    pub step: &'a Step,
    pub batch: usize,
    pub options: &'a LowerOptions,
}

/// One named step of lowering.
pub trait Pass {
    /// The name used by dumps, timings and errors (`kebab-case`).
    fn name(&self) -> &'static str;
    /// What the count [`Pass::run`] returns counts (`rewrites`, `kernels`, ...).
    fn counts(&self) -> &'static str {
        "rewrites"
    }
    /// Rewrites `ir`, returning it in the same form or the next, with a count of what it did
    /// ([`Pass::counts`]) when the pass counts.
    fn run(&self, ir: Lowered, cx: &PassContext) -> Result<(Lowered, Option<usize>), LowerError>;
}

/// Which passes print the IR after themselves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Dump {
    #[default]
    None,
    AfterAll,
    After(Vec<String>),
}

impl Dump {
    /// From `TOWERPACK_DUMP`: `after-all`, or pass names separated by commas.
    pub fn from_env() -> Dump {
        match std::env::var("TOWERPACK_DUMP") {
            Ok(v) if v == "after-all" => Dump::AfterAll,
            Ok(v) if !v.is_empty() => Dump::After(v.split(',').map(|s| s.trim().into()).collect()),
            _ => Dump::None,
        }
    }

    fn wants(&self, pass: &str) -> bool {
        match self {
            Dump::None => false,
            Dump::AfterAll => true,
            Dump::After(names) => names.iter().any(|n| n == pass),
        }
    }
}

/// What one pass did.
#[derive(Clone, Debug)]
pub struct PassRecord {
    pub name: &'static str,
    pub time: Duration,
    /// What the pass did, for passes that count: a number and its unit.
    pub count: Option<(usize, &'static str)>,
    /// The IR after the pass, when dumped.
    pub dump: Option<String>,
}

/// The passes one lowering ran, in order.
#[derive(Clone, Debug, Default)]
pub struct PassReport {
    pub passes: Vec<PassRecord>,
}

impl std::fmt::Display for PassReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: Duration = self.passes.iter().map(|p| p.time).sum();
        for p in &self.passes {
            write!(f, "{:>18} {:>9.3} ms", p.name, p.time.as_secs_f64() * 1e3)?;
            if let Some((n, unit)) = p.count {
                write!(f, "  {n} {unit}")?;
            }
            writeln!(f)?;
        }
        write!(f, "{:>18} {:>9.3} ms", "total", total.as_secs_f64() * 1e3)
    }
}

/// An ordered list of passes and how to run them.
pub struct Pipeline {
    passes: Vec<Box<dyn Pass>>,
    /// Check the IR after every pass ([`Lowered::check`]).
    pub verify_each: bool,
    /// Which passes keep a printout of the IR after themselves (in the report).
    pub dump: Dump,
}

impl Pipeline {
    /// An empty pipeline (add passes with [`Pipeline::push`]).
    pub fn new() -> Pipeline {
        Pipeline {
            passes: Vec::new(),
            verify_each: false,
            dump: Dump::None,
        }
    }

    /// Appends `pass`.
    pub fn push(&mut self, pass: impl Pass + 'static) -> &mut Pipeline {
        self.passes.push(Box::new(pass));
        self
    }

    /// The names of the passes, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// The passes `options` asks for (see the module documentation), verifying each in debug
    /// builds or with `TOWERPACK_VERIFY_EACH=1`, dumping what `TOWERPACK_DUMP` names.
    pub fn standard(options: &LowerOptions) -> Pipeline {
        let mut p = Pipeline::new();
        p.push(Extract).push(Expand);
        let half = options.precision.half_operands().is_some();
        if half {
            p.push(Autocast);
        }
        if options.simplify {
            p.push(Fold).push(Cse);
        }
        p.push(Dce);
        if half && options.fuse {
            p.push(AbsorbCasts);
        }
        p.push(Kernelize);
        if options.fuse && options.arena_fusion {
            p.push(FuseUpdates).push(FuseAllReduces);
        }
        if options.stores_half() {
            p.push(HalfStorage);
        }
        p.push(Emit);
        if options.verify {
            p.push(Verify);
        }
        p.verify_each = cfg!(debug_assertions)
            || std::env::var("TOWERPACK_VERIFY_EACH").is_ok_and(|v| v == "1");
        p.dump = Dump::from_env();
        p
    }

    /// Runs every pass on `step` of `graph` at `batch`; returns the program and what each pass
    /// did. An error of a pass, or of a check after it, names the pass.
    pub fn run(
        &self,
        graph: &Graph,
        step: &Step,
        batch: usize,
        options: &LowerOptions,
    ) -> Result<(Program, PassReport), LowerError> {
        let cx = PassContext {
            graph,
            step,
            batch,
            options,
        };
        let mut ir = Lowered::Start;
        let mut report = PassReport::default();
        for pass in &self.passes {
            let start = Instant::now();
            let (next, rewrites) = pass.run(ir, &cx)?;
            ir = next;
            let time = start.elapsed();
            if self.verify_each {
                ir.check().map_err(|e| LowerError::AfterPass {
                    pass: pass.name(),
                    source: Box::new(e),
                })?;
            }
            report.passes.push(PassRecord {
                name: pass.name(),
                time,
                count: rewrites.map(|n| (n, pass.counts())),
                dump: self.dump.wants(pass.name()).then(|| ir.print()),
            });
        }
        match ir {
            Lowered::Program(mut p) => {
                p.precision = options.precision;
                Ok((p, report))
            }
            other => Err(LowerError::Pipeline(format!(
                "the passes {:?} end with the {}, not a program",
                self.names(),
                other.form()
            ))),
        }
    }
}

impl Default for Pipeline {
    fn default() -> Pipeline {
        Pipeline::new()
    }
}

fn wrong_form(pass: &str, want: &str, got: &Lowered) -> LowerError {
    LowerError::Pipeline(format!(
        "pass `{pass}` takes the {want}, but the passes before it produced the {}",
        got.form()
    ))
}

/// The step graph of `ir`, or an error naming `pass`.
fn graph_of(pass: &str, ir: Lowered) -> Result<StepGraph, LowerError> {
    match ir {
        Lowered::Graph(sg) => Ok(sg),
        other => Err(wrong_form(pass, "graph", &other)),
    }
}

fn kernels_of(pass: &str, ir: Lowered) -> Result<Box<KernelStage>, LowerError> {
    match ir {
        Lowered::Kernels(k) => Ok(k),
        other => Err(wrong_form(pass, "kernels", &other)),
    }
}

/// `extract`: the subgraph the step needs.
pub struct Extract;
impl Pass for Extract {
    fn name(&self) -> &'static str {
        "extract"
    }
    fn run(&self, ir: Lowered, cx: &PassContext) -> Result<(Lowered, Option<usize>), LowerError> {
        match ir {
            Lowered::Start => Ok((Lowered::Graph(passes::extract(cx.graph, cx.step)?), None)),
            other => Err(wrong_form(self.name(), "nothing", &other)),
        }
    }
}

/// A graph-to-graph pass from a function returning its rewrite count.
macro_rules! graph_pass {
    ($(#[$doc:meta])* $ty:ident, $name:literal, |$sg:ident, $cx:ident| $body:expr) => {
        $(#[$doc])*
        pub struct $ty;
        impl Pass for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            fn run(
                &self,
                ir: Lowered,
                $cx: &PassContext,
            ) -> Result<(Lowered, Option<usize>), LowerError> {
                let mut $sg = graph_of(self.name(), ir)?;
                let n = $body?;
                Ok((Lowered::Graph($sg), Some(n)))
            }
        }
    };
}

graph_pass!(
    /// `expand`: composite ops into primitives.
    Expand, "expand", |sg, _cx| passes::expand(&mut sg)
);
graph_pass!(
    /// `autocast`: both operands of every GEMM read through a round trip to the precision's
    /// 16-bit format (bf16/fp16 only).
    Autocast, "autocast", |sg, cx| match cx.options.precision.half_operands() {
        Some(format) => autocast::insert_casts(&mut sg.graph, format),
        None => Ok(0),
    }
);
graph_pass!(
    /// `absorb-casts`: GEMM kernels round their operands themselves; the casts go.
    AbsorbCasts, "absorb-casts", |sg, _cx| autocast::absorb_casts(&mut sg)
);
graph_pass!(
    /// `fold`: constant folding and algebraic simplification.
    Fold, "fold", |sg, cx| passes::fold(&mut sg, cx.batch)
);
graph_pass!(
    /// `cse`: common subexpression elimination.
    Cse, "cse", |sg, _cx| passes::cse(&mut sg)
);
graph_pass!(
    /// `dce`: dead code elimination.
    Dce, "dce", |sg, _cx| passes::dce(&mut sg)
);

/// `kernelize`: kernel formation (fusion groups, reductions, epilogues, prologues).
pub struct Kernelize;
impl Pass for Kernelize {
    fn name(&self) -> &'static str {
        "kernelize"
    }
    fn counts(&self) -> &'static str {
        "kernels"
    }
    fn run(&self, ir: Lowered, cx: &PassContext) -> Result<(Lowered, Option<usize>), LowerError> {
        let sg = graph_of(self.name(), ir)?;
        let o = cx.options;
        let fusions = kernelize::Fusions {
            fuse: o.fuse,
            epilogue_reductions: o.epilogue_reductions,
            epilogue_variances: o.epilogue_variances,
            conv_prologues: o.conv_prologues,
        };
        let kernels = kernelize::kernelize(&sg, cx.batch, fusions)?;
        let count = kernels.drafts.iter().filter(|d| d.alive).count();
        // Bucketed all-reduces are planned on the whole graph: the same on every participant
        // of a job whatever its step.
        let stage = KernelStage {
            kernels,
            arenas: Vec::new(),
            collectives: Vec::new(),
            layout: StateLayout::new(cx.graph),
            plan: CollectivePlan::new(cx.graph, o.bucket_bytes)?,
            step_graph: sg,
        };
        Ok((Lowered::Kernels(Box::new(stage)), Some(count)))
    }
}

/// `fuse-updates`: identical per-variable updates into one kernel per bucket.
pub struct FuseUpdates;
impl Pass for FuseUpdates {
    fn name(&self) -> &'static str {
        "fuse-updates"
    }
    fn counts(&self) -> &'static str {
        "fused updates"
    }
    fn run(&self, ir: Lowered, cx: &PassContext) -> Result<(Lowered, Option<usize>), LowerError> {
        let mut k = kernels_of(self.name(), ir)?;
        let all_reduced = k.plan.value_slots(&k.kernels);
        let stage = &mut *k;
        stage.arenas = arena::fuse_updates(
            &stage.step_graph.graph,
            &mut stage.kernels,
            &stage.layout,
            cx.batch,
            cx.options.bucket_bytes,
            &all_reduced,
        );
        let n = stage.arenas.len();
        Ok((Lowered::Kernels(k), Some(n)))
    }
}

/// `fuse-all-reduces`: a distributed step's all-reduces into one in-place one per bucket.
pub struct FuseAllReduces;
impl Pass for FuseAllReduces {
    fn name(&self) -> &'static str {
        "fuse-all-reduces"
    }
    fn counts(&self) -> &'static str {
        "bucket all-reduces"
    }
    fn run(&self, ir: Lowered, cx: &PassContext) -> Result<(Lowered, Option<usize>), LowerError> {
        let mut k = kernels_of(self.name(), ir)?;
        let stage = &mut *k;
        stage.collectives = collectives::fuse_all_reduces(
            &stage.step_graph.graph,
            &mut stage.kernels,
            &stage.arenas,
            &stage.plan,
            cx.batch,
        );
        let n = stage.collectives.len();
        Ok((Lowered::Kernels(k), Some(n)))
    }
}

/// `half-storage`: activations stored in bf16 ([`super::half_storage`]).
pub struct HalfStorage;
impl Pass for HalfStorage {
    fn name(&self) -> &'static str {
        "half-storage"
    }
    fn counts(&self) -> &'static str {
        "values stored in bf16"
    }
    fn run(&self, ir: Lowered, cx: &PassContext) -> Result<(Lowered, Option<usize>), LowerError> {
        let mut k = kernels_of(self.name(), ir)?;
        let stage = &mut *k;
        let chosen = super::half_storage::choose(
            &stage.step_graph,
            &stage.kernels,
            cx.batch,
            &stage.arenas,
            &stage.collectives,
            cx.options.half_gradients,
        );
        super::half_storage::round_where_computed(&mut stage.kernels, &chosen);
        let n = chosen.len();
        stage.kernels.half_stored = chosen;
        Ok((Lowered::Kernels(k), Some(n)))
    }
}

/// `emit`: scheduling, buffers, the memory plan and the cross-device waits.
pub struct Emit;
impl Pass for Emit {
    fn name(&self) -> &'static str {
        "emit"
    }
    fn counts(&self) -> &'static str {
        "kernels"
    }
    fn run(&self, ir: Lowered, cx: &PassContext) -> Result<(Lowered, Option<usize>), LowerError> {
        let k = *kernels_of(self.name(), ir)?;
        let program = emit::emit(
            &k.step_graph,
            k.kernels,
            cx.batch,
            k.layout,
            (k.arenas, k.collectives),
            &k.plan,
            cx.options.in_place_assigns,
        )?;
        let n = program.kernels.len();
        Ok((Lowered::Program(program), Some(n)))
    }
}

/// `verify`: the program verifier ([`mod@super::verify`]).
pub struct Verify;
impl Pass for Verify {
    fn name(&self) -> &'static str {
        "verify"
    }
    fn run(&self, ir: Lowered, _cx: &PassContext) -> Result<(Lowered, Option<usize>), LowerError> {
        match ir {
            Lowered::Program(p) => {
                super::verify::verify(&p)?;
                Ok((Lowered::Program(p), None))
            }
            other => Err(wrong_form(self.name(), "program", &other)),
        }
    }
}

/// The kernels of a stage, one line each (drafts still alive, fused updates, bucket
/// all-reduces), with the graph values they read and write.
fn print_kernels(k: &KernelStage) -> String {
    let g = &k.step_graph.graph;
    let names = |vs: &mut dyn Iterator<Item = Value>| -> String {
        vs.map(|v| format!("%{}", g.value_name(v)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::new();
    for (i, d) in k.kernels.drafts.iter().enumerate().filter(|(_, d)| d.alive) {
        let _ = writeln!(
            out,
            "d{i} {} `{}` dev{} ({}) -> [{}]",
            d.kind.name(),
            d.name,
            d.device,
            names(&mut d.inputs.iter().map(|o| o.base)),
            names(&mut d.outputs.iter().copied())
        );
    }
    for a in &k.arenas {
        let arenas = a
            .operands
            .iter()
            .filter_map(|o| match o {
                ArenaOperand::Arena { values } => Some(values.len()),
                _ => None,
            })
            .count();
        let _ = writeln!(
            out,
            "fused update `{}` dev{} over {} elements of {} variables, {arenas} arena(s)",
            a.name,
            a.device,
            a.len(),
            a.sizes.len()
        );
    }
    for c in &k.collectives {
        let _ = writeln!(
            out,
            "bucket all-reduce `{}` dev{} over {} elements ({})",
            c.name,
            c.device,
            c.len(),
            names(&mut c.inputs.iter().copied())
        );
    }
    let _ = write!(
        out,
        "fetches: [{}]",
        names(&mut k.kernels.fetches.iter().map(|o| o.base))
    );
    out
}

/// Every operand of a live kernel (and every member of a fused update's arena) is an output
/// of a live kernel, a bucket all-reduce's result, or a graph leaf (input, variable read,
/// constant).
fn check_kernels(k: &KernelStage) -> Result<(), LowerError> {
    let g = &k.step_graph.graph;
    let bad = |node: String, reason: String| LowerError::Unsupported {
        node,
        op: "kernels".into(),
        reason,
    };
    let merged: HashSet<Value> = k
        .arenas
        .iter()
        .flat_map(|a| a.operands.iter())
        .filter_map(|o| match o {
            ArenaOperand::Arena { values } => Some(values.iter().copied()),
            _ => None,
        })
        .flatten()
        .collect();
    let leaf = |v: Value| {
        g.inputs(v.node).is_empty() || matches!(g.node(v.node).op, crate::ir::Op::Variable { .. })
    };
    // Computed by a live kernel that lists it among its outputs.
    let computed = |v: &Value| {
        k.kernels
            .producer
            .get(v)
            .and_then(|&p| k.kernels.drafts.get(p))
            .is_some_and(|d| d.alive && d.outputs.contains(v))
    };
    let collective_results: HashSet<Value> = k
        .collectives
        .iter()
        .flat_map(|c| c.outputs.iter().copied())
        .collect();
    for d in k.kernels.drafts.iter().filter(|d| d.alive) {
        for o in &d.inputs {
            if !computed(&o.base) && !leaf(o.base) && !collective_results.contains(&o.base) {
                return Err(bad(
                    d.name.clone(),
                    format!(
                        "reads `{}`, which no live kernel computes",
                        g.value_name(o.base)
                    ),
                ));
            }
        }
    }
    for v in merged {
        if !computed(&v) && !collective_results.contains(&v) && !leaf(v) {
            return Err(bad(
                g.value_name(v),
                "a fused update reads it, but no live kernel computes it".into(),
            ));
        }
    }
    Ok(())
}
