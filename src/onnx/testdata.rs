//! The ONNX backend node tests as data: one case is a folder with `model.onnx`
//! and `test_data_set_N/` folders of `input_K.pb` / `output_K.pb` protobuf files.
//!
//! `scripts/fetch_onnx_tests.sh` puts the 1765 cases of `onnx==1.22.0` (the last release that
//! ships them) under [`default_dir`]. A data file is a `TensorProto` when the graph's value
//! is a tensor; for sequence, optional and map values it is a `SequenceProto`,
//! `OptionalProto` or `MapProto` (`onnx-data.proto`), chosen by the declared type of the
//! graph input or output at the same position. Decoding works from bytes everywhere; the
//! folder walking ([`load_case`], [`list_cases`], [`default_dir`]) is native only.

use bytes::Bytes;
use prost::Message;
#[cfg(not(target_arch = "wasm32"))]
use std::path::{Path, PathBuf};

#[cfg(not(target_arch = "wasm32"))]
use super::file::LoadOptions;
use super::file::{OnnxFile, ValueType};
use super::proto::{self, value_kind};
use super::tensor::{self, HostTensor, TensorDType};
use super::OnnxError;

/// Environment variable naming the folder that holds `node/test_*/` (the cache of
/// `scripts/fetch_onnx_tests.sh`).
pub const DIR_ENV: &str = "DYNRT_ONNX_TESTS_DIR";

#[cfg(not(target_arch = "wasm32"))]
/// Where the node tests are: `$DYNRT_ONNX_TESTS_DIR/node`, by default
/// `target/onnx-tests/node` in the crate's folder (where `scripts/fetch_onnx_tests.sh` puts
/// them).
pub fn default_dir() -> PathBuf {
    let base = std::env::var_os(DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/onnx-tests"));
    base.join("node")
}

#[cfg(not(target_arch = "wasm32"))]
/// [`default_dir`] when the cases are there; otherwise prints that the calling test is
/// skipped (run `scripts/fetch_onnx_tests.sh`) and returns `None` — or panics when
/// `DYNRT_REQUIRE_ONNX_TESTS=1` (CI), where a missing case folder is a failure. For tests.
pub fn dir_or_skip() -> Option<PathBuf> {
    let dir = default_dir();
    if dir.is_dir() {
        return Some(dir);
    }
    let msg = format!(
        "no ONNX node tests in {} (run scripts/fetch_onnx_tests.sh)",
        dir.display()
    );
    if std::env::var("DYNRT_REQUIRE_ONNX_TESTS").as_deref() == Ok("1") {
        panic!("{msg}; DYNRT_REQUIRE_ONNX_TESTS=1");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

/// A value of a test-data file.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TestValue {
    /// A dense tensor.
    Tensor(HostTensor),
    /// A sequence of values.
    Sequence(Vec<TestValue>),
    /// An optional value, absent when `None`.
    Optional(Option<Box<TestValue>>),
    /// A map: keys (an i64 or string tensor) and the values (a sequence).
    Map {
        /// The keys.
        keys: HostTensor,
        /// The values, one per key.
        values: Vec<TestValue>,
    },
    /// A sparse tensor, densified.
    SparseTensor(HostTensor),
}

/// One `test_data_set_N` folder.
#[derive(Debug, Clone, PartialEq)]
pub struct TestDataSet {
    /// The folder's name.
    pub name: String,
    /// `input_K.pb` in order of K.
    pub inputs: Vec<TestValue>,
    /// `output_K.pb` in order of K.
    pub outputs: Vec<TestValue>,
}

/// A node test case: its model and data sets.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTestCase {
    /// The folder's name (`test_abs`).
    pub name: String,
    /// The model.
    pub model: OnnxFile,
    /// Its data sets, in order of N.
    pub data_sets: Vec<TestDataSet>,
}

#[cfg(not(target_arch = "wasm32"))]
/// The case folders under `dir` (those containing a `model.onnx`), sorted by name.
///
/// # Errors
/// [`OnnxError::Io`] when `dir` cannot be listed.
pub fn list_cases(dir: &Path) -> Result<Vec<PathBuf>, OnnxError> {
    let io = |cause| OnnxError::Io {
        path: dir.display().to_string(),
        cause,
    };
    let mut cases = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.join("model.onnx").is_file() {
            cases.push(path);
        }
    }
    cases.sort();
    Ok(cases)
}

