//! `CudaSession`: the CUDA backend behind the [`Session`] interface, on real GPUs or on emulated
//! devices (the same code above the [`Driver`]).
//!
//! Each distinct (step, batch size) is lowered, rendered, compiled and placed once
//! ([`Prepared`]). With [`CudaOptions::graphs`] (the default) the whole step — feeds copied in,
//! kernels, status words and fetches copied out, write-backs — is captured once as a graph and
//! replayed every step ([`graph`](super::graph)): the host synchronises once per step, only
//! when it fetches something. Otherwise (or when capture is unavailable, or the step all-reduces
//! through host memory) a run copies the feeds in, submits the kernels, reads the status words,
//! copies the fetches out and applies the write-backs, launch by launch. Logical device `d` of
//! the graph is driver device `d`; variables live in per-device state arenas laid out by
//! [`StateLayout`].

use super::driver::emulated::EmulatedDriver;
use super::driver::gpu::GpuDriver;
use super::driver::{DevicePtr, Driver};
use super::error::CudaError;
use super::graph::{GraphState, StepContext, StepGraph, Writeback, submit_writebacks};
use super::nvrtc::{self, Compiler};
use super::prepared::{ModuleCache, Prepared, SessionMemory};
use super::render::launch;
use crate::backend::binding::{self, ProgramCache};
pub use crate::backend::poison::PoisonScratch;
use crate::backend::{BackendError, Collective, Feed, Session, Step};
use crate::ir::{Graph, Op, Shape, TensorType, VarId, verify};
use crate::lower::{BufferId, LowerOptions, Precision, Program, StateLayout, lower};
use crate::tensor::HostTensor;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Options of the CUDA backend.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub lower: LowerOptions,
    /// Where compiled PTX is cached across runs (`None`: in memory only). Default:
    /// [`nvrtc::default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Capture each step as a graph and replay it (default on). Off: every step is submitted
    /// launch by launch (the results are bitwise the same).
    pub graphs: bool,
    /// Scratch poisoning on a GPU (emulated devices poison at least once, whatever this says).
    /// Default: [`PoisonScratch::from_environment`].
    pub poison_scratch: PoisonScratch,
    /// Let convolutions read their input through shared-memory windows loaded once per block,
    /// rather than once per filter tap, where the launch allows (tensor-core precisions): the
    /// forward and input-gradient GEMMs of stride 1 (`kernels/gemm_core.cuh` tp_window; bitwise
    /// the same results either way) and filter gradients (`kernels/conv2d_backprop_filter.cu`
    /// TP_FWIN; the same products summed in other partial sums, within the precision's bound
    /// of each other). Default: on, unless `TOWERPACK_CUDA_WINDOWS` is `0`, `off` or `false`
    /// (to compare the two on a GPU with one build; [`launch::WINDOWS_ENV`]).
    pub conv_windows: bool,
    /// Let convolutions compute their input as they stage it ([`LowerOptions::conv_prologues`]:
    /// batch norm's apply and ReLU in the forward and filter-gradient loaders, bitwise the
    /// values the elementwise kernel would have written) where [`CudaOptions::lower`] allows
    /// them too — never under [`Precision::Tf32`], whose tiles copy x with `cp.async`. Default
    /// off, unless `TOWERPACK_CUDA_PROLOGUES` is `1`, `on` or `true` ([`PROLOGUES_ENV`], to
    /// compare the two on a GPU with one build): the H100 performance model prices them slower
    /// than the launches they remove (ResNet-20 b128 bf16: 1,088 → 1,103 µs a step: the
    /// pipelined tiles read the per-channel operands again at every tap, and the kernels keep
    /// 3 blocks an SM to stay free of spills; docs/performance.md).
    pub conv_prologues: bool,
    /// Under [`Precision::Bf16`], store activations in bf16 where every kernel writing and
    /// reading them can ([`LowerOptions::half_activations`], `lower::half_storage`: as the CPU
    /// backend does): fused expressions load and store them as bf16, and the forward and
    /// filter-gradient convolutions load `x` as bf16 — its bits copied straight into their
    /// 16-bit stages, or widened in registers where they compute with it
    /// (`kernels/gemm_core.cuh` tp_bf16, tp_travel). Half the bytes of those activations
    /// written and read back. Default on, unless `TOWERPACK_CUDA_HALF_ACTIVATIONS` is `0`,
    /// `off` or `false` ([`HALF_ACTIVATIONS_ENV`], to compare the two on a GPU with one build).
    pub half_activations: bool,
    /// With [`CudaOptions::half_activations`], also store in bf16 the gradients convolutions
    /// read as `dy` ([`LowerOptions::half_gradients`]; the input- and filter-gradient
    /// convolutions load them as bf16, as the forward ones load `x`). Default on, unless
    /// `TOWERPACK_CUDA_HALF_GRADIENTS` is `0`, `off` or `false` ([`HALF_GRADIENTS_ENV`]).
    pub half_gradients: bool,
}

