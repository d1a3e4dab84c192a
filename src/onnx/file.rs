//! [`OnnxFile`]: a decoded and checked ONNX model.

use bytes::Bytes;
use prost::Message;
use std::collections::HashMap;
use std::ops::RangeInclusive;

use super::error::OnnxError;
use super::external::{ExternalData, ExternalRef};
use super::ops::DEFAULT_DOMAIN_OPSETS;
use super::proto::{self, attribute_type as at};
use super::tensor::{self, HostTensor, TensorDType, TensorError};

/// How [`OnnxFile::from_bytes`] treats the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// Read external tensor data (`true`, the default), or only check that each file exists
    /// and holds the range (`false`: [`Initializer::tensor`] is then `None` for external
    /// initializers; what `dynrt inspect` uses, so a large model is not read to be listed).
    pub read_external: bool,
    /// Opset versions accepted for the default domain (`""` / `ai.onnx`); other domains are
    /// accepted at any version and their ops reported unsupported by
    /// [`crate::onnx::ops::is_supported`]. Default [`DEFAULT_DOMAIN_OPSETS`].
    pub default_domain_opsets: RangeInclusive<i64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            read_external: true,
            default_domain_opsets: DEFAULT_DOMAIN_OPSETS,
        }
    }
}

/// One opset import: a domain (`""` for the default ONNX domain, also when the file says
/// `ai.onnx`) and its version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Opset {
    /// The domain.
    pub domain: String,
    /// The version.
    pub version: i64,
}

/// A dimension of a declared tensor type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OnnxDim {
    /// `dim_value`: a fixed extent.
    Fixed(u64),
    /// `dim_param`: a symbol bound per run (`batch`, `sequence_length`, `past_sequence_length`).
    Symbolic(String),
    /// Neither: an extent the model leaves open.
    Unknown,
}

impl std::fmt::Display for OnnxDim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OnnxDim::Fixed(n) => write!(f, "{n}"),
            OnnxDim::Symbolic(s) => f.write_str(s),
            OnnxDim::Unknown => f.write_str("?"),
        }
    }
}

impl serde::Serialize for OnnxDim {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            OnnxDim::Fixed(n) => s.serialize_u64(*n),
            OnnxDim::Symbolic(name) => s.serialize_str(name),
            OnnxDim::Unknown => s.serialize_none(),
        }
    }
}

/// A tensor type: element type (`None` when the model leaves it open, as some subgraphs do)
/// and dimensions (`None` when even the rank is unknown).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: Option<TensorDType>,
    /// Dimensions, outermost first.
    pub dims: Option<Vec<OnnxDim>>,
}

/// The type of a value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ValueType {
    /// A dense tensor.
    Tensor(TensorType),
    /// A sparse tensor.
    SparseTensor(TensorType),
    /// A sequence of values of one type (open when `None`).
    Sequence(Option<Box<ValueType>>),
    /// A value that may be absent.
    Optional(Option<Box<ValueType>>),
    /// A map from a key element type to values.
    Map {
        /// Key element type.
        key: TensorDType,
        /// Value type.
        value: Option<Box<ValueType>>,
    },
}

impl ValueType {
    /// The tensor type, when this is a dense tensor.
    pub fn as_tensor(&self) -> Option<&TensorType> {
        match self {
            ValueType::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open =
            |t: &Option<Box<ValueType>>| t.as_ref().map_or("?".to_string(), |t| t.to_string());
        match self {
            ValueType::Tensor(t) | ValueType::SparseTensor(t) => {
                if matches!(self, ValueType::SparseTensor(_)) {
                    f.write_str("sparse ")?;
                }
                match t.dtype {
                    Some(d) => write!(f, "{d}")?,
                    None => f.write_str("?")?,
                }
                match &t.dims {
                    Some(dims) => {
                        let d: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
                        write!(f, "[{}]", d.join(", "))
                    }
                    None => f.write_str("[..]"),
                }
            }
            ValueType::Sequence(t) => write!(f, "seq({})", open(t)),
            ValueType::Optional(t) => write!(f, "optional({})", open(t)),
            ValueType::Map { key, value } => write!(f, "map({key}, {})", open(value)),
        }
    }
}

/// A named value with its declared type (graph inputs, outputs, `value_info`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ValueInfo {
    /// The value's name.
    pub name: String,
    /// Its type; `None` when the model does not declare one.
    #[serde(rename = "type")]
    pub ty: Option<ValueType>,
}

/// Where an initializer's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataLocation {
    /// In the model file (`raw_data` or a typed field).
    Inline,
    /// In a file beside it.
    External(ExternalRef),
}

