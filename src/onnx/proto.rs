//! The subset of `onnx.proto` (and `onnx-data.proto`) that dynrt reads, as `prost` messages.
//!
//! Written by hand from the `.proto` files of `onnx==1.22.0` (IR version 13): field numbers and
//! types are those of the schema, so the wire format is the real one; fields dynrt never reads
//! (training info, device configurations, sharding, quantization annotations) are left out and
//! skipped by the decoder like any unknown field. No `protoc` runs at build time.
//!
//! `bytes` fields that can be large (`TensorProto.raw_data`, string data) are [`Bytes`]:
//! decoding from a [`Bytes`] buffer makes them slices of that buffer, so a model's weights are
//! not copied by the decoder.
//!
//! These are crate-private wire structs: nothing here is validated. [`crate::onnx::OnnxFile`]
//! turns them into checked types. Fields carry `onnx.proto`'s names; see its comments.

use bytes::Bytes;

/// `ModelProto`: the top-level container of an `.onnx` file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "2")]
    pub producer_name: String,
    #[prost(string, tag = "3")]
    pub producer_version: String,
    #[prost(string, tag = "4")]
    pub domain: String,
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    #[prost(string, tag = "6")]
    pub doc_string: String,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
    #[prost(message, repeated, tag = "25")]
    pub functions: Vec<FunctionProto>,
}

/// `OperatorSetIdProto`: one opset import (`domain` empty or `ai.onnx` is the default domain).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// `StringStringEntryProto`: a key/value pair (metadata, external-data fields).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `GraphProto`: nodes in topological order, initializers, inputs, outputs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub sparse_initializer: Vec<SparseTensorProto>,
    #[prost(string, tag = "10")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "16")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `NodeProto`: one operator invocation.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(string, tag = "7")]
    pub domain: String,
    #[prost(string, tag = "8")]
    pub overload: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    #[prost(string, tag = "6")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "9")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `AttributeProto.AttributeType` values.
pub mod attribute_type {
    pub const UNDEFINED: i32 = 0;
    pub const FLOAT: i32 = 1;
    pub const INT: i32 = 2;
    pub const STRING: i32 = 3;
    pub const TENSOR: i32 = 4;
    pub const GRAPH: i32 = 5;
    pub const FLOATS: i32 = 6;
    pub const INTS: i32 = 7;
    pub const STRINGS: i32 = 8;
    pub const TENSORS: i32 = 9;
    pub const GRAPHS: i32 = 10;
    pub const SPARSE_TENSOR: i32 = 11;
    pub const SPARSE_TENSORS: i32 = 12;
    pub const TYPE_PROTO: i32 = 13;
    pub const TYPE_PROTOS: i32 = 14;
}

/// `AttributeProto`: a named attribute of a node; `type` says which value field is in use.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
    #[prost(string, tag = "13")]
    pub doc_string: String,
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    #[prost(bytes = "bytes", optional, tag = "4")]
    pub s: Option<Bytes>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    #[prost(message, optional, tag = "6")]
    pub g: Option<GraphProto>,
    #[prost(message, optional, tag = "22")]
    pub sparse_tensor: Option<SparseTensorProto>,
    #[prost(message, optional, tag = "14")]
    pub tp: Option<TypeProto>,
    #[prost(float, repeated, tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
    #[prost(bytes = "bytes", repeated, tag = "9")]
    pub strings: Vec<Bytes>,
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub graphs: Vec<GraphProto>,
    #[prost(message, repeated, tag = "23")]
    pub sparse_tensors: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub type_protos: Vec<TypeProto>,
}

/// `ValueInfoProto`: a named value and its type (graph inputs, outputs, value_info).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
    #[prost(string, tag = "3")]
    pub doc_string: String,
}

/// `TensorProto.Segment`: a tensor split over several protos (dynrt rejects these).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Segment {
    #[prost(int64, tag = "1")]
    pub begin: i64,
    #[prost(int64, tag = "2")]
    pub end: i64,
}

/// `TensorProto.DataLocation` values (0 is `DEFAULT`: inline).
pub mod data_location {
    pub const EXTERNAL: i32 = 1;
}

/// `TensorProto`: a tensor's dims, element type and data (`raw_data`, one typed repeated
/// field, or `external_data`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(message, optional, tag = "3")]
    pub segment: Option<Segment>,
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    #[prost(bytes = "bytes", repeated, tag = "6")]
    pub string_data: Vec<Bytes>,
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(string, tag = "12")]
    pub doc_string: String,
    #[prost(bytes = "bytes", optional, tag = "9")]
    pub raw_data: Option<Bytes>,
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    #[prost(int32, tag = "14")]
    pub data_location: i32,
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
}

/// `SparseTensorProto`: COO values and indices of a sparse tensor of shape `dims`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseTensorProto {
    #[prost(message, optional, tag = "1")]
    pub values: Option<TensorProto>,
    #[prost(message, optional, tag = "2")]
    pub indices: Option<TensorProto>,
    #[prost(int64, repeated, tag = "3")]
    pub dims: Vec<i64>,
}