/// The environment variable that turns bf16 activation storage off by default (`0`, `off` or
/// `false`): [`CudaOptions::half_activations`].
pub const HALF_ACTIVATIONS_ENV: &str = "TOWERPACK_CUDA_HALF_ACTIVATIONS";

/// Whether [`HALF_ACTIVATIONS_ENV`] leaves bf16 activation storage on (read once).
pub fn half_activations_from_environment() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    switch_once(&ON, HALF_ACTIVATIONS_ENV, true)
}

/// The environment variable that turns bf16 storage of convolutions' `dy` off by default:
/// [`CudaOptions::half_gradients`].
pub const HALF_GRADIENTS_ENV: &str = "TOWERPACK_CUDA_HALF_GRADIENTS";

/// Whether [`HALF_GRADIENTS_ENV`] leaves bf16 storage of `dy` on (read once).
pub fn half_gradients_from_environment() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    switch_once(&ON, HALF_GRADIENTS_ENV, true)
}

/// The environment variable that turns convolution prologues on by default (`1`, `on` or
/// `true`): [`CudaOptions::conv_prologues`].
pub const PROLOGUES_ENV: &str = "TOWERPACK_CUDA_PROLOGUES";

/// Whether [`PROLOGUES_ENV`] turns convolution prologues on (read once).
pub fn prologues_from_environment() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    switch_once(&ON, PROLOGUES_ENV, false)
}

/// The environment variable (`1`, `on` or `true`) that makes [`CudaSession::emulated`]'s devices
/// execute nothing, so that a run (`resnet --device cuda-emu --bench`) times the host's share of
/// each step: the trainer, the data flow and the session, without the device's work.
pub const HOST_ONLY_ENV: &str = "TOWERPACK_EMU_HOST_ONLY";

/// The switch in `var` ([`launch::switch_from_environment`]), or `default` where it says
/// neither, read once into `cell`.
fn switch_once(cell: &OnceLock<bool>, var: &str, default: bool) -> bool {
    *cell.get_or_init(|| launch::switch_from_environment(var).unwrap_or(default))
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions {
            // Batch-norm statistics and gradient sums in convolution epilogues, as on the CPU
            // (rendered with per-block partials combined in a fixed order).
            lower: LowerOptions::default(),
            cache_dir: nvrtc::default_cache_dir(),
            graphs: true,
            poison_scratch: PoisonScratch::from_environment(),
            conv_windows: launch::windows_from_environment(),
            conv_prologues: prologues_from_environment(),
            half_activations: half_activations_from_environment(),
            half_gradients: half_gradients_from_environment(),
        }
    }
}