/// A weight or other constant tensor of a graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Initializer {
    /// The value's name.
    pub name: String,
    /// Element type.
    pub dtype: TensorDType,
    /// Dimensions.
    pub dims: Vec<u64>,
    /// Size of the data in bytes.
    pub size_bytes: u64,
    /// Where the data is.
    pub location: DataLocation,
    tensor: Option<HostTensor>,
}

impl Initializer {
    /// The tensor; `None` for external data loaded with `read_external: false`.
    pub fn tensor(&self) -> Option<&HostTensor> {
        self.tensor.as_ref()
    }
}

/// A sparse tensor (COO): `values` `[nnz]` at `indices` (`[nnz]` linear or `[nnz, rank]`).
#[derive(Debug, Clone, PartialEq)]
pub struct SparseTensor {
    /// Dense dimensions.
    pub dims: Vec<u64>,
    /// The stored values, `[nnz]`.
    pub values: HostTensor,
    /// Their positions as i64 (validated to be within `dims`).
    pub indices: Vec<i64>,
    /// Whether `indices` are linear offsets (`[nnz]`) rather than coordinates (`[nnz, rank]`).
    pub linear: bool,
}

/// Dense tensors made from sparse ones are limited to this many bytes (1 GiB).
pub const MAX_DENSE_BYTES: u64 = 1 << 30;

impl SparseTensor {
    /// A sparse tensor from its parts, checked: `values` 1-d `[nnz]`, `indices` an integer
    /// tensor `[nnz]` (linear) or `[nnz, rank]`, every index within `dims`.
    ///
    /// # Errors
    /// A description of the first thing wrong.
    pub fn checked(
        dims: Vec<u64>,
        values: HostTensor,
        indices: &HostTensor,
    ) -> Result<Self, String> {
        let [nnz] = values.dims() else {
            return Err(format!("values must be 1-d, are {:?}", values.dims()));
        };
        let nnz = *nnz;
        let rank = dims.len() as u64;
        let linear = match indices.dims() {
            [n] if *n == nnz => true,
            [n, r] if *n == nnz && *r == rank => false,
            other => {
                return Err(format!(
                    "indices must be [{nnz}] or [{nnz}, {rank}], are {other:?}"
                ))
            }
        };
        let indices = indices.to_i64_vec().map_err(|e| format!("indices: {e}"))?;
        let total = tensor::checked_num_elements(&dims).unwrap_or(u64::MAX);
        for (k, &i) in indices.iter().enumerate() {
            let limit = if linear { total } else { dims[k % dims.len()] };
            if i < 0 || i as u64 >= limit {
                return Err(format!("index {i} at {k} is out of range (< {limit})"));
            }
        }
        Ok(SparseTensor {
            dims,
            values,
            indices,
            linear,
        })
    }

    /// The dense tensor (zeros elsewhere). Only for element types of whole bytes.
    ///
    /// # Errors
    /// [`TensorError::NotNumeric`] for strings and sub-byte types, [`TensorError::Overflow`]
    /// when the dense tensor would exceed [`MAX_DENSE_BYTES`].
    pub fn to_dense(&self) -> Result<HostTensor, TensorError> {
        let dtype = self.values.dtype();
        let bits = dtype.bits().filter(|b| b % 8 == 0);
        let (Some(bits), Some(src)) = (bits, self.values.bytes()) else {
            return Err(TensorError::NotNumeric { dtype });
        };
        let (_, size) = HostTensor::expected_bytes(dtype, &self.dims, "sparse")?;
        if size > MAX_DENSE_BYTES {
            return Err(TensorError::Overflow {
                dtype,
                dims: self.dims.clone(),
            });
        }
        let width = bits as usize / 8;
        let mut dense = vec![0u8; size as usize];
        let rank = self.dims.len();
        let nnz = self.values.num_elements() as usize;
        for k in 0..nnz {
            let linear = if self.linear {
                self.indices[k] as usize
            } else {
                self.indices[k * rank..(k + 1) * rank]
                    .iter()
                    .zip(&self.dims)
                    .fold(0usize, |acc, (&i, &d)| acc * d as usize + i as usize)
            };
            dense[linear * width..(linear + 1) * width]
                .copy_from_slice(&src[k * width..(k + 1) * width]);
        }
        HostTensor::from_bytes(dtype, self.dims.clone(), Bytes::from(dense))
    }
}

/// A sparse initializer.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseInitializer {
    /// The value's name (that of its `values` tensor).
    pub name: String,
    /// The tensor.
    pub tensor: SparseTensor,
}

