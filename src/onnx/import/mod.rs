//! The importer: an [`OnnxFile`] into a dynrt [`Graph`], device-free (it works from bytes on
//! wasm32 as everywhere; nothing is allocated on a device).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dynrt::onnx::{import, LoadOptions, OnnxFile};
//! let model = OnnxFile::load("model.onnx", &LoadOptions::default())?;
//! let imported = import::import(&model)?;
//! println!("{} nodes, inputs {:?}", imported.graph.len(), imported.inputs);
//! # Ok(())
//! # }
//! ```
//!
//! * **Values to nodes.** Every ONNX value name maps to a dynrt node; a node's output is
//!   labelled with its value name, so errors and `read_output` use the model's names.
//! * **Inputs.** Each graph input (that is not an initializer) becomes an
//!   [`crate::graph::Dim`]-typed input: `dim_value` fixed, `dim_param` a symbol bound per
//!   run, a dimension with neither a generated symbol `<input>:<axis>`.
//! * **Initializers** become constants the first time a node reads them, their bytes shared
//!   with the model buffer ([`ConstData`] over the [`bytes::Bytes`], no copy: ONNX stores them
//!   little-endian as dynrt does). Integer constants that only feed shape computations are
//!   marked shape-only by the graph and never uploaded. `Constant` nodes the same way.
//! * **The converter registry** ([`CONVERTERS`]): one line per ONNX op type, each mapping a
//!   node (its attributes, and the definition its opset selects, [`Ctx::version`]) to dynrt
//!   ops through a [`Ctx`]. Converters live in files by family; adding an op is its function
//!   and one registry line.
//! * **Unsupported ops** are found before anything is converted: one
//!   [`ImportError::Unsupported`] lists every node whose op has no converter (or whose opset
//!   selects a definition the converter does not map), with its op type and why.
//! * **Checked as built.** Each node's dtype rule runs when it is added, and its shape rule on
//!   two *probe* bindings of the symbols: where every input shape is fixed the result is exact
//!   and a failure is an [`ImportError::Infer`] naming the node; elsewhere the probes give the
//!   converters ranks and the fixed dims ([`Ctx::rank`], [`Ctx::dims`]), and the integer
//!   values that do not depend on a symbol ([`Ctx::const_ints`]).
//!
//! Integer shape chains (`Shape → Gather → Unsqueeze → Concat → Reshape`) become host-evaluable
//! dynrt ops: [`crate::graph::shape_data`] computes them at every `update_shape`, the graph
//! marks them shape-only, and the runtime never dispatches them.
//!
//! # Adding a converter
//!
//! Write the function in the file of its family (`elementwise.rs`, `logic.rs`, `shape.rs`, or
//! a new one) and add one line, in op-type order, to [`CONVERTERS`]:
//!
//! ```ignore
//! /// `Softsign(x) = x / (1 + |x|)`: three dynrt ops.
//! pub(super) fn softsign(ctx: &mut Ctx<'_>, node: &OnnxNode) -> Result<(), ImportError> {
//!     let x = ctx.input(node, 0)?;                          // a required input
//!     let one = ctx.constant_scalar(node, "one", ctx.dtype(x), 1.0)?;
//!     let abs = ctx.helper(node, "abs", UnaryOp::Abs, &[x])?; // helper nodes: `<output>/abs`
//!     let den = ctx.helper(node, "den", BinaryOp::Add, &[abs, one])?;
//!     ctx.emit(node, BinaryOp::Div, &[x, den])?;          // the node computing output 0
//!     Ok(())
//! }
//! // in CONVERTERS:  line("Softsign", 1, elementwise::softsign),
//! ```
//!
//! [`Ctx::version`] is the definition the model's opset selects (attributes moved to inputs
//! between versions); [`Ctx::attr_int`] and its siblings read attributes with defaults;
//! [`Ctx::const_input_ints`] reads an input that must be known at import (axes given as an
//! input); [`Ctx::rank`] and [`Ctx::dims`] say what the probes know of a shape;
//! [`Ctx::bind`] makes an output an alias of an existing node; [`Ctx::emit_output`] serves ops
//! with several outputs. A node the converter cannot map is [`Ctx::err`], naming the node.

mod attention;
mod cnn;
mod elementwise;
mod logic;
mod movement;
mod nn;
mod shape;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::file::{AttributeValue, Initializer, OnnxDim, OnnxFile, OnnxNode, ValueType};
use super::inspect::UnsupportedNode;
use super::ops::op_version;
use super::tensor::{HostTensor, TensorDType};
use crate::graph::ops::{InferError, Input, Op};
use crate::graph::{shape_data, Dim, Graph, GraphError, Node, NodeId};
use crate::shape::{DType, Shape};
use crate::tensor::ConstData;

