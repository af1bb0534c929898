//! A lowered [`Program`] made ready to run on a [`Driver`]: every kernel rendered, compiled and
//! loaded, every buffer placed, every launch's parameter struct packed — all once. Running a
//! step then only submits work: waits on other devices' events, peer copies of remote operands
//! into staging buffers, the launch, peer copies of remote results back, an event.
//!
//! Memory: one scratch arena per device (the memory plan's), one constants arena per device,
//! one staging buffer per (device, remote buffer) a kernel of that device touches, one workspace
//! per split launch (`RenderedKernel::workspace_bytes`). State arenas and status words belong to
//! the session and are passed in.

use super::driver::{DevicePtr, Driver, EventId, ModuleId, POISON_WORD};
use super::error::CudaError;
use super::nvrtc::Compiler;
use super::render::{self, AddressOf, KernelPlan, LaunchDims, Target};
use crate::backend::{BackendError, Collective};
use crate::ir::ReduceOp;
use crate::lower::{BufferId, Kernel, KernelKind, Precision, Program, Storage};
use std::collections::{BTreeSet, HashMap};

/// Device memory the session owns: per device, the state arena and the status word.
pub struct SessionMemory<'a> {
    pub state: &'a [DevicePtr],
    pub status: &'a [DevicePtr],
}

/// A copy of a whole buffer between devices.
#[derive(Clone, Copy, Debug)]
struct PeerCopy {
    dst_device: usize,
    dst: DevicePtr,
    src_device: usize,
    src: DevicePtr,
    bytes: usize,
}

/// What a kernel does once its operands are in place.
enum Action {
    Launch {
        module: ModuleId,
        entry: &'static str,
        dims: LaunchDims,
        params: Vec<u8>,
    },
    AllReduce {
        src: DevicePtr,
        dst: DevicePtr,
        op: ReduceOp,
        len: usize,
    },
    Nothing,
}

/// One kernel of the program, ready to submit.
struct Submission {
    device: usize,
    waits: Vec<EventId>,
    stage_in: Vec<PeerCopy>,
    action: Action,
    stage_out: Vec<PeerCopy>,
    record: Option<EventId>,
}

/// One launch of a prepared program, as submitted.
pub struct LaunchView<'a> {
    /// The index of the kernel in the program.
    pub kernel: usize,
    pub device: usize,
    pub module: ModuleId,
    pub entry: &'a str,
    pub dims: LaunchDims,
    pub params: &'a [u8],
}

/// Modules already loaded, by (device, source): shared by every program of a session.
pub type ModuleCache = HashMap<(usize, String), ModuleId>;

/// A program ready to run.
pub struct Prepared {
    pub program: Program,
    scratch: Vec<DevicePtr>,
    constants: Vec<DevicePtr>,
    constant_offsets: Vec<usize>,
    staging: HashMap<(usize, BufferId), DevicePtr>,
    state: Vec<DevicePtr>,
    submissions: Vec<Submission>,
    /// [`CudaOptions::conv_windows`](super::CudaOptions::conv_windows), as the kernels render.
    conv_windows: bool,
}

fn kernel_error(k: &Kernel, e: impl std::fmt::Display) -> BackendError {
    BackendError::Kernel {
        node: k.name.clone(),
        op: k.kind.name().to_string(),
        message: e.to_string(),
    }
}

/// Lets `collective` reduce `len` f32 at `dst` of `device` in place when it works on device
/// memory (NCCL) and `driver`'s addresses are real device addresses; `false` when the caller
/// must reduce through host memory.
fn reduce_on_device(
    driver: &dyn Driver,
    collective: &dyn Collective,
    device: usize,
    dst: DevicePtr,
    len: usize,
    op: ReduceOp,
) -> Result<bool, BackendError> {
    let Some(ordinal) = driver.cuda_ordinal(device) else {
        return Ok(false);
    };
    // The engine works on its own stream: this device's earlier work must be done.
    driver.synchronize(device)?;
    // SAFETY: `dst` is the kernel's output, `len` f32 allocated by the GPU driver in the
    // device's primary context; the device is idle (synchronised above), and the next work is
    // submitted by this thread after the call returns.
    unsafe { collective.all_reduce_device(ordinal, dst.0, len, op) }
}

/// The device a buffer lives on (`None` for constants, which every device holds).
fn home(program: &Program, b: BufferId) -> Option<usize> {
    match program.buffer(b).storage {
        Storage::Scratch { device, .. } | Storage::State { device, .. } => Some(device.into()),
        Storage::Constant(_) => None,
    }
}

