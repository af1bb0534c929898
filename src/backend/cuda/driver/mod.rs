//! The one narrow interface between the CUDA backend and a device: module load, allocation,
//! copies (host, device, peer), kernel launch with a packed parameter buffer, stream ordering
//! with events, and synchronisation. Two implementations: [`emulated`] (towerpack-ptx: runs in
//! CI) and [`gpu`] (the CUDA driver through cudarc). The backend's own code is the same above
//! both.
//!
//! Each device executes the work submitted to it in order (one compute stream per device). Work
//! on different devices is ordered only by events: [`Driver::record`] after a kernel on one
//! device, [`Driver::wait`] before dependent work on another.
//!
//! **Graphs.** Between [`Driver::begin_capture`] and [`Driver::end_capture`], the stream-ordered
//! work submitted to any device (launches, device and peer copies, memsets, event records and
//! waits, downloads into pinned memory) is recorded, not executed; the result is an instantiated
//! graph that [`Driver::launch_graph`] replays as one unit, in the recorded order and with the
//! recorded dependencies. Synchronous calls (host copies, allocation, synchronisation) are
//! errors while capturing and invalidate the capture. On a GPU this is CUDA stream capture
//! (every device's stream joins the capture of device 0's); the emulated driver records the
//! operations and replays them.
//!
//! **Pinned memory and the copy stream.** [`Driver::alloc_pinned`] gives page-locked host
//! memory owned by the driver. [`Driver::upload`] copies from it to a device on that device's
//! *copy stream*, which runs beside the compute stream: [`Driver::await_uploads`] orders later
//! compute work after the uploads so far, [`Driver::copy_wait`] orders later uploads after an
//! event (recorded with [`Driver::record_external`] when it is recorded inside a graph).
//! [`Driver::write_pinned`] waits until earlier uploads from that memory are done.

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

/// A captured and instantiated graph (an index into the driver's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphId(pub usize);

/// Page-locked host memory owned by the driver (an index into the driver's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PinnedId(pub usize);

pub use crate::backend::poison::POISON_WORD;

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
    /// Sets `count` 32-bit words at `dst` (4-byte aligned) to `value`, in stream order.
    fn memset_u32(
        &self,
        device: usize,
        dst: DevicePtr,
        value: u32,
        count: usize,
    ) -> Result<(), CudaError>;
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
    /// Starts recording the stream-ordered work of every device into a graph (see the module
    /// documentation). A driver or device without graphs returns [`CudaError::Capture`].
    fn begin_capture(&self) -> Result<(), CudaError>;
    /// Ends the capture begun by [`Driver::begin_capture`] and instantiates the graph.
    fn end_capture(&self) -> Result<GraphId, CudaError>;
    /// Ends a capture after an error, discarding what was recorded; a no-op without one.
    fn abort_capture(&self);
    /// Replays `graph` after the work submitted so far to every device; later work on any
    /// device runs after it.
    fn launch_graph(&self, graph: GraphId) -> Result<(), CudaError>;
    /// Records `event` after the work submitted to `device` so far, such that work outside a
    /// graph may wait for it even when it is recorded inside one (an external event node).
    fn record_external(&self, device: usize, event: EventId) -> Result<(), CudaError>;
    /// Allocates `bytes` of zeroed page-locked host memory, usable by every device.
    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedId, CudaError>;
    /// Writes `data` at `offset` of pinned memory `dst`, after the uploads from it are done.
    fn write_pinned(&self, dst: PinnedId, offset: usize, data: &[u8]) -> Result<(), CudaError>;
    /// Reads pinned memory `src` from `offset` into `out`. The caller has synchronised the
    /// devices whose downloads wrote it.
    fn read_pinned(&self, src: PinnedId, offset: usize, out: &mut [u8]) -> Result<(), CudaError>;
    /// Copies `bytes` from `offset` of pinned memory `src` to `dst` of `device`, on the
    /// device's copy stream (asynchronous; never captured).
    fn upload(
        &self,
        device: usize,
        dst: DevicePtr,
        src: PinnedId,
        offset: usize,
        bytes: usize,
    ) -> Result<(), CudaError>;
    /// Makes later work on `device`'s compute stream wait for its uploads so far.
    fn await_uploads(&self, device: usize) -> Result<(), CudaError>;
    /// Makes later uploads to `device` wait for `event`.
    fn copy_wait(&self, device: usize, event: EventId) -> Result<(), CudaError>;
    /// Copies `bytes` from `src` of `device` to `offset` of pinned memory `dst`, in the compute
    /// stream's order (capturable: a graph may end by downloading its results).
    fn download(
        &self,
        device: usize,
        dst: PinnedId,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError>;
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
