//! Errors of the CUDA backend. Every one says what is missing or which kernel failed; none is a
//! panic (cudarc panics when a library is missing, so every entry point checks first).

use super::render::RenderError;

/// An error of the CUDA backend.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library cannot be loaded (no NVIDIA driver on this machine).
    #[error(
        "no CUDA driver: libcuda.so cannot be loaded (is an NVIDIA driver installed?); \
         `--device cuda-emu` runs the same kernels on emulated devices"
    )]
    NoDriver,
    /// The driver loaded but reports no (or too few) devices.
    #[error(
        "the CUDA driver reports {found} device(s), the program needs {needed}; \
         `--device cuda-emu` runs the same kernels on emulated devices"
    )]
    NoDevice { found: usize, needed: usize },
    /// NVRTC cannot be loaded.
    #[error(
        "NVRTC cannot be loaded: {reason}; install the CUDA toolkit's NVRTC (12 or 13), or \
         `pip install nvidia-cuda-nvrtc-cu12==12.9.86`, or set TOWERPACK_NVRTC to the library's path"
    )]
    NoNvrtc { reason: String },
    /// NVRTC rejected a kernel: its log and the source it was given.
    #[error(
        "NVRTC failed to compile kernel `{kernel}` for {arch}:\n{log}\n--- source ---\n{}",
        numbered(source_text)
    )]
    Compile {
        kernel: String,
        arch: String,
        log: String,
        source_text: String,
    },
    /// A kernel cannot be rendered.
    #[error("kernel `{kernel}`: {error}")]
    Render { kernel: String, error: RenderError },
    /// A driver call failed (allocation, copy, module load, launch).
    #[error("{call} on device {device}: {message}")]
    Driver {
        call: &'static str,
        device: usize,
        message: String,
    },
    /// A kernel faulted on the device; the emulated device names the PTX line.
    #[error("kernel `{kernel}` faulted: {message}")]
    Fault {
        kernel: String,
        ptx_line: Option<u32>,
        message: String,
    },
    /// A step cannot be captured or replayed as a graph (the session falls back to submitting
    /// it launch by launch).
    #[error("graph capture: {call}: {message}")]
    Capture { call: &'static str, message: String },
    /// The disk cache of compiled kernels cannot be used.
    #[error("kernel cache {path}: {message}")]
    Cache { path: String, message: String },
}

/// `source` with line numbers (NVRTC's log cites them).
fn numbered(source: &str) -> String {
    source
        .lines()
        .enumerate()
        .map(|(i, l)| format!("{:5} | {l}\n", i + 1))
        .collect()
}

impl From<CudaError> for crate::backend::BackendError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::NoDriver | CudaError::NoDevice { .. } | CudaError::NoNvrtc { .. } => {
                crate::backend::BackendError::Unavailable {
                    backend: "cuda".into(),
                    reason: e.to_string(),
                }
            }
            CudaError::Fault {
                kernel, message, ..
            } => crate::backend::BackendError::Kernel {
                node: kernel,
                op: "cuda".into(),
                message,
            },
            other => crate::backend::BackendError::Kernel {
                node: String::new(),
                op: "cuda".into(),
                message: other.to_string(),
            },
        }
    }
}
