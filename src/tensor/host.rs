//! `HostTensor`: a dense, row-major tensor in host memory with a concrete shape.
//!
//! It is the currency between stages that hold real data: IR constants, feeds and fetches of a
//! step, variable values, checkpoints and data pipelines.

use std::borrow::Cow;

use super::{DType, TensorError};
use half::{bf16, f16};

/// The typed element buffer of a [`HostTensor`].
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

impl Storage {
    /// The element type of this buffer.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::F16(_) => DType::F16,
            Storage::BF16(_) => DType::BF16,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
            Storage::U8(_) => DType::U8,
            Storage::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::F64(v) => v.len(),
            Storage::F16(v) => v.len(),
            Storage::BF16(v) => v.len(),
            Storage::I32(v) => v.len(),
            Storage::I64(v) => v.len(),
            Storage::U8(v) => v.len(),
            Storage::Bool(v) => v.len(),
        }
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A buffer of `len` zeros (false for bool).
    pub fn zeros(dtype: DType, len: usize) -> Storage {
        match dtype {
            DType::F32 => Storage::F32(vec![0.0; len]),
            DType::F64 => Storage::F64(vec![0.0; len]),
            DType::F16 => Storage::F16(vec![f16::ZERO; len]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; len]),
            DType::I32 => Storage::I32(vec![0; len]),
            DType::I64 => Storage::I64(vec![0; len]),
            DType::U8 => Storage::U8(vec![0; len]),
            DType::Bool => Storage::Bool(vec![false; len]),
        }
    }

    /// Element `i` widened to `f64` (booleans are 0 or 1).
    ///
    /// # Panics
    /// When `i` is out of range (an internal invariant of callers).
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Storage::F32(v) => f64::from(v[i]),
            Storage::F64(v) => v[i],
            Storage::F16(v) => v[i].to_f64(),
            Storage::BF16(v) => v[i].to_f64(),
            Storage::I32(v) => f64::from(v[i]),
            Storage::I64(v) => v[i] as f64,
            Storage::U8(v) => f64::from(v[i]),
            Storage::Bool(v) => f64::from(u8::from(v[i])),
        }
    }

    /// Builds a buffer of `dtype` from `f64` values, rounding to the target type
    /// (integers truncate toward zero, booleans are `x != 0`).
    pub fn from_f64(dtype: DType, values: impl IntoIterator<Item = f64>) -> Storage {
        let it = values.into_iter();
        match dtype {
            DType::F32 => Storage::F32(it.map(|x| x as f32).collect()),
            DType::F64 => Storage::F64(it.collect()),
            DType::F16 => Storage::F16(it.map(f16::from_f64).collect()),
            DType::BF16 => Storage::BF16(it.map(super::bf16_from_f64).collect()),
            DType::I32 => Storage::I32(it.map(|x| x as i32).collect()),
            DType::I64 => Storage::I64(it.map(|x| x as i64).collect()),
            DType::U8 => Storage::U8(it.map(|x| x as u8).collect()),
            DType::Bool => Storage::Bool(it.map(|x| x != 0.0).collect()),
        }
    }
}

/// A dense row-major tensor with a concrete shape.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    shape: Vec<usize>,
    storage: Storage,
}

impl HostTensor {
    /// Wraps `storage` with `shape`; errors when the element count does not match.
    pub fn new(shape: Vec<usize>, storage: Storage) -> Result<HostTensor, TensorError> {
        let expected: usize = shape.iter().product();
        if expected != storage.len() {
            return Err(TensorError::ElementCount {
                shape,
                expected,
                got: storage.len(),
            });
        }
        Ok(HostTensor { shape, storage })
    }

    /// A tensor of zeros.
    pub fn zeros(dtype: DType, shape: &[usize]) -> HostTensor {
        let len = shape.iter().product();
        HostTensor {
            shape: shape.to_vec(),
            storage: Storage::zeros(dtype, len),
        }
    }

    /// An `f32` tensor; errors when `data.len()` does not match `shape`.
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<HostTensor, TensorError> {
        HostTensor::new(shape.to_vec(), Storage::F32(data))
    }