/// Why a model could not be imported. Every variant names the node (its name, or
/// `op_type#index`), the input or the tensor it is about.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// Nodes whose op the importer does not map, all of them, found before any conversion.
    #[error("{} unsupported node(s): {}", nodes.len(), list_unsupported(nodes))]
    Unsupported {
        /// Every unsupported node, in graph order, with its op type and why.
        nodes: Vec<UnsupportedNode>,
    },
    /// A value whose element type dynrt has no [`DType`] for (f64, i16, strings, ...).
    #[error("value `{value}` is {dtype}, which dynrt does not hold (it holds f32, f16, bf16, i64, i32, u32, i8, u8, bool)")]
    UnsupportedDType {
        /// The value (graph input, initializer or node output).
        value: String,
        /// Its ONNX element type.
        dtype: TensorDType,
    },
    /// A graph input that is not a dense tensor (a sequence, a map, an optional of one):
    /// dynrt graphs hold tensors only.
    #[error("graph input `{value}` is {ty}; dynrt graphs hold tensors only")]
    NotATensor {
        /// The input.
        value: String,
        /// Its type, printed.
        ty: String,
    },
    /// A graph input without a tensor type of known rank and element type.
    #[error("graph input `{input}`: {reason}")]
    Input {
        /// The input.
        input: String,
        /// What is missing.
        reason: String,
    },
    /// A node that does not fit its op's definition: a missing input, a bad attribute, an
    /// input that must be a constant and is not, a case the converter does not map.
    #[error("node `{node}` ({op_type}): {reason}")]
    Node {
        /// The node.
        node: String,
        /// Its op type.
        op_type: String,
        /// What is wrong.
        reason: String,
    },
    /// An input of a node has an element type its op does not take.
    #[error("node `{node}` ({op_type}) input {input} is {got}, expected {expected}")]
    NodeDType {
        /// The node.
        node: String,
        /// Its op type.
        op_type: String,
        /// Input position (of the dynrt op the node became).
        input: usize,
        /// The type found.
        got: DType,
        /// What the op takes.
        expected: &'static str,
    },
    /// A node with more inputs than [`MAX_NODE_INPUTS`], refused before anything is
    /// converted.
    #[error("node `{node}` ({op_type}) has {inputs} inputs, more than the {max} a node may have")]
    TooManyInputs {
        /// The node.
        node: String,
        /// Its op type.
        op_type: String,
        /// Its input count.
        inputs: usize,
        /// [`MAX_NODE_INPUTS`].
        max: usize,
    },
    /// A node's shape rule fails on inputs whose shapes are fixed (a malformed graph).
    #[error("node `{node}` ({op_type}): {cause}")]
    Infer {
        /// The node.
        node: String,
        /// Its op type.
        op_type: String,
        /// Why.
        cause: InferError,
    },
    /// The finished graph is invalid (a converter bug rather than a model problem).
    #[error(transparent)]
    Graph(#[from] GraphError),
}

