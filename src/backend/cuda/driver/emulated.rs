//! The [`Driver`] on emulated devices (towerpack-ptx): the CUDA backend runs unchanged, without a
//! GPU. Everything is synchronous (a stream's work completes before the call returns), so
//! events only mark points in time. A fault names the program kernel and the PTX line.

use super::{DevicePtr, Driver, EventId, ModuleId};
use crate::backend::cuda::error::CudaError;
use crate::backend::cuda::nvrtc::Arch;
use crate::backend::cuda::render::LaunchDims;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use towerpack_ptx::{Device, EmuError, KernelArgs, LaunchConfig, Module};

/// `n` emulated devices.
pub struct EmulatedDriver {
    devices: Vec<Arc<Device>>,
    /// Loaded modules, with the device each was loaded on.
    modules: RwLock<Vec<(usize, Arc<Module>)>>,
    /// Events created so far (an event is only its id: the devices are synchronous).
    events: AtomicUsize,
    lane_instructions: AtomicU64,
}

impl EmulatedDriver {
    /// `n` devices with ordinals `0..n`.
    pub fn new(n: usize) -> EmulatedDriver {
        EmulatedDriver {
            devices: towerpack_ptx::create_devices(n.max(1)),
            modules: RwLock::new(Vec::new()),
            events: AtomicUsize::new(0),
            lane_instructions: AtomicU64::new(0),
        }
    }

    /// The emulated device `i` (to set step budgets or serial execution in tests).
    pub fn device(&self, i: usize) -> Option<&Device> {
        self.devices.get(i).map(|d| &**d)
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
}

fn driver_error(call: &'static str, device: usize) -> impl Fn(EmuError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        device,
        message: e.to_string(),
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
        Arch::EMULATED
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
        // A zero-byte allocation still gets a distinct address.
        let p = self
            .dev(device, "alloc")?
            .alloc(bytes.max(1))
            .map_err(driver_error("alloc", device))?;
        Ok(DevicePtr(p.0))
    }

    fn copy_htod(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<(), CudaError> {
        self.dev(device, "copy to device")?
            .copy_htod(towerpack_ptx::DevicePtr(dst.0), src)
            .map_err(driver_error("copy to device", device))
    }

    fn copy_dtoh(&self, device: usize, dst: &mut [u8], src: DevicePtr) -> Result<(), CudaError> {
        self.dev(device, "copy to host")?
            .copy_dtoh(dst, towerpack_ptx::DevicePtr(src.0))
            .map_err(driver_error("copy to host", device))
    }

    fn copy_dtod(
        &self,
        device: usize,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        self.dev(device, "copy on device")?
            .copy_dtod(
                towerpack_ptx::DevicePtr(dst.0),
                towerpack_ptx::DevicePtr(src.0),
                bytes,
            )
            .map_err(driver_error("copy on device", device))
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
        towerpack_ptx::copy_peer(
            self.dev(dst_device, "peer copy")?,
            towerpack_ptx::DevicePtr(dst.0),
            self.dev(src_device, "peer copy")?,
            towerpack_ptx::DevicePtr(src.0),
            bytes,
        )
        .map_err(driver_error("peer copy", dst_device))
    }

    fn memset_zero(&self, device: usize, dst: DevicePtr, bytes: usize) -> Result<(), CudaError> {
        self.dev(device, "memset")?
            .memset_d8(towerpack_ptx::DevicePtr(dst.0), 0, bytes)
            .map_err(driver_error("memset", device))
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
        let m = {
            let modules = self.modules.read().unwrap_or_else(|e| e.into_inner());
            match modules.get(module.0) {
                Some((d, m)) if *d == device => m.clone(),
                _ => {
                    return Err(CudaError::Driver {
                        call: "launch",
                        device,
                        message: format!("module {} is not loaded on this device", module.0),
                    });
                }
            }
        };
        let cfg = LaunchConfig {
            grid: dims.grid,
            block: dims.block,
            shared_bytes: dims.shared_bytes,
        };
        self.dev(device, "launch")?
            .launch(&m, entry, cfg, KernelArgs::Packed(params))
            .map(|stats| {
                self.lane_instructions
                    .fetch_add(stats.lane_instructions, Ordering::Relaxed);
            })
            .map_err(|e| match e {
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
            })
    }

    fn create_event(&self, _device: usize) -> Result<EventId, CudaError> {
        Ok(EventId(self.events.fetch_add(1, Ordering::Relaxed)))
    }

    fn record(&self, _device: usize, _event: EventId) -> Result<(), CudaError> {
        // Synchronous devices: the recorded work is already complete.
        Ok(())
    }

    fn wait(&self, _device: usize, _event: EventId) -> Result<(), CudaError> {
        Ok(())
    }

    fn synchronize(&self, _device: usize) -> Result<(), CudaError> {
        Ok(())
    }

    fn multiprocessors(&self, device: usize) -> Option<u32> {
        self.devices.get(device).map(|d| d.multiprocessors())
    }

    fn lane_instructions(&self) -> Option<u64> {
        Some(self.lane_instructions.load(Ordering::Relaxed))
    }
}
