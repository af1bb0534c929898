//! `TrainConfig`: everything a run needs besides the trainer (tensorpack's `TrainConfig` and
//! `AutoResumeTrainConfig`), and the choice of backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::cpu::{CpuOptions, CpuSession};
use crate::backend::cuda::{CudaOptions, CudaSession};
use crate::backend::reference::ReferenceSession;
use crate::backend::{Device, Placement, Session};
use crate::data::DataFlow;
use crate::ir::Graph;
use crate::lower::LowerOptions;

use super::callback::Callback;
use super::error::TrainError;
use super::input::InputSource;
use super::model::ModelDesc;
use super::monitors::TrainingMonitor;
use super::session_init::SessionInit;

/// Which backend runs the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The compiled CPU backend with `threads` workers (0: one per core). Its results are
    /// deterministic for a given thread count.
    Cpu { threads: usize },
    /// The reference executor (the slow oracle).
    Reference,
    /// The CUDA backend on this machine's GPUs: `devices` of them (0: one per logical device
    /// of the graph). Kernels are compiled by NVRTC; without a driver, a GPU or NVRTC the
    /// session is not created and the error says which is missing.
    Cuda { devices: usize },
    /// The CUDA backend on `devices` emulated devices (0: one per logical device of the graph):
    /// the same kernels, executed on the CPU by towerpack-ptx (needs NVRTC, not a GPU).
    CudaEmu { devices: usize },
}

impl Default for BackendChoice {
    fn default() -> BackendChoice {
        BackendChoice::Cpu { threads: 0 }
    }
}

impl BackendChoice {
    /// A session of this backend over `graph` (variables not yet initialized).
    pub fn create_session(self, graph: Graph) -> Result<Box<dyn Session>, TrainError> {
        self.create_session_on(graph, &Placement::default(), None)
    }

    /// A session over `graph` whose logical devices run where `placement` says, with fused
    /// updates cut into buckets of at most `bucket_bytes` (default
    /// [`DEFAULT_BUCKET_BYTES`](crate::lower::DEFAULT_BUCKET_BYTES)). The reference executor
    /// runs every logical device itself and ignores both.
    pub fn create_session_on(
        self,
        graph: Graph,
        placement: &Placement,
        bucket_bytes: Option<usize>,
    ) -> Result<Box<dyn Session>, TrainError> {
        Ok(match self {
            BackendChoice::Cpu { threads } => {
                let mut options = CpuOptions {
                    threads,
                    ..CpuOptions::default()
                };
                set_bucket_bytes(&mut options.lower, bucket_bytes);
                let mut session = CpuSession::new(graph, options)?;
                session.place(placement)?;
                Box::new(session)
            }
            BackendChoice::Reference => Box::new(ReferenceSession::new(graph)?),
            BackendChoice::Cuda { devices } => {
                check_cuda_placement(placement, Device::Cuda, "cuda")?;
                let options = cuda_options(bucket_bytes);
                Box::new(CudaSession::gpu(graph, devices, options)?)
            }
            BackendChoice::CudaEmu { devices } => {
                check_cuda_placement(placement, Device::CudaEmu, "cuda-emu")?;
                let options = cuda_options(bucket_bytes);
                Box::new(CudaSession::emulated(graph, devices, options)?)
            }
        })
    }
}

/// The CUDA backend's options with the trainer's bucket size, and batch-norm statistics and
/// gradient sums taken in convolution epilogues (as on the CPU).
fn cuda_options(bucket_bytes: Option<usize>) -> CudaOptions {
    let mut options = CudaOptions::default();
    options.lower.epilogue_reductions = true;
    set_bucket_bytes(&mut options.lower, bucket_bytes);
    options
}

/// A backend's lowering options with the trainer's bucket size, when it sets one.
fn set_bucket_bytes(lower: &mut LowerOptions, bucket_bytes: Option<usize>) {
    if let Some(bytes) = bucket_bytes {
        lower.bucket_bytes = bytes;
    }
}

/// The CUDA backend runs logical device `d` on its device `d`: a placement may only spell that
/// out (`Device::Cuda(d)` for logical `d`); anything else is an error naming the device.
fn check_cuda_placement(
    placement: &Placement,
    kind: fn(u16) -> Device,
    backend: &str,
) -> Result<(), TrainError> {
    for (logical, device) in placement.devices.iter().enumerate() {
        let Some(device) = device else { continue };
        let expected = kind(u16::try_from(logical).unwrap_or(u16::MAX));
        if *device != expected {
            return Err(TrainError::Config(format!(
                "the {backend} backend runs logical device {logical} on {expected}; it cannot \
                 place it on {device}"
            )));
        }
    }
    Ok(())
}

impl std::fmt::Display for BackendChoice {
    /// The `--device` spelling ([`FromStr`](std::str::FromStr) reads it back).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, count) = match *self {
            BackendChoice::Cpu { threads } => ("cpu", threads),
            BackendChoice::Reference => ("reference", 0),
            BackendChoice::Cuda { devices } => ("cuda", devices),
            BackendChoice::CudaEmu { devices } => ("cuda-emu", devices),
        };
        match count {
            0 => write!(f, "{name}"),
            n => write!(f, "{name}:{n}"),
        }
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = String;

    /// The `--device` spellings: `cpu`, `reference`, `cuda`, `cuda-emu`, the last two with an
    /// optional device count (`cuda-emu:2`).
    fn from_str(s: &str) -> Result<BackendChoice, String> {
        let (name, count) = match s.split_once(':') {
            Some((n, c)) => (
                n,
                c.parse::<usize>()
                    .map_err(|_| format!("`{c}` in `{s}` is not a device count"))?,
            ),
            None => (s, 0),
        };
        match name {
            "cpu" => Ok(BackendChoice::Cpu { threads: count }),
            "reference" => Ok(BackendChoice::Reference),
            "cuda" => Ok(BackendChoice::Cuda { devices: count }),
            "cuda-emu" => Ok(BackendChoice::CudaEmu { devices: count }),
            _ => Err(format!(
                "unknown device `{s}` (expected cpu, reference, cuda or cuda-emu)"
            )),
        }
    }
}

