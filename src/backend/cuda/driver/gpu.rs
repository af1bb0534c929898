//! The [`Driver`] on real GPUs: the CUDA driver API through cudarc (dynamically loaded, so a
//! machine without a driver gets [`CudaError::NoDriver`], never a panic). One primary context
//! and one non-blocking stream per device; every call makes the device's context current on
//! the calling thread first. Host copies synchronise the stream (they are only used for feeds,
//! fetches and variables).
//!
//! No machine of this project has a GPU: this file is compiled and reviewed, not executed. Its
//! logic above the driver calls is shared with the emulated driver through the backend.

use super::{DevicePtr, Driver, EventId, ModuleId};
use crate::backend::cuda::error::CudaError;
use crate::backend::cuda::nvrtc::Arch;
use crate::backend::cuda::render::LaunchDims;
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::Mutex;

/// One device: its context and stream.
struct Gpu {
    device: sys::CUdevice,
    context: sys::CUcontext,
    stream: sys::CUstream,
    arch: Arch,
}

/// Handles created through the driver, freed on drop.
#[derive(Default)]
struct Tables {
    modules: Vec<(usize, sys::CUmodule, HashMap<String, sys::CUfunction>)>,
    events: Vec<(usize, sys::CUevent)>,
    allocations: Vec<(usize, sys::CUdeviceptr)>,
}

/// The GPUs `0..n` of this machine.
pub struct GpuDriver {
    gpus: Vec<Gpu>,
    tables: Mutex<Tables>,
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
                arch: Arch(cc),
            });
        }
        Ok(GpuDriver {
            gpus,
            tables: Mutex::new(Tables::default()),
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
        self.gpu(device, "cuMemAlloc")?;
        // SAFETY: the context is current; the memory is zeroed before use and freed on drop.
        let p = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(fail("cuMemAlloc", device))?;
        // SAFETY: `p` is a fresh allocation of at least `bytes` bytes.
        unsafe { result::memset_d8_sync(p, 0, bytes.max(1)) }
            .map_err(fail("cuMemsetD8", device))?;
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
}

impl GpuDriver {
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
        for (d, g) in self.gpus.iter().enumerate() {
            if self.gpu(d, "teardown").is_err() {
                continue;
            }
            // SAFETY: every handle below was created on this device and is released once.
            unsafe {
                let _ = result::stream::synchronize(g.stream);
                for &(_, p) in t.allocations.iter().filter(|(o, _)| *o == d) {
                    let _ = result::free_sync(p);
                }
                for &(_, e) in t.events.iter().filter(|(o, _)| *o == d) {
                    let _ = result::event::destroy(e);
                }
                for (_, m, _) in t.modules.iter().filter(|(o, _, _)| *o == d) {
                    let _ = result::module::unload(*m);
                }
                let _ = result::stream::destroy(g.stream);
                let _ = result::primary_ctx::release(g.device);
            }
        }
    }
}