#[cfg(not(target_arch = "wasm32"))]
fn read(path: &Path) -> Result<Bytes, OnnxError> {
    let bytes =
        crate::fileio::read_bounded(path, crate::fileio::MAX_ONNX_BYTES, "an ONNX test file")?;
    Ok(Bytes::from(bytes))
}

#[cfg(not(target_arch = "wasm32"))]
/// Files `prefix_K.pb` of a folder, in order of K (0, 1, ... until one is missing).
fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    (0..)
        .map(|k| dir.join(format!("{prefix}_{k}.pb")))
        .take_while(|p| p.is_file())
        .collect()
}

#[cfg(not(target_arch = "wasm32"))]
/// Loads a case folder: the model (with `options`) and every data set, each file decoded by
/// the declared type of the graph value at its position.
///
/// # Errors
/// [`OnnxError`] from the model or any data file (a decode error names the file), and
/// [`OnnxError::Type`] when there are more data files than graph inputs or outputs.
pub fn load_case(dir: &Path, options: &LoadOptions) -> Result<NodeTestCase, OnnxError> {
    let model = OnnxFile::load(dir.join("model.onnx"), options)?;
    let input_types: Vec<Option<ValueType>> =
        model.graph.runtime_inputs().map(|v| v.ty.clone()).collect();
    let output_types: Vec<Option<ValueType>> =
        model.graph.outputs.iter().map(|v| v.ty.clone()).collect();
    let mut data_sets = Vec::new();
    for n in 0.. {
        let set = dir.join(format!("test_data_set_{n}"));
        if !set.is_dir() {
            break;
        }
        let decode_all = |prefix: &str, types: &[Option<ValueType>]| {
            numbered(&set, prefix)
                .iter()
                .enumerate()
                .map(|(k, path)| {
                    let what = path.display().to_string();
                    let ty = types.get(k).ok_or_else(|| OnnxError::Type {
                        value: what.clone(),
                        reason: format!("the graph has only {} {prefix}s", types.len()),
                    })?;
                    decode_value(read(path)?, ty.as_ref(), &what)
                })
                .collect::<Result<Vec<_>, _>>()
        };
        data_sets.push(TestDataSet {
            name: format!("test_data_set_{n}"),
            inputs: decode_all("input", &input_types)?,
            outputs: decode_all("output", &output_types)?,
        });
    }
    Ok(NodeTestCase {
        name: dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        model,
        data_sets,
    })
}

/// Decodes a `TensorProto` file (inline data only).
///
/// # Errors
/// [`OnnxError::Decode`] for a malformed protobuf, [`OnnxError::Tensor`] for bad data.
pub fn decode_tensor(bytes: Bytes, what: &str) -> Result<HostTensor, OnnxError> {
    let t = proto::TensorProto::decode(bytes).map_err(|cause| OnnxError::Decode {
        what: what.to_string(),
        cause,
    })?;
    tensor_value(&t, what)
}

fn tensor_value(t: &proto::TensorProto, what: &str) -> Result<HostTensor, OnnxError> {
    tensor::decode_inline(t).map_err(|cause| OnnxError::Tensor {
        tensor: what.to_string(),
        cause,
    })
}

/// Decodes a test-data file as the message its declared type calls for (a tensor when the
/// type is not declared).
///
/// # Errors
/// As [`decode_tensor`].
pub fn decode_value(
    bytes: Bytes,
    ty: Option<&ValueType>,
    what: &str,
) -> Result<TestValue, OnnxError> {
    let decode_err = |cause| OnnxError::Decode {
        what: what.to_string(),
        cause,
    };
    match ty {
        None | Some(ValueType::Tensor(_)) => decode_tensor(bytes, what).map(TestValue::Tensor),
        Some(ValueType::SparseTensor(_)) => {
            let s = proto::SparseTensorProto::decode(bytes).map_err(decode_err)?;
            sparse_value(&s, what)
        }
        Some(ValueType::Sequence(_)) => {
            let s = proto::SequenceProto::decode(bytes).map_err(decode_err)?;
            sequence_value(&s, what)
        }
        Some(ValueType::Optional(_)) => {
            let o = proto::OptionalProto::decode(bytes).map_err(decode_err)?;
            optional_value(&o, what)
        }
        Some(ValueType::Map { .. }) => {
            let m = proto::MapProto::decode(bytes).map_err(decode_err)?;
            map_value(&m, what)
        }
    }
}

