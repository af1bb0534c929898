//! A training step as one captured graph: what the session submits for a step is recorded once
//! (the first time the step runs) and replayed every step after.
//!
//! The graph holds, in order: the scratch poisoning of every step (when asked for), copies of
//! the feeds from fixed *input staging* buffers into the program's feed buffers, an external
//! event per device saying the staging buffers were read, every kernel of the program (with
//! its peer copies and events), downloads of the status words and of every fetch into pinned
//! host memory, and the write-backs of assigned variables.
//!
//! Around it, each step: the feeds are written into pinned memory (waiting only for the
//! previous step's uploads), uploaded on each device's copy stream once the previous step has
//! read its staging buffers — so the upload overlaps the rest of the previous step —, and the
//! graph is launched after the uploads. The host synchronises once, and only when the step
//! fetches something: it then reads the status words and the fetches from pinned memory.
//!
//! What cannot be captured: all-reduces across processes through host memory (MPI). A program
//! with such kernels is submitted launch by launch ([`Prepared::needs_host`]); the graph is not
//! split around them.

use super::driver::{DevicePtr, Driver, EventId, GraphId, PinnedId};
use super::error::CudaError;
use super::prepared::Prepared;
use crate::backend::{BackendError, Collective};
use crate::ir::{NodeId, Shape, TensorType};
use crate::lower::BufferId;
use crate::tensor::HostTensor;

/// Where one feed goes: pinned memory, then the device's staging buffer, then the program's
/// feed buffer.
struct FeedSlot {
    node: NodeId,
    buffer: BufferId,
    device: usize,
    staging: DevicePtr,
    /// Offset in the pinned input memory.
    pinned: usize,
    bytes: usize,
}

/// Where one fetch (or status word) lands in the pinned output memory.
struct OutSlot {
    offset: usize,
    bytes: usize,
}

/// The captured step of one prepared program, with its fixed input and output memory.
pub struct StepGraph {
    graph: GraphId,
    feeds: Vec<FeedSlot>,
    /// Per device: the event recorded inside the graph once its staging buffers were read.
    consumed: Vec<Option<EventId>>,
    pinned_in: PinnedId,
    pinned_out: PinnedId,
    /// Per device: its status word in the pinned output.
    status: Vec<OutSlot>,
    fetches: Vec<OutSlot>,
}

/// What the session keeps about the graph of a program.
pub enum GraphState {
    /// Not tried yet.
    Untried,
    /// Captured: replayed every step.
    Ready(StepGraph),
    /// Submitted launch by launch, and why.
    Unavailable(String),
}

/// How a step is run as a graph.
pub struct StepContext<'a> {
    pub driver: &'a dyn Driver,
    pub collective: Option<&'a dyn Collective>,
    /// The session's status word per device.
    pub status: &'a [DevicePtr],
    /// Poison the program's scratch at the start of every step.
    pub poison_every_step: bool,
    /// The session's state arena per device (write-back destinations).
    pub state: &'a [DevicePtr],
    /// Every write-back of the program: (source buffer, byte offset, bytes, destination
    /// device, byte offset in its state arena).
    pub writebacks: &'a [Writeback],
}

/// One write-back of a step: a region of a program buffer copied into a variable's slot.
#[derive(Clone, Copy, Debug)]
pub struct Writeback {
    pub buffer: BufferId,
    pub offset: usize,
    pub bytes: usize,
    pub device: usize,
    pub slot: usize,
}

/// Submits a step's write-backs (in stream order; capturable).
pub fn submit_writebacks(
    driver: &dyn Driver,
    prepared: &Prepared,
    state: &[DevicePtr],
    writebacks: &[Writeback],
) -> Result<(), BackendError> {
    for w in writebacks {
        let src = prepared.home_address(w.buffer).offset(w.offset);
        let dst = state[w.device].offset(w.slot);
        let from = prepared.home_device(w.buffer);
        if from == w.device {
            driver.copy_dtod(w.device, dst, src, w.bytes)?;
        } else {
            driver.copy_peer(w.device, w.device, dst, from, src, w.bytes)?;
        }
    }
    Ok(())
}