/// A typed attribute value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AttributeValue {
    /// `f`.
    Float(f32),
    /// `i`.
    Int(i64),
    /// `s` (UTF-8 by convention, not checked).
    String(Bytes),
    /// `t`.
    Tensor(HostTensor),
    /// `g`: a subgraph (`If` branches, `Loop`/`Scan` bodies).
    Graph(Box<OnnxGraph>),
    /// `sparse_tensor`.
    SparseTensor(SparseTensor),
    /// `tp`.
    Type(ValueType),
    /// `floats`.
    Floats(Vec<f32>),
    /// `ints`.
    Ints(Vec<i64>),
    /// `strings`.
    Strings(Vec<Bytes>),
    /// `tensors`.
    Tensors(Vec<HostTensor>),
    /// `graphs`.
    Graphs(Vec<OnnxGraph>),
    /// `sparse_tensors`.
    SparseTensors(Vec<SparseTensor>),
    /// `type_protos`.
    Types(Vec<ValueType>),
}

/// A named attribute.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: AttributeValue,
}

/// One operator invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct OnnxNode {
    /// The node's name (may be empty; see [`OnnxNode::label`]).
    pub name: String,
    /// The operator (`MatMul`, ...).
    pub op_type: String,
    /// Its domain, `""` for the default ONNX domain (also when the file says `ai.onnx`).
    pub domain: String,
    /// Input value names; `""` marks an omitted optional input.
    pub inputs: Vec<String>,
    /// Output value names; `""` marks an omitted optional output.
    pub outputs: Vec<String>,
    /// Attributes, in file order, names unique.
    pub attributes: Vec<Attribute>,
    /// Position in its graph's node list.
    pub index: usize,
}

impl OnnxNode {
    /// The name used in messages: the node's name, or `op_type#index` when it has none.
    pub fn label(&self) -> String {
        node_label(&self.name, &self.op_type, self.index)
    }

    /// The attribute called `name`.
    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|a| a.name == name)
            .map(|a| &a.value)
    }

    /// The value of a `Constant` node: `value` as is; `value_float(s)` as f32 and
    /// `value_int(s)` as i64 scalars or 1-d tensors; `value_string(s)` as strings;
    /// `sparse_value` densified.
    ///
    /// # Errors
    /// [`OnnxError::Constant`] when the node is not a `Constant` of the default domain, has no
    /// value attribute or more than one, or its value cannot be made.
    pub fn constant_value(&self) -> Result<HostTensor, OnnxError> {
        let err = |reason: String| OnnxError::Constant {
            node: self.label(),
            reason,
        };
        if self.op_type != "Constant" || !self.domain.is_empty() {
            return Err(err(format!("is a {} node", self.op_type)));
        }
        let values: Vec<&Attribute> = self
            .attributes
            .iter()
            .filter(|a| {
                a.name == "value" || a.name.starts_with("value_") || a.name == "sparse_value"
            })
            .collect();
        let [a] = values.as_slice() else {
            return Err(err(format!(
                "needs exactly one value attribute, has {}",
                values.len()
            )));
        };
        let tensor = |r: Result<HostTensor, TensorError>| r.map_err(|e| err(e.to_string()));
        let strings =
            |s: &[Bytes], dims: Vec<u64>| tensor(HostTensor::from_strings(dims, s.to_vec()));
        match (a.name.as_str(), &a.value) {
            ("value", AttributeValue::Tensor(t)) => Ok(t.clone()),
            ("sparse_value", AttributeValue::SparseTensor(s)) => tensor(s.to_dense()),
            ("value_float", AttributeValue::Float(v)) => {
                tensor(HostTensor::from_f32(vec![], &[*v]))
            }
            ("value_floats", AttributeValue::Floats(v)) => {
                tensor(HostTensor::from_f32(vec![v.len() as u64], v))
            }
            ("value_int", AttributeValue::Int(v)) => tensor(HostTensor::from_i64(vec![], &[*v])),
            ("value_ints", AttributeValue::Ints(v)) => {
                tensor(HostTensor::from_i64(vec![v.len() as u64], v))
            }
            ("value_string", AttributeValue::String(s)) => strings(std::slice::from_ref(s), vec![]),
            ("value_strings", AttributeValue::Strings(s)) => strings(s, vec![s.len() as u64]),
            (name, value) => Err(err(format!(
                "attribute `{name}` is unknown or of the wrong type ({})",
                attribute_kind(value)
            ))),
        }
    }
}

fn attribute_kind(v: &AttributeValue) -> &'static str {
    match v {
        AttributeValue::Float(_) => "float",
        AttributeValue::Int(_) => "int",
        AttributeValue::String(_) => "string",
        AttributeValue::Tensor(_) => "tensor",
        AttributeValue::Graph(_) => "graph",
        AttributeValue::SparseTensor(_) => "sparse tensor",
        AttributeValue::Type(_) => "type",
        AttributeValue::Floats(_) => "floats",
        AttributeValue::Ints(_) => "ints",
        AttributeValue::Strings(_) => "strings",
        AttributeValue::Tensors(_) => "tensors",
        AttributeValue::Graphs(_) => "graphs",
        AttributeValue::SparseTensors(_) => "sparse tensors",
        AttributeValue::Types(_) => "types",
    }
}