fn sparse_value(s: &proto::SparseTensorProto, what: &str) -> Result<TestValue, OnnxError> {
    let bad = |reason: String| OnnxError::Sparse {
        tensor: what.to_string(),
        reason,
    };
    let values = tensor_value(
        s.values.as_ref().ok_or_else(|| bad("no values".into()))?,
        what,
    )?;
    let indices = tensor_value(
        s.indices.as_ref().ok_or_else(|| bad("no indices".into()))?,
        what,
    )?;
    let dims = tensor::dims_from_onnx(&s.dims).map_err(|cause| OnnxError::Tensor {
        tensor: what.to_string(),
        cause,
    })?;
    let sparse = super::file::SparseTensor::checked(dims, values, &indices).map_err(bad)?;
    sparse
        .to_dense()
        .map(TestValue::SparseTensor)
        .map_err(|cause| OnnxError::Tensor {
            tensor: what.to_string(),
            cause,
        })
}

fn sequence_value(s: &proto::SequenceProto, what: &str) -> Result<TestValue, OnnxError> {
    let items: Result<Vec<TestValue>, OnnxError> = match s.elem_type {
        value_kind::TENSOR | value_kind::UNDEFINED => s
            .tensor_values
            .iter()
            .map(|t| tensor_value(t, what).map(TestValue::Tensor))
            .collect(),
        value_kind::SPARSE_TENSOR => s
            .sparse_tensor_values
            .iter()
            .map(|t| sparse_value(t, what))
            .collect(),
        value_kind::SEQUENCE => s
            .sequence_values
            .iter()
            .map(|t| sequence_value(t, what))
            .collect(),
        value_kind::MAP => s.map_values.iter().map(|t| map_value(t, what)).collect(),
        value_kind::OPTIONAL => s
            .optional_values
            .iter()
            .map(|t| optional_value(t, what))
            .collect(),
        other => Err(OnnxError::Type {
            value: what.to_string(),
            reason: format!("sequence of unknown element kind {other}"),
        }),
    };
    items.map(TestValue::Sequence)
}

fn optional_value(o: &proto::OptionalProto, what: &str) -> Result<TestValue, OnnxError> {
    let inner = match o.elem_type {
        value_kind::UNDEFINED => None,
        value_kind::TENSOR => o
            .tensor_value
            .as_ref()
            .map(|t| tensor_value(t, what).map(TestValue::Tensor))
            .transpose()?,
        value_kind::SPARSE_TENSOR => o
            .sparse_tensor_value
            .as_ref()
            .map(|t| sparse_value(t, what))
            .transpose()?,
        value_kind::SEQUENCE => o
            .sequence_value
            .as_ref()
            .map(|t| sequence_value(t, what))
            .transpose()?,
        value_kind::MAP => o
            .map_value
            .as_ref()
            .map(|t| map_value(t, what))
            .transpose()?,
        value_kind::OPTIONAL => o
            .optional_value
            .as_ref()
            .map(|t| optional_value(t, what))
            .transpose()?,
        other => {
            return Err(OnnxError::Type {
                value: what.to_string(),
                reason: format!("optional of unknown element kind {other}"),
            })
        }
    };
    Ok(TestValue::Optional(inner.map(Box::new)))
}

fn map_value(m: &proto::MapProto, what: &str) -> Result<TestValue, OnnxError> {
    let err = |reason: String| OnnxError::Type {
        value: what.to_string(),
        reason,
    };
    let key_type = TensorDType::from_onnx(m.key_type).map_err(|e| err(e.to_string()))?;
    let keys = if key_type == TensorDType::String {
        HostTensor::from_strings(vec![m.string_keys.len() as u64], m.string_keys.clone())
    } else {
        HostTensor::from_i64(vec![m.keys.len() as u64], &m.keys)
    }
    .map_err(|cause| OnnxError::Tensor {
        tensor: what.to_string(),
        cause,
    })?;
    let values = match &m.values {
        Some(s) => match sequence_value(s, what)? {
            TestValue::Sequence(v) => v,
            _ => unreachable!("sequence_value returns a sequence"),
        },
        None => Vec::new(),
    };
    if values.len() as u64 != keys.num_elements() {
        return Err(err(format!(
            "map has {} keys but {} values",
            keys.num_elements(),
            values.len()
        )));
    }
    Ok(TestValue::Map { keys, values })
}