    /// An `i64` tensor; errors when `data.len()` does not match `shape`.
    pub fn from_i64(shape: &[usize], data: Vec<i64>) -> Result<HostTensor, TensorError> {
        HostTensor::new(shape.to_vec(), Storage::I64(data))
    }

    /// An `i32` tensor; errors when `data.len()` does not match `shape`.
    pub fn from_i32(shape: &[usize], data: Vec<i32>) -> Result<HostTensor, TensorError> {
        HostTensor::new(shape.to_vec(), Storage::I32(data))
    }

    /// A rank-0 `f32` tensor.
    pub fn scalar_f32(x: f32) -> HostTensor {
        HostTensor {
            shape: Vec::new(),
            storage: Storage::F32(vec![x]),
        }
    }

    /// A rank-0 `i64` tensor.
    pub fn scalar_i64(x: i64) -> HostTensor {
        HostTensor {
            shape: Vec::new(),
            storage: Storage::I64(vec![x]),
        }
    }

    /// A rank-0 tensor of `dtype` holding `x` (converted as by [`Storage::from_f64`]).
    pub fn scalar(dtype: DType, x: f64) -> HostTensor {
        HostTensor {
            shape: Vec::new(),
            storage: Storage::from_f64(dtype, [x]),
        }
    }

    /// A tensor of `dtype` built from `f64` values (see [`Storage::from_f64`]).
    pub fn from_f64_values(
        dtype: DType,
        shape: &[usize],
        values: Vec<f64>,
    ) -> Result<HostTensor, TensorError> {
        let len = values.len();
        let expected: usize = shape.iter().product();
        if expected != len {
            return Err(TensorError::ElementCount {
                shape: shape.to_vec(),
                expected,
                got: len,
            });
        }
        Ok(HostTensor {
            shape: shape.to_vec(),
            storage: Storage::from_f64(dtype, values),
        })
    }