impl CudaOptions {
    /// The lowering options the CUDA session lowers with: [`CudaOptions::lower`] less what it
    /// is not asked for (bf16 activation storage unless [`CudaOptions::half_activations`], of
    /// convolutions' `dy` too with [`CudaOptions::half_gradients`]; convolution prologues
    /// unless [`CudaOptions::conv_prologues`] asks for them, and never under
    /// [`Precision::Tf32`]), with batch norm's variances in the convolutions' epilogues
    /// ([`LowerOptions::epilogue_variances`]). A program lowered with them renders; tests and
    /// reports that lower by themselves use this.
    pub fn lowering(&self) -> LowerOptions {
        let half_activations = self.half_activations && self.lower.half_activations;
        LowerOptions {
            conv_prologues: self.conv_prologues
                && self.lower.conv_prologues
                && self.lower.precision != Precision::Tf32,
            half_activations,
            half_gradients: self.half_gradients && half_activations,
            epilogue_variances: true,
            ..self.lower
        }
    }
}

/// A prepared program and its captured step.
struct Entry {
    prepared: Prepared,
    graph: GraphState,
    writebacks: Vec<Writeback>,
}

/// A graph bound to CUDA devices.
pub struct CudaSession {
    graph: Graph,
    layout: StateLayout,
    driver: Arc<dyn Driver>,
    compiler: Compiler,
    modules: ModuleCache,
    state: Vec<DevicePtr>,
    status: Vec<DevicePtr>,
    options: CudaOptions,
    /// The poisoning this session applies (the option, at least once on emulated devices).
    poison: PoisonScratch,
    programs: ProgramCache<Entry>,
    collective: Option<Arc<dyn Collective>>,
    /// A graph step that fetched nothing and was not synchronised: its program, whose status
    /// words are checked at the next synchronisation.
    pending: Mutex<Option<(Step, usize)>>,
    graph_replays: AtomicU64,
    graph_fallback: Option<String>,
}

/// The number of logical devices `graph` places nodes on (at least 1).
pub fn graph_devices(graph: &Graph) -> usize {
    graph
        .node_ids()
        .filter_map(|id| graph.node(id).device)
        .map(|d| usize::from(d) + 1)
        .max()
        .unwrap_or(1)
}

/// `devices`, or (for 0) one per logical device of `graph`.
fn devices_for(graph: &Graph, devices: usize) -> usize {
    if devices == 0 {
        graph_devices(graph)
    } else {
        devices
    }
}

impl CudaSession {
    /// Binds `graph` to `devices` GPUs of this machine (0: one per logical device of the
    /// graph). Without a driver, a GPU or NVRTC this is a clear error, never a panic.
    pub fn gpu(
        graph: Graph,
        devices: usize,
        options: CudaOptions,
    ) -> Result<CudaSession, BackendError> {
        let driver = GpuDriver::new(devices_for(&graph, devices))?;
        CudaSession::with_driver(graph, Arc::new(driver), options)
    }

    /// Binds `graph` to `devices` emulated devices (0: one per logical device of the graph).
    /// With [`HOST_ONLY_ENV`] on, the devices execute nothing
    /// ([`EmulatedDriver::set_host_only`]): the run measures the host's share of a step.
    pub fn emulated(
        graph: Graph,
        devices: usize,
        options: CudaOptions,
    ) -> Result<CudaSession, BackendError> {
        let driver = EmulatedDriver::new(devices_for(&graph, devices));
        if launch::switch_from_environment(HOST_ONLY_ENV) == Some(true) {
            log::warn!(
                target: "towerpack",
                "{HOST_ONLY_ENV}: the emulated devices execute nothing; every result is garbage"
            );
            driver.set_host_only(true);
        }
        CudaSession::with_driver(graph, Arc::new(driver), options)
    }

