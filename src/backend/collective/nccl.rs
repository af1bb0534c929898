//! [`NcclEngine`]: the collective engine of GPU ranks (feature `nccl`). Gradient all-reduces
//! run on device memory through NCCL (cudarc's bindings; libnccl is loaded at run time); every
//! other operation — control messages, broadcasts, the per-step agreement, liveness — goes
//! through the engine it was bootstrapped over (MPI in practice), whose watchdog keeps naming
//! lost ranks.
//!
//! Creation is collective and guarded, because cudarc panics when a library is missing: every
//! rank first checks that libnccl and the CUDA driver load, and the ranks agree on the outcome
//! (one rank without NCCL makes every rank fail with the same error, naming it); the same for
//! opening the GPU; then rank 0 makes the `ncclUniqueId`, [`share_bootstrap_id`] sends it and
//! `ncclCommInitRank` joins the ranks. One GPU per rank: CUDA device `ordinal` of the process.
//!
//! No machine of this project has a GPU or libnccl: the guard is tested; the rest is compiled
//! and reviewed, not executed.

use std::ffi::CStr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{result as cu, sys as cu_sys};
use cudarc::nccl::{result as nc, sys as nc_sys};

use super::wire::{WireFormat, from_bf16_bits, to_bf16_bits};
use super::{CollectiveEngine, CollectiveError, finish_mean, share_bootstrap_id};
use crate::backend::{BackendError, Collective};
use crate::ir::ReduceOp;

/// Why NCCL cannot be used in this process, if it cannot: a missing libnccl (saying what to
/// install) or a missing CUDA driver. Loads nothing that could panic.
pub fn missing_libraries() -> Option<String> {
    let mut missing = Vec::new();
    // SAFETY: probing loads a library by name and drops it (cudarc panics only on use).
    if !unsafe { nc_sys::is_culib_present() } {
        // SAFETY: as above; NCCL's initialisers have no preconditions.
        let runtime_only = unsafe { libloading::Library::new("libnccl.so.2") }.is_ok();
        missing.push(if runtime_only {
            "libnccl.so.2 is installed, but cudarc 0.19 loads NCCL only as libnccl.so (or \
             libnccl.so.<CUDA major>): install libnccl-dev, or put a symlink libnccl.so -> \
             libnccl.so.2 in a directory of LD_LIBRARY_PATH"
        } else {
            "libnccl cannot be loaded (install NCCL 2.x: `apt install libnccl2 libnccl-dev`, or \
             `pip install nvidia-nccl-cu12` with a symlink libnccl.so -> libnccl.so.2 on \
             LD_LIBRARY_PATH)"
        });
    }
    // SAFETY: as above.
    if !unsafe { cu_sys::is_culib_present() } {
        missing.push("the CUDA driver (libcuda.so) cannot be loaded: no NVIDIA driver");
    }
    (!missing.is_empty()).then(|| missing.join("; "))
}

/// Every rank learns whether any rank failed `what` (`problem` is this rank's reason); all
/// fail together, each with its own reason or the ranks that failed.
fn agree(
    bootstrap: &dyn CollectiveEngine,
    problem: Option<&str>,
    what: &str,
) -> Result<(), CollectiveError> {
    let mut flags = vec![0f32; bootstrap.size()];
    flags[bootstrap.rank()] = f32::from(u8::from(problem.is_some()));
    bootstrap.all_reduce_as(&mut flags, ReduceOp::Sum, WireFormat::F32)?;
    let failed: Vec<usize> = (0..flags.len()).filter(|&r| flags[r] != 0.0).collect();
    if failed.is_empty() {
        return Ok(());
    }
    let reason = match problem {
        Some(p) => format!("{p} (ranks {failed:?} cannot {what})"),
        None => format!("ranks {failed:?} cannot {what} (see their logs)"),
    };
    Err(CollectiveError::Unavailable {
        engine: "nccl".into(),
        reason,
    })
}

fn driver_error(call: &str) -> impl Fn(cu::DriverError) -> CollectiveError {
    move |e| CollectiveError::Library {
        call: call.into(),
        code: e.0 as i32,
        message: format!("{e:?}"),
    }
}