/// Packing addresses of one kernel: buffers as its device sees them.
struct KernelAddresses<'a> {
    prepared: &'a Prepared,
    device: usize,
    status: DevicePtr,
    /// The launch's own workspace (null when it needs none).
    workspace: DevicePtr,
}

impl AddressOf for KernelAddresses<'_> {
    fn buffer(&self, b: BufferId) -> u64 {
        self.prepared.address_on(self.device, b).0
    }

    fn status(&self) -> u64 {
        self.status.0
    }

    fn workspace(&self) -> u64 {
        self.workspace.0
    }
}

impl Prepared {
    /// Places, renders, compiles and loads `program`; `memory` is the session's device memory,
    /// `conv_windows` [`CudaOptions::conv_windows`](super::CudaOptions::conv_windows).
    pub fn new(
        program: Program,
        driver: &dyn Driver,
        compiler: &Compiler,
        modules: &mut ModuleCache,
        memory: &SessionMemory,
        conv_windows: bool,
    ) -> Result<Prepared, BackendError> {
        let devices = driver.devices();
        let needed = program.devices().max(program.arena_bytes.len());
        if needed > devices {
            return Err(CudaError::NoDevice {
                found: devices,
                needed,
            }
            .into());
        }
        let mut scratch = Vec::with_capacity(devices);
        for d in 0..devices {
            let bytes = program.arena_bytes.get(d).copied().unwrap_or(0);
            scratch.push(driver.alloc(d, bytes)?);
        }
        let mut constant_offsets = Vec::with_capacity(program.constants.len());
        let mut blob = Vec::new();
        for c in &program.constants {
            constant_offsets.push(blob.len());
            blob.extend_from_slice(&c.to_le_bytes());
            blob.resize(blob.len().next_multiple_of(64), 0);
        }
        let mut constants = Vec::with_capacity(devices);
        for d in 0..devices {
            let p = driver.alloc(d, blob.len())?;
            driver.copy_htod(d, p, &blob)?;
            constants.push(p);
        }
        let mut prepared = Prepared {
            program,
            scratch,
            constants,
            constant_offsets,
            staging: HashMap::new(),
            state: memory.state.to_vec(),
            submissions: Vec::new(),
            conv_windows,
        };
        prepared.allocate_staging(driver)?;
        let waited: BTreeSet<u32> = prepared.program.waits.iter().flatten().copied().collect();
        let mut events: HashMap<u32, EventId> = HashMap::new();
        for &w in &waited {
            let k = prepared.program.kernels.get(w as usize).ok_or_else(|| {
                BackendError::Unavailable {
                    backend: driver.name().into(),
                    reason: format!("the program waits for kernel {w}, which does not exist"),
                }
            })?;
            events.insert(w, driver.create_event(k.device.into())?);
        }
        for i in 0..prepared.program.kernels.len() {
            let s = prepared.submission(i, driver, compiler, modules, memory, &events)?;
            prepared.submissions.push(s);
        }
        Ok(prepared)
    }

    /// One staging buffer per (device, remote buffer) that a kernel of the device touches.
    fn allocate_staging(&mut self, driver: &dyn Driver) -> Result<(), BackendError> {
        let mut wanted: BTreeSet<(usize, BufferId)> = BTreeSet::new();
        for k in &self.program.kernels {
            let d = usize::from(k.device);
            let touched = k
                .inputs
                .iter()
                .map(|v| v.buffer)
                .chain(k.outputs.iter().copied());
            for b in touched {
                if home(&self.program, b).is_some_and(|h| h != d) {
                    wanted.insert((d, b));
                }
            }
        }
        for (d, b) in wanted {
            let p = driver.alloc(d, self.program.buffer(b).bytes())?;
            self.staging.insert((d, b), p);
        }
        Ok(())
    }

    /// Where buffer `b` lives on its home device.
    pub fn home_address(&self, b: BufferId) -> DevicePtr {
        match self.program.buffer(b).storage {
            Storage::Scratch { device, offset } => self.scratch[usize::from(device)].offset(offset),
            Storage::State { device, offset } => self.state[usize::from(device)].offset(offset),
            Storage::Constant(i) => self.constants[0].offset(self.constant_offsets[i as usize]),
        }
    }

    /// The address a kernel on `device` uses for `b`: the buffer itself, this device's copy of
    /// a constant, or its staging copy of a remote buffer.
    fn address_on(&self, device: usize, b: BufferId) -> DevicePtr {
        match self.program.buffer(b).storage {
            Storage::Constant(i) => {
                self.constants[device].offset(self.constant_offsets[i as usize])
            }
            _ => match self.staging.get(&(device, b)) {
                Some(&p) => p,
                None => self.home_address(b),
            },
        }
    }

