//! A decoded kernel: its instructions with their PTX lines, register-file sizes and constant
//! registers, parameter layout (as `cuLaunchKernel` packs it) and the launch limits and memory
//! the entry declares. Decoding produces it; a [`Module`](crate::Module) holds it; execution
//! reads it.

use crate::inst::Inst;

/// One kernel parameter, laid out as `cuLaunchKernel` packs the parameter buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// The PTX name (`kernel_param_3`).
    pub name: String,
    /// Byte offset in the packed parameter buffer.
    pub offset: usize,
    /// Size in bytes (`.u64` is 8; `.align 8 .b8 p[72]` is 72).
    pub size: usize,
    /// Required alignment in bytes.
    pub align: usize,
}

/// Register-file sizes of a kernel, constants included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RegCounts {
    pub r32: usize,
    pub r64: usize,
    pub pred: usize,
}

/// A decoded kernel.
#[derive(Debug)]
pub struct Kernel {
    pub(crate) name: String,
    pub(crate) params: Vec<ParamInfo>,
    pub(crate) param_bytes: usize,
    pub(crate) code: Vec<Inst>,
    /// PTX line of each instruction.
    pub(crate) lines: Vec<u32>,
    pub(crate) regs: RegCounts,
    /// Constant registers: (index, value) in the 32- and 64-bit files.
    pub(crate) consts32: Vec<(u32, u32)>,
    pub(crate) consts64: Vec<(u32, u64)>,
    /// Registers that may be read before written (`decode::undef`): zeroed at warp start.
    pub(crate) zero32: Vec<u32>,
    pub(crate) zero64: Vec<u32>,
    pub(crate) zero_pred: Vec<u32>,
    pub(crate) static_shared: usize,
    pub(crate) uses_dynamic_shared: bool,
    pub(crate) local_bytes: usize,
    pub(crate) maxntid: Option<[u32; 3]>,
    pub(crate) reqntid: Option<[u32; 3]>,
}

impl Kernel {
    /// The entry's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Parameters in declaration order.
    pub fn params(&self) -> &[ParamInfo] {
        &self.params
    }
    /// Size of the packed parameter buffer.
    pub fn param_bytes(&self) -> usize {
        self.param_bytes
    }
    /// Statically declared shared memory per CTA, in bytes.
    pub fn static_shared_bytes(&self) -> usize {
        self.static_shared
    }
    /// Whether the kernel declares an `.extern .shared` array (dynamic shared memory).
    pub fn uses_dynamic_shared(&self) -> bool {
        self.uses_dynamic_shared
    }
    /// Local memory per thread, in bytes.
    pub fn local_bytes(&self) -> usize {
        self.local_bytes
    }
    /// `.maxntid` of the entry, if declared.
    pub fn max_threads(&self) -> Option<[u32; 3]> {
        self.maxntid
    }
    /// `.reqntid` of the entry, if declared.
    pub fn required_threads(&self) -> Option<[u32; 3]> {
        self.reqntid
    }
    /// Number of decoded instructions.
    pub fn instruction_count(&self) -> usize {
        self.code.len()
    }
}
