//! The [`Driver`] on emulated devices (towerpack-ptx): the CUDA backend runs unchanged, without a
//! GPU. Everything is synchronous (a stream's work completes before the call returns), so
//! events only mark points in time. A fault names the program kernel and the PTX line.
//!
//! Graphs are emulated faithfully enough for CI to cover the capture-and-replay path: between
//! [`Driver::begin_capture`] and [`Driver::end_capture`] every stream-ordered operation is
//! recorded instead of executed, a synchronous call invalidates the capture (as CUDA's stream
//! capture does), and [`Driver::launch_graph`] executes the recorded operations in order.
//! Pinned memory is host memory; uploads are immediate.
//!
//! [`EmulatedDriver::set_host_only`] makes the devices execute nothing — no kernel, copy to or
//! from a device, or memset — so that a run measures the host's share of a step alone: what
//! the trainer, the session and the data flow cost per step before a GPU does any work (every
//! result of such a run is garbage).

use super::{DevicePtr, Driver, EventId, GraphId, ModuleId, PinnedId};
use crate::backend::cuda::error::CudaError;
use crate::backend::cuda::nvrtc::Arch;
use crate::backend::cuda::render::LaunchDims;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use towerpack_ptx::{Device, EmuError, KernelArgs, LaunchConfig, LaunchStats, Module};

/// One stream-ordered operation, as a graph records it.
#[derive(Clone, Debug)]
enum Op {
    Launch {
        device: usize,
        module: ModuleId,
        entry: String,
        dims: LaunchDims,
        params: Vec<u8>,
        kernel: String,
    },
    CopyDtod {
        device: usize,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    },
    CopyPeer {
        dst_device: usize,
        dst: DevicePtr,
        src_device: usize,
        src: DevicePtr,
        bytes: usize,
    },
    MemsetU8 {
        device: usize,
        dst: DevicePtr,
        bytes: usize,
    },
    MemsetU32 {
        device: usize,
        dst: DevicePtr,
        value: u32,
        count: usize,
    },
    Download {
        device: usize,
        dst: PinnedId,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
    },
    /// An event record or wait: nothing to do on synchronous devices, kept so a graph holds
    /// every operation that was submitted.
    Event,
}

/// The state of stream capture.
enum Capture {
    Idle,
    Recording(Vec<Op>),
    /// A synchronous call or a failed operation broke the capture; `end_capture` reports it.
    Invalid(String),
}

/// `n` emulated devices.
pub struct EmulatedDriver {
    devices: Vec<Arc<Device>>,
    /// Loaded modules, with the device each was loaded on.
    modules: RwLock<Vec<(usize, Arc<Module>)>>,
    /// Events created so far (an event is only its id: the devices are synchronous).
    events: AtomicUsize,
    lane_instructions: AtomicU64,
    capture: Mutex<Capture>,
    graphs: RwLock<Vec<Arc<Vec<Op>>>>,
    pinned: RwLock<Vec<Arc<Mutex<Vec<u8>>>>>,
    graphs_available: AtomicBool,
    graph_replays: AtomicU64,
    /// The compute capability the devices report ([`Driver::arch`]).
    arch: AtomicU32,
    /// Whether the devices skip every operation ([`EmulatedDriver::set_host_only`]).
    host_only: AtomicBool,
}

impl EmulatedDriver {
    /// `n` devices with ordinals `0..n`.
    pub fn new(n: usize) -> EmulatedDriver {
        EmulatedDriver {
            devices: towerpack_ptx::create_devices(n.max(1)),
            modules: RwLock::new(Vec::new()),
            events: AtomicUsize::new(0),
            lane_instructions: AtomicU64::new(0),
            capture: Mutex::new(Capture::Idle),
            graphs: RwLock::new(Vec::new()),
            pinned: RwLock::new(Vec::new()),
            graphs_available: AtomicBool::new(true),
            graph_replays: AtomicU64::new(0),
            arch: AtomicU32::new(Arch::EMULATED.0),
            host_only: AtomicBool::new(false),
        }
    }

