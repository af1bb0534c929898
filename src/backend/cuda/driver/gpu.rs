//! The [`Driver`] on real GPUs: the CUDA driver API through cudarc (dynamically loaded, so a
//! machine without a driver gets [`CudaError::NoDriver`], never a panic). One primary context
//! and two non-blocking streams per device (compute, and copy for uploads from pinned memory);
//! every call makes the device's context current on the calling thread first. Pageable host
//! copies synchronise the stream (they are only used for variables and one-off programs).
//!
//! Graphs are CUDA stream capture: device 0's compute stream begins a thread-local capture and
//! every other device's stream joins it through an event (fork), and rejoins it before the end
//! (join), so one graph holds the whole multi-device step; a launch is ordered after, and
//! orders later work after, every device's stream the same way. Events recorded for the copy
//! stream inside a capture are external event nodes. Graphs need a driver for CUDA 12.0 or
//! newer; older ones answer [`CudaError::Capture`] and the backend submits launch by launch.
//!
//! No machine of this project has a GPU: this file is compiled and reviewed, not executed. Its
//! logic above the driver calls is shared with the emulated driver through the backend.

use super::{DevicePtr, Driver, EventId, GraphId, ModuleId, PinnedId};
use crate::backend::cuda::error::CudaError;
use crate::backend::cuda::nvrtc::Arch;
use crate::backend::cuda::render::LaunchDims;
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::Mutex;

/// One device: its context, streams and the driver's own events.
struct Gpu {
    device: sys::CUdevice,
    context: sys::CUcontext,
    /// Kernels, device copies, memsets, downloads: the stream graphs are captured on.
    stream: sys::CUstream,
    /// Uploads from pinned memory.
    copy_stream: sys::CUstream,
    /// Recorded on the copy stream after every upload.
    uploaded: sys::CUevent,
    /// Fork and join points of captures and graph launches across devices.
    sync: sys::CUevent,
    arch: Arch,
}

/// Page-locked host memory.
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

/// Handles created through the driver, freed on drop.
#[derive(Default)]
struct Tables {
    modules: Vec<(usize, sys::CUmodule, HashMap<String, sys::CUfunction>)>,
    events: Vec<(usize, sys::CUevent)>,
    allocations: Vec<(usize, sys::CUdeviceptr)>,
    graphs: Vec<sys::CUgraphExec>,
    pinned: Vec<Pinned>,
}

/// The GPUs `0..n` of this machine.
pub struct GpuDriver {
    gpus: Vec<Gpu>,
    tables: Mutex<Tables>,
    /// `cuDriverGetVersion`, e.g. 12090.
    version: i32,
    /// A capture is under way.
    capturing: Mutex<bool>,
}

// SAFETY: CUDA driver handles (contexts, streams, modules, functions, events, device pointers)
// may be used from any thread once the owning context is made current, which every method does
// first; the tables of handles are behind a mutex.
unsafe impl Send for GpuDriver {}
// SAFETY: as above.
unsafe impl Sync for GpuDriver {}

fn fail(call: &'static str, device: usize) -> impl Fn(result::DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        device,
        message: format!("{e:?}"),
    }
}