    /// Binds `graph` (verified first) to fresh, zeroed variables on `driver`'s devices.
    pub fn with_driver(
        graph: Graph,
        driver: Arc<dyn Driver>,
        options: CudaOptions,
    ) -> Result<CudaSession, BackendError> {
        verify(&graph)?;
        let compiler = Compiler::new(options.cache_dir.clone())?;
        log::info!(
            target: "towerpack",
            "CUDA kernels compile with {}",
            nvrtc::describe()?
        );
        let layout = StateLayout::new(&graph);
        let devices = driver.devices();
        if layout.arena_bytes.len() > devices {
            return Err(CudaError::NoDevice {
                found: devices,
                needed: layout.arena_bytes.len(),
            }
            .into());
        }
        let mut state = Vec::with_capacity(devices);
        let mut status = Vec::with_capacity(devices);
        for d in 0..devices {
            state.push(driver.alloc(d, layout.arena_bytes.get(d).copied().unwrap_or(0))?);
            status.push(driver.alloc(d, 8)?);
        }
        let poison = if driver.name() == "cuda-emu" {
            options.poison_scratch.max(PoisonScratch::AtAllocation)
        } else {
            options.poison_scratch
        };
        Ok(CudaSession {
            graph,
            layout,
            driver,
            compiler,
            modules: ModuleCache::new(),
            state,
            status,
            options,
            poison,
            programs: ProgramCache::default(),
            collective: None,
            pending: Mutex::new(None),
            graph_replays: AtomicU64::new(0),
            graph_fallback: None,
        })
    }

    /// Joins a distributed job: `Op::AllReduce` kernels reduce across its participants.
    pub fn set_collective(&mut self, collective: Arc<dyn Collective>) {
        self.collective = Some(collective);
    }

    /// The driver beneath the session.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// How many kernel sources NVRTC compiled so far (cache misses).
    pub fn compilations(&self) -> usize {
        self.compiler.compilations()
    }

    /// How many steps ran as a replayed graph.
    pub fn graph_replays(&self) -> u64 {
        self.graph_replays.load(Ordering::Relaxed)
    }

    /// Why the last program that could not run as a graph is submitted launch by launch.
    pub fn graph_fallback(&self) -> Option<&str> {
        self.graph_fallback.as_deref()
    }

    /// Places and compiles a program against this session's variables, its scratch poisoned
    /// as the session's options say.
    fn prepare(&mut self, program: Program) -> Result<Prepared, BackendError> {
        let memory = SessionMemory {
            state: &self.state,
            status: &self.status,
        };
        let prepared = Prepared::new(
            program,
            &*self.driver,
            &self.compiler,
            &mut self.modules,
            &memory,
            self.options.conv_windows,
        )?;
        if self.poison >= PoisonScratch::AtAllocation {
            prepared.poison_scratch(&*self.driver)?;
        }
        Ok(prepared)
    }

    fn entry(&mut self, step: &Step, batch: usize) -> Result<&mut Entry, BackendError> {
        if self.programs.get(step, batch).is_none() {
            let program = lower(&self.graph, step, batch, &self.options.lowering())
                .map_err(BackendError::from)?;
            let prepared = self.prepare(program)?;
            let writebacks = self.writebacks(&prepared);
            let graph = if self.options.graphs {
                GraphState::Untried
            } else {
                GraphState::Unavailable("graphs are off (CudaOptions::graphs)".into())
            };
            self.programs.insert(
                step,
                batch,
                Entry {
                    prepared,
                    graph,
                    writebacks,
                },
            );
        }
        self.programs
            .get_mut(step, batch)
            .ok_or_else(|| BackendError::Unavailable {
                backend: "cuda".into(),
                reason: "program cache lost an entry".into(),
            })
    }

    fn prepared(&mut self, step: &Step, batch: usize) -> Result<&mut Prepared, BackendError> {
        self.entry(step, batch).map(|e| &mut e.prepared)
    }

    /// The write-backs of a program: regions of its buffers copied into variable slots.
    fn writebacks(&self, prepared: &Prepared) -> Vec<Writeback> {
        prepared
            .program
            .writebacks
            .iter()
            .map(|(region, var)| {
                let slot = self.layout.slot(*var);
                let size = prepared.program.buffer(region.buffer).dtype.size_bytes();
                Writeback {
                    buffer: region.buffer,
                    offset: region.offset * size,
                    bytes: region.shape.iter().product::<usize>() * size,
                    device: usize::from(slot.device),
                    slot: slot.offset,
                }
            })
            .collect()
    }