/// Whether and how a run continues an earlier one.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Resume {
    /// A fresh run (unless `session_init` and `starting_epoch` say otherwise, as in tensorpack).
    #[default]
    No,
    /// tensorpack's `AutoResumeTrainConfig`: continue from the latest checkpoint of the logdir,
    /// if there is one. With `always` false, a `session_init` given by the user wins.
    Auto { always: bool },
    /// Continue exactly from this checkpoint (file, prefix, directory or index).
    From(PathBuf),
}

/// The configuration of a run.
pub struct TrainConfig {
    pub model: Option<Arc<dyn ModelDesc>>,
    /// The training data; becomes the trainer's default input source. XOR `data`.
    pub dataflow: Option<Box<dyn DataFlow>>,
    /// The training input source. XOR `dataflow`.
    pub data: Option<Box<dyn InputSource>>,
    pub callbacks: Vec<Box<dyn Callback>>,
    /// `None`: tensorpack's defaults ([`default_callbacks`](super::callbacks::default_callbacks)).
    pub extra_callbacks: Option<Vec<Box<dyn Callback>>>,
    /// `None`: `[TFEventWriter, JSONWriter, ScalarPrinter]`.
    pub monitors: Option<Vec<Box<dyn TrainingMonitor>>>,
    /// How variables get their values after initialization (default: they keep them).
    pub session_init: Option<Box<dyn SessionInit>>,
    pub starting_epoch: u64,
    /// Default: the input's size (the data flow's length); an error if unknown.
    pub steps_per_epoch: Option<u64>,
    pub max_epoch: u64,
    /// Seeds graph randomness and variable initialization.
    pub seed: u64,
    pub backend: BackendChoice,
    /// Where files go. Default: the logger dir set by `logdir::set_logger_dir`, if any.
    pub logdir: Option<PathBuf>,
    pub resume: Resume,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            model: None,
            dataflow: None,
            data: None,
            callbacks: Vec::new(),
            extra_callbacks: None,
            monitors: None,
            session_init: None,
            starting_epoch: 1,
            steps_per_epoch: None,
            max_epoch: 99_999,
            seed: 0,
            backend: BackendChoice::default(),
            logdir: None,
            resume: Resume::No,
        }
    }
}

impl TrainConfig {
    /// A configuration training `model` (everything else default).
    pub fn new(model: impl ModelDesc + 'static) -> TrainConfig {
        TrainConfig {
            model: Some(Arc::new(model)),
            ..TrainConfig::default()
        }
    }

    /// Trains on `flow` (the trainer picks the input source).
    pub fn dataflow(mut self, flow: impl DataFlow + 'static) -> TrainConfig {
        self.dataflow = Some(Box::new(flow));
        self
    }

    /// Trains on `input`.
    pub fn data(mut self, input: impl InputSource + 'static) -> TrainConfig {
        self.data = Some(Box::new(input));
        self
    }

    /// Adds a callback (after those added before).
    pub fn callback(mut self, callback: impl Callback + 'static) -> TrainConfig {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Replaces the default extra callbacks.
    pub fn extra_callbacks(mut self, callbacks: Vec<Box<dyn Callback>>) -> TrainConfig {
        self.extra_callbacks = Some(callbacks);
        self
    }

    /// Replaces the default monitors.
    pub fn monitors(mut self, monitors: Vec<Box<dyn TrainingMonitor>>) -> TrainConfig {
        self.monitors = Some(monitors);
        self
    }

    /// Initializes variables with `init`.
    pub fn session_init(mut self, init: impl SessionInit + 'static) -> TrainConfig {
        self.session_init = Some(Box::new(init));
        self
    }

    /// Sets `starting_epoch`.
    pub fn starting_epoch(mut self, epoch: u64) -> TrainConfig {
        self.starting_epoch = epoch;
        self
    }

    /// Sets `steps_per_epoch`.
    pub fn steps_per_epoch(mut self, steps: u64) -> TrainConfig {
        self.steps_per_epoch = Some(steps);
        self
    }

    /// Sets `max_epoch`.
    pub fn max_epoch(mut self, epoch: u64) -> TrainConfig {
        self.max_epoch = epoch;
        self
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> TrainConfig {
        self.seed = seed;
        self
    }

    /// Sets the backend.
    pub fn backend(mut self, backend: BackendChoice) -> TrainConfig {
        self.backend = backend;
        self
    }

    /// Writes files to `dir`.
    pub fn logdir(mut self, dir: impl AsRef<Path>) -> TrainConfig {
        self.logdir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// tensorpack's `AutoResumeTrainConfig(always_resume=always)`.
    pub fn auto_resume(mut self, always: bool) -> TrainConfig {
        self.resume = Resume::Auto { always };
        self
    }

    /// Continues exactly from `checkpoint`.
    pub fn resume_from(mut self, checkpoint: impl AsRef<Path>) -> TrainConfig {
        self.resume = Resume::From(checkpoint.as_ref().to_path_buf());
        self
    }
}
