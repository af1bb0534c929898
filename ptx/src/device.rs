//! The emulated device, shaped like the CUDA driver API: module load, allocation, host/device and
//! peer copies, memset, and kernel launch with parameters packed as `cuLaunchKernel` packs them.
//! Streams and events are synchronous: every call completes before it returns. A `Device` is
//! `Send + Sync`; allocations and copies lock its allocation table, launches read a snapshot.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::error::EmuError;
use crate::exec::{self, Launch, LaunchStats};
use crate::kernel::Kernel;
use crate::memory::{ALLOC_ALIGN, Allocation, GUARD_BYTES, GlobalView, device_base, device_of};
use crate::module::Module;

/// A device address (`CUdeviceptr`). Addresses of different devices never overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

/// Grid and block dimensions and dynamic shared memory, as `cuLaunchKernel` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

/// Kernel arguments: one byte slice per parameter (what `kernelParams` points to), or one buffer
/// laid out at the parameters' offsets (`CU_LAUNCH_PARAM_BUFFER_POINTER`).
#[derive(Debug, Clone, Copy)]
pub enum KernelArgs<'a> {
    PerParam(&'a [&'a [u8]]),
    Packed(&'a [u8]),
}

/// A recorded point in time (events are synchronous).
#[derive(Debug, Clone, Copy)]
pub struct Event(Instant);

impl Event {
    /// Time from `start` to this event.
    pub fn elapsed_since(&self, start: &Event) -> Duration {
        self.0.saturating_duration_since(start.0)
    }
}

/// Largest shared memory per CTA (sm_90 with the opt-in attribute).
pub const MAX_SHARED_PER_CTA: usize = 232_448;
/// Default budget of warp-instructions per CTA before a launch is declared a livelock.
pub const DEFAULT_STEP_LIMIT: u64 = 1 << 28;

#[derive(Debug)]
struct Table {
    allocs: BTreeMap<u64, Arc<Allocation>>,
    next: u64,
    in_use: usize,
}

/// One emulated CUDA device.
#[derive(Debug)]
pub struct Device {
    ordinal: usize,
    capacity: usize,
    table: RwLock<Table>,
    step_limit: AtomicU64,
    parallel: AtomicBool,
    multiprocessors: AtomicU32,
}

/// The multiprocessor count an emulated device reports unless told otherwise: an H100 SXM's.
pub const DEFAULT_MULTIPROCESSORS: u32 = 132;

/// Creates `n` devices with ordinals `0..n` (distinct address ranges, as `cuDeviceGet`).
pub fn create_devices(n: usize) -> Vec<Arc<Device>> {
    (0..n).map(|i| Arc::new(Device::new(i))).collect()
}

/// Copies `bytes` from `src` on `src_dev` to `dst` on `dst_dev` (`cuMemcpyPeer`; also within one
/// device when both are the same).
pub fn copy_peer(
    dst_dev: &Device,
    dst: DevicePtr,
    src_dev: &Device,
    src: DevicePtr,
    bytes: usize,
) -> Result<(), EmuError> {
    let (s, soff) = src_dev.find(src, bytes)?;
    let (d, doff) = dst_dev.find(dst, bytes)?;
    let mut buf = vec![0u8; bytes];
    s.read_bytes(soff, &mut buf);
    d.write_bytes(doff, &buf);
    Ok(())
}

impl Device {
    /// A device with `ordinal` and a 16 GiB memory capacity (host memory is taken per allocation).
    pub fn new(ordinal: usize) -> Device {
        Device::with_capacity(ordinal, 16 << 30)
    }

    /// A device with `capacity` bytes of memory.
    pub fn with_capacity(ordinal: usize, capacity: usize) -> Device {
        Device {
            ordinal,
            capacity,
            table: RwLock::new(Table {
                allocs: BTreeMap::new(),
                next: device_base(ordinal),
                in_use: 0,
            }),
            step_limit: AtomicU64::new(DEFAULT_STEP_LIMIT),
            parallel: AtomicBool::new(true),
            multiprocessors: AtomicU32::new(DEFAULT_MULTIPROCESSORS),
        }
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Sets the budget of warp-instructions per CTA (exceeding it is an error, not a hang).
    pub fn set_step_limit(&self, limit: u64) {
        self.step_limit.store(limit.max(1), Ordering::Relaxed);
    }

    /// Runs CTAs on several host threads (default) or on the calling thread only.
    pub fn set_parallel(&self, parallel: bool) {
        self.parallel.store(parallel, Ordering::Relaxed);
    }

    /// The multiprocessor count the device reports (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`;
    /// default [`DEFAULT_MULTIPROCESSORS`]). It changes nothing in how kernels execute: callers
    /// size their launches by it, so a small count makes small problems take the launch shapes
    /// a large GPU gives large ones.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors.load(Ordering::Relaxed)
    }

    /// Sets the reported multiprocessor count (at least 1).
    pub fn set_multiprocessors(&self, count: u32) {
        self.multiprocessors.store(count.max(1), Ordering::Relaxed);
    }