impl GpuDriver {
    /// Opens GPUs `0..n`; a clear error without a driver or with fewer than `n` devices.
    pub fn new(n: usize) -> Result<GpuDriver, CudaError> {
        // SAFETY: probing only loads the library by name (cudarc panics on use otherwise).
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        result::init().map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_NO_DEVICE => CudaError::NoDevice {
                found: 0,
                needed: n,
            },
            _ => fail("cuInit", 0)(e),
        })?;
        let found = result::device::get_count().map_err(fail("cuDeviceGetCount", 0))?;
        let found = usize::try_from(found).unwrap_or(0);
        if found < n.max(1) {
            return Err(CudaError::NoDevice {
                found,
                needed: n.max(1),
            });
        }
        let mut gpus = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let device = result::device::get(i as i32).map_err(fail("cuDeviceGet", i))?;
            // SAFETY: `device` was just returned by cuDeviceGet.
            let context = unsafe { result::primary_ctx::retain(device) }
                .map_err(fail("cuDevicePrimaryCtxRetain", i))?;
            // SAFETY: the context was just retained.
            unsafe { result::ctx::set_current(context) }.map_err(fail("cuCtxSetCurrent", i))?;
            let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(fail("cuStreamCreate", i))?;
            let copy_stream = result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(fail("cuStreamCreate", i))?;
            let event = || {
                result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(fail("cuEventCreate", i))
            };
            let (uploaded, sync) = (event()?, event()?);
            let attr = |a| {
                // SAFETY: `device` is valid.
                unsafe { result::device::get_attribute(device, a) }
                    .map_err(fail("cuDeviceGetAttribute", i))
            };
            let major =
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor =
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            // NVRTC 12.9 compiles for up to compute_120; newer GPUs run that PTX through the JIT.
            let cc = (major * 10 + minor).clamp(50, 120) as u32;
            gpus.push(Gpu {
                device,
                context,
                stream,
                copy_stream,
                uploaded,
                sync,
                arch: Arch(cc),
            });
        }
        let mut version = 0;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(fail("cuDriverGetVersion", 0))?;
        Ok(GpuDriver {
            gpus,
            tables: Mutex::new(Tables::default()),
            version,
            capturing: Mutex::new(false),
        })
    }

    /// Makes `device`'s context current and returns it.
    fn gpu(&self, device: usize, call: &'static str) -> Result<&Gpu, CudaError> {
        let g = self.gpus.get(device).ok_or_else(|| CudaError::Driver {
            call,
            device,
            message: format!("only {} GPUs are open", self.gpus.len()),
        })?;
        // SAFETY: the context was retained in `new` and is released only on drop.
        unsafe { result::ctx::set_current(g.context) }.map_err(fail("cuCtxSetCurrent", device))?;
        Ok(g)
    }

    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Driver for GpuDriver {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn devices(&self) -> usize {
        self.gpus.len()
    }

    fn arch(&self, device: usize) -> Arch {
        self.gpus.get(device).map_or(Arch(80), |g| g.arch)
    }

    fn multiprocessors(&self, device: usize) -> Option<u32> {
        let g = self.gpus.get(device)?;
        // SAFETY: `g.device` was returned by cuDeviceGet in `new`.
        let count = unsafe {
            result::device::get_attribute(
                g.device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
        };
        count.ok().and_then(|c| u32::try_from(c).ok())
    }

    fn cuda_ordinal(&self, device: usize) -> Option<usize> {
        // GPU `i` of this driver is CUDA device `i` (see `new`), in its primary context.
        (device < self.gpus.len()).then_some(device)
    }

    fn load_module(&self, device: usize, ptx: &str) -> Result<ModuleId, CudaError> {
        self.gpu(device, "cuModuleLoadData")?;
        let image = CString::new(ptx).map_err(|_| CudaError::Driver {
            call: "cuModuleLoadData",
            device,
            message: "PTX contains a NUL byte".into(),
        })?;
        // SAFETY: `image` is a NUL-terminated PTX string that outlives the call.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map_err(fail("cuModuleLoadData", device))?;
        let mut t = self.tables();
        t.modules.push((device, module, HashMap::new()));
        Ok(ModuleId(t.modules.len() - 1))
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr, CudaError> {
        let g = self.gpu(device, "cuMemAlloc")?;
        // SAFETY: the context is current; the memory is zeroed before use and freed on drop.
        let p = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(fail("cuMemAlloc", device))?;
        // Zeroed on this device's own stream, and waited for. `cuMemsetD8` runs on the legacy
        // default stream, asynchronously to the host and unordered with the non-blocking
        // streams every copy and kernel use: a copy issued right after (the constants, the
        // variables) could land first and be wiped. Measured on an H100: the constants read
        // as zeros (x / 255 infinite) and ResNet-20 trained to NaN at batch 96 and above.
        // SAFETY: `p` is a fresh allocation of at least `bytes` bytes; the stream is this
        // device's and the wait completes the memset before `p` is handed out.
        unsafe {
            result::memset_d8_async(p, 0, bytes.max(1), g.stream)
                .map_err(fail("cuMemsetD8Async", device))?;
            result::stream::synchronize(g.stream).map_err(fail("cuStreamSynchronize", device))?;
        }
        self.tables().allocations.push((device, p));
        Ok(DevicePtr(p))
    }

    fn copy_htod(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuMemcpyHtoDAsync")?;
        // SAFETY: `dst` addresses at least `src.len()` bytes (the backend's planned buffers);
        // the stream is synchronised before `src` can be released.
        unsafe {
            result::memcpy_htod_async(dst.0, src, g.stream)
                .map_err(fail("cuMemcpyHtoDAsync", device))?;
            result::stream::synchronize(g.stream).map_err(fail("cuStreamSynchronize", device))
        }
    }

    fn copy_dtoh(&self, device: usize, dst: &mut [u8], src: DevicePtr) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuMemcpyDtoHAsync")?;
        // SAFETY: `src` addresses at least `dst.len()` bytes; the copy is complete when the
        // stream synchronisation returns.
        unsafe {
            result::memcpy_dtoh_async(dst, src.0, g.stream)
                .map_err(fail("cuMemcpyDtoHAsync", device))?;
            result::stream::synchronize(g.stream).map_err(fail("cuStreamSynchronize", device))
        }
    }

    fn copy_dtod(
        &self,
        device: usize,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuMemcpyDtoDAsync")?;
        // SAFETY: both ranges lie in live allocations of this device (planned buffers).
        unsafe { result::memcpy_dtod_async(dst.0, src.0, bytes, g.stream) }
            .map_err(fail("cuMemcpyDtoDAsync", device))
    }

    fn copy_peer(
        &self,
        stream: usize,
        dst_device: usize,
        dst: DevicePtr,
        src_device: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        let src_ctx = self.gpu(src_device, "cuMemcpyPeerAsync")?.context;
        let dst_ctx = self.gpu(dst_device, "cuMemcpyPeerAsync")?.context;
        let s = self.gpu(stream, "cuMemcpyPeerAsync")?.stream;
        // SAFETY: both ranges lie in live allocations of their devices; the stream is live.
        unsafe { result::memcpy_peer_async(dst_ctx, dst.0, src_ctx, src.0, bytes, s) }
            .map_err(fail("cuMemcpyPeerAsync", dst_device))
    }

    fn memset_zero(&self, device: usize, dst: DevicePtr, bytes: usize) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuMemsetD8Async")?;
        // SAFETY: the range lies in a live allocation of this device.
        unsafe { result::memset_d8_async(dst.0, 0, bytes, g.stream) }
            .map_err(fail("cuMemsetD8Async", device))
    }

    fn memset_u32(
        &self,
        device: usize,
        dst: DevicePtr,
        value: u32,
        count: usize,
    ) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuMemsetD32Async")?;
        // SAFETY: the range of `count` words lies in a live allocation of this device.
        unsafe { sys::cuMemsetD32Async(dst.0, value, count, g.stream) }
            .result()
            .map_err(fail("cuMemsetD32Async", device))
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
        let g = self.gpu(device, "cuLaunchKernel")?;
        let function = {
            let mut t = self.tables();
            let (owner, m, functions) =
                t.modules
                    .get_mut(module.0)
                    .ok_or_else(|| CudaError::Driver {
                        call: "cuLaunchKernel",
                        device,
                        message: format!("no module {}", module.0),
                    })?;
            if *owner != device {
                return Err(CudaError::Driver {
                    call: "cuLaunchKernel",
                    device,
                    message: format!("module {} belongs to device {owner}", module.0),
                });
            }
            match functions.get(entry) {
                Some(f) => *f,
                None => {
                    let name = CString::new(entry).map_err(|_| CudaError::Driver {
                        call: "cuModuleGetFunction",
                        device,
                        message: "entry name contains a NUL byte".into(),
                    })?;
                    // SAFETY: the module is loaded and not unloaded before drop.
                    let f = unsafe { result::module::get_function(*m, name) }
                        .map_err(fail("cuModuleGetFunction", device))?;
                    functions.insert(entry.to_string(), f);
                    f
                }
            }
        };
        // The kernel takes one parameter, the packed struct: kernelParams holds its address.
        // cuLaunchKernel copies the bytes before returning, so `params` may be dropped after.
        let mut args = [params.as_ptr() as *mut c_void];
        let [gx, gy, gz] = dims.grid;
        let [bx, by, bz] = dims.block;
        // SAFETY: `function` takes exactly one parameter whose layout is `params` (rendered from
        // one descriptor); every pointer in it addresses a live allocation of this device.
        unsafe {
            result::launch_kernel(
                function,
                (gx, gy, gz),
                (bx, by, bz),
                dims.shared_bytes,
                g.stream,
                &mut args,
            )
        }
        .map_err(|e| CudaError::Fault {
            kernel: kernel.to_string(),
            ptx_line: None,
            message: format!("cuLaunchKernel on GPU {device}: {e:?}"),
        })
    }

    fn create_event(&self, device: usize) -> Result<EventId, CudaError> {
        self.gpu(device, "cuEventCreate")?;
        let e = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(fail("cuEventCreate", device))?;
        let mut t = self.tables();
        t.events.push((device, e));
        Ok(EventId(t.events.len() - 1))
    }

    fn record(&self, device: usize, event: EventId) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuEventRecord")?;
        let e = self.event(event, device)?;
        // SAFETY: the event and stream are live.
        unsafe { result::event::record(e, g.stream) }.map_err(fail("cuEventRecord", device))
    }

    fn wait(&self, device: usize, event: EventId) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuStreamWaitEvent")?;
        let e = self.event(event, device)?;
        // SAFETY: the event and stream are live; events may be waited on from any device.
        unsafe {
            result::stream::wait_event(g.stream, e, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        }
        .map_err(fail("cuStreamWaitEvent", device))
    }

    fn synchronize(&self, device: usize) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuStreamSynchronize")?;
        // SAFETY: the stream is live.
        unsafe { result::stream::synchronize(g.stream) }.map_err(|e| CudaError::Fault {
            kernel: "(asynchronous)".into(),
            ptx_line: None,
            message: format!("GPU {device}: {e:?}"),
        })
    }

    fn begin_capture(&self) -> Result<(), CudaError> {
        if self.version < 12000 {
            return Err(capture_error("cuStreamBeginCapture")(format!(
                "the driver supports CUDA {}.{}; graphs of this backend need 12.0",
                self.version / 1000,
                self.version % 1000 / 10
            )));
        }
        let mut capturing = self.capturing.lock().unwrap_or_else(|e| e.into_inner());
        if *capturing {
            return Err(capture_error("cuStreamBeginCapture")(
                "a capture is already under way".into(),
            ));
        }
        let origin = self.gpu(0, "cuStreamBeginCapture")?;
        // SAFETY: the stream is live; thread-local mode only forbids unsafe calls on this
        // thread, which the backend does not make while capturing.
        unsafe {
            result::stream::begin_capture(
                origin.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| capture_error("cuStreamBeginCapture")(format!("{e:?}")))?;
        *capturing = true;
        drop(capturing);
        // Every other device's stream joins the capture by waiting for a point of it.
        if self.gpus.len() > 1 {
            let fork = (|| {
                // SAFETY: the event and stream belong to device 0, whose context is current.
                unsafe { result::event::record(origin.sync, origin.stream) }
                    .map_err(|e| capture_error("cuEventRecord")(format!("{e:?}")))?;
                for d in 1..self.gpus.len() {
                    let g = self.gpu(d, "cuStreamWaitEvent")?;
                    // SAFETY: both handles are live; an event may be waited on from any device.
                    unsafe {
                        result::stream::wait_event(
                            g.stream,
                            origin.sync,
                            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                        )
                    }
                    .map_err(|e| capture_error("cuStreamWaitEvent")(format!("{e:?}")))?;
                }
                Ok(())
            })();
            if let Err(e) = fork {
                self.abort_capture();
                return Err(e);
            }
        }
        Ok(())
    }

    fn end_capture(&self) -> Result<GraphId, CudaError> {
        {
            let mut capturing = self.capturing.lock().unwrap_or_else(|e| e.into_inner());
            if !*capturing {
                return Err(capture_error("cuStreamEndCapture")(
                    "no capture is under way".into(),
                ));
            }
            *capturing = false;
        }
        let joined = self.join_into_origin("cuStreamEndCapture");
        let origin = self.gpu(0, "cuStreamEndCapture")?;
        // SAFETY: the stream is capturing (begun above); ending returns the graph or an error
        // and leaves every joined stream out of capture either way.
        let graph = unsafe { result::stream::end_capture(origin.stream) }
            .map_err(|e| capture_error("cuStreamEndCapture")(format!("{e:?}")))?;
        let instantiated = joined.and_then(|()| {
            // SAFETY: `graph` was just returned by the capture.
            unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
                .map_err(|e| capture_error("cuGraphInstantiate")(format!("{e:?}")))
        });
        // SAFETY: the executable graph does not depend on the graph it was made from.
        let _ = unsafe { result::graph::destroy(graph) };
        let exec = instantiated?;
        let mut t = self.tables();
        t.graphs.push(exec);
        Ok(GraphId(t.graphs.len() - 1))
    }

    fn abort_capture(&self) {
        let mut capturing = self.capturing.lock().unwrap_or_else(|e| e.into_inner());
        if !*capturing {
            return;
        }
        *capturing = false;
        let _ = self.join_into_origin("abort capture");
        if let Ok(origin) = self.gpu(0, "cuStreamEndCapture") {
            // SAFETY: ends the capture begun on this stream; the graph, if any, is discarded.
            if let Ok(graph) = unsafe { result::stream::end_capture(origin.stream) } {
                // SAFETY: `graph` was just returned and is not used again.
                let _ = unsafe { result::graph::destroy(graph) };
            }
        }
    }

    fn launch_graph(&self, graph: GraphId) -> Result<(), CudaError> {
        let exec = self
            .tables()
            .graphs
            .get(graph.0)
            .copied()
            .ok_or_else(|| capture_error("cuGraphLaunch")(format!("no graph {}", graph.0)))?;
        // After every device's earlier work ...
        self.join_into_origin("cuGraphLaunch")?;
        let origin = self.gpu(0, "cuGraphLaunch")?;
        // SAFETY: the executable graph and the stream are live; every address in the graph
        // belongs to live allocations (freed only on drop).
        unsafe { result::graph::launch(exec, origin.stream) }.map_err(|e| CudaError::Fault {
            kernel: "(graph)".into(),
            ptx_line: None,
            message: format!("cuGraphLaunch: {e:?}"),
        })?;
        // ... and before every device's later work.
        self.fork_from_origin("cuGraphLaunch")
    }

    fn record_external(&self, device: usize, event: EventId) -> Result<(), CudaError> {
        let capturing = *self.capturing.lock().unwrap_or_else(|e| e.into_inner());
        let g = self.gpu(device, "cuEventRecordWithFlags")?;
        let e = self.event(event, device)?;
        let flags = if capturing {
            sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL
        } else {
            sys::CUevent_record_flags::CU_EVENT_RECORD_DEFAULT
        };
        // SAFETY: the event and stream are live and belong to this device.
        unsafe { sys::cuEventRecordWithFlags(e, g.stream, flags as u32) }
            .result()
            .map_err(fail("cuEventRecordWithFlags", device))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedId, CudaError> {
        self.gpu(0, "cuMemHostAlloc")?;
        let len = bytes.max(1);
        // SAFETY: allocates `len` bytes of page-locked memory, zeroed below, freed on drop.
        let ptr = unsafe { result::malloc_host(len, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(fail("cuMemHostAlloc", 0))?
            .cast::<u8>();
        // SAFETY: `ptr` addresses `len` writable bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        let mut t = self.tables();
        t.pinned.push(Pinned { ptr, len });
        Ok(PinnedId(t.pinned.len() - 1))
    }

    fn write_pinned(&self, dst: PinnedId, offset: usize, data: &[u8]) -> Result<(), CudaError> {
        // Uploads read pinned memory asynchronously: wait for those submitted so far.
        for (d, g) in self.gpus.iter().enumerate() {
            self.gpu(d, "cuEventSynchronize")?;
            // SAFETY: the event is live (recorded or not: an unrecorded event is complete).
            unsafe { result::event::synchronize(g.uploaded) }
                .map_err(fail("cuEventSynchronize", d))?;
        }
        let (ptr, _) = self.pinned_range(dst, offset, data.len())?;
        // SAFETY: `ptr .. ptr + data.len()` lies in the pinned buffer, which no upload reads
        // any more (waited above) and no download writes (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
        Ok(())
    }

    fn read_pinned(&self, src: PinnedId, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        let (ptr, _) = self.pinned_range(src, offset, out.len())?;
        // SAFETY: the range lies in the buffer; the caller synchronised the downloads into it.
        unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), out.len()) };
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
        let (ptr, _) = self.pinned_range(src, offset, bytes)?;
        let g = self.gpu(device, "cuMemcpyHtoDAsync")?;
        // SAFETY: the source range lies in live pinned memory that the host does not write
        // until `uploaded` completes (`write_pinned` waits); `dst` addresses `bytes` bytes of
        // a live allocation of this device.
        unsafe {
            let host = std::slice::from_raw_parts(ptr, bytes);
            result::memcpy_htod_async(dst.0, host, g.copy_stream)
                .map_err(fail("cuMemcpyHtoDAsync", device))?;
            result::event::record(g.uploaded, g.copy_stream).map_err(fail("cuEventRecord", device))
        }
    }

    fn await_uploads(&self, device: usize) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuStreamWaitEvent")?;
        // SAFETY: both handles are live and belong to this device.
        unsafe {
            result::event::record(g.uploaded, g.copy_stream)
                .map_err(fail("cuEventRecord", device))?;
            result::stream::wait_event(
                g.stream,
                g.uploaded,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(fail("cuStreamWaitEvent", device))
        }
    }

    fn copy_wait(&self, device: usize, event: EventId) -> Result<(), CudaError> {
        let g = self.gpu(device, "cuStreamWaitEvent")?;
        let e = self.event(event, device)?;
        // SAFETY: both handles are live.
        unsafe {
            result::stream::wait_event(
                g.copy_stream,
                e,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(fail("cuStreamWaitEvent", device))
    }

    fn download(
        &self,
        device: usize,
        dst: PinnedId,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        let (ptr, _) = self.pinned_range(dst, offset, bytes)?;
        let g = self.gpu(device, "cuMemcpyDtoHAsync")?;
        // SAFETY: the destination range lies in live pinned memory, which the host reads only
        // after synchronising this stream; `src` addresses `bytes` bytes of this device.
        unsafe {
            let host = std::slice::from_raw_parts_mut(ptr, bytes);
            result::memcpy_dtoh_async(host, src.0, g.stream)
        }
        .map_err(fail("cuMemcpyDtoHAsync", device))
    }
}

fn capture_error(call: &'static str) -> impl Fn(String) -> CudaError {
    move |message| CudaError::Capture { call, message }
}

impl GpuDriver {
    /// `offset .. offset + bytes` of pinned buffer `id`: its address and the buffer's length.
    fn pinned_range(
        &self,
        id: PinnedId,
        offset: usize,
        bytes: usize,
    ) -> Result<(*mut u8, usize), CudaError> {
        let t = self.tables();
        let p = t.pinned.get(id.0).ok_or_else(|| CudaError::Driver {
            call: "pinned memory",
            device: 0,
            message: format!("no pinned buffer {}", id.0),
        })?;
        if offset.checked_add(bytes).is_none_or(|end| end > p.len) {
            return Err(CudaError::Driver {
                call: "pinned memory",
                device: 0,
                message: format!(
                    "bytes {offset}..{} lie outside the pinned buffer of {}",
                    offset.saturating_add(bytes),
                    p.len
                ),
            });
        }
        // SAFETY: `offset` is within the allocation (checked above).
        Ok((unsafe { p.ptr.add(offset) }, p.len))
    }

    /// Orders device 0's compute stream after every other device's work so far.
    fn join_into_origin(&self, call: &'static str) -> Result<(), CudaError> {
        for d in 1..self.gpus.len() {
            let g = self.gpu(d, call)?;
            // SAFETY: the event and stream belong to device `d`.
            unsafe { result::event::record(g.sync, g.stream) }.map_err(fail("cuEventRecord", d))?;
            let origin = self.gpu(0, call)?;
            // SAFETY: both handles are live; events may be waited on across devices.
            unsafe {
                result::stream::wait_event(
                    origin.stream,
                    g.sync,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .map_err(fail("cuStreamWaitEvent", 0))?;
        }
        Ok(())
    }

    /// Orders every other device's later work after device 0's compute stream so far.
    fn fork_from_origin(&self, call: &'static str) -> Result<(), CudaError> {
        if self.gpus.len() < 2 {
            return Ok(());
        }
        let origin = self.gpu(0, call)?;
        // SAFETY: the event and stream belong to device 0.
        unsafe { result::event::record(origin.sync, origin.stream) }
            .map_err(fail("cuEventRecord", 0))?;
        for d in 1..self.gpus.len() {
            let g = self.gpu(d, call)?;
            // SAFETY: both handles are live.
            unsafe {
                result::stream::wait_event(
                    g.stream,
                    origin.sync,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .map_err(fail("cuStreamWaitEvent", d))?;
        }
        Ok(())
    }

    fn event(&self, event: EventId, device: usize) -> Result<sys::CUevent, CudaError> {
        self.tables()
            .events
            .get(event.0)
            .map(|(_, e)| *e)
            .ok_or_else(|| CudaError::Driver {
                call: "event",
                device,
                message: format!("no event {}", event.0),
            })
    }
}

impl Drop for GpuDriver {
    fn drop(&mut self) {
        let t = std::mem::take(&mut *self.tables());
        // Errors while tearing down cannot be reported; the process keeps running.
        // Every device idle first: a graph or upload may touch memory of several devices.
        for (d, g) in self.gpus.iter().enumerate() {
            if self.gpu(d, "teardown").is_ok() {
                // SAFETY: the streams are live until destroyed below.
                unsafe {
                    let _ = result::stream::synchronize(g.stream);
                    let _ = result::stream::synchronize(g.copy_stream);
                }
            }
        }
        for (d, g) in self.gpus.iter().enumerate() {
            if self.gpu(d, "teardown").is_err() {
                continue;
            }
            // SAFETY: every handle below was created on this device and is released once.
            unsafe {
                if d == 0 {
                    for &exec in &t.graphs {
                        let _ = result::graph::exec_destroy(exec);
                    }
                    // Pinned memory was allocated with device 0's context current.
                    for p in &t.pinned {
                        let _ = result::free_host(p.ptr.cast());
                    }
                }
                for &(_, p) in t.allocations.iter().filter(|(o, _)| *o == d) {
                    let _ = result::free_sync(p);
                }
                for &(_, e) in t.events.iter().filter(|(o, _)| *o == d) {
                    let _ = result::event::destroy(e);
                }
                for (_, m, _) in t.modules.iter().filter(|(o, _, _)| *o == d) {
                    let _ = result::module::unload(*m);
                }
                let _ = result::event::destroy(g.uploaded);
                let _ = result::event::destroy(g.sync);
                let _ = result::stream::destroy(g.copy_stream);
                let _ = result::stream::destroy(g.stream);
                let _ = result::primary_ctx::release(g.device);
            }
        }
    }
}