fn list_unsupported(nodes: &[UnsupportedNode]) -> String {
    nodes
        .iter()
        .map(|n| format!("`{}` ({}: {})", n.node, n.op_type, n.reason))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A converter: maps one ONNX node to dynrt ops through the context, binding each of the
/// node's outputs ([`Ctx::bind`], or [`Ctx::emit`] for the usual one-op case).
pub type ConvertFn = fn(&mut Ctx<'_>, &OnnxNode) -> Result<(), ImportError>;

/// One line of the registry: an ONNX op type of the default domain, the oldest definition
/// (`since_version`) the converter maps, and the converter.
#[derive(Debug, Clone, Copy)]
pub struct Converter {
    /// The op type (`Add`).
    pub op_type: &'static str,
    /// Definitions older than this are refused as unsupported (their attributes differ).
    pub since: i64,
    /// The converter.
    pub convert: ConvertFn,
}

const fn line(op_type: &'static str, since: i64, convert: ConvertFn) -> Converter {
    Converter {
        op_type,
        since,
        convert,
    }
}

/// The converter registry: one line per ONNX op type of the default domain, sorted by op type
/// (a unit test keeps it so). `dynrt inspect`'s "unsupported" list is this registry's
/// complement ([`refusal`]).
pub const CONVERTERS: &[Converter] = &[
    line("Abs", 6, elementwise::unary),
    line("Add", 7, elementwise::binary),
    line("And", 7, logic::logic),
    line("Attention", 23, attention::attention),
    line("AveragePool", 7, cnn::average_pool),
    line("BatchNormalization", 9, cnn::batch_norm),
    line("Cast", 6, logic::cast),
    line("CastLike", 15, logic::cast_like),
    line("Ceil", 6, elementwise::unary),
    line("Clip", 6, elementwise::clip),
    line("Concat", 4, movement::concat),
    line("Constant", 1, shape::constant),
    line("ConstantOfShape", 9, shape::constant_of_shape),
    line("Conv", 1, cnn::conv),
    line("Cos", 7, elementwise::unary),
    line("CumSum", 11, nn::cumsum),
    line("Div", 7, elementwise::binary),
    line("Equal", 7, logic::compare),
    line("Erf", 9, elementwise::unary),
    line("Exp", 6, elementwise::unary),
    line("Expand", 8, movement::expand),
    line("Flatten", 1, movement::flatten),
    line("Floor", 6, elementwise::unary),
    line("Gather", 1, movement::gather),
    line("Gelu", 20, elementwise::gelu),
    line("Gemm", 7, nn::gemm),
    line("GlobalAveragePool", 1, cnn::global_average_pool),
    line("GlobalMaxPool", 1, cnn::global_max_pool),
    line("Greater", 7, logic::compare),
    line("GreaterOrEqual", 12, logic::compare),
    line("Identity", 1, shape::identity),
    line("LayerNormalization", 17, nn::layer_norm),
    line("Less", 7, logic::compare),
    line("LessOrEqual", 12, logic::compare),
    line("Log", 6, elementwise::unary),
    line("LogSoftmax", 1, nn::log_softmax),
    line("MatMul", 1, nn::matmul),
    line("Max", 8, elementwise::variadic),
    line("MaxPool", 1, cnn::max_pool),
    line("Mean", 8, elementwise::variadic),
    line("Min", 8, elementwise::variadic),
    line("Mul", 7, elementwise::binary),
    line("Neg", 6, elementwise::unary),
    line("Not", 1, logic::not),
    line("Or", 7, logic::logic),
    line("Pow", 7, elementwise::binary),
    line("RMSNormalization", 23, nn::rms_norm),
    line("Range", 11, shape::range),
    line("Reciprocal", 6, elementwise::unary),
    line("ReduceMax", 1, nn::reduce_max),
    line("ReduceMean", 1, nn::reduce_mean),
    line("ReduceMin", 1, nn::reduce_min),
    line("ReduceSum", 1, nn::reduce_sum),
    line("Relu", 6, elementwise::unary),
    line("Reshape", 5, movement::reshape),
    line("RotaryEmbedding", 23, attention::rotary_embedding),
    line("Round", 11, elementwise::unary),
    line("Shape", 1, shape::shape),
    line("Sigmoid", 6, elementwise::unary),
    line("Sign", 9, elementwise::unary),
    line("Sin", 7, elementwise::unary),
    line("Size", 1, shape::size),
    line("Slice", 10, movement::slice),
    line("Softmax", 1, nn::softmax),
    line("Split", 2, movement::split),
    line("Sqrt", 6, elementwise::unary),
    line("Squeeze", 1, movement::squeeze),
    line("Sub", 7, elementwise::binary),
    line("Sum", 8, elementwise::variadic),
    line("Tanh", 6, elementwise::unary),
    line("Transpose", 1, movement::transpose),
    line("Trilu", 14, nn::trilu),
    line("Unsqueeze", 1, movement::unsqueeze),
    line("Where", 9, logic::where_),
    line("Xor", 7, logic::logic),
];

/// The registry line of `op_type` (default domain).
pub fn converter(op_type: &str) -> Option<&'static Converter> {
    CONVERTERS
        .binary_search_by(|c| c.op_type.cmp(op_type))
        .ok()
        .map(|i| &CONVERTERS[i])
}

/// Why the importer cannot take a node of `domain`/`op_type` in a model whose default-domain
/// opset is `opset`, or `None` when it can.
pub fn refusal(domain: &str, op_type: &str, opset: i64) -> Option<String> {
    if !domain.is_empty() && domain != "ai.onnx" {
        return Some(format!("domain `{domain}` not supported"));
    }
    let Some(c) = converter(op_type) else {
        return Some("not in the importer's op list".to_string());
    };
    match op_version(op_type, opset) {
        None => Some(format!("not defined at opset {opset}")),
        Some(v) if v < c.since => Some(format!(
            "opset {opset} selects {op_type}-{v}; the importer maps {op_type}-{} and later",
            c.since
        )),
        Some(_) => None,
    }
}

/// The dynrt element type of an ONNX one, if dynrt holds it.
pub fn dtype_of(t: TensorDType) -> Option<DType> {
    Some(match t {
        TensorDType::F32 => DType::F32,
        TensorDType::F16 => DType::F16,
        TensorDType::BF16 => DType::BF16,
        TensorDType::I64 => DType::I64,
        TensorDType::I32 => DType::I32,
        TensorDType::U32 => DType::U32,
        TensorDType::I8 => DType::I8,
        TensorDType::U8 => DType::U8,
        TensorDType::Bool => DType::Bool,
        _ => return None,
    })
}

/// An ONNX host tensor (a test-data file, an `.npy`) as the runtime's
/// [`crate::tensor::HostTensor`] (the bytes are copied once).
///
/// # Errors
/// [`ImportError::UnsupportedDType`] naming `name` for a type dynrt does not hold.
pub fn runtime_tensor(
    name: &str,
    t: &HostTensor,
) -> Result<crate::tensor::HostTensor, ImportError> {
    let unsupported = || ImportError::UnsupportedDType {
        value: name.to_string(),
        dtype: t.dtype(),
    };
    let dtype = dtype_of(t.dtype()).ok_or_else(unsupported)?;
    let bytes = t.bytes().ok_or_else(unsupported)?;
    Ok(crate::tensor::HostTensor {
        shape: Shape::new(t.dims().to_vec()),
        dtype,
        bytes: bytes.to_vec(),
    })
}

/// A graph input or output of the imported graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedValue {
    /// The ONNX value name (also the node's label: what the runtime's inputs and
    /// `read_output` take).
    pub name: String,
    /// The node.
    pub node: NodeId,
    /// Its element type.
    pub dtype: DType,
}

/// The result of [`import`]: the graph and its ONNX inputs and outputs, in model order.
#[derive(Debug, Clone)]
pub struct ImportedGraph {
    /// The dynrt graph (every node labelled; outputs marked in model order).
    pub graph: Graph,
    /// The graph inputs the caller feeds (those without an initializer).
    pub inputs: Vec<ImportedValue>,
    /// The graph outputs.
    pub outputs: Vec<ImportedValue>,
}

/// Most inputs one node may have (`Sum`, `Concat`, ... are variadic). Each input becomes at
/// least one dynrt node and a dispatch per run, while the file spends three bytes on it: a
/// node past this limit is refused ([`ImportError::TooManyInputs`]) before anything is
/// converted rather than built at a hundred times its file size. Import time is linear in
/// the inputs up to the limit (a `Sum` of 2^20 inputs imports in about a second).
pub const MAX_NODE_INPUTS: usize = 1 << 20;