    /// Synchronises a graph step that fetched nothing and checks its status words.
    fn finish_pending(&self) -> Result<(), BackendError> {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some((step, batch)) = pending else {
            return Ok(());
        };
        self.sync_all()?;
        let entry = self
            .programs
            .get(&step, batch)
            .ok_or_else(|| BackendError::UnknownValue("program".into()))?;
        self.check_status(&entry.prepared)
    }

    /// The lowered program of `step` for `batch`, compiling it on first use.
    pub fn program(&mut self, step: &Step, batch: usize) -> Result<&Program, BackendError> {
        self.prepared(step, batch).map(|p| &p.program)
    }

    /// Replaces kernel `index` of the program of (`step`, `batch`) by `source`'s `entry`, which
    /// must take the same parameter struct: a debugging hook that runs a hand-modified kernel
    /// through the backend's launch path (the tests use it to inject faulty kernels).
    pub fn replace_kernel(
        &mut self,
        step: &Step,
        batch: usize,
        index: usize,
        source: &str,
        entry: &'static str,
    ) -> Result<(), BackendError> {
        let device = {
            let p = self.prepared(step, batch)?;
            p.program
                .kernels
                .get(index)
                .map(|k| usize::from(k.device))
                .ok_or_else(|| BackendError::UnknownValue(format!("kernel {index}")))?
        };
        let ptx = self
            .compiler
            .compile("replacement", source, self.driver.arch(device))?;
        let module = self.driver.load_module(device, &ptx)?;
        let graphs = self.options.graphs;
        let e = self.entry(step, batch)?;
        if e.prepared.replace_module(index, module, entry) {
            // A step captured before holds the old kernel: capture it again.
            if graphs {
                e.graph = GraphState::Untried;
            }
            Ok(())
        } else {
            Err(BackendError::UnknownValue(format!(
                "kernel {index} launches no CUDA kernel"
            )))
        }
    }

    /// Captures the step of (`step`, `batch`) as a graph the first time it runs, when it can
    /// be; otherwise records why not (the step then runs launch by launch).
    fn try_capture(&mut self, step: &Step, batch: usize) -> Result<(), BackendError> {
        let entry = self
            .programs
            .get(step, batch)
            .ok_or_else(|| BackendError::UnknownValue("program".into()))?;
        if !matches!(entry.graph, GraphState::Untried) {
            return Ok(());
        }
        let ctx = StepContext {
            driver: &*self.driver,
            collective: self.collective.as_deref(),
            status: &self.status,
            poison_every_step: self.poison == PoisonScratch::EveryStep,
            state: &self.state,
            writebacks: &entry.writebacks,
        };
        let state = match StepGraph::capture(&ctx, &entry.prepared) {
            Ok(g) => GraphState::Ready(g),
            Err(e) => {
                let reason = e.to_string();
                log::warn!(
                    target: "towerpack",
                    "the CUDA step runs launch by launch, not as a graph: {reason}"
                );
                self.graph_fallback = Some(reason.clone());
                GraphState::Unavailable(reason)
            }
        };
        if let Some(entry) = self.programs.get_mut(step, batch) {
            entry.graph = state;
        }
        Ok(())
    }