    /// Makes the devices report compute capability `arch` (default [`Arch::EMULATED`]): below
    /// 8.0, a device without tensor cores, whose kernels the session renders on the SIMT tiles
    /// (to test those in tests; the emulator executes the PTX either way).
    pub fn set_arch(&self, arch: Arch) {
        self.arch.store(arch.0, Ordering::Relaxed);
    }

    /// Makes the devices execute nothing from now on: kernels, copies between host and device
    /// or on a device, memsets, downloads and uploads all return at once (captured graphs still
    /// record and replay their operations, skipping each). Allocation, pinned memory and
    /// everything the host does stay as they are, so a run measures the host's share of a
    /// step: what a GPU would wait for if the device took no time. Every value a session reads
    /// back is garbage.
    pub fn set_host_only(&self, host_only: bool) {
        self.host_only.store(host_only, Ordering::Relaxed);
    }

    fn skips(&self) -> bool {
        self.host_only.load(Ordering::Relaxed)
    }

    /// The emulated device `i` (to set step budgets or serial execution in tests).
    pub fn device(&self, i: usize) -> Option<&Device> {
        self.devices.get(i).map(|d| &**d)
    }

    /// Makes [`Driver::begin_capture`] fail as on a device without graphs (to test fallbacks).
    pub fn set_graphs_available(&self, available: bool) {
        self.graphs_available.store(available, Ordering::Relaxed);
    }

    /// How many times a captured graph was replayed.
    pub fn graph_replays(&self) -> u64 {
        self.graph_replays.load(Ordering::Relaxed)
    }

    /// Runs only the CTAs `ctas` of a launch (see [`Device::launch_sampled`]) and returns their
    /// counters: how the performance model measures a launch's per-block work at full size
    /// without running the whole grid. Never recorded into a graph.
    pub fn sample_launch(
        &self,
        device: usize,
        module: ModuleId,
        entry: &str,
        dims: LaunchDims,
        params: &[u8],
        ctas: &[u64],
    ) -> Result<LaunchStats, CudaError> {
        let m = self.module(device, module)?;
        self.dev(device, "sample launch")?
            .launch_sampled(&m, entry, config(dims), KernelArgs::Packed(params), ctas)
            .map_err(|e| fault(entry, device, e))
    }

    /// The static shared memory of `entry` of `module`, as its PTX declares it.
    pub fn static_shared_bytes(
        &self,
        device: usize,
        module: ModuleId,
        entry: &str,
    ) -> Option<usize> {
        let m = self.module(device, module).ok()?;
        m.kernel(entry).map(|k| k.static_shared_bytes())
    }

    fn dev(&self, device: usize, call: &'static str) -> Result<&Device, CudaError> {
        self.devices
            .get(device)
            .map(|d| &**d)
            .ok_or_else(|| CudaError::Driver {
                call,
                device,
                message: format!("only {} emulated devices exist", self.devices.len()),
            })
    }

    fn module(&self, device: usize, module: ModuleId) -> Result<Arc<Module>, CudaError> {
        let modules = self.modules.read().unwrap_or_else(|e| e.into_inner());
        match modules.get(module.0) {
            Some((d, m)) if *d == device => Ok(m.clone()),
            _ => Err(CudaError::Driver {
                call: "launch",
                device,
                message: format!("module {} is not loaded on this device", module.0),
            }),
        }
    }