/// Imports `model` into a dynrt graph.
///
/// # Errors
/// [`ImportError::TooManyInputs`] for a node with more than [`MAX_NODE_INPUTS`] inputs and
/// [`ImportError::Unsupported`] listing every node whose op is not mapped, before anything
/// else; then the first of [`ImportError::UnsupportedDType`], [`ImportError::Input`],
/// [`ImportError::Node`], [`ImportError::NodeDType`], [`ImportError::Infer`] naming the node
/// or input; [`ImportError::Graph`] if the finished graph is invalid.
pub fn import(model: &OnnxFile) -> Result<ImportedGraph, ImportError> {
    let graph = &model.graph;
    let opset = model.opset("").unwrap_or(0);
    let nodes = graph.walk_nodes();
    if let Some(n) = nodes.iter().find(|n| n.inputs.len() > MAX_NODE_INPUTS) {
        return Err(ImportError::TooManyInputs {
            node: n.label(),
            op_type: n.op_type.clone(),
            inputs: n.inputs.len(),
            max: MAX_NODE_INPUTS,
        });
    }
    let unsupported: Vec<UnsupportedNode> = nodes
        .into_iter()
        .filter_map(|n| {
            refusal(&n.domain, &n.op_type, opset).map(|reason| UnsupportedNode {
                node: n.label(),
                domain: n.domain.clone(),
                op_type: n.op_type.clone(),
                reason,
            })
        })
        .collect();
    if !unsupported.is_empty() {
        return Err(ImportError::Unsupported { nodes: unsupported });
    }

    let mut ctx = Ctx::new(model, opset);
    let mut inputs = Vec::new();
    for info in graph.runtime_inputs() {
        let id = ctx.graph_input(&info.name, info.ty.as_ref())?;
        inputs.push(ImportedValue {
            name: info.name.clone(),
            node: id,
            dtype: ctx.dtype(id),
        });
    }
    for node in &graph.nodes {
        ctx.version = op_version(&node.op_type, opset).unwrap_or(0);
        let c = converter(&node.op_type).ok_or_else(|| ImportError::Node {
            node: node.label(),
            op_type: node.op_type.clone(),
            reason: "no converter".into(),
        })?;
        (c.convert)(&mut ctx, node)?;
        for (k, out) in node.outputs.iter().enumerate() {
            if !out.is_empty() && !ctx.values.contains_key(out) {
                return Err(ctx.err(
                    node,
                    format!("output {k} (`{out}`) is not produced by the importer"),
                ));
            }
        }
    }
    let mut outputs = Vec::new();
    for info in &graph.outputs {
        let id = match ctx.values.get(info.name.as_str()) {
            Some(&id) => id,
            None => match ctx.initializers.get(info.name.as_str()).copied() {
                Some(init) => ctx.initializer_constant(init)?,
                None => {
                    return Err(ImportError::Input {
                        input: info.name.clone(),
                        reason: "graph output that no node produces".into(),
                    })
                }
            },
        };
        // The runtime reads an output by its node's label, from a buffer of its own: a value
        // that is another value's node (Identity), a constant or a second output of one node
        // gets a copy labelled with its name.
        let own = ctx.nodes[id.index()].label == info.name
            && !matches!(ctx.nodes[id.index()].op, Op::Constant(_))
            && !outputs.iter().any(|o: &ImportedValue| o.node == id);
        let id = if own {
            id
        } else {
            if ctx.nodes[id.index()].label == info.name {
                // A constant output: the copy takes the name, the constant another label.
                let relabel = ctx.fresh_label(&format!("{}/value", info.name));
                ctx.labels.insert(relabel.clone());
                ctx.nodes[id.index()].label = relabel;
            }
            ctx.add_labelled(
                info.name.clone(),
                "Identity",
                elementwise::identity_op(),
                &[id],
            )?
        };
        outputs.push(ImportedValue {
            name: info.name.clone(),
            node: id,
            dtype: ctx.dtype(id),
        });
    }
    let graph = Graph::from_nodes(ctx.nodes, outputs.iter().map(|o| o.node).collect())?;
    Ok(ImportedGraph {
        graph,
        inputs,
        outputs,
    })
}

/// What the importer knows of a node while building: its shape and integer values under the
/// two probe bindings of the symbols.
#[derive(Debug, Clone, Default)]
struct Known {
    /// Shape under probe 0 and probe 1 (`None`: the shape rule failed on a probe).
    shapes: [Option<Shape>; 2],
    /// Host values under each probe (integer shape data).
    values: [Option<Vec<i64>>; 2],
    /// Every input shape fixed: the probes are the real shape.
    exact: bool,
}

/// The importer's context, handed to every converter: value lookup, node creation, the
/// probes, and attribute helpers. Nodes are added with their dtype and shape rules checked.
pub struct Ctx<'m> {
    model: &'m OnnxFile,
    opset: i64,
    version: i64,
    nodes: Vec<Node>,
    known: Vec<Known>,
    values: HashMap<String, NodeId>,
    labels: HashSet<String>,
    /// Every value name of the model: generated labels avoid them.
    names: HashSet<&'m str>,
    initializers: HashMap<&'m str, &'m Initializer>,
    /// Probe bindings of the symbols.
    probes: [HashMap<String, u64>; 2],
}

