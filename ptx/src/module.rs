//! A loaded PTX module: its kernels, decoded once, with the parameter metadata the host side
//! checks its argument packing against, and the launch limits the PTX declares.

use std::collections::HashMap;
use std::sync::Arc;

use crate::decode::decode_module;
use crate::error::LoadError;
use crate::kernel::Kernel;
use crate::lexer::line_text;
use crate::parser::parse;

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
