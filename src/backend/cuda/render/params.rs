//! Kernel parameter descriptors: ONE list of fields per kernel launch generates both the C
//! `struct tp_params` the kernel receives by value and the bytes the host packs for it.
//!
//! A field's kind carries its value (or where the value comes from: a buffer, the status word),
//! and the C type is derived from the kind, so the declaration and the packing cannot disagree;
//! layout follows the C rules (each field at a multiple of its alignment, the struct padded to
//! its largest alignment), which `tests/cuda/compile.rs` checks against the parameter sizes
//! NVRTC's PTX declares.

use super::RenderError;
use crate::lower::BufferId;
use crate::tensor::DType;
use std::fmt::Write as _;

/// Where a field's value comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldKind {
    /// The address of element `offset` of `buffer`, as a pointer to its storage type.
    Buffer {
        buffer: BufferId,
        offset: usize,
        dtype: DType,
        writable: bool,
    },
    /// The address of the device's status word (`unsigned int[2]`, see `tp_report`).
    Status,
    /// `offset` bytes into the launch's workspace (scratch the backend allocates per launch for
    /// split reductions: partials and arrival counters), as a pointer to `elem`.
    Workspace {
        offset: usize,
        elem: &'static str,
    },
    I32(i32),
    I64(i64),
    F32(f32),
}

impl FieldKind {
    /// The C type of the field.
    pub fn c_type(&self) -> String {
        match self {
            FieldKind::Buffer {
                dtype, writable, ..
            } => {
                let elem = storage_type(*dtype);
                if *writable {
                    format!("{elem}*")
                } else {
                    format!("const {elem}*")
                }
            }
            FieldKind::Status => "unsigned int*".into(),
            FieldKind::Workspace { elem, .. } => format!("{elem}*"),
            FieldKind::I32(_) => "int".into(),
            FieldKind::I64(_) => "long long".into(),
            FieldKind::F32(_) => "float".into(),
        }
    }

    /// Size (and alignment) in bytes.
    pub fn size(&self) -> usize {
        match self {
            FieldKind::Buffer { .. }
            | FieldKind::Status
            | FieldKind::Workspace { .. }
            | FieldKind::I64(_) => 8,
            FieldKind::I32(_) | FieldKind::F32(_) => 4,
        }
    }
}

/// The C type elements of `dtype` are stored as in device memory.
pub fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 => "unsigned short",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 | DType::Bool => "unsigned char",
    }
}

/// One member of the parameter struct.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub name: String,
    pub kind: FieldKind,
}

/// The parameter struct of one kernel launch.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ParamStruct {
    fields: Vec<Field>,
}

/// Resolved addresses for packing: buffer base addresses and the status word.
pub trait AddressOf {
    /// The device address of `buffer`'s first byte.
    fn buffer(&self, buffer: BufferId) -> u64;
    /// The device address of the status word.
    fn status(&self) -> u64;
    /// The device address of the launch's workspace (see [`FieldKind::Workspace`]).
    fn workspace(&self) -> u64;
}

impl ParamStruct {
    /// Appends a field. Names must be unique C identifiers (a duplicate fails to compile).
    pub fn push(&mut self, name: impl Into<String>, kind: FieldKind) -> &mut ParamStruct {
        self.fields.push(Field {
            name: name.into(),
            kind,
        });
        self
    }

    /// Appends an `int` field; a value beyond `i32` is an error naming the field.
    pub fn int(&mut self, name: &str, value: usize) -> Result<&mut ParamStruct, RenderError> {
        let v = i32::try_from(value).map_err(|_| RenderError::TooLarge {
            what: name.to_string(),
            value,
        })?;
        Ok(self.push(name, FieldKind::I32(v)))
    }