impl<'m> Ctx<'m> {
    fn new(model: &'m OnnxFile, opset: i64) -> Ctx<'m> {
        let g = &model.graph;
        let mut names: HashSet<&str> = HashSet::new();
        for i in &g.inputs {
            names.insert(&i.name);
        }
        for i in &g.initializers {
            names.insert(&i.name);
        }
        for n in &g.nodes {
            names.extend(n.outputs.iter().map(String::as_str));
        }
        // Symbols get two distinct values each, never 0 or 1 (which broadcast specially).
        let symbols: BTreeSet<String> = g
            .runtime_inputs()
            .flat_map(|i| input_dims(&i.name, i.ty.as_ref()).unwrap_or_default())
            .filter_map(|d| match d {
                Dim::Sym(s) => Some(s),
                Dim::Fixed(_) => None,
            })
            .collect();
        let mut probes = [HashMap::new(), HashMap::new()];
        for (k, s) in symbols.into_iter().enumerate() {
            probes[0].insert(s.clone(), 11 + k as u64);
            probes[1].insert(s, 29 + 3 * k as u64);
        }
        Ctx {
            model,
            opset,
            version: 0,
            nodes: Vec::new(),
            known: Vec::new(),
            values: HashMap::new(),
            labels: HashSet::new(),
            names,
            initializers: g
                .initializers
                .iter()
                .map(|i| (i.name.as_str(), i))
                .collect(),
            probes,
        }
    }

    /// The model being imported (its `value_info`, metadata, ...).
    pub fn model(&self) -> &'m OnnxFile {
        self.model
    }

    /// The model's default-domain opset.
    pub fn opset(&self) -> i64 {
        self.opset
    }

    /// The definition of the node being converted that the model's opset selects (its
    /// `since_version`: `Clip` is 6, 11, 12 or 13, ...).
    pub fn version(&self) -> i64 {
        self.version
    }

    /// A [`ImportError::Node`] about `node`.
    pub fn err(&self, node: &OnnxNode, reason: impl Into<String>) -> ImportError {
        ImportError::Node {
            node: node.label(),
            op_type: node.op_type.clone(),
            reason: reason.into(),
        }
    }

    fn graph_input(&mut self, name: &str, ty: Option<&ValueType>) -> Result<NodeId, ImportError> {
        let bad = |reason: &str| ImportError::Input {
            input: name.to_string(),
            reason: reason.to_string(),
        };
        let not_a_tensor = |t: &ValueType| ImportError::NotATensor {
            value: name.to_string(),
            ty: t.to_string(),
        };
        let t = match ty {
            Some(ValueType::Tensor(t)) => t,
            Some(o @ ValueType::Optional(Some(inner))) => {
                inner.as_tensor().ok_or_else(|| not_a_tensor(o))?
            }
            Some(other) => return Err(not_a_tensor(other)),
            None => return Err(bad("no declared type")),
        };
        let onnx_dtype = t.dtype.ok_or_else(|| bad("no declared element type"))?;
        let dtype = dtype_of(onnx_dtype).ok_or_else(|| ImportError::UnsupportedDType {
            value: name.to_string(),
            dtype: onnx_dtype,
        })?;
        let dims = input_dims(name, ty).ok_or_else(|| bad("no declared rank"))?;
        let id = self.add_labelled(name.to_string(), "input", Input::new(dims, dtype), &[])?;
        self.values.insert(name.to_string(), id);
        Ok(id)
    }

    fn initializer_constant(&mut self, init: &Initializer) -> Result<NodeId, ImportError> {
        let unsupported = || ImportError::UnsupportedDType {
            value: init.name.clone(),
            dtype: init.dtype,
        };
        let dtype = dtype_of(init.dtype).ok_or_else(unsupported)?;
        let t = init.tensor().ok_or_else(|| ImportError::Input {
            input: init.name.clone(),
            reason: "external data was not read (LoadOptions::read_external is off)".into(),
        })?;
        let id = self.constant_tensor(&init.name, dtype, t)?;
        self.values.insert(init.name.clone(), id);
        Ok(id)
    }

    /// A constant node from an ONNX tensor: its bytes are shared, not copied.
    fn constant_tensor(
        &mut self,
        label: &str,
        dtype: DType,
        t: &HostTensor,
    ) -> Result<NodeId, ImportError> {
        let unsupported = || ImportError::UnsupportedDType {
            value: label.to_string(),
            dtype: t.dtype(),
        };
        let bytes = t.bytes().ok_or_else(unsupported)?.clone();
        let len = bytes.len();
        let data = ConstData::slice(Arc::new(bytes), 0..len).map_err(|e| ImportError::Input {
            input: label.to_string(),
            reason: e.to_string(),
        })?;
        let op = crate::graph::ops::Constant {
            shape: Shape::new(t.dims().to_vec()),
            dtype,
            data,
        };
        self.add_labelled(self.fresh_label(label), "constant", op, &[])
    }

    /// Input `i` of `node`, which must be present.
    ///
    /// # Errors
    /// [`ImportError::Node`] when the node has no such input (or it is empty);
    /// [`ImportError::UnsupportedDType`] for an initializer of a type dynrt does not hold.
    pub fn input(&mut self, node: &OnnxNode, i: usize) -> Result<NodeId, ImportError> {
        match self.optional_input(node, i)? {
            Some(id) => Ok(id),
            None => Err(self.err(node, format!("input {i} is required"))),
        }
    }

