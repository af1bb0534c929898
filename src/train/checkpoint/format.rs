//! The checkpoint file format: safetensors (what PyTorch and the Hugging Face tools read), mapping
//! [`HostTensor`] dtypes one to one and carrying resume state in the string→string
//! `__metadata__` map. Decoding failures are diagnosed into truncated / not-safetensors / corrupt.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, View};

use super::{Checkpoint, CheckpointError};
use crate::tensor::{DType, HostTensor};

/// safetensors refuses headers larger than this (its `MAX_HEADER_SIZE`).
const MAX_HEADER_BYTES: u64 = 100_000_000;

fn to_safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

fn from_safetensors_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// A tensor's little-endian bytes, in the shape safetensors serializes.
struct RawTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for RawTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Encodes named tensors and metadata as a safetensors file image.
pub fn encode(
    tensors: &[(String, HostTensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, CheckpointError> {
    let mut seen = HashSet::new();
    let mut raw = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let reason = if name.is_empty() {
            Some("names must not be empty")
        } else if name == "__metadata__" {
            Some("`__metadata__` is reserved by safetensors")
        } else if !seen.insert(name.as_str()) {
            Some("the name appears twice")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(CheckpointError::InvalidTensorName {
                name: name.clone(),
                reason: reason.into(),
            });
        }
        raw.push((
            name.clone(),
            RawTensor {
                dtype: to_safetensors_dtype(t.dtype()),
                shape: t.shape().to_vec(),
                bytes: t.to_le_bytes(),
            },
        ));
    }
    let meta: HashMap<String, String> = metadata.clone().into_iter().collect();
    let meta = if meta.is_empty() { None } else { Some(meta) };
    safetensors::serialize(raw, meta).map_err(|e| CheckpointError::Encode {
        detail: e.to_string(),
    })
}

/// Decodes a safetensors file image read from `path` into a [`Checkpoint`].
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let (_, header) =
        SafeTensors::read_metadata(bytes).map_err(|e| diagnose(path, bytes, &e.to_string()))?;
    let parsed =
        SafeTensors::deserialize(bytes).map_err(|e| diagnose(path, bytes, &e.to_string()))?;
    let metadata: BTreeMap<String, String> = header
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut tensors = BTreeMap::new();
    for (name, view) in parsed.iter() {
        let dtype = from_safetensors_dtype(view.dtype()).ok_or_else(|| {
            CheckpointError::UnsupportedDtype {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                dtype: format!("{:?}", view.dtype()),
            }
        })?;
        let tensor = HostTensor::from_le_bytes(dtype, view.shape(), view.data()).map_err(|e| {
            CheckpointError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("tensor `{name}`: {e}"),
            }
        })?;
        tensors.insert(name.to_string(), tensor);
    }
    Ok(Checkpoint {
        path: path.to_path_buf(),
        tensors,
        metadata,
    })
}

/// Explains why `bytes` (the content of `path`) did not decode, naming sizes and offsets.
fn diagnose(path: &Path, bytes: &[u8], library_error: &str) -> CheckpointError {
    let len = bytes.len() as u64;
    let path_buf = path.to_path_buf();
    let truncated = |needed: u64| CheckpointError::Truncated {
        path: path_buf.clone(),
        needed,
        len,
    };
    let not_safetensors = |detail: String| CheckpointError::NotSafetensors {
        path: path_buf.clone(),
        detail,
    };
    if len < 8 {
        return truncated(8);
    }
    let mut n_bytes = [0u8; 8];
    n_bytes.copy_from_slice(&bytes[..8]);
    let header_len = u64::from_le_bytes(n_bytes);
    if bytes.len() > 8 && bytes[8] != b'{' {
        return not_safetensors("byte 8 does not start a JSON header".into());
    }
    if header_len > MAX_HEADER_BYTES {
        return not_safetensors(format!(
            "the declared header length {header_len} is implausible"
        ));
    }
    let header_end = 8 + header_len;
    if header_end > len {
        return truncated(header_end);
    }
    // `header_end <= len`, so the range is in bounds.
    let header: serde_json::Value = match serde_json::from_slice(&bytes[8..header_end as usize]) {
        Ok(v) => v,
        Err(e) => {
            return CheckpointError::Corrupt {
                path: path_buf,
                detail: format!("header JSON (bytes 8..{header_end}): {e}"),
            };
        }
    };
    let data_end = header
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    let needed = header_end + data_end;
    if needed > len {
        return truncated(needed);
    }
    CheckpointError::Corrupt {
        path: path_buf,
        detail: library_error.to_string(),
    }
}