fn node_label(name: &str, op_type: &str, index: usize) -> String {
    if name.is_empty() {
        format!("{op_type}#{index}")
    } else {
        name.to_string()
    }
}

/// A graph: nodes in topological order, its inputs, outputs and constants.
#[derive(Debug, Clone, PartialEq)]
pub struct OnnxGraph {
    /// The graph's name.
    pub name: String,
    /// Declared inputs, in order. Some may also be initializers (their default value, older
    /// IR versions list every initializer here): see [`OnnxGraph::runtime_inputs`].
    pub inputs: Vec<ValueInfo>,
    /// Declared outputs, in order.
    pub outputs: Vec<ValueInfo>,
    /// Types the model declares for intermediate values.
    pub value_info: Vec<ValueInfo>,
    /// Constant tensors.
    pub initializers: Vec<Initializer>,
    /// Sparse constant tensors.
    pub sparse_initializers: Vec<SparseInitializer>,
    /// The nodes, every input defined before use.
    pub nodes: Vec<OnnxNode>,
}

impl OnnxGraph {
    /// The inputs a caller must (or may) feed: the declared inputs that are not initializers.
    pub fn runtime_inputs(&self) -> impl Iterator<Item = &ValueInfo> {
        self.inputs
            .iter()
            .filter(move |i| self.initializer(&i.name).is_none())
    }

    /// The initializer called `name`.
    pub fn initializer(&self, name: &str) -> Option<&Initializer> {
        self.initializers.iter().find(|i| i.name == name)
    }

    /// Every node of this graph and of its subgraphs (depth first, a node before its
    /// subgraphs' nodes).
    pub fn walk_nodes(&self) -> Vec<&OnnxNode> {
        let mut out = Vec::new();
        fn go<'a>(g: &'a OnnxGraph, out: &mut Vec<&'a OnnxNode>) {
            for n in &g.nodes {
                out.push(n);
                for a in &n.attributes {
                    match &a.value {
                        AttributeValue::Graph(sub) => go(sub, out),
                        AttributeValue::Graphs(subs) => subs.iter().for_each(|s| go(s, out)),
                        _ => {}
                    }
                }
            }
        }
        go(self, &mut out);
        out
    }
}

/// A model-local function (`ModelProto.functions`): only its identity is kept, so that nodes
/// calling it are recognised; dynrt does not inline functions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LocalFunction {
    /// Its domain.
    pub domain: String,
    /// Its name (the `op_type` that calls it).
    pub name: String,
}

/// A decoded, checked ONNX model. Made by [`OnnxFile::from_bytes`] or (native)
/// [`OnnxFile::load`]; holds the data of its initializers (slices of the model buffer when
/// they were `raw_data`, so the buffer lives as long as they do).
#[derive(Debug, Clone, PartialEq)]
pub struct OnnxFile {
    /// ONNX IR version of the file.
    pub ir_version: i64,
    /// The tool that wrote it.
    pub producer_name: String,
    /// Its version.
    pub producer_version: String,
    /// Opset imports, default domain as `""`.
    pub opsets: Vec<Opset>,
    /// `metadata_props` key/value pairs.
    pub metadata: Vec<(String, String)>,
    /// The main graph.
    pub graph: OnnxGraph,
    /// Model-local functions.
    pub functions: Vec<LocalFunction>,
}

impl OnnxFile {
    /// Decodes and checks a model from its bytes (works on every target). Initializers stored
    /// as `raw_data` become slices of `bytes` (no copy); external data comes from `external`.
    ///
    /// # Errors
    /// [`OnnxError::Decode`] for bytes that are not a model (truncated, malformed);
    /// [`OnnxError::UnsupportedOpset`], [`OnnxError::MissingOpset`],
    /// [`OnnxError::DuplicateOpset`]; [`OnnxError::Tensor`] and [`OnnxError::External`] for
    /// initializers; [`OnnxError::UndefinedInput`], [`OnnxError::DuplicateName`],
    /// [`OnnxError::UndefinedOutput`], [`OnnxError::Attribute`], [`OnnxError::Constant`],
    /// [`OnnxError::Type`] for the graph.
    pub fn from_bytes(
        bytes: Bytes,
        external: &dyn ExternalData,
        options: &LoadOptions,
    ) -> Result<Self, OnnxError> {
        let m = proto::ModelProto::decode(bytes).map_err(|cause| OnnxError::Decode {
            what: "model".to_string(),
            cause,
        })?;
        let mut opsets: Vec<Opset> = Vec::new();
        for o in &m.opset_import {
            let domain = normalize_domain(&o.domain);
            if let Some(prev) = opsets.iter().find(|p| p.domain == domain) {
                return Err(OnnxError::DuplicateOpset {
                    domain,
                    first: prev.version,
                    second: o.version,
                });
            }
            let range = if domain.is_empty() {
                options.default_domain_opsets.clone()
            } else {
                1..=i64::MAX
            };
            if !range.contains(&o.version) {
                return Err(OnnxError::UnsupportedOpset {
                    domain,
                    version: o.version,
                    min: *range.start(),
                    max: *range.end(),
                });
            }
            opsets.push(Opset {
                domain,
                version: o.version,
            });
        }
        let graph = m.graph.as_ref().ok_or(OnnxError::NoGraph)?;
        let ctx = Context {
            external,
            options,
            domains: opsets.iter().map(|o| o.domain.clone()).collect(),
        };
        let graph = ctx.graph(graph, None)?;
        Ok(OnnxFile {
            ir_version: m.ir_version,
            producer_name: m.producer_name,
            producer_version: m.producer_version,
            opsets,
            metadata: m
                .metadata_props
                .into_iter()
                .map(|e| (e.key, e.value))
                .collect(),
            graph,
            functions: m
                .functions
                .into_iter()
                .map(|f| LocalFunction {
                    domain: normalize_domain(&f.domain),
                    name: f.name,
                })
                .collect(),
        })
    }