    /// Input `i` of `node`, `None` when absent or empty (an omitted optional input).
    ///
    /// # Errors
    /// As [`Ctx::input`] for a value that exists but cannot be had.
    pub fn optional_input(
        &mut self,
        node: &OnnxNode,
        i: usize,
    ) -> Result<Option<NodeId>, ImportError> {
        let Some(name) = node.inputs.get(i).filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        if let Some(&id) = self.values.get(name.as_str()) {
            return Ok(Some(id));
        }
        if let Some(init) = self.initializers.get(name.as_str()).copied() {
            return self.initializer_constant(init).map(Some);
        }
        Err(self.err(
            node,
            format!(
                "input {i} (`{name}`) is not a value the importer knows (an outer-scope value?)"
            ),
        ))
    }

    /// Every present input of `node`, in order.
    ///
    /// # Errors
    /// As [`Ctx::input`].
    pub fn inputs(&mut self, node: &OnnxNode) -> Result<Vec<NodeId>, ImportError> {
        let mut v = Vec::new();
        for i in 0..node.inputs.len() {
            if let Some(id) = self.optional_input(node, i)? {
                v.push(id);
            }
        }
        Ok(v)
    }

    /// The element type of a node.
    pub fn dtype(&self, id: NodeId) -> DType {
        self.nodes[id.index()].dtype
    }

    /// The rank of a node's output, when the probes agree on one.
    pub fn rank(&self, id: NodeId) -> Option<usize> {
        match &self.known[id.index()].shapes {
            [Some(a), Some(b)] if a.rank() == b.rank() => Some(a.rank()),
            _ => None,
        }
    }

    /// The dims of a node's output: `Some(n)` where it does not depend on a symbol, `None`
    /// where it does; `None` overall when the rank is unknown.
    pub fn dims(&self, id: NodeId) -> Option<Vec<Option<u64>>> {
        match &self.known[id.index()].shapes {
            [Some(a), Some(b)] if a.rank() == b.rank() => Some(
                a.dims()
                    .iter()
                    .zip(b.dims())
                    .map(|(&x, &y)| (x == y).then_some(x))
                    .collect(),
            ),
            _ => None,
        }
    }

    /// The integer values of a node that do not depend on a symbol (constants and what the
    /// host evaluator makes of them and of fixed shapes).
    pub fn const_ints(&self, id: NodeId) -> Option<&[i64]> {
        match &self.known[id.index()].values {
            [Some(a), Some(b)] if a == b => Some(a),
            _ => None,
        }
    }

    /// The float values of a constant node (f32, f16, bf16), widened to f32.
    pub fn const_floats(&self, id: NodeId) -> Option<Vec<f32>> {
        match &self.nodes[id.index()].op {
            Op::Constant(c) if c.dtype.is_float() && c.dtype.block().is_none() => {
                crate::tensor::decode_f32(c.dtype, c.data.bytes()).ok()
            }
            _ => None,
        }
    }

    /// A label for a new node: `hint` when no value or node has it, else `hint#k`.
    fn fresh_label(&self, hint: &str) -> String {
        let taken = |l: &str| self.labels.contains(l);
        if !taken(hint) {
            return hint.to_string();
        }
        (1..)
            .map(|k| format!("{hint}#{k}"))
            .find(|l| !taken(l) && !self.names.contains(l.as_str()))
            .unwrap_or_default()
    }

    /// Adds a helper node of `node`'s conversion (a node that is not one of its outputs),
    /// labelled `<first output>/<suffix>`; checks the op's dtype rule and, where the input
    /// shapes are fixed, its shape rule.
    ///
    /// # Errors
    /// [`ImportError::NodeDType`], [`ImportError::Infer`], [`ImportError::Node`] (arity),
    /// naming `node`.
    pub fn helper(
        &mut self,
        node: &OnnxNode,
        suffix: &str,
        op: impl Into<Op>,
        inputs: &[NodeId],
    ) -> Result<NodeId, ImportError> {
        let base = node
            .outputs
            .first()
            .filter(|o| !o.is_empty())
            .cloned()
            .unwrap_or_else(|| node.label());
        let mut hint = format!("{base}/{suffix}");
        if self.names.contains(hint.as_str()) {
            hint.push('~');
        }
        let label = self.fresh_label(&hint);
        self.add_node(label, node, op.into(), inputs)
    }

    /// Adds the node that computes output `k` of `node` (labelled with the output's name) and
    /// binds the output to it.
    ///
    /// # Errors
    /// As [`Ctx::helper`].
    pub fn emit_output(
        &mut self,
        node: &OnnxNode,
        k: usize,
        op: impl Into<Op>,
        inputs: &[NodeId],
    ) -> Result<NodeId, ImportError> {
        let name = self.output_name(node, k)?;
        let label = self.fresh_label(&name);
        let id = self.add_node(label, node, op.into(), inputs)?;
        self.values.insert(name, id);
        Ok(id)
    }

    /// The name of output `k` of `node`, which must be present.
    fn output_name(&self, node: &OnnxNode, k: usize) -> Result<String, ImportError> {
        node.outputs
            .get(k)
            .filter(|o| !o.is_empty())
            .cloned()
            .ok_or_else(|| self.err(node, format!("has no output {k}")))
    }

    /// [`Ctx::emit_output`] for output 0: the usual one-op conversion.
    ///
    /// # Errors
    /// As [`Ctx::helper`].
    pub fn emit(
        &mut self,
        node: &OnnxNode,
        op: impl Into<Op>,
        inputs: &[NodeId],
    ) -> Result<NodeId, ImportError> {
        self.emit_output(node, 0, op, inputs)
    }

