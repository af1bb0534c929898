//! A loaded PTX module: its kernels, decoded once, with the parameter metadata the host side
//! checks its argument packing against, and the launch limits the PTX declares.

use std::collections::HashMap;
use std::sync::Arc;

use crate::decode::decode_module;
use crate::error::LoadError;
use crate::inst::Inst;
use crate::lexer::line_text;
use crate::parser::parse;

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

/// A loaded module: decoded kernels plus the PTX text (for error messages).
#[derive(Debug, Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

#[derive(Debug)]
struct ModuleInner {
    source: String,
    kernels: Vec<Kernel>,
    by_name: HashMap<String, usize>,
}

impl Module {
    /// Parses and decodes PTX text. Any unsupported instruction or directive is an error naming
    /// the kernel, the PTX line and its text.
    pub fn load(ptx: &str) -> Result<Module, LoadError> {
        let ast = parse(ptx)?;
        let kernels = decode_module(&ast, ptx)?;
        let by_name = kernels
            .iter()
            .enumerate()
            .map(|(i, k)| (k.name.clone(), i))
            .collect();
        Ok(Module {
            inner: Arc::new(ModuleInner {
                source: ptx.to_string(),
                kernels,
                by_name,
            }),
        })
    }

    /// The kernel named `name`.
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.inner
            .by_name
            .get(name)
            .map(|&i| &self.inner.kernels[i])
    }

    /// All kernels in PTX order.
    pub fn kernels(&self) -> &[Kernel] {
        &self.inner.kernels
    }

    /// The text of 1-based PTX line `line`.
    pub(crate) fn line_text(&self, line: u32) -> String {
        line_text(&self.inner.source, line)
    }
}
