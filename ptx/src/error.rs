//! The emulator's errors. [`LoadError`]: PTX that does not parse or uses something unsupported
//! (kernel, line, text). [`ExecError`]: a kernel that faults while running (kernel, line, text,
//! CTA, thread, what went wrong). [`EmuError`]: everything the device API returns.

use std::fmt;

use thiserror::Error;

/// A PTX module could not be loaded: a syntax error or an unsupported instruction or directive.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}PTX line {line}: {message}: `{text}`", kernel_prefix(.kernel))]
pub struct LoadError {
    /// The entry being decoded, when the error is inside one.
    pub kernel: Option<String>,
    /// 1-based line in the PTX text.
    pub line: u32,
    /// What is wrong.
    pub message: String,
    /// The offending source line, trimmed.
    pub text: String,
}

fn kernel_prefix(kernel: &Option<String>) -> String {
    match kernel {
        Some(k) => format!("kernel `{k}`, "),
        None => String::new(),
    }
}

impl LoadError {
    pub(crate) fn syntax(line: u32, message: impl Into<String>, text: impl Into<String>) -> Self {
        LoadError {
            kernel: None,
            line,
            message: message.into(),
            text: text.into(),
        }
    }
}

/// Which memory an address was meant for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    Global,
    Shared,
    Local,
    Param,
    Generic,
}

impl fmt::Display for Space {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Space::Global => "global",
            Space::Shared => "shared",
            Space::Local => "local",
            Space::Param => "param",
            Space::Generic => "generic",
        })
    }
}

/// What went wrong while a kernel ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// No allocation (or shared/local window) holds `[addr, addr + bytes)`.
    OutOfBounds { space: Space, addr: u64, bytes: u32 },
    /// `addr` is not a multiple of the access size.
    Misaligned { space: Space, addr: u64, bytes: u32 },
    /// A global address that belongs to another emulated device.
    WrongDevice {
        addr: u64,
        owner: usize,
        device: usize,
    },
    /// A `.sync` warp instruction whose member lanes never all arrived.
    NotConverged {
        waiting: u32,
        missing: u32,
        detail: String,
    },
    /// A lane executed a `.sync` warp instruction without being in its member mask.
    NotInMemberMask { lane: u32, mask: u32 },
    /// A `.sync.aligned` instruction (`mma`, `ldmatrix`) that not every thread of the warp
    /// executes together: undefined behaviour on hardware.
    NotWarpUniform {
        active: u32,
        missing: u32,
        detail: String,
    },
    /// Threads wait at a barrier that the rest of the CTA can never reach.
    Deadlock { detail: String },
    /// The step budget ran out: a livelock or an infinite loop.
    StepBudget { limit: u64 },
    /// `trap` or `brkpt`.
    Trap,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::OutOfBounds { space, addr, bytes } => {
                write!(
                    f,
                    "out-of-bounds {space} access of {bytes} bytes at address {addr:#x}"
                )
            }
            Fault::Misaligned { space, addr, bytes } => {
                write!(
                    f,
                    "misaligned {space} access of {bytes} bytes at address {addr:#x}"
                )
            }
            Fault::WrongDevice {
                addr,
                owner,
                device,
            } => write!(
                f,
                "address {addr:#x} belongs to emulated device {owner}, used on device {device}"
            ),
            Fault::NotConverged {
                waiting,
                missing,
                detail,
            } => write!(
                f,
                "warp-synchronous instruction not converged: lanes {waiting:#010x} wait for lanes \
                 {missing:#010x} of the member mask ({detail})"
            ),
            Fault::NotWarpUniform {
                active,
                missing,
                detail,
            } => write!(
                f,
                "a .sync.aligned instruction needs every thread of the warp together: lanes \
                 {active:#010x} execute it, lanes {missing:#010x} do not ({detail})"
            ),
            Fault::NotInMemberMask { lane, mask } => {
                write!(f, "lane {lane} is not in the member mask {mask:#010x}")
            }
            Fault::Deadlock { detail } => write!(f, "barrier deadlock: {detail}"),
            Fault::StepBudget { limit } => write!(
                f,
                "step budget of {limit} warp-instructions per CTA exhausted (livelock or infinite loop)"
            ),
            Fault::Trap => f.write_str("trap"),
        }
    }
}

/// Lane sets as text: `lanes 0-3, 7`.
pub(crate) fn describe_lanes(mask: u32) -> String {
    let mut parts = Vec::new();
    let mut l = 0;
    while l < 32 {
        if (mask >> l) & 1 == 1 {
            let start = l;
            while l + 1 < 32 && (mask >> (l + 1)) & 1 == 1 {
                l += 1;
            }
            parts.push(if start == l {
                format!("{start}")
            } else {
                format!("{start}-{l}")
            });
        }
        l += 1;
    }
    let noun = if mask.count_ones() == 1 {
        "lane"
    } else {
        "lanes"
    };
    format!("{noun} {}", parts.join(", "))
}

/// A kernel faulted while running.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "kernel `{kernel}`, PTX line {line} (`{text}`), CTA {cta:?}{}: {fault}",
    thread_suffix(.thread)
)]
pub struct ExecError {
    pub kernel: String,
    /// 1-based PTX line of the faulting instruction.
    pub line: u32,
    /// The faulting instruction's text.
    pub text: String,
    /// Block index (x, y, z).
    pub cta: [u32; 3],
    /// Thread index (x, y, z) of the first faulting thread, when one thread is at fault.
    pub thread: Option<[u32; 3]>,
    pub fault: Fault,
}

fn thread_suffix(thread: &Option<[u32; 3]>) -> String {
    match thread {
        Some(t) => format!(", thread {t:?}"),
        None => String::new(),
    }
}

/// Every error of the device API.
#[derive(Debug, Error)]
pub enum EmuError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Exec(#[from] Box<ExecError>),
    #[error("module has no kernel named `{0}`")]
    UnknownKernel(String),
    #[error("kernel `{kernel}`: {message}")]
    Params { kernel: String, message: String },
    #[error("kernel `{kernel}`: invalid launch configuration: {message}")]
    LaunchConfig { kernel: String, message: String },
    #[error("device {device}: {message} (pointer {ptr:#x}, {bytes} bytes)")]
    InvalidPointer {
        device: usize,
        ptr: u64,
        bytes: usize,
        message: String,
    },
    #[error(
        "device {device}: out of memory allocating {bytes} bytes ({in_use} in use of {capacity})"
    )]
    OutOfMemory {
        device: usize,
        bytes: usize,
        in_use: usize,
        capacity: usize,
    },
    #[error("host buffer of {host} bytes does not match the copy of {device} bytes")]
    SizeMismatch { host: usize, device: usize },
}

impl From<ExecError> for EmuError {
    fn from(e: ExecError) -> Self {
        EmuError::Exec(Box::new(e))
    }
}