    /// (free, total) bytes, as `cuMemGetInfo`.
    pub fn mem_info(&self) -> (usize, usize) {
        let t = self.read_table();
        (self.capacity - t.in_use, self.capacity)
    }

    /// Parses and decodes PTX (`cuModuleLoadData`).
    pub fn load_module(&self, ptx: &str) -> Result<Module, EmuError> {
        Ok(Module::load(ptx)?)
    }

    fn read_table(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        // A poisoned lock only means another thread panicked mid-update of the map; the map
        // itself is always consistent (single insert/remove), so keep using it.
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_table(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `bytes` of zeroed device memory (`cuMemAlloc`), 256-byte aligned.
    pub fn alloc(&self, bytes: usize) -> Result<DevicePtr, EmuError> {
        let mut t = self.write_table();
        if t.in_use + bytes > self.capacity {
            return Err(EmuError::OutOfMemory {
                device: self.ordinal,
                bytes,
                in_use: t.in_use,
                capacity: self.capacity,
            });
        }
        let base = t.next;
        let end = base + bytes as u64;
        if device_of(end + GUARD_BYTES) != Some(self.ordinal) {
            return Err(EmuError::OutOfMemory {
                device: self.ordinal,
                bytes,
                in_use: t.in_use,
                capacity: self.capacity,
            });
        }
        t.next = (end + GUARD_BYTES).div_ceil(ALLOC_ALIGN) * ALLOC_ALIGN;
        t.in_use += bytes;
        t.allocs
            .insert(base, Arc::new(Allocation::new(base, bytes)));
        Ok(DevicePtr(base))
    }

    /// Frees an allocation (`cuMemFree`); its addresses are never reused.
    pub fn free(&self, ptr: DevicePtr) -> Result<(), EmuError> {
        let mut t = self.write_table();
        match t.allocs.remove(&ptr.0) {
            Some(a) => {
                t.in_use -= a.len;
                Ok(())
            }
            None => Err(self.bad_pointer(ptr, 0, "not the start of a live allocation")),
        }
    }

    fn bad_pointer(&self, ptr: DevicePtr, bytes: usize, message: &str) -> EmuError {
        let message = match device_of(ptr.0) {
            Some(owner) if owner != self.ordinal => format!("pointer belongs to device {owner}"),
            _ => message.to_string(),
        };
        EmuError::InvalidPointer {
            device: self.ordinal,
            ptr: ptr.0,
            bytes,
            message,
        }
    }

    /// The allocation holding `[ptr, ptr + bytes)` and the offset of `ptr` in it.
    fn find(&self, ptr: DevicePtr, bytes: usize) -> Result<(Arc<Allocation>, usize), EmuError> {
        let t = self.read_table();
        let hit = t.allocs.range(..=ptr.0).next_back().map(|(_, a)| a.clone());
        match hit {
            Some(a)
                if ptr
                    .0
                    .checked_add(bytes as u64)
                    .is_some_and(|e| e <= a.base + a.len as u64) =>
            {
                let off = (ptr.0 - a.base) as usize;
                Ok((a, off))
            }
            _ => Err(self.bad_pointer(ptr, bytes, "range is not inside one live allocation")),
        }
    }

    /// Host → device (`cuMemcpyHtoD`).
    pub fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), EmuError> {
        let (a, off) = self.find(dst, src.len())?;
        a.write_bytes(off, src);
        Ok(())
    }

    /// Device → host (`cuMemcpyDtoH`).
    pub fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), EmuError> {
        let (a, off) = self.find(src, dst.len())?;
        a.read_bytes(off, dst);
        Ok(())
    }

