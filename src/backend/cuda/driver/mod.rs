//! The one narrow interface between the CUDA backend and a device: module load, allocation,
//! copies (host, device, peer), kernel launch with a packed parameter buffer, stream ordering
//! with events, and synchronisation. Two implementations: [`emulated`] (towerpack-ptx: runs in
//! CI) and [`gpu`] (the CUDA driver through cudarc). The backend's own code is the same above
//! both.
//!
//! Each device executes the work submitted to it in order (one stream per device). Work on
//! different devices is ordered only by events: [`Driver::record`] after a kernel on one device,
//! [`Driver::wait`] before dependent work on another.

pub mod emulated;
pub mod gpu;

use super::error::CudaError;
use super::nvrtc::Arch;
use super::render::LaunchDims;

/// A device address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }
}

/// A module loaded on one device (an index into the driver's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleId(pub usize);

/// An event created on one device (an index into the driver's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventId(pub usize);

/// What the backend needs from a set of CUDA devices.
pub trait Driver: Send + Sync {
    /// `"cuda"` or `"cuda-emu"`.
    fn name(&self) -> &'static str;
    /// Number of devices.
    fn devices(&self) -> usize;
    /// The architecture to compile for on `device`.
    fn arch(&self, device: usize) -> Arch;
    /// Loads PTX on `device` (`cuModuleLoadData`).
    fn load_module(&self, device: usize, ptx: &str) -> Result<ModuleId, CudaError>;
    /// Allocates `bytes` of zeroed memory on `device`.
    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr, CudaError>;
    /// Host to device; returns when `src` may be reused.
    fn copy_htod(&self, device: usize, dst: DevicePtr, src: &[u8]) -> Result<(), CudaError>;
    /// Device to host, after the device's earlier work.
    fn copy_dtoh(&self, device: usize, dst: &mut [u8], src: DevicePtr) -> Result<(), CudaError>;
    /// Device to device on one device, in stream order.
    fn copy_dtod(
        &self,
        device: usize,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError>;
    /// From `src` on `src_device` to `dst` on `dst_device`, in `stream`'s order (the device
    /// whose kernel needs the copy: the reader for inputs, the writer for outputs).
    fn copy_peer(
        &self,
        stream: usize,
        dst_device: usize,
        dst: DevicePtr,
        src_device: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError>;
    /// Sets `bytes` bytes to zero, in stream order.
    fn memset_zero(&self, device: usize, dst: DevicePtr, bytes: usize) -> Result<(), CudaError>;
    /// Launches `entry` of `module` with the packed parameter struct `params`. `kernel` names
    /// the program kernel for errors.
    fn launch(
        &self,
        device: usize,
        module: ModuleId,
        entry: &str,
        dims: LaunchDims,
        params: &[u8],
        kernel: &str,
    ) -> Result<(), CudaError>;
    /// Creates an event on `device`.
    fn create_event(&self, device: usize) -> Result<EventId, CudaError>;
    /// Records `event` after the work submitted to `device` so far.
    fn record(&self, device: usize, event: EventId) -> Result<(), CudaError>;
    /// Makes later work on `device` wait for `event` (recorded on any device).
    fn wait(&self, device: usize, event: EventId) -> Result<(), CudaError>;
    /// Waits until `device` has finished all its work.
    fn synchronize(&self, device: usize) -> Result<(), CudaError>;
    /// Streaming multiprocessors of `device`, when the driver knows them: launch shapes are
    /// chosen to fill them (`render::Target`; an H100's 132 otherwise).
    fn multiprocessors(&self, device: usize) -> Option<u32> {
        let _ = device;
        None
    }
    /// Lane-instructions executed so far, when the driver counts them (the emulated one).
    fn lane_instructions(&self) -> Option<u64> {
        None
    }
    /// The CUDA ordinal of `device` when its [`DevicePtr`]s are real device addresses of its
    /// primary context (the GPU driver), so a collective engine may reduce them in place.
    fn cuda_ordinal(&self, device: usize) -> Option<usize> {
        let _ = device;
        None
    }
}