    /// Binds output `k` of `node` to an existing node (an alias: `Identity`, a no-op cast).
    ///
    /// # Errors
    /// [`ImportError::Node`] when the node has no output `k`.
    pub fn bind(&mut self, node: &OnnxNode, k: usize, id: NodeId) -> Result<(), ImportError> {
        let name = self.output_name(node, k)?;
        self.values.insert(name, id);
        Ok(())
    }

    /// An i64 constant of `shape` (a helper of `node`'s conversion: axes, shape targets).
    ///
    /// # Errors
    /// As [`Ctx::helper`].
    pub fn constant_i64(
        &mut self,
        node: &OnnxNode,
        suffix: &str,
        shape: Shape,
        values: &[i64],
    ) -> Result<NodeId, ImportError> {
        let op = crate::graph::ops::Constant {
            shape,
            dtype: DType::I64,
            data: ConstData::from_i64(values),
        };
        self.helper(node, suffix, op, &[])
    }

    /// A constant of `dtype` from values carried as f64 (a scalar bound such as Clip's
    /// default min), encoded as that type.
    ///
    /// # Errors
    /// As [`Ctx::helper`]; [`ImportError::Node`] for a type that cannot be encoded.
    pub fn constant_scalar(
        &mut self,
        node: &OnnxNode,
        suffix: &str,
        dtype: DType,
        value: f64,
    ) -> Result<NodeId, ImportError> {
        let bytes = if dtype.is_int() {
            crate::tensor::encode_i64(dtype, &[value as i64])
        } else {
            crate::tensor::encode_f32(dtype, &[value as f32])
        }
        .map_err(|e| self.err(node, e.to_string()))?;
        let op = crate::graph::ops::Constant {
            shape: Shape::new(vec![]),
            dtype,
            data: ConstData::from_vec(bytes),
        };
        self.helper(node, suffix, op, &[])
    }

    /// A `Constant`-node value or attribute tensor as a constant node labelled `label`.
    ///
    /// # Errors
    /// [`ImportError::UnsupportedDType`] naming `label` for a type dynrt does not hold.
    pub fn tensor_constant(&mut self, label: &str, t: &HostTensor) -> Result<NodeId, ImportError> {
        let dtype = dtype_of(t.dtype()).ok_or_else(|| ImportError::UnsupportedDType {
            value: label.to_string(),
            dtype: t.dtype(),
        })?;
        self.constant_tensor(label, dtype, t)
    }

    fn add_labelled(
        &mut self,
        label: String,
        op_type: &str,
        op: impl Into<Op>,
        inputs: &[NodeId],
    ) -> Result<NodeId, ImportError> {
        let pseudo = OnnxNode {
            name: label.clone(),
            op_type: op_type.to_string(),
            domain: String::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            attributes: Vec::new(),
            index: 0,
        };
        self.add_node(label, &pseudo, op.into(), inputs)
    }

    fn add_node(
        &mut self,
        label: String,
        node: &OnnxNode,
        op: Op,
        inputs: &[NodeId],
    ) -> Result<NodeId, ImportError> {
        let (min, max) = op.arity();
        if inputs.len() < min || inputs.len() > max {
            return Err(self.err(
                node,
                format!(
                    "{} takes {min}..={max} inputs, the conversion gave {}",
                    op.name(),
                    inputs.len()
                ),
            ));
        }
        let dtypes: Vec<DType> = inputs.iter().map(|&i| self.dtype(i)).collect();
        let dtype = op
            .output_dtype(&dtypes)
            .map_err(|e| ImportError::NodeDType {
                node: node.label(),
                op_type: node.op_type.clone(),
                input: e.input,
                got: dtypes.get(e.input).copied().unwrap_or(DType::F32),
                expected: e.expected,
            })?;
        let known = self.probe(node, &op, dtype, inputs)?;
        let id = NodeId(self.nodes.len() as u32);
        self.labels.insert(label.clone());
        self.nodes.push(Node {
            label,
            op,
            inputs: inputs.to_vec(),
            dtype,
        });
        self.known.push(known);
        Ok(id)
    }

