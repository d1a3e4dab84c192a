//! What a decoded graph holds: nodes with their attributes, declared value types, and the
//! graph itself.

use bytes::Bytes;

use super::{Initializer, SparseInitializer, SparseTensor};
use crate::onnx::error::OnnxError;
use crate::onnx::tensor::{HostTensor, TensorDType, TensorError};

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

/// The name used in messages: `name`, or `op_type#index` when it is empty.
pub(super) fn node_label(name: &str, op_type: &str, index: usize) -> String {
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
