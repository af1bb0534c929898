//! Finding the NVRTC library and calling it.
//!
//! towerpack binds the eight NVRTC functions it calls itself, through `libloading`, rather than
//! through cudarc: cudarc's loader only tries the sonames of CUDA 12 and older
//! (`libnvrtc.so.12`, …), so a CUDA 13 runtime that ships `libnvrtc.so.13` alone (a runtime
//! container, the `nvidia-cuda-nvrtc` 13 wheel) was invisible to it. The C API towerpack uses
//! is the same in NVRTC 12 and 13.
//!
//! The library is looked up, in order: the path in `TOWERPACK_NVRTC`; `libnvrtc.so`,
//! `libnvrtc.so.13`, `libnvrtc.so.12` on the system's search path (`LD_LIBRARY_PATH`, the
//! toolkit's `ld.so.conf` entries); the `nvidia-cuda-nvrtc-cu12` wheel of `python3`'s
//! environment, then the CUDA 13 one (`nvidia-cuda-nvrtc` 13.x, under `nvidia/cu13`).

use libloading::Library;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;

/// `nvrtcProgram`: an opaque handle.
type Program = *mut c_void;
/// `nvrtcResult`.
type Status = c_int;
const SUCCESS: Status = 0;
/// `NVRTC_ERROR_COMPILATION`: the source was rejected (the log says why).
const ERROR_COMPILATION: Status = 6;

type CreateProgram = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> Status;
type CompileProgram = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status;
type GetSize = unsafe extern "C" fn(Program, *mut usize) -> Status;
type GetText = unsafe extern "C" fn(Program, *mut c_char) -> Status;

/// A loaded NVRTC: the functions towerpack calls, valid while `_library` is loaded (the one
/// instance lives in a `static` and is never dropped).
pub(super) struct Nvrtc {
    /// What was loaded: a path, or a soname the system's search path resolved.
    pub(super) source: String,
    pub(super) version: (i32, i32),
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create_program: CreateProgram,
    compile_program: CompileProgram,
    ptx_size: GetSize,
    ptx: GetText,
    log_size: GetSize,
    log: GetText,
    destroy_program: unsafe extern "C" fn(*mut Program) -> Status,
    _library: Library,
}

/// Why a compilation gave no PTX.
pub(super) enum Failure {
    /// NVRTC rejected the source; its log.
    Rejected { log: String },
    /// An NVRTC call failed outright (out of memory, an invalid option, ...).
    Call { call: &'static str, message: String },
}

/// Loads NVRTC from the first place of the module docs' order that has it.
pub(super) fn find() -> Result<Nvrtc, String> {
    if let Some(path) = std::env::var_os("TOWERPACK_NVRTC") {
        let path = PathBuf::from(path);
        return load(path.as_os_str(), path.display().to_string())
            .map_err(|e| format!("TOWERPACK_NVRTC is set, but {e}"));
    }
    let mut tried = Vec::new();
    for name in ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"] {
        match load(name.as_ref(), name.to_string()) {
            Ok(nvrtc) => return Ok(nvrtc),
            Err(e) => tried.push(e),
        }
    }
    for path in wheel_libraries() {
        match load(path.as_os_str(), path.display().to_string()) {
            Ok(nvrtc) => return Ok(nvrtc),
            Err(e) => tried.push(e),
        }
    }
    Err(format!(
        "not on the library path nor in python3's nvidia-cuda-nvrtc wheels ({})",
        tried.join("; ")
    ))
}

/// The NVRTC libraries of the `nvidia-cuda-nvrtc-cu12` and `nvidia-cuda-nvrtc` (13) wheels
/// that `python3` can import, in that order; none when there is no `python3`.
fn wheel_libraries() -> Vec<PathBuf> {
    const SCRIPT: &str = "import importlib, os\n\
        for mod, lib in (('nvidia.cuda_nvrtc', 'libnvrtc.so.12'), ('nvidia.cu13', 'libnvrtc.so.13')):\n\
        \x20   try:\n\
        \x20       m = importlib.import_module(mod)\n\
        \x20   except Exception:\n\
        \x20       continue\n\
        \x20   for d in m.__path__:\n\
        \x20       print(os.path.join(d, 'lib', lib))\n";
    let Ok(out) = std::process::Command::new("python3")
        .args(["-c", SCRIPT])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect()
}

