//! NVRTC: finds the library, compiles kernel sources to PTX, and caches the PTX in memory and on
//! disk under a SHA-256 of (NVRTC version, options, source), so a program's kernels compile once
//! per machine.
//!
//! Its `library` module finds NVRTC 12 or 13 (the order it looks in is there) and binds its C API.
//! Options are fixed: C++17 and `--fmad=false` (every `a * b + c` rounds twice, as the reference
//! executor computes; kernels that want FMA call `fmaf`).

mod library;

use super::error::CudaError;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The PTX virtual architecture kernels are compiled for, as `major * 10 + minor` (80: sm_80).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arch(pub u32);

impl Arch {
    /// What the emulated device executes.
    pub const EMULATED: Arch = Arch(80);

    /// The NVRTC option value, `compute_80`.
    pub fn compute(self) -> String {
        format!("compute_{}", self.0)
    }

    /// The ptxas / cubin name, `sm_80`.
    pub fn sm(self) -> String {
        format!("sm_{}", self.0)
    }
}

/// The fixed NVRTC options besides the architecture.
pub const OPTIONS: [&str; 2] = ["--std=c++17", "--fmad=false"];

static LIBRARY: OnceLock<Result<library::Nvrtc, String>> = OnceLock::new();

/// The loaded NVRTC (found once per process), or why there is none.
fn nvrtc() -> Result<&'static library::Nvrtc, CudaError> {
    LIBRARY
        .get_or_init(library::find)
        .as_ref()
        .map_err(|reason| CudaError::NoNvrtc {
            reason: reason.clone(),
        })
}

/// Makes NVRTC loadable (once per process), or says why it is not.
pub fn ensure_nvrtc() -> Result<(), CudaError> {
    nvrtc().map(|_| ())
}

/// The NVRTC version, `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    Ok(nvrtc()?.version)
}

/// Where NVRTC was loaded from (a path, or the soname the search path resolved) and its
/// version, e.g. `libnvrtc.so (NVRTC 13.0)`: for the reports of a run.
pub fn describe() -> Result<String, CudaError> {
    let n = nvrtc()?;
    Ok(format!(
        "{} (NVRTC {}.{})",
        n.source, n.version.0, n.version.1
    ))
}

/// Compiles kernels to PTX with caching.
pub struct Compiler {
    version: (i32, i32),
    disk: Option<PathBuf>,
    memory: Mutex<HashMap<[u8; 32], Arc<str>>>,
    compilations: AtomicUsize,
}

/// The default disk cache: `$TOWERPACK_CUDA_CACHE`, else `$XDG_CACHE_HOME/towerpack/ptx`, else
/// `$HOME/.cache/towerpack/ptx`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TOWERPACK_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("towerpack").join("ptx"))
}

impl Compiler {
    /// A compiler caching on disk under `disk` (none: memory only). Fails when NVRTC is missing.
    pub fn new(disk: Option<PathBuf>) -> Result<Compiler, CudaError> {
        Ok(Compiler {
            version: version()?,
            disk,
            memory: Mutex::new(HashMap::new()),
            compilations: AtomicUsize::new(0),
        })
    }

    /// How many sources NVRTC actually compiled (cache misses).
    pub fn compilations(&self) -> usize {
        self.compilations.load(Ordering::Relaxed)
    }

    fn key(&self, source: &str, arch: Arch) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(format!("nvrtc {}.{}\n", self.version.0, self.version.1));
        h.update(arch.compute());
        for o in OPTIONS {
            h.update(o);
        }
        h.update([0u8]);
        h.update(source);
        h.finalize().into()
    }

    /// The PTX of `source` (kernel `kernel`, for errors) for `arch`.
    pub fn compile(&self, kernel: &str, source: &str, arch: Arch) -> Result<Arc<str>, CudaError> {
        let key = self.key(source, arch);
        let memory = |m: &Mutex<HashMap<[u8; 32], Arc<str>>>| {
            m.lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .cloned()
        };
        if let Some(ptx) = memory(&self.memory) {
            return Ok(ptx);
        }
        let file = self
            .disk
            .as_ref()
            .map(|d| d.join(format!("{}.ptx", hex(&key))));
        let cached = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok());
        let ptx: Arc<str> = match cached {
            Some(ptx) => ptx.into(),
            None => {
                let ptx: Arc<str> = nvrtc_compile(kernel, source, arch)?.into();
                self.compilations.fetch_add(1, Ordering::Relaxed);
                if let Some(f) = &file {
                    store(f, &ptx)?;
                }
                ptx
            }
        };
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, ptx.clone());
        Ok(ptx)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `ptx` to `file` atomically ([`crate::atomic_file`]: a temporary file unique to this
/// write, renamed into place, so sessions on several threads storing the same kernel at once
/// never see a partial file or fail each other's rename).
fn store(file: &Path, ptx: &str) -> Result<(), CudaError> {
    let err = |e: std::io::Error| CudaError::Cache {
        path: file.display().to_string(),
        message: e.to_string(),
    };
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    crate::atomic_file::write_atomically(file, ptx.as_bytes()).map_err(err)
}

/// One NVRTC compilation; a rejected source comes back with NVRTC's log and the source.
pub fn nvrtc_compile(kernel: &str, source: &str, arch: Arch) -> Result<String, CudaError> {
    let nvrtc = nvrtc()?;
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={}", arch.compute()));
    let name = format!("{}.cu", kernel_file_name(kernel));
    nvrtc
        .compile(source, &name, &options)
        .map_err(|failure| CudaError::Compile {
            kernel: kernel.to_string(),
            arch: arch.compute(),
            log: match failure {
                library::Failure::Rejected { log } => log,
                library::Failure::Call { call, message } => format!("{call}: {message}"),
            },
            source_text: source.to_string(),
        })
}

/// A file-name-safe version of a scoped kernel name.
fn kernel_file_name(kernel: &str) -> String {
    kernel
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}