    /// The concrete shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.storage.len()
    }

    /// True when the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.storage.is_empty()
    }

    /// The typed element buffer.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The typed element buffer, mutably (the shape cannot change through it).
    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    /// Consumes the tensor into its shape and buffer.
    pub fn into_parts(self) -> (Vec<usize>, Storage) {
        (self.shape, self.storage)
    }

    /// The elements as `f32`, if this is an `f32` tensor.
    pub fn as_f32(&self) -> Result<&[f32], TensorError> {
        match &self.storage {
            Storage::F32(v) => Ok(v),
            other => Err(TensorError::WrongDType {
                expected: DType::F32,
                got: other.dtype(),
            }),
        }
    }

    /// The elements as mutable `f32`, if this is an `f32` tensor.
    pub fn as_f32_mut(&mut self) -> Result<&mut [f32], TensorError> {
        match &mut self.storage {
            Storage::F32(v) => Ok(v),
            other => Err(TensorError::WrongDType {
                expected: DType::F32,
                got: other.dtype(),
            }),
        }
    }

    /// Every element widened to `f64`.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.storage.get_f64(i)).collect()
    }

    /// Every element converted to `f32`.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.storage {
            Storage::F32(v) => v.clone(),
            _ => self.to_f64_vec().into_iter().map(|x| x as f32).collect(),
        }
    }

    /// The single element of a tensor with one element, widened to `f64`.
    pub fn scalar_value(&self) -> Result<f64, TensorError> {
        if self.len() != 1 {
            return Err(TensorError::NotScalar {
                shape: self.shape.clone(),
            });
        }
        Ok(self.storage.get_f64(0))
    }

    /// The same data converted to `dtype`.
    pub fn cast(&self, dtype: DType) -> HostTensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        HostTensor {
            shape: self.shape.clone(),
            storage: Storage::from_f64(dtype, self.to_f64_vec()),
        }
    }

    /// The same data with a new shape of equal element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<HostTensor, TensorError> {
        HostTensor::new(shape.to_vec(), self.storage.clone())
    }

    /// Raw little-endian bytes of the elements (booleans as one byte each), as an owned copy.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.le_bytes().into_owned()
    }

    /// Raw little-endian bytes of the elements (booleans as one byte each): the elements' own
    /// memory where that already is their little-endian encoding (every type but `bool` on a
    /// little-endian machine), else a converted copy. Uploading a batch to a device then copies
    /// it once, straight into pinned memory, instead of first into a fresh byte vector.
    pub fn le_bytes(&self) -> Cow<'_, [u8]> {
        #[cfg(target_endian = "little")]
        {
            let bytes: Option<&[u8]> = match &self.storage {
                Storage::F32(v) => Some(bytemuck::cast_slice(v)),
                Storage::F64(v) => Some(bytemuck::cast_slice(v)),
                Storage::F16(v) => Some(bytemuck::cast_slice(v)),
                Storage::BF16(v) => Some(bytemuck::cast_slice(v)),
                Storage::I32(v) => Some(bytemuck::cast_slice(v)),
                Storage::I64(v) => Some(bytemuck::cast_slice(v)),
                Storage::U8(v) => Some(v),
                Storage::Bool(_) => None,
            };
            if let Some(bytes) = bytes {
                return Cow::Borrowed(bytes);
            }
        }
        Cow::Owned(self.converted_le_bytes())
    }

    /// Every element converted to its little-endian bytes (what big-endian machines need).
    fn converted_le_bytes(&self) -> Vec<u8> {
        match &self.storage {
            Storage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Storage::U8(v) => v.clone(),
            Storage::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
        }
    }

    /// Rebuilds a tensor from little-endian bytes written by [`HostTensor::to_le_bytes`].
    pub fn from_le_bytes(
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<HostTensor, TensorError> {
        let n: usize = shape.iter().product();
        let need = n * dtype.size_bytes();
        if bytes.len() != need {
            return Err(TensorError::ByteCount {
                dtype,
                shape: shape.to_vec(),
                expected: need,
                got: bytes.len(),
            });
        }
        fn chunks<const W: usize, T>(b: &[u8], f: impl Fn([u8; W]) -> T) -> Vec<T> {
            b.chunks_exact(W)
                .map(|c| {
                    let mut a = [0u8; W];
                    a.copy_from_slice(c);
                    f(a)
                })
                .collect()
        }
        let storage = match dtype {
            DType::F32 => Storage::F32(chunks(bytes, f32::from_le_bytes)),
            DType::F64 => Storage::F64(chunks(bytes, f64::from_le_bytes)),
            DType::F16 => Storage::F16(chunks(bytes, f16::from_le_bytes)),
            DType::BF16 => Storage::BF16(chunks(bytes, bf16::from_le_bytes)),
            DType::I32 => Storage::I32(chunks(bytes, i32::from_le_bytes)),
            DType::I64 => Storage::I64(chunks(bytes, i64::from_le_bytes)),
            DType::U8 => Storage::U8(bytes.to_vec()),
            DType::Bool => Storage::Bool(bytes.iter().map(|&b| b != 0).collect()),
        };
        Ok(HostTensor {
            shape: shape.to_vec(),
            storage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_round_trip_every_dtype() {
        for dtype in DType::ALL {
            let t = HostTensor::from_f64_values(dtype, &[2, 3], vec![0.0, 1.0, 2.0, 3.0, 0.0, 5.0])
                .expect("6 elements");
            let back = HostTensor::from_le_bytes(dtype, &[2, 3], &t.to_le_bytes()).expect("bytes");
            assert_eq!(t, back, "{dtype}");
        }
    }

    #[test]
    fn borrowed_bytes_are_the_little_endian_encoding_of_every_element() {
        for dtype in DType::ALL {
            let values = vec![-1.5, 1.0, 2.0, 300.0, 0.0, 5.25];
            let t = HostTensor::from_f64_values(dtype, &[2, 3], values).expect("6 elements");
            let view = t.le_bytes();
            assert_eq!(view.as_ref(), t.converted_le_bytes().as_slice(), "{dtype}");
            if cfg!(target_endian = "little") {
                assert_eq!(
                    matches!(view, Cow::Borrowed(_)),
                    dtype != DType::Bool,
                    "{dtype}: only booleans are converted"
                );
            }
        }
    }

    #[test]
    fn element_count_is_checked() {
        let err = HostTensor::from_f32(&[2, 2], vec![1.0; 3]).unwrap_err();
        assert!(matches!(
            err,
            TensorError::ElementCount {
                expected: 4,
                got: 3,
                ..
            }
        ));
    }
}