    /// Reads `path` and decodes it, external data from the model's folder (native only). The
    /// file is read once into memory; `raw_data` initializers are slices of that buffer. It
    /// must be a regular file of at most [`crate::fileio::MAX_ONNX_BYTES`] bytes (protobuf's
    /// limit on one message; larger models keep their weights as external data).
    ///
    /// # Errors
    /// [`OnnxError::Io`] when the file cannot be read, [`OnnxError::File`] when it is not a
    /// regular file or is too large, then as [`OnnxFile::from_bytes`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(
        path: impl AsRef<std::path::Path>,
        options: &LoadOptions,
    ) -> Result<Self, OnnxError> {
        let path = path.as_ref();
        let bytes =
            crate::fileio::read_bounded(path, crate::fileio::MAX_ONNX_BYTES, "an ONNX model")?;
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let resolver = super::external::FolderResolver::new(folder);
        Self::from_bytes(Bytes::from(bytes), &resolver, options)
    }

    /// The imported version of `domain` (`""` or `ai.onnx` for the default domain).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let domain = normalize_domain(domain);
        self.opsets
            .iter()
            .find(|o| o.domain == domain)
            .map(|o| o.version)
    }
}

/// `ai.onnx` and `""` name the same domain; dynrt writes `""`.
pub(crate) fn normalize_domain(domain: &str) -> String {
    if domain == "ai.onnx" {
        String::new()
    } else {
        domain.to_string()
    }
}

/// Value names visible in a graph: its own (with what defined them) and its enclosing graphs'.
struct Scope<'a> {
    names: HashMap<String, String>,
    parent: Option<&'a Scope<'a>>,
}

impl Scope<'_> {
    fn visible(&self, name: &str) -> bool {
        self.names.contains_key(name) || self.parent.is_some_and(|p| p.visible(name))
    }
}

struct Context<'a> {
    external: &'a dyn ExternalData,
    options: &'a LoadOptions,
    domains: Vec<String>,
}