    /// The shape rule (and the host evaluation) on both probes.
    fn probe(
        &self,
        node: &OnnxNode,
        op: &Op,
        dtype: DType,
        inputs: &[NodeId],
    ) -> Result<Known, ImportError> {
        let mut k = Known {
            exact: inputs.iter().all(|i| self.known[i.index()].exact),
            ..Known::default()
        };
        if let Op::Input(Input { dims, .. }) = op {
            k.exact = dims.iter().all(|d| matches!(d, Dim::Fixed(_)));
            for p in 0..2 {
                k.shapes[p] = dims
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => Some(*n),
                        Dim::Sym(s) => self.probes[p].get(s).copied(),
                    })
                    .collect::<Option<Vec<u64>>>()
                    .map(Shape);
            }
            return Ok(k);
        }
        for p in 0..2 {
            let Some(shapes) = inputs
                .iter()
                .map(|i| self.known[i.index()].shapes[p].as_ref())
                .collect::<Option<Vec<&Shape>>>()
            else {
                continue;
            };
            let data: Vec<Option<&[i64]>> = inputs
                .iter()
                .map(|i| self.known[i.index()].values[p].as_deref())
                .collect();
            let inferred = match op.infer(&shapes, &data) {
                // A gather index out of range for a probe's extent may be in range for the
                // real one: the shape stands without the values.
                Err(InferError::IndexOutOfRange { .. }) if !k.exact => {
                    op.infer(&shapes, &[]).map(|s| (s, false))
                }
                r => r.map(|s| (s, true)),
            };
            match inferred {
                Ok((s, with_values)) => {
                    if with_values {
                        k.values[p] = shape_data::evaluate(op, dtype, &shapes, &data, &s)
                            .ok()
                            .flatten();
                    }
                    k.shapes[p] = Some(s);
                }
                // Values the rule needs that are not known at import time are fine: they
                // are known per run.
                Err(InferError::MissingShapeData { .. }) => {}
                Err(source) if k.exact => {
                    return Err(ImportError::Infer {
                        node: node.label(),
                        op_type: node.op_type.clone(),
                        cause: source,
                    })
                }
                Err(_) => {}
            }
        }
        Ok(k)
    }

    /// Integer attribute `name`, or `default` when absent.
    ///
    /// # Errors
    /// [`ImportError::Node`] when the attribute has another type.
    pub fn attr_int(&self, node: &OnnxNode, name: &str, default: i64) -> Result<i64, ImportError> {
        match node.attribute(name) {
            None => Ok(default),
            Some(AttributeValue::Int(v)) => Ok(*v),
            Some(_) => Err(self.err(node, format!("attribute `{name}` must be an int"))),
        }
    }

    /// Float attribute `name`, or `default` when absent.
    ///
    /// # Errors
    /// [`ImportError::Node`] when the attribute has another type.
    pub fn attr_float(
        &self,
        node: &OnnxNode,
        name: &str,
        default: f32,
    ) -> Result<f32, ImportError> {
        match node.attribute(name) {
            None => Ok(default),
            Some(AttributeValue::Float(v)) => Ok(*v),
            Some(_) => Err(self.err(node, format!("attribute `{name}` must be a float"))),
        }
    }

    /// Integer-list attribute `name`, `None` when absent.
    ///
    /// # Errors
    /// [`ImportError::Node`] when the attribute has another type.
    pub fn attr_ints(&self, node: &OnnxNode, name: &str) -> Result<Option<Vec<i64>>, ImportError> {
        match node.attribute(name) {
            None => Ok(None),
            Some(AttributeValue::Ints(v)) => Ok(Some(v.clone())),
            Some(_) => Err(self.err(node, format!("attribute `{name}` must be a list of ints"))),
        }
    }

    /// String attribute `name`, or `default` when absent.
    ///
    /// # Errors
    /// [`ImportError::Node`] when the attribute has another type or is not UTF-8.
    pub fn attr_string(
        &self,
        node: &OnnxNode,
        name: &str,
        default: &str,
    ) -> Result<String, ImportError> {
        match node.attribute(name) {
            None => Ok(default.to_string()),
            Some(AttributeValue::String(s)) => std::str::from_utf8(s)
                .map(str::to_string)
                .map_err(|_| self.err(node, format!("attribute `{name}` is not UTF-8"))),
            Some(_) => Err(self.err(node, format!("attribute `{name}` must be a string"))),
        }
    }

    /// The integer values of input `i`, which must be known at import time (a constant, or
    /// computed from constants and fixed shapes).
    ///
    /// # Errors
    /// [`ImportError::Node`] naming what it is for when they are not.
    pub fn const_input_ints(
        &mut self,
        node: &OnnxNode,
        i: usize,
        what: &str,
    ) -> Result<Option<Vec<i64>>, ImportError> {
        let Some(id) = self.optional_input(node, i)? else {
            return Ok(None);
        };
        match self.const_ints(id) {
            Some(v) => Ok(Some(v.to_vec())),
            None => Err(self.err(
                node,
                format!("{what} (input {i}) must be known when the model is imported"),
            )),
        }
    }

    /// Normalises a possibly negative axis against `rank`.
    ///
    /// # Errors
    /// [`ImportError::Node`] when it is out of range.
    pub fn axis(&self, node: &OnnxNode, axis: i64, rank: usize) -> Result<usize, ImportError> {
        let r = rank as i64;
        let a = if axis < 0 {
            axis.saturating_add(r)
        } else {
            axis
        };
        if (0..r).contains(&a) {
            Ok(a as usize)
        } else {
            Err(self.err(node, format!("axis {axis} is out of range for rank {rank}")))
        }
    }

    /// The rank of `id`, which the conversion needs.
    ///
    /// # Errors
    /// [`ImportError::Node`] when the probes do not give one.
    pub fn need_rank(&self, node: &OnnxNode, id: NodeId) -> Result<usize, ImportError> {
        self.rank(id).ok_or_else(|| {
            self.err(
                node,
                "the rank of an input is not known when the model is imported",
            )
        })
    }
}

/// Declared dims of a graph input as dynrt dims; `None` without a tensor type of known rank.
fn input_dims(name: &str, ty: Option<&ValueType>) -> Option<Vec<Dim>> {
    let t = match ty? {
        ValueType::Tensor(t) => t,
        ValueType::Optional(Some(inner)) => inner.as_tensor()?,
        _ => return None,
    };
    Some(
        t.dims
            .as_ref()?
            .iter()
            .enumerate()
            .map(|(axis, d)| match d {
                OnnxDim::Fixed(n) => Dim::Fixed(*n),
                OnnxDim::Symbolic(s) => Dim::Sym(s.clone()),
                OnnxDim::Unknown => Dim::Sym(format!("{name}:{axis}")),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests;