    /// Runs an arbitrary lowered `program` (placed against this session's variables) with
    /// `inputs` written into their buffers first, and returns the contents of `outputs`: a
    /// debugging entry point, and how the tests run single kernels on fresh inputs.
    pub fn run_program(
        &mut self,
        program: Program,
        inputs: &[(BufferId, HostTensor)],
        outputs: &[BufferId],
    ) -> Result<Vec<HostTensor>, BackendError> {
        self.finish_pending()?;
        let prepared = self.prepare(program)?;
        for (b, value) in inputs {
            write_buffer(&*self.driver, &prepared, *b, value)?;
        }
        self.reset_status()?;
        prepared.run(&*self.driver, self.collective.as_deref())?;
        self.check_status(&prepared)?;
        outputs
            .iter()
            .map(|&b| {
                read_region(
                    &*self.driver,
                    &prepared,
                    b,
                    0,
                    &prepared.program.buffer(b).shape,
                )
            })
            .collect()
    }

    fn reset_status(&self) -> Result<(), BackendError> {
        for (d, &s) in self.status.iter().enumerate() {
            self.driver.memset_zero(d, s, 8)?;
        }
        Ok(())
    }

    /// Turns a kernel's report in a status word into an error naming the kernel.
    fn check_status(&self, prepared: &Prepared) -> Result<(), BackendError> {
        let mut words = Vec::with_capacity(self.status.len());
        for (d, &s) in self.status.iter().enumerate() {
            let mut word = [0u8; 8];
            self.driver.copy_dtoh(d, &mut word, s)?;
            words.push(word);
        }
        self.report_status(prepared, &words)
    }

    /// The error a set of status words reports, if any (and the words reset for later steps).
    fn report_status(&self, prepared: &Prepared, words: &[[u8; 8]]) -> Result<(), BackendError> {
        for word in words {
            let code = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            let detail = u32::from_le_bytes([word[4], word[5], word[6], word[7]]);
            if code != 0 {
                // Graph steps never reset the words themselves: clear the report now.
                self.reset_status()?;
                let (node, op, message) = match prepared.kernel_of_code(code) {
                    Some(k) => (
                        k.name.clone(),
                        k.kind.name().to_string(),
                        format!("the label of row {detail} is outside the classes"),
                    ),
                    None => (
                        String::new(),
                        "cuda".into(),
                        format!("status {code}/{detail}"),
                    ),
                };
                return Err(BackendError::Kernel { node, op, message });
            }
        }
        Ok(())
    }

    fn sync_all(&self) -> Result<(), BackendError> {
        for d in 0..self.driver.devices() {
            self.driver.synchronize(d)?;
        }
        Ok(())
    }
}

/// Writes `value` into buffer `b` on its home device.
fn write_buffer(
    driver: &dyn Driver,
    p: &Prepared,
    b: BufferId,
    value: &HostTensor,
) -> Result<(), BackendError> {
    let buf = p.program.buffer(b);
    if value.dtype() != buf.dtype || value.len() != buf.len() {
        return Err(BackendError::FeedMismatch {
            input: buf.name.clone(),
            expected: TensorType::new(buf.dtype, Shape::fixed(&buf.shape)).to_string(),
            got: TensorType::of_host(value).to_string(),
        });
    }
    driver.copy_htod(p.home_device(b), p.home_address(b), &value.le_bytes())?;
    Ok(())
}

/// Reads `shape` elements of buffer `b` from element `offset`.
fn read_region(
    driver: &dyn Driver,
    p: &Prepared,
    b: BufferId,
    offset: usize,
    shape: &[usize],
) -> Result<HostTensor, BackendError> {
    let buf = p.program.buffer(b);
    let size = buf.dtype.size_bytes();
    let mut bytes = vec![0u8; shape.iter().product::<usize>() * size];
    driver.copy_dtoh(
        p.home_device(b),
        &mut bytes,
        p.home_address(b).offset(offset * size),
    )?;
    HostTensor::from_le_bytes(buf.dtype, shape, &bytes).map_err(|e| BackendError::Kernel {
        node: buf.name.clone(),
        op: "fetch".into(),
        message: e.to_string(),
    })
}

impl Session for CudaSession {
    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn join_collective(&mut self, collective: Arc<dyn Collective>) -> Result<(), BackendError> {
        self.set_collective(collective);
        Ok(())
    }

