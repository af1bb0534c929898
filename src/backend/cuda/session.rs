//! `CudaSession`: the CUDA backend behind the [`Session`] interface, on real GPUs or on emulated
//! devices (the same code above the [`Driver`]).
//!
//! Each distinct (step, batch size) is lowered, rendered, compiled and placed once
//! ([`Prepared`]); a run copies the feeds in, submits the kernels, reads the status words,
//! applies the write-backs and copies the fetches out. Logical device `d` of the graph is driver
//! device `d`; variables live in per-device state arenas laid out by [`StateLayout`].

use super::driver::emulated::EmulatedDriver;
use super::driver::gpu::GpuDriver;
use super::driver::{DevicePtr, Driver};
use super::error::CudaError;
use super::nvrtc::{self, Compiler};
use super::prepared::{ModuleCache, Prepared, SessionMemory};
use crate::backend::binding::{self, ProgramCache};
use crate::backend::{BackendError, Collective, Feed, Session, Step};
use crate::ir::{Graph, Op, Shape, TensorType, VarId, verify};
use crate::lower::{BufferId, LowerOptions, Program, StateLayout, lower};
use crate::tensor::HostTensor;
use std::path::PathBuf;
use std::sync::Arc;

/// Options of the CUDA backend.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub lower: LowerOptions,
    /// Where compiled PTX is cached across runs (`None`: in memory only). Default:
    /// [`nvrtc::default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions {
            // Epilogues with reductions have no CUDA rendering yet (see `LowerOptions`).
            lower: LowerOptions {
                epilogue_reductions: false,
                ..LowerOptions::default()
            },
            cache_dir: nvrtc::default_cache_dir(),
        }
    }
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
    programs: ProgramCache<Prepared>,
    collective: Option<Arc<dyn Collective>>,
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
    pub fn emulated(
        graph: Graph,
        devices: usize,
        options: CudaOptions,
    ) -> Result<CudaSession, BackendError> {
        let n = devices_for(&graph, devices);
        CudaSession::with_driver(graph, Arc::new(EmulatedDriver::new(n)), options)
    }

    /// Binds `graph` (verified first) to fresh, zeroed variables on `driver`'s devices.
    pub fn with_driver(
        graph: Graph,
        driver: Arc<dyn Driver>,
        options: CudaOptions,
    ) -> Result<CudaSession, BackendError> {
        verify(&graph)?;
        let compiler = Compiler::new(options.cache_dir.clone())?;
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
        Ok(CudaSession {
            graph,
            layout,
            driver,
            compiler,
            modules: ModuleCache::new(),
            state,
            status,
            options,
            programs: ProgramCache::default(),
            collective: None,
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

    /// Places and compiles a program against this session's variables.
    fn prepare(&mut self, program: Program) -> Result<Prepared, BackendError> {
        let memory = SessionMemory {
            state: &self.state,
            status: &self.status,
        };
        Prepared::new(
            program,
            &*self.driver,
            &self.compiler,
            &mut self.modules,
            &memory,
        )
    }

    fn prepared(&mut self, step: &Step, batch: usize) -> Result<&mut Prepared, BackendError> {
        if self.programs.get(step, batch).is_none() {
            let program =
                lower(&self.graph, step, batch, &self.options.lower).map_err(BackendError::from)?;
            let prepared = self.prepare(program)?;
            self.programs.insert(step, batch, prepared);
        }
        self.programs
            .get_mut(step, batch)
            .ok_or_else(|| BackendError::Unavailable {
                backend: "cuda".into(),
                reason: "program cache lost an entry".into(),
            })
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
        let p = self.prepared(step, batch)?;
        if p.replace_module(index, module, entry) {
            Ok(())
        } else {
            Err(BackendError::UnknownValue(format!(
                "kernel {index} launches no CUDA kernel"
            )))
        }
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
        for (d, &s) in self.status.iter().enumerate() {
            let mut word = [0u8; 8];
            self.driver.copy_dtoh(d, &mut word, s)?;
            let code = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            let detail = u32::from_le_bytes([word[4], word[5], word[6], word[7]]);
            if code != 0 {
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
    driver.copy_htod(p.home_device(b), p.home_address(b), &value.to_le_bytes())?;
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
        self.prepared(step, batch)?;
        self.reset_status()?;
        let prepared = self
            .programs
            .get(step, batch)
            .ok_or_else(|| BackendError::UnknownValue("program".into()))?;
        let driver = &*self.driver;
        for &(node, b) in &prepared.program.feeds {
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
        for (region, var) in &prepared.program.writebacks {
            let slot = self.layout.slot(*var);
            let dtype = prepared.program.buffer(region.buffer).dtype;
            let bytes = region.shape.iter().product::<usize>() * dtype.size_bytes();
            let src = prepared
                .home_address(region.buffer)
                .offset(region.offset * dtype.size_bytes());
            let dst = self.state[usize::from(slot.device)].offset(slot.offset);
            let (from, to) = (
                prepared.home_device(region.buffer),
                usize::from(slot.device),
            );
            if from == to {
                driver.copy_dtod(to, dst, src, bytes)?;
            } else {
                driver.copy_peer(to, to, dst, from, src, bytes)?;
            }
        }
        self.sync_all()?;
        Ok(out)
    }

    fn read_variable(&self, var: VarId) -> Result<HostTensor, BackendError> {
        let (def, shape) = binding::variable(&self.graph, var, None)?;
        let slot = self.layout.slot(var);
        let mut bytes = vec![0u8; slot.bytes];
        let d = usize::from(slot.device);
        self.driver
            .copy_dtoh(d, &mut bytes, self.state[d].offset(slot.offset))?;
        binding::variable_from_bytes(def, &shape, &bytes)
    }

    fn write_variable(&mut self, var: VarId, value: &HostTensor) -> Result<(), BackendError> {
        binding::variable(&self.graph, var, Some(value))?;
        let slot = self.layout.slot(var);
        let d = usize::from(slot.device);
        self.driver
            .copy_htod(d, self.state[d].offset(slot.offset), &value.to_le_bytes())?;
        Ok(())
    }
}