    fn pinned_buffer(&self, id: PinnedId) -> Result<Arc<Mutex<Vec<u8>>>, CudaError> {
        self.pinned
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id.0)
            .cloned()
            .ok_or_else(|| CudaError::Driver {
                call: "pinned memory",
                device: 0,
                message: format!("no pinned buffer {}", id.0),
            })
    }

    fn capture_state(&self) -> std::sync::MutexGuard<'_, Capture> {
        self.capture.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `op` while capturing, else executes it.
    fn submit(&self, op: Op) -> Result<(), CudaError> {
        {
            let mut c = self.capture_state();
            match &mut *c {
                Capture::Recording(ops) => {
                    ops.push(op);
                    return Ok(());
                }
                Capture::Invalid(why) => {
                    return Err(CudaError::Capture {
                        call: "submit",
                        message: format!("the capture was invalidated: {why}"),
                    });
                }
                Capture::Idle => {}
            }
        }
        self.execute(&op)
    }

    /// A synchronous call: an error that invalidates the capture while one is under way.
    fn not_capturing(&self, call: &'static str) -> Result<(), CudaError> {
        let mut c = self.capture_state();
        match &*c {
            Capture::Idle => Ok(()),
            _ => {
                let message = format!("{call} is not permitted while a graph is being captured");
                *c = Capture::Invalid(message.clone());
                Err(CudaError::Capture { call, message })
            }
        }
    }

    fn execute(&self, op: &Op) -> Result<(), CudaError> {
        if self.skips() {
            return Ok(());
        }
        match op {
            Op::Launch {
                device,
                module,
                entry,
                dims,
                params,
                kernel,
            } => {
                let m = self.module(*device, *module)?;
                let stats = self
                    .dev(*device, "launch")?
                    .launch(&m, entry, config(*dims), KernelArgs::Packed(params))
                    .map_err(|e| fault(kernel, *device, e))?;
                self.lane_instructions
                    .fetch_add(stats.lane_instructions, Ordering::Relaxed);
                Ok(())
            }
            Op::CopyDtod {
                device,
                dst,
                src,
                bytes,
            } => self
                .dev(*device, "copy on device")?
                .copy_dtod(ptr(*dst), ptr(*src), *bytes)
                .map_err(driver_error("copy on device", *device)),
            Op::CopyPeer {
                dst_device,
                dst,
                src_device,
                src,
                bytes,
            } => towerpack_ptx::copy_peer(
                self.dev(*dst_device, "peer copy")?,
                ptr(*dst),
                self.dev(*src_device, "peer copy")?,
                ptr(*src),
                *bytes,
            )
            .map_err(driver_error("peer copy", *dst_device)),
            Op::MemsetU8 { device, dst, bytes } => self
                .dev(*device, "memset")?
                .memset_d8(ptr(*dst), 0, *bytes)
                .map_err(driver_error("memset", *device)),
            Op::MemsetU32 {
                device,
                dst,
                value,
                count,
            } => self
                .dev(*device, "memset")?
                .memset_d32(ptr(*dst), *value, *count)
                .map_err(driver_error("memset", *device)),
            Op::Download {
                device,
                dst,
                offset,
                src,
                bytes,
            } => {
                let buf = self.pinned_buffer(*dst)?;
                let mut host = buf.lock().unwrap_or_else(|e| e.into_inner());
                let out = host
                    .get_mut(*offset..offset + bytes)
                    .ok_or_else(|| out_of_range("download", *device, *offset, *bytes))?;
                self.dev(*device, "download")?
                    .copy_dtoh(out, ptr(*src))
                    .map_err(driver_error("download", *device))
            }
            Op::Event => Ok(()),
        }
    }
}

fn ptr(p: DevicePtr) -> towerpack_ptx::DevicePtr {
    towerpack_ptx::DevicePtr(p.0)
}

fn config(dims: LaunchDims) -> LaunchConfig {
    LaunchConfig {
        grid: dims.grid,
        block: dims.block,
        shared_bytes: dims.shared_bytes,
    }
}

fn out_of_range(call: &'static str, device: usize, offset: usize, bytes: usize) -> CudaError {
    CudaError::Driver {
        call,
        device,
        message: format!(
            "bytes {offset}..{} lie outside the pinned buffer",
            offset + bytes
        ),
    }
}

fn driver_error(call: &'static str, device: usize) -> impl Fn(EmuError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        device,
        message: e.to_string(),
    }
}

fn fault(kernel: &str, device: usize, e: EmuError) -> CudaError {
    match e {
        EmuError::Exec(x) => CudaError::Fault {
            kernel: kernel.to_string(),
            ptx_line: Some(x.line),
            message: format!("{x} (emulated device {device})"),
        },
        other => CudaError::Fault {
            kernel: kernel.to_string(),
            ptx_line: None,
            message: format!("{other} (emulated device {device})"),
        },
    }
}