    fn run(&mut self, step: &Step, feeds: &[Feed]) -> Result<Vec<HostTensor>, BackendError> {
        let batch = binding::bind_feeds(&self.graph, feeds)?;
        let key_pending = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if key_pending.is_some_and(|(s, b)| &s != step || b != batch) {
            // The status words of an unsynchronised step name kernels of its own program.
            self.finish_pending()?;
        }
        self.entry(step, batch)?;
        let mut values: Vec<(crate::ir::NodeId, &HostTensor)> = Vec::new();
        {
            let entry = self
                .programs
                .get(step, batch)
                .ok_or_else(|| BackendError::UnknownValue("program".into()))?;
            for &(node, _) in &entry.prepared.program.feeds {
                let value = feeds
                    .iter()
                    .find(|(n, _)| *n == node)
                    .map(|(_, t)| t)
                    .ok_or_else(|| BackendError::MissingFeed {
                        input: match &self.graph.node(node).op {
                            Op::Input { name, .. } => name.clone(),
                            _ => self.graph.node(node).name.clone(),
                        },
                    })?;
                values.push((node, value));
            }
        }
        self.try_capture(step, batch)?;
        let entry = self
            .programs
            .get(step, batch)
            .ok_or_else(|| BackendError::UnknownValue("program".into()))?;
        let driver = &*self.driver;
        let prepared = &entry.prepared;
        // A session that joined a collective after the capture must reduce through the host.
        let needs_host = prepared.needs_host(self.collective.as_deref());
        if let (GraphState::Ready(graph), false) = (&entry.graph, needs_host) {
            graph.launch(driver, prepared, &values)?;
            self.graph_replays.fetch_add(1, Ordering::Relaxed);
            if prepared.program.fetches.is_empty() {
                *self.pending.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((step.clone(), batch));
                return Ok(Vec::new());
            }
            *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = None;
            self.sync_all()?;
            self.report_status(prepared, &graph.status_words(driver)?)?;
            return graph.fetches(driver, prepared);
        }
        self.finish_pending()?;
        self.reset_status()?;
        if self.poison == PoisonScratch::EveryStep {
            prepared.poison_scratch(driver)?;
        }
        for (node, value) in &values {
            let b = prepared
                .program
                .feeds
                .iter()
                .find(|(n, _)| n == node)
                .map(|(_, b)| *b)
                .ok_or_else(|| BackendError::UnknownValue("feed".into()))?;
            write_buffer(driver, prepared, b, value)?;
        }
        prepared.run(driver, self.collective.as_deref())?;
        self.sync_all()?;
        self.check_status(prepared)?;
        // Fetches first: a fetched variable read must see the value the step began with.
        let mut out = Vec::with_capacity(prepared.program.fetches.len());
        for r in &prepared.program.fetches {
            out.push(read_region(driver, prepared, r.buffer, r.offset, &r.shape)?);
        }
        submit_writebacks(driver, prepared, &self.state, &entry.writebacks)?;
        self.sync_all()?;
        Ok(out)
    }

    fn read_variable(&self, var: VarId) -> Result<HostTensor, BackendError> {
        self.finish_pending()?;
        let (def, shape) = binding::variable(&self.graph, var, None)?;
        let slot = self.layout.slot(var);
        let mut bytes = vec![0u8; slot.bytes];
        let d = usize::from(slot.device);
        self.driver
            .copy_dtoh(d, &mut bytes, self.state[d].offset(slot.offset))?;
        binding::variable_from_bytes(def, &shape, &bytes)
    }

    fn write_variable(&mut self, var: VarId, value: &HostTensor) -> Result<(), BackendError> {
        self.finish_pending()?;
        binding::variable(&self.graph, var, Some(value))?;
        let slot = self.layout.slot(var);
        let d = usize::from(slot.device);
        self.driver
            .copy_htod(d, self.state[d].offset(slot.offset), &value.le_bytes())?;
        Ok(())
    }
}
