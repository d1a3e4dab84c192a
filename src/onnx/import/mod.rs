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
//!   with the model buffer ([`crate::tensor::ConstData`] over the [`bytes::Bytes`], no copy:
//!   ONNX stores them little-endian as dynrt does). Integer constants that only feed shape
//!   computations are marked shape-only by the graph and never uploaded. `Constant` nodes the
//!   same way.
//! * **The converter registry** ([`CONVERTERS`]): one line per ONNX op type, each mapping a
//!   node (its attributes, and the definition its opset selects, [`Ctx::version`]) to dynrt
//!   ops through a [`Ctx`]. Converters live in files by family; adding an op is its function
//!   and one registry line. ONNX Runtime's contrib ops (`com.microsoft`) have a registry of
//!   their own, [`CONTRIB_CONVERTERS`] (`MatMulNBits`: 4-bit weights kept in blocks on the
//!   device, `contrib.rs`).
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
mod contrib;
mod ctx;
mod elementwise;
mod indexing;
mod logic;
mod movement;
mod nn;
mod shape;

use super::file::{OnnxFile, OnnxNode};
use super::inspect::UnsupportedNode;
use super::ops::op_version;
use super::tensor::{HostTensor, TensorDType};
use crate::graph::ops::{InferError, Op};
use crate::graph::{Graph, GraphError, NodeId};
use crate::shape::{DType, Shape};

pub use ctx::Ctx;

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

/// One line of a registry: an ONNX op type, the oldest definition (`since_version`) the
/// converter maps, and the converter.
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
    line("GatherND", 11, indexing::gather_nd),
    line("Gelu", 20, elementwise::gelu),
    line("Gemm", 7, nn::gemm),
    line("GlobalAveragePool", 1, cnn::global_average_pool),
    line("GlobalMaxPool", 1, cnn::global_max_pool),
    line("Greater", 7, logic::compare),
    line("GreaterOrEqual", 12, logic::compare),
    line("Identity", 1, shape::identity),
    line("IsNaN", 9, indexing::is_nan),
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

/// ONNX Runtime's contrib-op domain.
pub const CONTRIB_DOMAIN: &str = "com.microsoft";

/// The converter registry of [`CONTRIB_DOMAIN`] (ONNX Runtime's contrib ops, whose one
/// version is 1), sorted by op type like [`CONVERTERS`].
pub const CONTRIB_CONVERTERS: &[Converter] = &[line("MatMulNBits", 1, contrib::matmul_nbits)];

fn find(registry: &'static [Converter], op_type: &str) -> Option<&'static Converter> {
    registry
        .binary_search_by(|c| c.op_type.cmp(op_type))
        .ok()
        .map(|i| &registry[i])
}

/// The registry line of `op_type` (default domain).
pub fn converter(op_type: &str) -> Option<&'static Converter> {
    find(CONVERTERS, op_type)
}

/// The registry line of `op_type` in `domain` (`""` or `ai.onnx` for the default one,
/// [`CONTRIB_DOMAIN`]); `None` for any other domain.
pub fn converter_in(domain: &str, op_type: &str) -> Option<&'static Converter> {
    match domain {
        "" | "ai.onnx" => converter(op_type),
        CONTRIB_DOMAIN => find(CONTRIB_CONVERTERS, op_type),
        _ => None,
    }
}

/// Why the importer cannot take a node of `domain`/`op_type` in a model whose default-domain
/// opset is `opset`, or `None` when it can.
pub fn refusal(domain: &str, op_type: &str, opset: i64) -> Option<String> {
    if domain == CONTRIB_DOMAIN {
        return converter_in(domain, op_type)
            .is_none()
            .then(|| format!("not in the importer's {CONTRIB_DOMAIN} op list"));
    }
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
        ctx.version = if node.domain == CONTRIB_DOMAIN {
            1
        } else {
            op_version(&node.op_type, opset).unwrap_or(0)
        };
        let c = converter_in(&node.domain, &node.op_type).ok_or_else(|| ImportError::Node {
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

#[cfg(test)]
mod tests;