impl Driver for EmulatedDriver {
    fn name(&self) -> &'static str {
        "cuda-emu"
    }

    fn devices(&self) -> usize {
        self.devices.len()
    }

    fn arch(&self, _device: usize) -> Arch {
        Arch(self.arch.load(Ordering::Relaxed))
    }

    fn load_module(&self, device: usize, ptx: &str) -> Result<ModuleId, CudaError> {
        let m = self
            .dev(device, "load module")?
            .load_module(ptx)
            .map_err(driver_error("load module", device))?;
        let mut modules = self.modules.write().unwrap_or_else(|e| e.into_inner());
        modules.push((device, Arc::new(m)));
        Ok(ModuleId(modules.len() - 1))
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr, CudaError> {
        self.not_capturing("alloc")?;
        // A zero-byte allocation still gets a distinct address.
        let p = self
            .dev(device, "alloc")?
            .alloc(bytes.max(1))
            .map_err(driver_error("alloc", device))?;
        Ok(DevicePtr(p.0))
    }

    fn copy_htod(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<(), CudaError> {
        self.not_capturing("copy to device")?;
        if self.skips() {
            return Ok(());
        }
        self.dev(device, "copy to device")?
            .copy_htod(ptr(dst), src)
            .map_err(driver_error("copy to device", device))
    }

    fn copy_dtoh(&self, device: usize, dst: &mut [u8], src: DevicePtr) -> Result<(), CudaError> {
        self.not_capturing("copy to host")?;
        if self.skips() {
            return Ok(());
        }
        self.dev(device, "copy to host")?
            .copy_dtoh(dst, ptr(src))
            .map_err(driver_error("copy to host", device))
    }

    fn copy_dtod(
        &self,
        device: usize,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        self.submit(Op::CopyDtod {
            device,
            dst,
            src,
            bytes,
        })
    }

    fn copy_peer(
        &self,
        _stream: usize,
        dst_device: usize,
        dst: DevicePtr,
        src_device: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        self.submit(Op::CopyPeer {
            dst_device,
            dst,
            src_device,
            src,
            bytes,
        })
    }

    fn memset_zero(&self, device: usize, dst: DevicePtr, bytes: usize) -> Result<(), CudaError> {
        self.submit(Op::MemsetU8 { device, dst, bytes })
    }

    fn memset_u32(
        &self,
        device: usize,
        dst: DevicePtr,
        value: u32,
        count: usize,
    ) -> Result<(), CudaError> {
        self.submit(Op::MemsetU32 {
            device,
            dst,
            value,
            count,
        })
    }

    fn launch(
        &self,
        device: usize,
        module: ModuleId,
        entry: &str,
        dims: LaunchDims,
        params: &[u8],
        kernel: &str,
    ) -> Result<(), CudaError> {
        self.submit(Op::Launch {
            device,
            module,
            entry: entry.to_string(),
            dims,
            params: params.to_vec(),
            kernel: kernel.to_string(),
        })
    }

    fn create_event(&self, _device: usize) -> Result<EventId, CudaError> {
        Ok(EventId(self.events.fetch_add(1, Ordering::Relaxed)))
    }

    fn record(&self, _device: usize, _event: EventId) -> Result<(), CudaError> {
        // Synchronous devices: the recorded work is already complete.
        self.submit(Op::Event)
    }

    fn wait(&self, _device: usize, _event: EventId) -> Result<(), CudaError> {
        self.submit(Op::Event)
    }

    fn synchronize(&self, _device: usize) -> Result<(), CudaError> {
        self.not_capturing("synchronize")
    }

    fn begin_capture(&self) -> Result<(), CudaError> {
        if !self.graphs_available.load(Ordering::Relaxed) {
            return Err(CudaError::Capture {
                call: "begin capture",
                message: "graphs are disabled on this emulated driver".into(),
            });
        }
        let mut c = self.capture_state();
        match &*c {
            Capture::Idle => {
                *c = Capture::Recording(Vec::new());
                Ok(())
            }
            _ => Err(CudaError::Capture {
                call: "begin capture",
                message: "a capture is already under way".into(),
            }),
        }
    }

    fn end_capture(&self) -> Result<GraphId, CudaError> {
        let state = std::mem::replace(&mut *self.capture_state(), Capture::Idle);
        match state {
            Capture::Recording(ops) => {
                let mut graphs = self.graphs.write().unwrap_or_else(|e| e.into_inner());
                graphs.push(Arc::new(ops));
                Ok(GraphId(graphs.len() - 1))
            }
            Capture::Invalid(why) => Err(CudaError::Capture {
                call: "end capture",
                message: format!("the capture was invalidated: {why}"),
            }),
            Capture::Idle => Err(CudaError::Capture {
                call: "end capture",
                message: "no capture is under way".into(),
            }),
        }
    }

    fn abort_capture(&self) {
        *self.capture_state() = Capture::Idle;
    }

    fn launch_graph(&self, graph: GraphId) -> Result<(), CudaError> {
        self.not_capturing("launch graph")?;
        let ops = self
            .graphs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(graph.0)
            .cloned()
            .ok_or_else(|| CudaError::Capture {
                call: "launch graph",
                message: format!("no graph {}", graph.0),
            })?;
        self.graph_replays.fetch_add(1, Ordering::Relaxed);
        ops.iter().try_for_each(|op| self.execute(op))
    }

    fn record_external(&self, _device: usize, _event: EventId) -> Result<(), CudaError> {
        self.submit(Op::Event)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedId, CudaError> {
        self.not_capturing("alloc pinned")?;
        let mut pinned = self.pinned.write().unwrap_or_else(|e| e.into_inner());
        pinned.push(Arc::new(Mutex::new(vec![0u8; bytes])));
        Ok(PinnedId(pinned.len() - 1))
    }

    fn write_pinned(&self, dst: PinnedId, offset: usize, data: &[u8]) -> Result<(), CudaError> {
        let buf = self.pinned_buffer(dst)?;
        let mut host = buf.lock().unwrap_or_else(|e| e.into_inner());
        host.get_mut(offset..offset + data.len())
            .ok_or_else(|| out_of_range("write pinned", 0, offset, data.len()))?
            .copy_from_slice(data);
        Ok(())
    }

    fn read_pinned(&self, src: PinnedId, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        let buf = self.pinned_buffer(src)?;
        let host = buf.lock().unwrap_or_else(|e| e.into_inner());
        out.copy_from_slice(
            host.get(offset..offset + out.len())
                .ok_or_else(|| out_of_range("read pinned", 0, offset, out.len()))?,
        );
        Ok(())
    }

    fn upload(
        &self,
        device: usize,
        dst: DevicePtr,
        src: PinnedId,
        offset: usize,
        bytes: usize,
    ) -> Result<(), CudaError> {
        // The copy stream is never part of a capture: the upload happens now.
        if self.skips() {
            return Ok(());
        }
        let buf = self.pinned_buffer(src)?;
        let host = buf.lock().unwrap_or_else(|e| e.into_inner());
        let data = host
            .get(offset..offset + bytes)
            .ok_or_else(|| out_of_range("upload", device, offset, bytes))?;
        self.dev(device, "upload")?
            .copy_htod(ptr(dst), data)
            .map_err(driver_error("upload", device))
    }

    fn await_uploads(&self, _device: usize) -> Result<(), CudaError> {
        self.submit(Op::Event)
    }

    fn copy_wait(&self, _device: usize, _event: EventId) -> Result<(), CudaError> {
        Ok(())
    }

    fn download(
        &self,
        device: usize,
        dst: PinnedId,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        self.submit(Op::Download {
            device,
            dst,
            offset,
            src,
            bytes,
        })
    }

    fn multiprocessors(&self, device: usize) -> Option<u32> {
        self.devices.get(device).map(|d| d.multiprocessors())
    }

    fn lane_instructions(&self) -> Option<u64> {
        Some(self.lane_instructions.load(Ordering::Relaxed))
    }
}