/// `TensorShapeProto`: one entry per dimension.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`: a fixed extent, a symbolic name, or neither (unknown).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    #[prost(oneof = "DimensionValue", tags = "1, 2")]
    pub value: Option<DimensionValue>,
    #[prost(string, tag = "3")]
    pub denotation: String,
}

/// The `value` oneof of `TensorShapeProto.Dimension`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum DimensionValue {
    #[prost(int64, tag = "1")]
    DimValue(i64),
    #[prost(string, tag = "2")]
    DimParam(String),
}

/// `TypeProto`: the type of a value (tensor, sequence, map, optional, sparse tensor).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    #[prost(oneof = "TypeValue", tags = "1, 4, 5, 9, 8")]
    pub value: Option<TypeValue>,
    #[prost(string, tag = "6")]
    pub denotation: String,
}

/// The `value` oneof of `TypeProto` (`tensor_type`, `sequence_type`, ... on the wire).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TypeValue {
    #[prost(message, tag = "1")]
    Tensor(TypeProtoTensor),
    #[prost(message, tag = "4")]
    Sequence(Box<TypeProtoSequence>),
    #[prost(message, tag = "5")]
    Map(Box<TypeProtoMap>),
    #[prost(message, tag = "9")]
    Optional(Box<TypeProtoOptional>),
    #[prost(message, tag = "8")]
    SparseTensor(TypeProtoTensor),
}

/// `TypeProto.Tensor` (also the layout of `TypeProto.SparseTensor`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProtoTensor {
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TypeProto.Sequence`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProtoSequence {
    #[prost(message, optional, boxed, tag = "1")]
    pub elem_type: Option<Box<TypeProto>>,
}

/// `TypeProto.Map`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProtoMap {
    #[prost(int32, tag = "1")]
    pub key_type: i32,
    #[prost(message, optional, boxed, tag = "2")]
    pub value_type: Option<Box<TypeProto>>,
}

/// `TypeProto.Optional`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProtoOptional {
    #[prost(message, optional, boxed, tag = "1")]
    pub elem_type: Option<Box<TypeProto>>,
}

/// `FunctionProto`: a model-local function (its nodes are kept as wire structs).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FunctionProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "4")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    pub output: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    pub attribute: Vec<String>,
    #[prost(message, repeated, tag = "7")]
    pub node: Vec<NodeProto>,
    #[prost(message, repeated, tag = "9")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "10")]
    pub domain: String,
}

#[cfg(any(test, feature = "testing"))]
/// `SequenceProto.DataType` / `OptionalProto.DataType` values (`onnx-data.proto`).
pub mod value_kind {
    pub const UNDEFINED: i32 = 0;
    pub const TENSOR: i32 = 1;
    pub const SPARSE_TENSOR: i32 = 2;
    pub const SEQUENCE: i32 = 3;
    pub const MAP: i32 = 4;
    pub const OPTIONAL: i32 = 5;
}

#[cfg(any(test, feature = "testing"))]
/// `SequenceProto` (`onnx-data.proto`): a test-data value of sequence type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SequenceProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub elem_type: i32,
    #[prost(message, repeated, tag = "3")]
    pub tensor_values: Vec<TensorProto>,
    #[prost(message, repeated, tag = "4")]
    pub sparse_tensor_values: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "5")]
    pub sequence_values: Vec<SequenceProto>,
    #[prost(message, repeated, tag = "6")]
    pub map_values: Vec<MapProto>,
    #[prost(message, repeated, tag = "7")]
    pub optional_values: Vec<OptionalProto>,
}

#[cfg(any(test, feature = "testing"))]
/// `MapProto` (`onnx-data.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MapProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub key_type: i32,
    #[prost(int64, repeated, tag = "3")]
    pub keys: Vec<i64>,
    #[prost(bytes = "bytes", repeated, tag = "4")]
    pub string_keys: Vec<Bytes>,
    #[prost(message, optional, tag = "5")]
    pub values: Option<SequenceProto>,
}

#[cfg(any(test, feature = "testing"))]
/// `OptionalProto` (`onnx-data.proto`): a test-data value of optional type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OptionalProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub elem_type: i32,
    #[prost(message, optional, tag = "3")]
    pub tensor_value: Option<TensorProto>,
    #[prost(message, optional, tag = "4")]
    pub sparse_tensor_value: Option<SparseTensorProto>,
    #[prost(message, optional, boxed, tag = "5")]
    pub sequence_value: Option<Box<SequenceProto>>,
    #[prost(message, optional, boxed, tag = "6")]
    pub map_value: Option<Box<MapProto>>,
    #[prost(message, optional, boxed, tag = "7")]
    pub optional_value: Option<Box<OptionalProto>>,
}