/// Loads `what` (a path, or a soname for the search path) and binds the functions.
fn load(what: &std::ffi::OsStr, source: String) -> Result<Nvrtc, String> {
    // SAFETY: NVRTC runs no initialisers with preconditions; the library is kept loaded for as
    // long as the `Nvrtc` holding the function pointers below.
    let library =
        unsafe { Library::new(what) }.map_err(|e| format!("{source}: {}", with_cause(&e)))?;
    macro_rules! bind {
        ($name:literal) => {
            // SAFETY: the symbol has this C signature in NVRTC 12 and 13 (nvrtc.h); the pointer
            // is used only while `library` stays loaded (it moves into the `Nvrtc`).
            *unsafe { library.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{source} has no {}: {}", $name, with_cause(&e)))?
        };
    }
    let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status = bind!("nvrtcVersion");
    let nvrtc = Nvrtc {
        version: (0, 0),
        error_string: bind!("nvrtcGetErrorString"),
        create_program: bind!("nvrtcCreateProgram"),
        compile_program: bind!("nvrtcCompileProgram"),
        ptx_size: bind!("nvrtcGetPTXSize"),
        ptx: bind!("nvrtcGetPTX"),
        log_size: bind!("nvrtcGetProgramLogSize"),
        log: bind!("nvrtcGetProgramLog"),
        destroy_program: bind!("nvrtcDestroyProgram"),
        source,
        _library: library,
    };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for the call.
    let status = unsafe { version_fn(&mut major, &mut minor) };
    nvrtc
        .check("nvrtcVersion", status)
        .map_err(|e| format!("{}: {e}", nvrtc.source))?;
    Ok(Nvrtc {
        version: (major, minor),
        ..nvrtc
    })
}

/// `e` and the system's reason under it (libloading's `dlopen failed` alone does not say why).
fn with_cause(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// Destroys the program when compilation is done, however it ended.
struct ProgramGuard<'a> {
    nvrtc: &'a Nvrtc,
    program: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `program` came from `nvrtcCreateProgram` and is destroyed only here. A
        // failure to free it leaks memory; there is nothing better to do with it in a drop.
        let _ = unsafe { (self.nvrtc.destroy_program)(&mut self.program) };
    }
}

impl Nvrtc {
    /// `Ok` for `NVRTC_SUCCESS`, else NVRTC's own description of `status`.
    fn check(&self, call: &'static str, status: Status) -> Result<(), String> {
        if status == SUCCESS {
            return Ok(());
        }
        // SAFETY: `nvrtcGetErrorString` returns a static NUL-terminated string for any value
        // (an "unrecognized" one for values it does not know).
        let text = unsafe { (self.error_string)(status) };
        let text = if text.is_null() {
            format!("status {status}")
        } else {
            // SAFETY: non-null and NUL-terminated (above), never freed.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(format!("{call} failed: {text}"))
    }

    /// Compiles `source` (named `name` in NVRTC's messages) with `options` to PTX.
    pub(super) fn compile(
        &self,
        source: &str,
        name: &str,
        options: &[String],
    ) -> Result<String, Failure> {
        let cstring = |call: &'static str, s: &str| {
            CString::new(s).map_err(|_| Failure::Call {
                call,
                message: "the text contains a NUL byte".into(),
            })
        };
        let source = cstring("nvrtcCreateProgram", source)?;
        let name = cstring("nvrtcCreateProgram", name)?;
        let options = options
            .iter()
            .map(|o| cstring("nvrtcCompileProgram", o))
            .collect::<Result<Vec<_>, _>>()?;
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let fail = |call| move |message| Failure::Call { call, message };

        let mut program: Program = std::ptr::null_mut();
        // SAFETY: the strings are NUL-terminated and outlive the call; no headers.
        let status = unsafe {
            (self.create_program)(
                &mut program,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        self.check("nvrtcCreateProgram", status)
            .map_err(fail("nvrtcCreateProgram"))?;
        let guard = ProgramGuard {
            nvrtc: self,
            program,
        };
        let count = c_int::try_from(option_ptrs.len()).map_err(|_| Failure::Call {
            call: "nvrtcCompileProgram",
            message: "too many options".into(),
        })?;
        // SAFETY: `option_ptrs` holds `count` NUL-terminated strings that outlive the call.
        let status = unsafe { (self.compile_program)(guard.program, count, option_ptrs.as_ptr()) };
        if status == ERROR_COMPILATION {
            return Err(Failure::Rejected {
                log: self
                    .text(&guard, "nvrtcGetProgramLog", self.log_size, self.log)
                    .unwrap_or_else(|e| e),
            });
        }
        self.check("nvrtcCompileProgram", status)
            .map_err(fail("nvrtcCompileProgram"))?;
        self.text(&guard, "nvrtcGetPTX", self.ptx_size, self.ptx)
            .map_err(fail("nvrtcGetPTX"))
    }

    /// The program's PTX or log: its size, then its bytes (NUL-terminated).
    fn text(
        &self,
        guard: &ProgramGuard<'_>,
        call: &'static str,
        size: GetSize,
        get: GetText,
    ) -> Result<String, String> {
        let mut len = 0usize;
        // SAFETY: the program is live (held by `guard`); `len` is valid for the call.
        self.check(call, unsafe { size(guard.program, &mut len) })?;
        let mut bytes = vec![0u8; len.max(1)];
        // SAFETY: `bytes` has room for the `len` bytes (NUL included) NVRTC writes.
        self.check(call, unsafe {
            get(guard.program, bytes.as_mut_ptr().cast())
        })?;
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        bytes.truncate(end);
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}
