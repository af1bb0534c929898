//! Backends: what runs a graph. Every backend implements [`Session`], the one interface the
//! trainer uses.
//!
//! - [`cpu`]: the fast CPU backend (its compute kernels live in [`cpu::kernels`]).
//! - `cuda`: the CUDA backend (NVRTC-compiled kernels on GPUs or on emulated devices; feature
//!   `cuda`, on by default).
//! - [`mod@reference`]: the oracle. An op-by-op interpreter of the IR, written for clarity. Every
//!   compiled backend is tested against it.
//! - [`device`]: the [`Device`]s logical devices run on, and their [`Placement`].
//! - [`choice`]: the factory — a [`BackendChoice`] creates the session of the backend it names.
//!
//! A step is *functional*: every `Variable` read sees the value the variable held when the step
//! began, and every `Assign` of the step takes effect when it ends. A step may assign a variable
//! at most once.

pub mod binding;
pub mod choice;
pub mod collective;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod poison;
pub mod reference;

pub use crate::ir::Step;
pub use choice::BackendChoice;
pub use device::{Device, Placement};

use crate::ir::{Graph, IrError, NodeId, VarId};
use crate::tensor::HostTensor;

/// A value fed to an `Input` node for one step.
pub type Feed = (NodeId, HostTensor);

/// Errors of running a step. Each names the node, input or variable at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Ir(#[from] IrError),
    /// The step could not be lowered (or the lowered program failed verification).
    #[error(transparent)]
    Lower(#[from] crate::lower::LowerError),
    #[error("input `{input}` needs a feed for this step")]
    MissingFeed { input: String },
    #[error("feed for input `{input}` is {got}, expected {expected}")]
    FeedMismatch {
        input: String,
        expected: String,
        got: String,
    },
    #[error("node `{node}` is fed but is not an input")]
    FeedNotInput { node: String },
    #[error("inputs disagree on the batch size: `{input}` has {got}, others {expected}")]
    BatchMismatch {
        input: String,
        expected: usize,
        got: usize,
    },
    #[error("variable `{variable}` is assigned more than once in one step")]
    DoubleAssign { variable: String },
    #[error("value {0} does not exist in the graph")]
    UnknownValue(String),
    #[error("unknown variable #{0}")]
    UnknownVariable(u32),
    #[error("variable `{variable}` is {expected}, got {got}")]
    VariableMismatch {
        variable: String,
        expected: String,
        got: String,
    },
    #[error("node `{node}` ({op}): {message}")]
    Kernel {
        node: String,
        op: String,
        message: String,
    },
    #[error("backend `{backend}` is unavailable: {reason}")]
    Unavailable { backend: String, reason: String },
    /// A placement asks a backend to run a logical device where it cannot.
    #[error(
        "the {backend} backend runs logical device {logical} on {expected}; it cannot place it \
         on {device}"
    )]
    Placement {
        backend: String,
        logical: usize,
        expected: String,
        device: String,
    },
    /// A collective operation of a distributed job failed (a lost rank, a timeout, ...).
    #[error(transparent)]
    Collective(collective::CollectiveError),
}

/// A collective-communication engine: the participants of a distributed job (MPI ranks,
/// NCCL communicators). Backends call it to carry out `Op::AllReduce`.
pub trait Collective: Send + Sync {
    /// This participant's index.
    fn rank(&self) -> usize;
    /// Number of participants.
    fn size(&self) -> usize;
    /// Replaces `data` by its elementwise reduction over every participant's `data`.
    fn all_reduce(&self, data: &mut [f32], op: crate::ir::ReduceOp) -> Result<(), BackendError>;

    /// Reduces, in place, `len` f32 values at address `ptr` of CUDA device `ordinal` (memory of
    /// the device's primary context), when this engine reduces device memory itself (NCCL):
    /// the CUDA backend then skips the trip through host memory. `Ok(false)` (the default)
    /// when it does not; the caller then reduces through host memory with
    /// [`Collective::all_reduce`].
    ///
    /// # Safety
    /// `ptr` must address `len` f32 of device memory of `ordinal`, allocated in its primary
    /// context, that no other work reads or writes until this returns.
    unsafe fn all_reduce_device(
        &self,
        ordinal: usize,
        ptr: u64,
        len: usize,
        op: crate::ir::ReduceOp,
    ) -> Result<bool, BackendError> {
        let _ = (ordinal, ptr, len, op);
        Ok(false)
    }
}

/// A graph bound to variable storage on some device(s): the executor interface of trainers.
pub trait Session: Send {
    /// The graph this session runs.
    fn graph(&self) -> &Graph;

    /// Runs one step with the given feeds and returns the fetched values.
    fn run(&mut self, step: &Step, feeds: &[Feed]) -> Result<Vec<HostTensor>, BackendError>;

    /// The current value of a variable.
    fn read_variable(&self, var: VarId) -> Result<HostTensor, BackendError>;

    /// Overwrites a variable; errors when dtype or shape differ from its declaration.
    fn write_variable(&mut self, var: VarId, value: &HostTensor) -> Result<(), BackendError>;

    /// Joins a distributed job: the step's `Op::AllReduce` kernels reduce across `collective`'s
    /// participants. Backends that cannot take part say so (the default).
    fn join_collective(
        &mut self,
        collective: std::sync::Arc<dyn Collective>,
    ) -> Result<(), BackendError> {
        Err(BackendError::Unavailable {
            backend: "this backend".into(),
            reason: format!(
                "it cannot take part in a distributed job ({} participants)",
                collective.size()
            ),
        })
    }

    /// Sets every variable to its initializer's value for the run seeded with `seed`.
    fn initialize_variables(&mut self, seed: u64) -> Result<(), BackendError> {
        let inits: Vec<(VarId, HostTensor)> = self
            .graph()
            .variable_ids()
            .map(|(id, def)| (id, crate::ir::init::initial_value(def, seed)))
            .collect();
        for (id, value) in inits {
            self.write_variable(id, &value)?;
        }
        Ok(())
    }
}
