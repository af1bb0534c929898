//! NVRTC: finds the library, compiles kernel sources to PTX, and caches the PTX in memory and on
//! disk under a SHA-256 of (NVRTC version, options, source), so a program's kernels compile once
//! per machine.
//!
//! The library is looked up, in order: the path in `TOWERPACK_NVRTC`; the system's search path
//! (`LD_LIBRARY_PATH`, ...); the `nvidia-cuda-nvrtc-cu12` wheel of `python3`'s environment.
//! Options are fixed: C++17 and `--fmad=false` (every `a * b + c` rounds twice, as the reference
//! executor computes; kernels that want FMA call `fmaf`).

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

static LIBRARY: OnceLock<Result<(), String>> = OnceLock::new();

/// Makes NVRTC loadable (once per process), or says why it is not.
pub fn ensure_nvrtc() -> Result<(), CudaError> {
    LIBRARY
        .get_or_init(find_library)
        .clone()
        .map_err(|reason| CudaError::NoNvrtc { reason })
}

fn find_library() -> Result<(), String> {
    let explicit = std::env::var_os("TOWERPACK_NVRTC").map(PathBuf::from);
    if let Some(path) = &explicit {
        open_global(path)?;
    }
    // SAFETY: probing loads the library by name and drops it; NVRTC has no unsafe initialisers.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    if explicit.is_some() {
        return Err("TOWERPACK_NVRTC is set but cudarc still cannot load NVRTC".into());
    }
    let path = wheel_library()?;
    open_global(&path)?;
    // SAFETY: as above.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(format!(
            "{} loaded, but not under the name cudarc looks for",
            path.display()
        ))
    }
}

/// Loads a library with global symbols and keeps it loaded for the life of the process, so a
/// later `dlopen` by soname (cudarc's) finds it.
fn open_global(path: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading NVRTC runs no initialisers with preconditions; it is never unloaded.
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
    std::mem::forget(lib);
    Ok(())
}

/// `libnvrtc.so.12` of the `nvidia-cuda-nvrtc-cu12` wheel, asking `python3` where it is.
fn wheel_library() -> Result<PathBuf, String> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvrtc as m; print(list(m.__path__)[0])",
        ])
        .output()
        .map_err(|e| format!("not on the library path, and python3 cannot be run ({e})"))?;
    if !out.status.success() {
        return Err(
            "not on the library path, nor in python3's nvidia-cuda-nvrtc-cu12 wheel".into(),
        );
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let path = Path::new(&dir).join("lib").join("libnvrtc.so.12");
    if path.exists() {
        Ok(path)
    } else {
        Err(format!("{} does not exist", path.display()))
    }
}

/// The NVRTC version, `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); the pointers are valid for the call.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::NoNvrtc {
            reason: format!("nvrtcVersion failed: {r:?}"),
        });
    }
    Ok((major, minor))
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
    ensure_nvrtc()?;
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={}", arch.compute()));
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        name: Some(format!("{}.cu", kernel_file_name(kernel))),
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => Err(CudaError::Compile {
            kernel: kernel.to_string(),
            arch: arch.compute(),
            log: log.to_string_lossy().into_owned(),
            source_text: source.to_string(),
        }),
        Err(e) => Err(CudaError::Compile {
            kernel: kernel.to_string(),
            arch: arch.compute(),
            log: format!("{e:?}"),
            source_text: source.to_string(),
        }),
    }
}

/// A file-name-safe version of a scoped kernel name.
fn kernel_file_name(kernel: &str) -> String {
    kernel
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}
