//! The ONNX protobuf messages and small constructors for the parts an export writes.
//!
//! [`pb`] is generated at build time by `prost-build` from the vendored `onnx.proto` (ONNX 1.23.2,
//! proto2 syntax, so scalar fields are `Option`s); encoding is `prost::Message::encode_to_vec`.
//! The helpers here build attributes, tensors and value infos from towerpack's types so the op
//! mapping reads as ONNX, not as protobuf plumbing.

use crate::ir::{Dim, Shape, TensorType};
use crate::tensor::{DType, HostTensor};

/// The generated ONNX messages (package `onnx`).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

use pb::attribute_proto::AttributeType;
use pb::tensor_proto::DataType;
use pb::tensor_shape_proto::{Dimension, dimension};

/// The name of the symbolic batch dimension in exported shapes.
pub const BATCH_DIM: &str = "N";

/// ONNX's element type code for `dtype`.
pub fn data_type(dtype: DType) -> i32 {
    let t = match dtype {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::U8 => DataType::Uint8,
        DType::Bool => DataType::Bool,
    };
    t as i32
}

/// A tensor named `name` holding `value` (little-endian `raw_data`, booleans one byte each).
pub fn tensor(name: &str, value: &HostTensor) -> pb::TensorProto {
    pb::TensorProto {
        name: Some(name.to_string()),
        dims: value.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(data_type(value.dtype())),
        raw_data: Some(value.to_le_bytes()),
        ..Default::default()
    }
}

/// A 1-D `int64` tensor (shapes, pads, axes of ONNX ops that take them as inputs).
pub fn i64_tensor(name: &str, values: &[i64]) -> pb::TensorProto {
    pb::TensorProto {
        name: Some(name.to_string()),
        dims: vec![values.len() as i64],
        data_type: Some(DataType::Int64 as i32),
        raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    }
}

/// The ONNX form of a symbolic shape: fixed sizes as values, the batch as the parameter `N`.
pub fn shape(shape: &Shape) -> pb::TensorShapeProto {
    pb::TensorShapeProto {
        dim: shape
            .dims()
            .iter()
            .map(|d| Dimension {
                value: Some(match d {
                    Dim::Fixed(n) => dimension::Value::DimValue(*n as i64),
                    Dim::Batch => dimension::Value::DimParam(BATCH_DIM.to_string()),
                }),
                ..Default::default()
            })
            .collect(),
    }
}

/// A graph input or output `name` of type `ty`.
pub fn value_info(name: &str, ty: &TensorType) -> pb::ValueInfoProto {
    pb::ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: Some(data_type(ty.dtype)),
                shape: Some(shape(&ty.shape)),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A node attribute.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Ints(Vec<i64>),
    Float(f32),
}

impl Attr {
    /// The attribute `name` with this value.
    pub fn proto(&self, name: &str) -> pb::AttributeProto {
        let mut a = pb::AttributeProto {
            name: Some(name.to_string()),
            ..Default::default()
        };
        match self {
            Attr::Int(i) => {
                a.r#type = Some(AttributeType::Int as i32);
                a.i = Some(*i);
            }
            Attr::Ints(v) => {
                a.r#type = Some(AttributeType::Ints as i32);
                a.ints = v.clone();
            }
            Attr::Float(f) => {
                a.r#type = Some(AttributeType::Float as i32);
                a.f = Some(*f);
            }
        }
        a
    }
}

/// A node of type `op_type` (default domain) named `name`.
pub fn node(
    name: &str,
    op_type: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: &[(&str, Attr)],
) -> pb::NodeProto {
    pb::NodeProto {
        name: Some(name.to_string()),
        op_type: Some(op_type.to_string()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs.iter().map(|(n, a)| a.proto(n)).collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn tensors_and_value_infos_round_trip_through_the_wire_format() {
        let t = HostTensor::from_f32(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5]).expect("t");
        let p = tensor("fc/W", &t);
        let back = pb::TensorProto::decode(p.encode_to_vec().as_slice()).expect("decode");
        assert_eq!(back.name.as_deref(), Some("fc/W"));
        assert_eq!(back.dims, [2, 3]);
        assert_eq!(back.data_type, Some(DataType::Float as i32));
        assert_eq!(back.raw_data.as_deref(), Some(t.to_le_bytes().as_slice()));

        let vi = value_info("input", &TensorType::f32(Shape::batched(&[28, 28, 1])));
        let Some(pb::type_proto::Value::TensorType(tt)) = vi.r#type.and_then(|t| t.value) else {
            panic!("a tensor type");
        };
        let dims: Vec<_> = tt
            .shape
            .expect("shape")
            .dim
            .into_iter()
            .map(|d| d.value)
            .collect();
        assert_eq!(
            dims,
            [
                Some(dimension::Value::DimParam("N".into())),
                Some(dimension::Value::DimValue(28)),
                Some(dimension::Value::DimValue(28)),
                Some(dimension::Value::DimValue(1)),
            ]
        );
    }
}