    /// The device buffer `b` is read from and written to by the host (constants: device 0).
    pub fn home_device(&self, b: BufferId) -> usize {
        home(&self.program, b).unwrap_or(0)
    }

    fn peer_copies(
        &self,
        device: usize,
        buffers: impl Iterator<Item = BufferId>,
        inbound: bool,
    ) -> Vec<PeerCopy> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for b in buffers {
            let Some(&stage) = self.staging.get(&(device, b)) else {
                continue;
            };
            if !seen.insert(b) {
                continue;
            }
            let h = self.home_device(b);
            let (remote, bytes) = (self.home_address(b), self.program.buffer(b).bytes());
            out.push(if inbound {
                PeerCopy {
                    dst_device: device,
                    dst: stage,
                    src_device: h,
                    src: remote,
                    bytes,
                }
            } else {
                PeerCopy {
                    dst_device: h,
                    dst: remote,
                    src_device: device,
                    src: stage,
                    bytes,
                }
            });
        }
        out
    }

    fn submission(
        &self,
        i: usize,
        driver: &dyn Driver,
        compiler: &Compiler,
        modules: &mut ModuleCache,
        memory: &SessionMemory,
        events: &HashMap<u32, EventId>,
    ) -> Result<Submission, BackendError> {
        let k = &self.program.kernels[i];
        let device = usize::from(k.device);
        let arch = driver.arch(device);
        // The TF32 mma.sync needs the tensor cores of compute capability 8.0 (Ampere) or newer;
        // without them BF16/FP16 GEMMs take the SIMT tiles (which round their operands too).
        let target = Target {
            tensor_cores: arch.0 >= 80,
            windows: self.conv_windows,
            ..driver
                .multiprocessors(device)
                .map_or_else(Target::default, Target::with_multiprocessors)
        };
        let plan =
            render::render_kernel_for(&self.program, i, &target).map_err(|e| kernel_error(k, e))?;
        // TF32 itself is tensor-core arithmetic: say so rather than compute f32 on an older
        // device under the name TF32.
        let gemm = matches!(
            k.kind,
            KernelKind::MatMul(..)
                | KernelKind::Conv2d(..)
                | KernelKind::Conv2dBackpropInput(..)
                | KernelKind::Conv2dBackpropFilter(..)
        );
        if matches!(plan, KernelPlan::Launch(_))
            && gemm
            && !target.tensor_cores
            && self.program.precision == Precision::Tf32
        {
            let e = render::RenderError::Unsupported(format!(
                "precision {} multiplies on tensor cores of compute capability 8.0 or newer; \
                 device {device} is {}: use precision fp32 on it",
                self.program.precision,
                arch.sm()
            ));
            return Err(kernel_error(k, e));
        }
        let action = match plan {
            KernelPlan::Empty => Action::Nothing,
            KernelPlan::AllReduce { op, len } => {
                let v = &k.inputs[0];
                Action::AllReduce {
                    src: self.address_on(device, v.buffer).offset(v.offset * 4),
                    dst: self.address_on(device, k.outputs[0]),
                    op,
                    len,
                }
            }
            KernelPlan::Launch(r) => {
                let source = r.source();
                let module = match modules.get(&(device, source.clone())) {
                    Some(&m) => m,
                    None => {
                        let ptx = compiler
                            .compile(&k.name, &source, driver.arch(device))
                            .map_err(|e| kernel_error(k, e))?;
                        let m = driver
                            .load_module(device, &ptx)
                            .map_err(|e| kernel_error(k, e))?;
                        modules.insert((device, source), m);
                        m
                    }
                };
                // A split launch's partials and arrival counters: zeroed once here; the kernel
                // leaves its counters at zero, so every later launch reuses the workspace.
                let workspace = if r.workspace_bytes > 0 {
                    driver.alloc(device, r.workspace_bytes)?
                } else {
                    DevicePtr(0)
                };
                let at = KernelAddresses {
                    prepared: self,
                    device,
                    status: memory.status[device],
                    workspace,
                };
                Action::Launch {
                    module,
                    entry: r.body.entry(),
                    dims: r.launch,
                    params: r.params.pack(&at),
                }
            }
        };
        let waits = self
            .program
            .waits
            .get(i)
            .map(|w| w.iter().filter_map(|j| events.get(j).copied()).collect())
            .unwrap_or_default();
        Ok(Submission {
            device,
            waits,
            stage_in: self.peer_copies(device, k.inputs.iter().map(|v| v.buffer), true),
            action,
            stage_out: self.peer_copies(device, k.outputs.iter().copied(), false),
            record: events.get(&(i as u32)).copied(),
        })
    }

    /// Submits every kernel in program order (each device's stream keeps its own order; events
    /// order devices).
    pub fn run(
        &self,
        driver: &dyn Driver,
        collective: Option<&dyn Collective>,
    ) -> Result<(), BackendError> {
        for (k, s) in self.program.kernels.iter().zip(&self.submissions) {
            for &e in &s.waits {
                driver.wait(s.device, e)?;
            }
            for c in &s.stage_in {
                driver.copy_peer(s.device, c.dst_device, c.dst, c.src_device, c.src, c.bytes)?;
            }
            match &s.action {
                Action::Launch {
                    module,
                    entry,
                    dims,
                    params,
                } => driver
                    .launch(s.device, *module, entry, *dims, params, &k.name)
                    .map_err(|e| match e {
                        CudaError::Fault { message, .. } => kernel_error(k, message),
                        other => kernel_error(k, other),
                    })?,
                Action::AllReduce { src, dst, op, len } => {
                    if src != dst {
                        driver.copy_dtod(s.device, *dst, *src, len * 4)?;
                    }
                    if let Some(c) = collective.filter(|c| c.size() > 1)
                        && !reduce_on_device(driver, c, s.device, *dst, *len, *op)?
                    {
                        let mut bytes = vec![0u8; len * 4];
                        driver.copy_dtoh(s.device, &mut bytes, *dst)?;
                        let mut values: Vec<f32> = bytes
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                            .collect();
                        c.all_reduce(&mut values, *op)?;
                        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                        driver.copy_htod(s.device, *dst, &bytes)?;
                    }
                }
                Action::Nothing => {}
            }
            for c in &s.stage_out {
                driver.copy_peer(s.device, c.dst_device, c.dst, c.src_device, c.src, c.bytes)?;
            }
            if let Some(e) = s.record {
                driver.record(s.device, e)?;
            }
        }
        Ok(())
    }

    /// Whether running this program needs the host between launches: an all-reduce across
    /// processes through host memory (`collective` with more than one participant). Such a
    /// program cannot be captured as a graph and is always submitted launch by launch.
    pub fn needs_host(&self, collective: Option<&dyn Collective>) -> bool {
        collective.is_some_and(|c| c.size() > 1)
            && self
                .submissions
                .iter()
                .any(|s| matches!(s.action, Action::AllReduce { .. }))
    }

    /// Fills the scratch memory this program owns (the memory plan's arena and the staging
    /// copies of remote buffers) with [`POISON_WORD`], in stream order: a kernel that reads a
    /// value no kernel of the step wrote then computes with a signalling NaN.
    pub fn poison_scratch(&self, driver: &dyn Driver) -> Result<(), BackendError> {
        for (d, &p) in self.scratch.iter().enumerate() {
            let bytes = self.program.arena_bytes.get(d).copied().unwrap_or(0);
            driver.memset_u32(d, p, POISON_WORD, bytes / 4)?;
        }
        for (&(d, b), &p) in &self.staging {
            driver.memset_u32(d, p, POISON_WORD, self.program.buffer(b).bytes() / 4)?;
        }
        Ok(())
    }

    /// Every kernel launch of the program, in program order.
    pub fn launches(&self) -> impl Iterator<Item = LaunchView<'_>> {
        self.submissions
            .iter()
            .enumerate()
            .filter_map(|(kernel, s)| match &s.action {
                Action::Launch {
                    module,
                    entry,
                    dims,
                    params,
                } => Some(LaunchView {
                    kernel,
                    device: s.device,
                    module: *module,
                    entry,
                    dims: *dims,
                    params,
                }),
                _ => None,
            })
    }

    /// The kernel a status code names (`index + 1`).
    pub fn kernel_of_code(&self, code: u32) -> Option<&Kernel> {
        self.program.kernels.get((code as usize).checked_sub(1)?)
    }

    /// Replaces kernel `index`'s module and entry point (keeping its parameters): a debugging
    /// hook to run a hand-modified kernel through the backend's launch path.
    pub fn replace_module(
        &mut self,
        index: usize,
        module: ModuleId,
        new_entry: &'static str,
    ) -> bool {
        match self.submissions.get_mut(index).map(|s| &mut s.action) {
            Some(Action::Launch {
                module: m, entry, ..
            }) => {
                *m = module;
                *entry = new_entry;
                true
            }
            _ => false,
        }
    }
}
