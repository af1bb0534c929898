//! The backend factory: a [`BackendChoice`] names a backend (`--device cpu|reference|cuda|
//! cuda-emu`, with an optional count) and creates its [`Session`] over a graph. Trainers and
//! predictors name a choice and never the concrete backends.

#[cfg(feature = "cuda")]
use super::Device;
use super::cpu::{CpuOptions, CpuSession};
#[cfg(feature = "cuda")]
use super::cuda::{CudaOptions, CudaSession};
use super::reference::ReferenceSession;
use super::{BackendError, Placement, Session};
use crate::ir::Graph;
use crate::lower::{LowerOptions, Precision};

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
    pub fn create_session(self, graph: Graph) -> Result<Box<dyn Session>, BackendError> {
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
    ) -> Result<Box<dyn Session>, BackendError> {
        self.create_session_with(graph, placement, bucket_bytes, Precision::default())
    }

    /// [`create_session_on`](Self::create_session_on) with the matrix products and convolutions
    /// in `precision` ([`LowerOptions::precision`]): TF32 tensor-core kernels on the CUDA
    /// backends; f32 arithmetic on the CPU backend (a CPU has no TF32 units, as in PyTorch) and
    /// the reference executor. Under bf16/fp16 every backend rounds GEMM operands to 16 bits
    /// ([`crate::lower::autocast`]).
    pub fn create_session_with(
        self,
        graph: Graph,
        placement: &Placement,
        bucket_bytes: Option<usize>,
        precision: Precision,
    ) -> Result<Box<dyn Session>, BackendError> {
        Ok(match self {
            BackendChoice::Cpu { threads } => {
                let mut options = CpuOptions {
                    threads,
                    ..CpuOptions::default()
                };
                set_bucket_bytes(&mut options.lower, bucket_bytes);
                options.lower.precision = precision;
                let mut session = CpuSession::new(graph, options)?;
                session.place(placement)?;
                Box::new(session)
            }
            // The reference executor computes in f32; under bf16/fp16 it runs the graph with
            // the autocast pass's casts, which define what those precisions compute.
            BackendChoice::Reference => {
                let mut graph = graph;
                if let Some(format) = precision.half_operands() {
                    crate::lower::autocast::insert_casts(&mut graph, format)?;
                }
                Box::new(ReferenceSession::new(graph)?)
            }
            #[cfg(feature = "cuda")]
            BackendChoice::Cuda { devices } => {
                check_cuda_placement(placement, Device::Cuda, "cuda")?;
                let options = cuda_options(bucket_bytes, precision);
                Box::new(CudaSession::gpu(graph, devices, options)?)
            }
            #[cfg(feature = "cuda")]
            BackendChoice::CudaEmu { devices } => {
                check_cuda_placement(placement, Device::CudaEmu, "cuda-emu")?;
                let options = cuda_options(bucket_bytes, precision);
                Box::new(CudaSession::emulated(graph, devices, options)?)
            }
            #[cfg(not(feature = "cuda"))]
            BackendChoice::Cuda { .. } | BackendChoice::CudaEmu { .. } => {
                let _ = (graph, placement, bucket_bytes, precision);
                return Err(BackendError::Unavailable {
                    backend: self.to_string(),
                    reason: "this towerpack was built without its `cuda` feature (it is on by \
                             default; build without `--no-default-features`)"
                        .into(),
                });
            }
        })
    }
}

/// The CUDA backend's options with the trainer's bucket size and precision.
#[cfg(feature = "cuda")]
fn cuda_options(bucket_bytes: Option<usize>, precision: Precision) -> CudaOptions {
    let mut options = CudaOptions::default();
    set_bucket_bytes(&mut options.lower, bucket_bytes);
    options.lower.precision = precision;
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
#[cfg(feature = "cuda")]
fn check_cuda_placement(
    placement: &Placement,
    kind: fn(u16) -> Device,
    backend: &str,
) -> Result<(), BackendError> {
    for (logical, device) in placement.devices.iter().enumerate() {
        let Some(device) = device else { continue };
        let expected = kind(u16::try_from(logical).unwrap_or(u16::MAX));
        if *device != expected {
            return Err(BackendError::Placement {
                backend: backend.to_string(),
                logical,
                expected: expected.to_string(),
                device: device.to_string(),
            });
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