impl Context<'_> {
    fn graph(
        &self,
        g: &proto::GraphProto,
        parent: Option<&Scope<'_>>,
    ) -> Result<OnnxGraph, OnnxError> {
        let mut scope = Scope {
            names: HashMap::new(),
            parent,
        };
        let define = |scope: &mut Scope<'_>, name: &str, by: String| -> Result<(), OnnxError> {
            if let Some(first) = scope.names.get(name) {
                return Err(OnnxError::DuplicateName {
                    name: name.to_string(),
                    graph: g.name.clone(),
                    first: first.clone(),
                    second: by,
                });
            }
            scope.names.insert(name.to_string(), by);
            Ok(())
        };
        let mut initializers = Vec::with_capacity(g.initializer.len());
        for (index, t) in g.initializer.iter().enumerate() {
            if t.name.is_empty() {
                return Err(OnnxError::EmptyName {
                    kind: "initializer",
                    index,
                    graph: g.name.clone(),
                });
            }
            define(&mut scope, &t.name, "an initializer".to_string())?;
            initializers.push(self.initializer(t, &t.name)?);
        }
        let mut sparse_initializers = Vec::with_capacity(g.sparse_initializer.len());
        for (index, s) in g.sparse_initializer.iter().enumerate() {
            let name = s
                .values
                .as_ref()
                .map(|v| v.name.clone())
                .unwrap_or_default();
            if name.is_empty() {
                return Err(OnnxError::EmptyName {
                    kind: "sparse initializer",
                    index,
                    graph: g.name.clone(),
                });
            }
            define(&mut scope, &name, "a sparse initializer".to_string())?;
            let tensor = self.sparse(s, &name)?;
            sparse_initializers.push(SparseInitializer { name, tensor });
        }
        let mut inputs = Vec::with_capacity(g.input.len());
        for (index, v) in g.input.iter().enumerate() {
            let info = value_info(v, "input", index, &g.name)?;
            // An input that is also an initializer is that initializer's overridable default.
            let is_init = scope
                .names
                .get(&info.name)
                .is_some_and(|by| by == "an initializer" || by == "a sparse initializer");
            if !is_init {
                define(&mut scope, &info.name, "a graph input".to_string())?;
            }
            inputs.push(info);
        }
        let mut nodes = Vec::with_capacity(g.node.len());
        for (index, n) in g.node.iter().enumerate() {
            let label = node_label(&n.name, &n.op_type, index);
            let domain = normalize_domain(&n.domain);
            if !self.domains.contains(&domain) {
                return Err(OnnxError::MissingOpset {
                    node: label,
                    op_type: n.op_type.clone(),
                    domain,
                });
            }
            for input in n.input.iter().filter(|i| !i.is_empty()) {
                if !scope.visible(input) {
                    return Err(OnnxError::UndefinedInput {
                        node: label,
                        op_type: n.op_type.clone(),
                        input: input.clone(),
                    });
                }
            }
            let mut attributes: Vec<Attribute> = Vec::with_capacity(n.attribute.len());
            for a in &n.attribute {
                let attr = self.attribute(a, &label, &scope)?;
                if attributes.iter().any(|b| b.name == attr.name) {
                    return Err(OnnxError::Attribute {
                        node: label,
                        attribute: attr.name,
                        reason: "appears twice".to_string(),
                    });
                }
                attributes.push(attr);
            }
            for output in n.output.iter().filter(|o| !o.is_empty()) {
                define(&mut scope, output, format!("node `{label}`"))?;
            }
            let node = OnnxNode {
                name: n.name.clone(),
                op_type: n.op_type.clone(),
                domain,
                inputs: n.input.clone(),
                outputs: n.output.clone(),
                attributes,
                index,
            };
            if node.op_type == "Constant" && node.domain.is_empty() {
                node.constant_value()?;
            }
            nodes.push(node);
        }
        let mut outputs = Vec::with_capacity(g.output.len());
        for (index, v) in g.output.iter().enumerate() {
            let info = value_info(v, "output", index, &g.name)?;
            if !scope.visible(&info.name) {
                return Err(OnnxError::UndefinedOutput {
                    output: info.name,
                    graph: g.name.clone(),
                });
            }
            outputs.push(info);
        }
        let value_info = g
            .value_info
            .iter()
            .enumerate()
            .map(|(i, v)| value_info(v, "value_info", i, &g.name))
            .collect::<Result<_, _>>()?;
        Ok(OnnxGraph {
            name: g.name.clone(),
            inputs,
            outputs,
            value_info,
            initializers,
            sparse_initializers,
            nodes,
        })
    }

    /// An initializer (or tensor attribute): inline data decoded, external data read or
    /// checked.
    fn initializer(&self, t: &proto::TensorProto, name: &str) -> Result<Initializer, OnnxError> {
        let tensor_err = |cause| OnnxError::Tensor {
            tensor: name.to_string(),
            cause,
        };
        if t.data_location != proto::data_location::EXTERNAL {
            let tensor = tensor::decode_inline(t).map_err(tensor_err)?;
            return Ok(Initializer {
                name: name.to_string(),
                dtype: tensor.dtype(),
                dims: tensor.dims().to_vec(),
                size_bytes: tensor.size_bytes(),
                location: DataLocation::Inline,
                tensor: Some(tensor),
            });
        }
        if t.segment.is_some() {
            return Err(tensor_err(TensorError::Segmented));
        }
        let dtype = TensorDType::from_onnx(t.data_type).map_err(tensor_err)?;
        let dims = tensor::dims_from_onnx(&t.dims).map_err(tensor_err)?;
        let (_, expected) =
            HostTensor::expected_bytes(dtype, &dims, "external data").map_err(tensor_err)?;
        let ext_err = |cause| OnnxError::External {
            initializer: name.to_string(),
            cause,
        };
        let r = ExternalRef::from_entries(
            t.external_data
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str())),
        )
        .map_err(ext_err)?;
        // Check the length before reading, so a wrong model does not read a large range.
        let length = self.external.check(&r).map_err(ext_err)?;
        if length != expected {
            return Err(tensor_err(TensorError::DataLength {
                dtype,
                dims,
                field: "external data",
                expected,
                actual: length,
                unit: "bytes",
            }));
        }
        let tensor = if self.options.read_external {
            let bytes = self.external.read(&r).map_err(ext_err)?;
            Some(
                HostTensor::from_bytes_field(dtype, dims.clone(), bytes, "external data")
                    .map_err(tensor_err)?,
            )
        } else {
            None
        };
        Ok(Initializer {
            name: name.to_string(),
            dtype,
            dims,
            size_bytes: expected,
            location: DataLocation::External(r),
            tensor,
        })
    }

    fn tensor(&self, t: &proto::TensorProto, name: &str) -> Result<HostTensor, OnnxError> {
        let init = self.initializer(t, name)?;
        // Attribute tensors are values the graph needs: read them even in check-only mode.
        match init.tensor {
            Some(t) => Ok(t),
            None => {
                let DataLocation::External(r) = &init.location else {
                    unreachable!("inline tensors are always decoded")
                };
                let bytes = self.external.read(r).map_err(|cause| OnnxError::External {
                    initializer: name.to_string(),
                    cause,
                })?;
                HostTensor::from_bytes_field(init.dtype, init.dims, bytes, "external data").map_err(
                    |cause| OnnxError::Tensor {
                        tensor: name.to_string(),
                        cause,
                    },
                )
            }
        }
    }

    fn sparse(&self, s: &proto::SparseTensorProto, name: &str) -> Result<SparseTensor, OnnxError> {
        let bad = |reason: String| OnnxError::Sparse {
            tensor: name.to_string(),
            reason,
        };
        let dims = tensor::dims_from_onnx(&s.dims).map_err(|cause| OnnxError::Tensor {
            tensor: name.to_string(),
            cause,
        })?;
        let values = match &s.values {
            Some(v) => self.tensor(v, name)?,
            None => return Err(bad("sparse tensor without values".to_string())),
        };
        let indices_t = match &s.indices {
            Some(i) => self.tensor(i, name)?,
            None => return Err(bad("sparse tensor without indices".to_string())),
        };
        SparseTensor::checked(dims, values, &indices_t).map_err(bad)
    }

    fn value_type(&self, t: &proto::TypeProto, value: &str) -> Result<ValueType, OnnxError> {
        convert_type(t, value)
    }

    fn attribute(
        &self,
        a: &proto::AttributeProto,
        node: &str,
        scope: &Scope<'_>,
    ) -> Result<Attribute, OnnxError> {
        let err = |reason: String| OnnxError::Attribute {
            node: node.to_string(),
            attribute: a.name.clone(),
            reason,
        };
        if a.name.is_empty() {
            return Err(err("has no name".to_string()));
        }
        if !a.ref_attr_name.is_empty() {
            return Err(err(format!(
                "refers to function attribute `{}`, which only a function body may do",
                a.ref_attr_name
            )));
        }
        let mut ty = a.r#type;
        if ty == at::UNDEFINED {
            // Old writers leave `type` unset: take the one field that is present.
            let present: Vec<i32> = [
                (a.f.is_some(), at::FLOAT),
                (a.i.is_some(), at::INT),
                (a.s.is_some(), at::STRING),
                (a.t.is_some(), at::TENSOR),
                (a.g.is_some(), at::GRAPH),
                (a.sparse_tensor.is_some(), at::SPARSE_TENSOR),
                (a.tp.is_some(), at::TYPE_PROTO),
                (!a.floats.is_empty(), at::FLOATS),
                (!a.ints.is_empty(), at::INTS),
                (!a.strings.is_empty(), at::STRINGS),
                (!a.tensors.is_empty(), at::TENSORS),
                (!a.graphs.is_empty(), at::GRAPHS),
                (!a.sparse_tensors.is_empty(), at::SPARSE_TENSORS),
                (!a.type_protos.is_empty(), at::TYPE_PROTOS),
            ]
            .into_iter()
            .filter_map(|(p, t)| p.then_some(t))
            .collect();
            match present.as_slice() {
                [t] => ty = *t,
                [] => return Err(err("has no type and no value".to_string())),
                _ => return Err(err("has no type and several values".to_string())),
            }
        }
        let what = format!("{node}/{}", a.name);
        let missing = |kind: &str| err(format!("is of type {kind} but has no value"));
        let value = match ty {
            // proto2 writers always set the field; a missing scalar reads as protobuf's default.
            at::FLOAT => AttributeValue::Float(a.f.unwrap_or(0.0)),
            at::INT => AttributeValue::Int(a.i.unwrap_or(0)),
            at::STRING => AttributeValue::String(a.s.clone().unwrap_or_default()),
            at::TENSOR => AttributeValue::Tensor(
                self.tensor(a.t.as_ref().ok_or_else(|| missing("TENSOR"))?, &what)?,
            ),
            at::GRAPH => AttributeValue::Graph(Box::new(
                self.graph(a.g.as_ref().ok_or_else(|| missing("GRAPH"))?, Some(scope))?,
            )),
            at::SPARSE_TENSOR => AttributeValue::SparseTensor(
                self.sparse(
                    a.sparse_tensor
                        .as_ref()
                        .ok_or_else(|| missing("SPARSE_TENSOR"))?,
                    &what,
                )?,
            ),
            at::TYPE_PROTO => AttributeValue::Type(
                self.value_type(a.tp.as_ref().ok_or_else(|| missing("TYPE_PROTO"))?, &what)?,
            ),
            at::FLOATS => AttributeValue::Floats(a.floats.clone()),
            at::INTS => AttributeValue::Ints(a.ints.clone()),
            at::STRINGS => AttributeValue::Strings(a.strings.clone()),
            at::TENSORS => AttributeValue::Tensors(
                a.tensors
                    .iter()
                    .map(|t| self.tensor(t, &what))
                    .collect::<Result<_, _>>()?,
            ),
            at::GRAPHS => AttributeValue::Graphs(
                a.graphs
                    .iter()
                    .map(|g| self.graph(g, Some(scope)))
                    .collect::<Result<_, _>>()?,
            ),
            at::SPARSE_TENSORS => AttributeValue::SparseTensors(
                a.sparse_tensors
                    .iter()
                    .map(|s| self.sparse(s, &what))
                    .collect::<Result<_, _>>()?,
            ),
            at::TYPE_PROTOS => AttributeValue::Types(
                a.type_protos
                    .iter()
                    .map(|t| self.value_type(t, &what))
                    .collect::<Result<_, _>>()?,
            ),
            other => return Err(err(format!("has unknown type code {other}"))),
        };
        Ok(Attribute {
            name: a.name.clone(),
            value,
        })
    }
}