fn nccl_error(call: &str, e: nc::NcclError) -> CollectiveError {
    // SAFETY: NCCL returns a static string for any result code.
    let message = unsafe { CStr::from_ptr(nc_sys::ncclGetErrorString(e.0)) };
    CollectiveError::Library {
        call: call.into(),
        code: e.0 as i32,
        message: message.to_string_lossy().into_owned(),
    }
}

/// This rank's GPU: its primary context, the engine's stream, the communicator and a staging
/// buffer for reductions of host memory.
struct Gpu {
    device: cu_sys::CUdevice,
    context: cu_sys::CUcontext,
    stream: cu_sys::CUstream,
    comm: nc_sys::ncclComm_t,
    staging: cu_sys::CUdeviceptr,
    staging_bytes: usize,
}

// SAFETY: CUDA handles may be used from any thread once their context is current (every use
// makes it current first), and the communicator is used by one thread at a time (the mutex).
unsafe impl Send for Gpu {}

impl Gpu {
    /// Retains `ordinal`'s primary context and creates the engine's stream.
    fn open(ordinal: usize) -> Result<Gpu, CollectiveError> {
        cu::init().map_err(driver_error("cuInit"))?;
        let device = cu::device::get(ordinal as i32).map_err(driver_error("cuDeviceGet"))?;
        // SAFETY: `device` was just returned by cuDeviceGet.
        let context = unsafe { cu::primary_ctx::retain(device) }
            .map_err(driver_error("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: the context was just retained.
        unsafe { cu::ctx::set_current(context) }.map_err(driver_error("cuCtxSetCurrent"))?;
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(driver_error("cuStreamCreate"))?;
        Ok(Gpu {
            device,
            context,
            stream,
            comm: std::ptr::null_mut(),
            staging: 0,
            staging_bytes: 0,
        })
    }

    fn make_current(&self) -> Result<(), CollectiveError> {
        // SAFETY: the context is retained until drop.
        unsafe { cu::ctx::set_current(self.context) }.map_err(driver_error("cuCtxSetCurrent"))
    }

    /// A staging buffer of at least `bytes`.
    fn staging(&mut self, bytes: usize) -> Result<cu_sys::CUdeviceptr, CollectiveError> {
        if self.staging_bytes < bytes {
            if self.staging != 0 {
                // SAFETY: allocated below by this engine; no work uses it (streams are
                // synchronised after every operation).
                unsafe { cu::free_sync(self.staging) }.map_err(driver_error("cuMemFree"))?;
                self.staging = 0;
            }
            // SAFETY: the context is current (callers make it so).
            self.staging = unsafe { cu::malloc_sync(bytes) }.map_err(driver_error("cuMemAlloc"))?;
            self.staging_bytes = bytes;
        }
        Ok(self.staging)
    }

    /// `ncclAllReduce` in place over `count` elements at `ptr`, then waits for it.
    ///
    /// # Safety
    /// `ptr` must address `count` elements of `dtype` of this GPU's memory, unused by other work.
    unsafe fn all_reduce_in_place(
        &self,
        ptr: cu_sys::CUdeviceptr,
        count: usize,
        dtype: nc_sys::ncclDataType_t,
        op: nc_sys::ncclRedOp_t,
    ) -> Result<(), CollectiveError> {
        let buf = ptr as *mut std::ffi::c_void;
        // SAFETY: the caller's contract; the communicator lives until drop.
        unsafe { nc::all_reduce(buf, buf, count, dtype, op, self.comm, self.stream.cast()) }
            .map_err(|e| nccl_error("ncclAllReduce", e))?;
        // SAFETY: the stream lives until drop.
        unsafe { cu::stream::synchronize(self.stream) }.map_err(driver_error("cuStreamSynchronize"))
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: the handles were created by `open`/`init` and are released once, here.
        unsafe {
            if cu::ctx::set_current(self.context).is_err() {
                return;
            }
            let _ = cu::stream::synchronize(self.stream);
            if !self.comm.is_null() {
                let _ = nc::comm_destroy(self.comm);
            }
            if self.staging != 0 {
                let _ = cu::free_sync(self.staging);
            }
            let _ = cu::stream::destroy(self.stream);
            let _ = cu::primary_ctx::release(self.device);
        }
    }
}

/// One GPU rank's collective engine (see the module docs).
pub struct NcclEngine {
    bootstrap: Arc<dyn CollectiveEngine>,
    ordinal: usize,
    gpu: Mutex<Gpu>,
    failed: Mutex<Option<String>>,
    wire: AtomicU8,
}

impl NcclEngine {
    /// Joins every rank of `bootstrap` in an NCCL communicator on CUDA device `ordinal` of
    /// this process. Collective: every rank of `bootstrap` calls it. A missing libnccl or CUDA
    /// driver, or a GPU that cannot be opened, on any rank is an error on every rank.
    pub fn init(
        bootstrap: Arc<dyn CollectiveEngine>,
        ordinal: usize,
    ) -> Result<Arc<NcclEngine>, CollectiveError> {
        let missing = missing_libraries();
        agree(bootstrap.as_ref(), missing.as_deref(), "load NCCL")?;
        let gpu = Gpu::open(ordinal);
        let problem = gpu.as_ref().err().map(|e| format!("GPU {ordinal}: {e}"));
        agree(bootstrap.as_ref(), problem.as_deref(), "open their GPU")?;
        let mut gpu = gpu?;
        let id = share_bootstrap_id(bootstrap.as_ref(), 0, || {
            nc::get_uniqueid()
                .map(|id| id.internal.map(|c| c as u8))
                .map_err(|e| nccl_error("ncclGetUniqueId", e).to_string())
        })?;
        let id = nc_sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let (size, rank) = (bootstrap.size() as i32, bootstrap.rank() as i32);
        // SAFETY: `comm` receives the new communicator; the GPU's context is current.
        unsafe { nc::comm_init_rank(&mut gpu.comm, size, id, rank) }
            .map_err(|e| nccl_error("ncclCommInitRank", e))?;
        log::info!(
            target: "towerpack",
            "NCCL: rank {rank} of {size} on GPU {ordinal} (bootstrapped over {})",
            bootstrap.host()
        );
        Ok(Arc::new(NcclEngine {
            wire: AtomicU8::new(bootstrap.gradient_wire() as u8),
            bootstrap,
            ordinal,
            gpu: Mutex::new(gpu),
            failed: Mutex::new(None),
        }))
    }

    /// The GPU, current on this thread, unless an earlier operation failed.
    fn gpu(&self) -> Result<MutexGuard<'_, Gpu>, CollectiveError> {
        let failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(first) = failed.as_ref() {
            return Err(CollectiveError::Failed {
                first: first.clone(),
            });
        }
        drop(failed);
        let gpu = self.gpu.lock().unwrap_or_else(|e| e.into_inner());
        gpu.make_current()?;
        Ok(gpu)
    }

    /// Records the first failure: NCCL's state is unknown afterwards.
    fn fail(&self, e: CollectiveError) -> CollectiveError {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        failed.get_or_insert_with(|| e.to_string());
        e
    }

    fn reduce_host(&self, data: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        let mut gpu = self.gpu()?;
        let bf16 = self.gradient_wire() == WireFormat::Bf16
            && matches!(op, ReduceOp::Sum | ReduceOp::Mean);
        if bf16 {
            let mut bits = vec![0u16; data.len()];
            to_bf16_bits(data, &mut bits);
            let at = gpu.staging(2 * bits.len().max(1))?;
            // SAFETY: `at` holds the bytes copied; the engine's stream is idle.
            unsafe {
                cu::memcpy_htod_sync(at, &bits).map_err(driver_error("cuMemcpyHtoD"))?;
                gpu.all_reduce_in_place(
                    at,
                    bits.len(),
                    nc_sys::ncclDataType_t::ncclBfloat16,
                    nc_sys::ncclRedOp_t::ncclSum,
                )?;
                cu::memcpy_dtoh_sync(&mut bits, at).map_err(driver_error("cuMemcpyDtoH"))?;
            }
            from_bf16_bits(&bits, data);
            finish_mean(data, op, self.size());
        } else {
            let at = gpu.staging(4 * data.len().max(1))?;
            // SAFETY: as above.
            unsafe {
                cu::memcpy_htod_sync(at, data).map_err(driver_error("cuMemcpyHtoD"))?;
                gpu.all_reduce_in_place(
                    at,
                    data.len(),
                    nc_sys::ncclDataType_t::ncclFloat32,
                    nccl_op(op),
                )?;
                cu::memcpy_dtoh_sync(data, at).map_err(driver_error("cuMemcpyDtoH"))?;
            }
        }
        Ok(())
    }
}

fn nccl_op(op: ReduceOp) -> nc_sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => nc_sys::ncclRedOp_t::ncclSum,
        ReduceOp::Mean => nc_sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => nc_sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => nc_sys::ncclRedOp_t::ncclMin,
    }
}