    /// Device → device on this device (`cuMemcpyDtoD`); see [`copy_peer`] across devices.
    pub fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), EmuError> {
        copy_peer(self, dst, self, src, bytes)
    }

    /// Sets `bytes` bytes to `value` (`cuMemsetD8`).
    pub fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<(), EmuError> {
        let (a, off) = self.find(dst, bytes)?;
        a.fill(off, bytes, value);
        Ok(())
    }

    /// Sets `count` 32-bit words to `value` (`cuMemsetD32`).
    pub fn memset_d32(&self, dst: DevicePtr, value: u32, count: usize) -> Result<(), EmuError> {
        if !dst.0.is_multiple_of(4) {
            return Err(self.bad_pointer(
                dst,
                count * 4,
                "memset_d32 needs a 4-byte aligned pointer",
            ));
        }
        let (a, off) = self.find(dst, count * 4)?;
        for i in 0..count {
            a.store(off + 4 * i, 4, u64::from(value));
        }
        Ok(())
    }

    /// Waits for all work (`cuCtxSynchronize`): everything is synchronous already.
    pub fn synchronize(&self) {}

    /// Records an event (`cuEventRecord`).
    pub fn record_event(&self) -> Event {
        Event(Instant::now())
    }

    /// Launches `kernel` of `module` (`cuLaunchKernel`) and waits for it.
    pub fn launch(
        &self,
        module: &Module,
        kernel: &str,
        config: LaunchConfig,
        args: KernelArgs,
    ) -> Result<LaunchStats, EmuError> {
        self.run_launch(module, kernel, config, args, None)
    }

    /// Runs only the CTAs of `ctas` (linear indices, x fastest; those beyond the grid are
    /// skipped) of a launch of `kernel`, with the grid's dimensions as seen by the kernel: a
    /// sample whose counters stand for the whole launch (what a performance model needs),
    /// at the cost of the sampled CTAs only. Writes of the sampled CTAs land in memory.
    pub fn launch_sampled(
        &self,
        module: &Module,
        kernel: &str,
        config: LaunchConfig,
        args: KernelArgs,
        ctas: &[u64],
    ) -> Result<LaunchStats, EmuError> {
        self.run_launch(module, kernel, config, args, Some(ctas))
    }

    fn run_launch(
        &self,
        module: &Module,
        kernel: &str,
        config: LaunchConfig,
        args: KernelArgs,
        only: Option<&[u64]>,
    ) -> Result<LaunchStats, EmuError> {
        let k = module
            .kernel(kernel)
            .ok_or_else(|| EmuError::UnknownKernel(kernel.to_string()))?;
        check_config(k, &config)?;
        let params = pack_params(k, args)?;
        let global = GlobalView {
            device: self.ordinal,
            allocs: self.read_table().allocs.values().cloned().collect(),
        };
        let launch = Launch {
            module,
            kernel: k,
            grid: config.grid,
            block: config.block,
            dynamic_shared: config.shared_bytes as usize,
            params: &params,
            global: &global,
            step_limit: self.step_limit.load(Ordering::Relaxed),
            parallel: self.parallel.load(Ordering::Relaxed),
            only,
        };
        Ok(exec::run(&launch)?)
    }
}

fn check_config(k: &Kernel, c: &LaunchConfig) -> Result<(), EmuError> {
    let bad = |message: String| EmuError::LaunchConfig {
        kernel: k.name().to_string(),
        message,
    };
    let [bx, by, bz] = c.block;
    let [gx, gy, gz] = c.grid;
    if c.block.contains(&0) || c.grid.contains(&0) {
        return Err(bad(format!(
            "zero dimension in grid {:?} or block {:?}",
            c.grid, c.block
        )));
    }
    if bx > 1024 || by > 1024 || bz > 64 || u64::from(bx) * u64::from(by) * u64::from(bz) > 1024 {
        return Err(bad(format!(
            "block {:?} exceeds 1024 threads (x, y ≤ 1024, z ≤ 64)",
            c.block
        )));
    }
    if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
        return Err(bad(format!(
            "grid {:?} exceeds (2^31 - 1, 65535, 65535)",
            c.grid
        )));
    }
    let threads = bx * by * bz;
    if let Some(m) = k.max_threads()
        && threads > m[0] * m[1] * m[2]
    {
        return Err(bad(format!(
            "block of {threads} threads exceeds .maxntid {m:?}"
        )));
    }
    if let Some(r) = k.required_threads()
        && c.block != r
    {
        return Err(bad(format!(
            "block {:?} differs from .reqntid {r:?}",
            c.block
        )));
    }
    let shared = k.static_shared_bytes() + c.shared_bytes as usize;
    if shared > MAX_SHARED_PER_CTA {
        return Err(bad(format!(
            "{shared} bytes of shared memory exceed {MAX_SHARED_PER_CTA}"
        )));
    }
    Ok(())
}

/// Lays the arguments out in the parameter buffer, checking them against the kernel's metadata.
fn pack_params(k: &Kernel, args: KernelArgs) -> Result<Vec<u8>, EmuError> {
    let bad = |message: String| EmuError::Params {
        kernel: k.name().to_string(),
        message,
    };
    let mut buf = vec![0u8; k.param_bytes()];
    match args {
        KernelArgs::PerParam(slices) => {
            if slices.len() != k.params().len() {
                return Err(bad(format!(
                    "{} arguments given, the kernel takes {}",
                    slices.len(),
                    k.params().len()
                )));
            }
            for (i, (p, s)) in k.params().iter().zip(slices).enumerate() {
                if s.len() != p.size {
                    return Err(bad(format!(
                        "argument {i} ({}) has {} bytes, the parameter takes {}",
                        p.name,
                        s.len(),
                        p.size
                    )));
                }
                buf[p.offset..p.offset + p.size].copy_from_slice(s);
            }
        }
        KernelArgs::Packed(bytes) => {
            let end = k.params().last().map_or(0, |p| p.offset + p.size);
            if bytes.len() < end || bytes.len() > k.param_bytes() {
                return Err(bad(format!(
                    "packed buffer of {} bytes; the parameters take {end} (padded: {})",
                    bytes.len(),
                    k.param_bytes()
                )));
            }
            buf[..bytes.len()].copy_from_slice(bytes);
        }
    }
    Ok(buf)
}