fn value_info(
    v: &proto::ValueInfoProto,
    kind: &'static str,
    index: usize,
    graph: &str,
) -> Result<ValueInfo, OnnxError> {
    if v.name.is_empty() {
        return Err(OnnxError::EmptyName {
            kind,
            index,
            graph: graph.to_string(),
        });
    }
    let ty = v
        .r#type
        .as_ref()
        .map(|t| convert_type(t, &v.name))
        .transpose()?;
    Ok(ValueInfo {
        name: v.name.clone(),
        ty,
    })
}

/// Converts a `TypeProto`. Also used for test-data values.
pub(crate) fn convert_type(t: &proto::TypeProto, value: &str) -> Result<ValueType, OnnxError> {
    use proto::TypeValue;
    let err = |reason: String| OnnxError::Type {
        value: value.to_string(),
        reason,
    };
    let dtype = |code: i32| -> Result<Option<TensorDType>, OnnxError> {
        if code == 0 {
            Ok(None)
        } else {
            TensorDType::from_onnx(code)
                .map(Some)
                .map_err(|e| err(e.to_string()))
        }
    };
    let tensor_type = |t: &proto::TypeProtoTensor| -> Result<TensorType, OnnxError> {
        let dims = match &t.shape {
            None => None,
            Some(s) => Some(
                s.dim
                    .iter()
                    .enumerate()
                    .map(|(i, d)| match &d.value {
                        Some(proto::DimensionValue::DimValue(v)) => u64::try_from(*v)
                            .map(OnnxDim::Fixed)
                            .map_err(|_| err(format!("dimension {i} is negative ({v})"))),
                        Some(proto::DimensionValue::DimParam(p)) if !p.is_empty() => {
                            Ok(OnnxDim::Symbolic(p.clone()))
                        }
                        _ => Ok(OnnxDim::Unknown),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(TensorType {
            dtype: dtype(t.elem_type)?,
            dims,
        })
    };
    let inner = |t: &Option<Box<proto::TypeProto>>| -> Result<Option<Box<ValueType>>, OnnxError> {
        t.as_ref()
            .map(|t| convert_type(t, value).map(Box::new))
            .transpose()
    };
    match &t.value {
        Some(TypeValue::Tensor(tt)) => Ok(ValueType::Tensor(tensor_type(tt)?)),
        Some(TypeValue::SparseTensor(tt)) => Ok(ValueType::SparseTensor(tensor_type(tt)?)),
        Some(TypeValue::Sequence(s)) => Ok(ValueType::Sequence(inner(&s.elem_type)?)),
        Some(TypeValue::Optional(o)) => Ok(ValueType::Optional(inner(&o.elem_type)?)),
        Some(TypeValue::Map(m)) => Ok(ValueType::Map {
            key: dtype(m.key_type)?.ok_or_else(|| err("map without key type".to_string()))?,
            value: inner(&m.value_type)?,
        }),
        None => Err(err(
            "type without a value (tensor, sequence, ...)".to_string()
        )),
    }
}