    /// Appends a pointer to a buffer (from element `offset`).
    pub fn buffer(
        &mut self,
        name: &str,
        buffer: BufferId,
        offset: usize,
        dtype: DType,
        writable: bool,
    ) -> &mut ParamStruct {
        self.push(
            name,
            FieldKind::Buffer {
                buffer,
                offset,
                dtype,
                writable,
            },
        )
    }

    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Byte offset of every field, and the struct's size and alignment.
    pub fn layout(&self) -> (Vec<usize>, usize, usize) {
        let mut offsets = Vec::with_capacity(self.fields.len());
        let (mut end, mut align) = (0usize, 1usize);
        for f in &self.fields {
            let size = f.kind.size();
            let at = end.next_multiple_of(size);
            offsets.push(at);
            end = at + size;
            align = align.max(size);
        }
        // An empty struct still occupies one byte in C++.
        (offsets, end.next_multiple_of(align).max(1), align)
    }

    /// The C declaration `struct tp_params { ... };`.
    pub fn declaration(&self) -> String {
        let mut s = String::from("struct tp_params {\n");
        for f in &self.fields {
            let _ = writeln!(s, "    {} {};", f.kind.c_type(), f.name);
        }
        s.push_str("};\n");
        s
    }

    /// The bytes of the struct as the kernel receives it, with addresses resolved by `at`.
    pub fn pack(&self, at: &dyn AddressOf) -> Vec<u8> {
        let (offsets, size, _) = self.layout();
        let mut bytes = vec![0u8; size];
        for (f, &o) in self.fields.iter().zip(&offsets) {
            let value: [u8; 8] = match &f.kind {
                FieldKind::Buffer {
                    buffer,
                    offset,
                    dtype,
                    ..
                } => (at.buffer(*buffer) + (offset * dtype.size_bytes()) as u64).to_le_bytes(),
                FieldKind::Status => at.status().to_le_bytes(),
                FieldKind::Workspace { offset, .. } => {
                    (at.workspace() + *offset as u64).to_le_bytes()
                }
                FieldKind::I64(v) => v.to_le_bytes(),
                FieldKind::I32(v) => widen(v.to_le_bytes()),
                FieldKind::F32(v) => widen(v.to_le_bytes()),
            };
            let n = f.kind.size();
            bytes[o..o + n].copy_from_slice(&value[..n]);
        }
        bytes
    }
}

fn widen(b: [u8; 4]) -> [u8; 8] {
    [b[0], b[1], b[2], b[3], 0, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl AddressOf for Fixed {
        fn buffer(&self, b: BufferId) -> u64 {
            0x1000 * (u64::from(b.0) + 1)
        }
        fn status(&self) -> u64 {
            0xABCD
        }
        fn workspace(&self) -> u64 {
            0x9000
        }
    }

    #[test]
    fn layout_follows_the_c_rules_and_packing_matches_it() {
        let mut p = ParamStruct::default();
        p.int("n", 7)
            .expect("small")
            .buffer("x", BufferId(2), 3, DType::F32, false)
            .push("scale", FieldKind::F32(0.5))
            .push("status", FieldKind::Status)
            .int("m", 9)
            .expect("small")
            .push(
                "ws",
                FieldKind::Workspace {
                    offset: 512,
                    elem: "float",
                },
            );
        assert!(p.clone().int("big", 1 << 31).is_err());
        let (offsets, size, align) = p.layout();
        assert_eq!(offsets, vec![0, 8, 16, 24, 32, 40]);
        assert_eq!((size, align), (48, 8));
        let bytes = p.pack(&Fixed);
        assert_eq!(&bytes[0..4], &7i32.to_le_bytes());
        assert_eq!(&bytes[8..16], &(0x3000u64 + 12).to_le_bytes());
        assert_eq!(&bytes[16..20], &0.5f32.to_le_bytes());
        assert_eq!(&bytes[24..32], &0xABCDu64.to_le_bytes());
        assert_eq!(&bytes[32..36], &9i32.to_le_bytes());
        assert_eq!(&bytes[40..48], &(0x9000u64 + 512).to_le_bytes());
        assert!(p.declaration().contains("    float* ws;\n"));
        assert!(p.declaration().contains("    const float* x;\n"));
        assert!(p.declaration().contains("    unsigned int* status;\n"));
    }
}