impl Collective for NcclEngine {
    fn rank(&self) -> usize {
        self.bootstrap.rank()
    }
    fn size(&self) -> usize {
        self.bootstrap.size()
    }
    fn all_reduce(&self, data: &mut [f32], op: ReduceOp) -> Result<(), BackendError> {
        self.reduce_host(data, op).map_err(|e| self.fail(e).into())
    }

    unsafe fn all_reduce_device(
        &self,
        ordinal: usize,
        ptr: u64,
        len: usize,
        op: ReduceOp,
    ) -> Result<bool, BackendError> {
        // bf16 needs a conversion kernel: such reductions go through host memory.
        if ordinal != self.ordinal || self.gradient_wire() != WireFormat::F32 {
            return Ok(false);
        }
        let gpu = self.gpu()?;
        // SAFETY: the caller's contract (`len` f32 of this GPU's primary context, unused).
        unsafe {
            gpu.all_reduce_in_place(ptr, len, nc_sys::ncclDataType_t::ncclFloat32, nccl_op(op))
        }
        .map_err(|e| self.fail(e))?;
        Ok(true)
    }
}

impl CollectiveEngine for NcclEngine {
    fn local_rank(&self) -> usize {
        self.bootstrap.local_rank()
    }
    fn local_size(&self) -> usize {
        self.bootstrap.local_size()
    }
    fn host(&self) -> String {
        self.bootstrap.host()
    }
    /// Control messages travel over the bootstrap engine (its watchdog names lost ranks).
    fn all_reduce_as(
        &self,
        data: &mut [f32],
        op: ReduceOp,
        wire: WireFormat,
    ) -> Result<(), CollectiveError> {
        self.bootstrap.all_reduce_as(data, op, wire)
    }
    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        self.bootstrap.broadcast(data, root)
    }
    fn gradient_wire(&self) -> WireFormat {
        WireFormat::from_u8(self.wire.load(Ordering::Relaxed))
    }
    fn set_gradient_wire(&self, wire: WireFormat) {
        self.wire.store(wire as u8, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::collective::LocalGroup;
    use std::time::Duration;

    #[test]
    fn without_libnccl_every_rank_gets_one_clear_error() {
        let Some(reason) = missing_libraries() else {
            // A machine with NCCL and a driver: nothing to check here.
            return;
        };
        let threads: Vec<_> = LocalGroup::new(2, Duration::from_secs(30))
            .into_iter()
            .map(|m| std::thread::spawn(move || NcclEngine::init(m, 0).err()))
            .collect();
        for t in threads {
            let e = t.join().expect("rank").expect("no NCCL here");
            assert!(
                matches!(&e, CollectiveError::Unavailable { engine, .. } if engine == "nccl"),
                "{e}"
            );
            let text = e.to_string();
            assert!(text.contains(&reason), "{text}");
            assert!(text.contains("ranks [0, 1] cannot load NCCL"), "{text}");
        }
    }
}