impl StepGraph {
    /// Allocates the fixed memory of `prepared`'s step and captures it. `Err` means the step
    /// is to be submitted launch by launch (the reason is in the error).
    pub fn capture(ctx: &StepContext, prepared: &Prepared) -> Result<StepGraph, BackendError> {
        let driver = ctx.driver;
        if prepared.needs_host(ctx.collective) {
            return Err(CudaError::Capture {
                call: "prepare",
                message: "the step all-reduces across processes through host memory".into(),
            }
            .into());
        }
        let devices = driver.devices();
        let program = &prepared.program;
        // Inputs: one staging arena per device with feeds, one pinned block for all.
        let mut per_device = vec![0usize; devices];
        let mut layout = Vec::new();
        let mut pinned = 0usize;
        for &(node, b) in &program.feeds {
            let device = prepared.home_device(b);
            let bytes = program.buffer(b).bytes();
            layout.push((node, b, device, per_device[device], pinned, bytes));
            per_device[device] += bytes.next_multiple_of(256);
            pinned += bytes;
        }
        let mut staging = vec![None; devices];
        let mut consumed = vec![None; devices];
        for d in 0..devices {
            if per_device[d] > 0 {
                staging[d] = Some(driver.alloc(d, per_device[d])?);
                consumed[d] = Some(driver.create_event(d)?);
            }
        }
        let feeds = layout
            .into_iter()
            .map(|(node, buffer, device, at, pinned, bytes)| FeedSlot {
                node,
                buffer,
                device,
                staging: staging[device].map_or(DevicePtr(0), |p| p.offset(at)),
                pinned,
                bytes,
            })
            .collect();
        let pinned_in = driver.alloc_pinned(pinned)?;
        // Outputs: the status words, then every fetch.
        let mut offset = 0usize;
        let mut slot = |bytes: usize| {
            let s = OutSlot { offset, bytes };
            offset += bytes.next_multiple_of(8);
            s
        };
        let status = (0..devices).map(|_| slot(8)).collect();
        let fetches = program
            .fetches
            .iter()
            .map(|r| {
                let size = program.buffer(r.buffer).dtype.size_bytes();
                slot(r.shape.iter().product::<usize>() * size)
            })
            .collect();
        let pinned_out = driver.alloc_pinned(offset)?;
        let mut graph = StepGraph {
            graph: GraphId(usize::MAX),
            feeds,
            consumed,
            pinned_in,
            pinned_out,
            status,
            fetches,
        };
        driver.begin_capture()?;
        let recorded = graph.record(ctx, prepared);
        match recorded {
            Ok(()) => {
                graph.graph = driver
                    .end_capture()
                    .inspect_err(|_| driver.abort_capture())?;
                Ok(graph)
            }
            Err(e) => {
                driver.abort_capture();
                Err(e)
            }
        }
    }

    /// The body of the graph, submitted while capturing.
    fn record(&self, ctx: &StepContext, prepared: &Prepared) -> Result<(), BackendError> {
        let driver = ctx.driver;
        if ctx.poison_every_step {
            prepared.poison_scratch(driver)?;
        }
        for f in &self.feeds {
            driver.copy_dtod(
                f.device,
                prepared.home_address(f.buffer),
                f.staging,
                f.bytes,
            )?;
        }
        for (d, e) in self.consumed.iter().enumerate() {
            if let Some(e) = e {
                driver.record_external(d, *e)?;
            }
        }
        prepared.run(driver, ctx.collective)?;
        for (d, s) in self.status.iter().enumerate() {
            driver.download(d, self.pinned_out, s.offset, ctx.status[d], s.bytes)?;
        }
        for (r, s) in prepared.program.fetches.iter().zip(&self.fetches) {
            let size = prepared.program.buffer(r.buffer).dtype.size_bytes();
            let src = prepared.home_address(r.buffer).offset(r.offset * size);
            driver.download(
                prepared.home_device(r.buffer),
                self.pinned_out,
                s.offset,
                src,
                s.bytes,
            )?;
        }
        submit_writebacks(driver, prepared, ctx.state, ctx.writebacks)
    }

    /// Uploads `feeds` and launches the graph (asynchronously: read the results with
    /// [`StepGraph::status_words`] and [`StepGraph::fetches`] after synchronising).
    pub fn launch(
        &self,
        driver: &dyn Driver,
        prepared: &Prepared,
        feeds: &[(NodeId, &HostTensor)],
    ) -> Result<(), BackendError> {
        for f in &self.feeds {
            let value = feeds
                .iter()
                .find(|(n, _)| *n == f.node)
                .map(|(_, t)| *t)
                .ok_or_else(|| BackendError::UnknownValue(format!("feed of node {:?}", f.node)))?;
            let buf = prepared.program.buffer(f.buffer);
            if value.dtype() != buf.dtype || value.len() != buf.len() {
                return Err(BackendError::FeedMismatch {
                    input: buf.name.clone(),
                    expected: TensorType::new(buf.dtype, Shape::fixed(&buf.shape)).to_string(),
                    got: TensorType::of_host(value).to_string(),
                });
            }
            driver.write_pinned(self.pinned_in, f.pinned, &value.le_bytes())?;
        }
        for f in &self.feeds {
            if let Some(e) = self.consumed[f.device] {
                driver.copy_wait(f.device, e)?;
            }
            driver.upload(f.device, f.staging, self.pinned_in, f.pinned, f.bytes)?;
        }
        for (d, e) in self.consumed.iter().enumerate() {
            if e.is_some() {
                driver.await_uploads(d)?;
            }
        }
        driver.launch_graph(self.graph)?;
        Ok(())
    }

    /// The status word of every device, as the last synchronised step left it.
    pub fn status_words(&self, driver: &dyn Driver) -> Result<Vec<[u8; 8]>, BackendError> {
        self.status
            .iter()
            .map(|s| {
                let mut word = [0u8; 8];
                driver.read_pinned(self.pinned_out, s.offset, &mut word)?;
                Ok(word)
            })
            .collect()
    }

    /// The fetches of the last synchronised step.
    pub fn fetches(
        &self,
        driver: &dyn Driver,
        prepared: &Prepared,
    ) -> Result<Vec<HostTensor>, BackendError> {
        prepared
            .program
            .fetches
            .iter()
            .zip(&self.fetches)
            .map(|(r, s)| {
                let buf = prepared.program.buffer(r.buffer);
                let mut bytes = vec![0u8; s.bytes];
                driver.read_pinned(self.pinned_out, s.offset, &mut bytes)?;
                HostTensor::from_le_bytes(buf.dtype, &r.shape, &bytes).map_err(|e| {
                    BackendError::Kernel {
                        node: buf.name.clone(),
                        op: "fetch".into(),
                        message: e.to_string(),
                    }
                })
            })
            .collect()
    }
}
