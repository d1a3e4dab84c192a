//! The graph: nodes, symbolic input dimensions, the builder, processing order and whole-graph
//! shape inference.
//!
//! Every node has exactly one output tensor, so `TensorId(n)` is the output of `NodeId(n)`.
//!
//! Files: this one (nodes, dimensions, errors and the graph's queries), `validate` (what
//! [`Graph::from_nodes`] checks and computes once), `infer` (binding the symbols, shape
//! inference), `builder` ([`GraphBuilder`]).

mod builder;
mod infer;
mod validate;

pub use builder::GraphBuilder;

use std::collections::BTreeMap;

use super::ops::{InferError, Op};
use super::{NodeId, Position, TensorId};
use crate::shape::{DType, Shape};
use validate::{check_node, processing_order, shape_only_nodes};

/// One dimension of a declared network input: fixed, or a symbol (`seq`, `past`) bound to a
/// number per run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A known extent.
    Fixed(u64),
    /// A named extent, bound per run through [`Bindings`].
    Sym(String),
}

impl Dim {
    /// A symbolic dimension.
    pub fn sym(name: impl Into<String>) -> Self {
        Dim::Sym(name.into())
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Self {
        Dim::Fixed(n)
    }
}

impl From<&str> for Dim {
    fn from(s: &str) -> Self {
        Dim::Sym(s.to_string())
    }
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// Values of the symbols for one run (`{"past": 17, "seq": 1}`).
pub type Bindings = BTreeMap<String, u64>;

/// Errors about a graph: its structure, its inputs, or a node's shape inference. Every variant
/// names the node (by label) it is about.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// A node refers to an input that is not a node of the graph.
    #[error("node `{node}` has input {input} which is not a node of the graph")]
    DanglingInput {
        /// Label of the node.
        node: String,
        /// The id it refers to.
        input: NodeId,
    },
    /// The graph has a cycle through this node.
    #[error("node `{node}` is on a cycle")]
    Cycle {
        /// Label of a node on the cycle.
        node: String,
    },
    /// Two nodes have the same label.
    #[error("two nodes are labelled `{label}`: labels must be unique")]
    DuplicateLabel {
        /// The label.
        label: String,
    },
    /// A node has the wrong number of inputs for its op.
    #[error("node `{node}` ({op}) has {got} inputs, expected {min}..={max}")]
    Arity {
        /// Label of the node.
        node: String,
        /// The op name.
        op: &'static str,
        /// Inputs found.
        got: usize,
        /// Fewest inputs accepted.
        min: usize,
        /// Most inputs accepted.
        max: usize,
    },
    /// An input of a node has an element type the op does not accept.
    #[error("node `{node}` input {input} is {got}, expected {expected}")]
    DType {
        /// Label of the node.
        node: String,
        /// Input position.
        input: usize,
        /// Element type found.
        got: DType,
        /// What was expected.
        expected: &'static str,
    },
    /// An output id is not a node of the graph.
    #[error("output {output} is not a node of the graph")]
    UnknownOutput {
        /// The id given.
        output: NodeId,
    },
    /// A constant's byte length differs from what its shape and type need.
    #[error("constant `{node}` has {got} bytes, its shape {shape} of {dtype} needs {expected}")]
    ConstantLength {
        /// Label of the node.
        node: String,
        /// Its shape.
        shape: Shape,
        /// Its element type.
        dtype: DType,
        /// Bytes needed.
        expected: u64,
        /// Bytes given.
        got: usize,
    },
    /// A node's declared element type is not what its op derives from its inputs.
    #[error("node `{node}` is declared {declared} but its op gives {derived}")]
    OutputDType {
        /// Label of the node.
        node: String,
        /// The node's `dtype`.
        declared: DType,
        /// What the op's dtype rule gives.
        derived: DType,
    },
    /// An input was given values of another element type than declared.
    #[error("input `{node}` is declared {declared} but {got} values were given")]
    InputDType {
        /// Label of the input.
        node: String,
        /// Its declared type.
        declared: DType,
        /// The type given.
        got: DType,
    },
    /// The CPU reference could not evaluate a node.
    #[error("node `{node}` ({op}): {cause}")]
    Reference {
        /// Label of the node.
        node: String,
        /// The op name.
        op: &'static str,
        /// Why.
        cause: super::reference::RefError,
    },
    /// The host evaluator of shape data and the CPU reference disagree on a node's values: a
    /// bug in one of them.
    #[error("node `{node}`: host shape data {host:?} but the reference computes {reference:?}")]
    HostValueMismatch {
        /// Label of the node.
        node: String,
        /// The host evaluator's values.
        host: Vec<i64>,
        /// The reference's values.
        reference: Vec<i64>,
    },
    /// A symbol of an input has no binding for this run.
    #[error("input `{node}` uses symbol `{symbol}` which is not bound")]
    UnboundSymbol {
        /// Label of the input.
        node: String,
        /// The symbol.
        symbol: String,
    },
    /// A given input shape contradicts the declaration or another input.
    #[error("input `{node}` declared as [{declared}] cannot have shape {got}: {reason}")]
    InputShape {
        /// Label of the input.
        node: String,
        /// The declaration, printed.
        declared: String,
        /// The shape given.
        got: Shape,
        /// What contradicts.
        reason: String,
    },
    /// A value was given for a label that is not an input of the graph.
    #[error("`{label}` is not an input of the graph")]
    UnknownInput {
        /// The label given.
        label: String,
    },
    /// An input of the graph was not given.
    #[error("input `{label}` was not given")]
    MissingInput {
        /// Label of the input.
        label: String,
    },
    /// Data of the wrong length was given for a tensor.
    #[error("`{node}` has shape {shape} ({expected} values) but {got} values were given")]
    DataLength {
        /// Label of the node.
        node: String,
        /// Its shape.
        shape: Shape,
        /// Values needed.
        expected: u64,
        /// Values given.
        got: usize,
    },
    /// A node's shape inference failed; the message carries the shapes involved.
    #[error("node `{node}` ({op}): {cause}")]
    Infer {
        /// Label of the node.
        node: String,
        /// The op name.
        op: &'static str,
        /// Why.
        cause: InferError,
    },
}

/// One node: an op, its inputs (outputs of other nodes) and its label.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Unique label, used in every error and debug dump.
    pub label: String,
    /// The operator and its parameters.
    pub op: Op,
    /// The nodes whose outputs this node reads, in the op's input order.
    pub inputs: Vec<NodeId>,
    /// Element type of the output.
    pub dtype: DType,
}

/// A validated graph: nodes, outputs, and a processing order (topological, ties broken by
/// smallest id so graphs built by [`GraphBuilder`] keep their insertion order).
#[derive(Debug, Clone)]
pub struct Graph {
    nodes: Vec<Node>,
    outputs: Vec<NodeId>,
    order: Vec<NodeId>,
    shape_only: Vec<bool>,
}

/// Result of whole-graph shape inference for one run.
#[derive(Debug, Clone, PartialEq)]
pub struct InferredShapes {
    /// Output shape per node, indexed by `NodeId::index()`.
    pub shapes: Vec<Shape>,
    /// Values known on the host per node: integer tensors computed from shapes
    /// ([`Op::ShapeOf`] and what is derived from it with integer constants) — the data that
    /// [`Op::shape_data_inputs`] consume. `None` for every other node.
    pub values: Vec<Option<Vec<i64>>>,
}

impl Graph {
    /// Validates nodes and outputs and computes the processing order.
    ///
    /// # Errors
    /// [`GraphError::DanglingInput`], [`GraphError::Cycle`], [`GraphError::DuplicateLabel`],
    /// [`GraphError::Arity`], [`GraphError::DType`], [`GraphError::ConstantLength`],
    /// [`GraphError::UnknownOutput`].
    pub fn from_nodes(nodes: Vec<Node>, outputs: Vec<NodeId>) -> Result<Graph, GraphError> {
        let n = nodes.len();
        let mut labels = std::collections::HashSet::new();
        for node in &nodes {
            if !labels.insert(node.label.as_str()) {
                return Err(GraphError::DuplicateLabel {
                    label: node.label.clone(),
                });
            }
            for &i in &node.inputs {
                if i.index() >= n {
                    return Err(GraphError::DanglingInput {
                        node: node.label.clone(),
                        input: i,
                    });
                }
            }
        }
        for &o in &outputs {
            if o.index() >= n {
                return Err(GraphError::UnknownOutput { output: o });
            }
        }
        let order = processing_order(&nodes)?;
        for node in &nodes {
            check_node(node, &nodes)?;
        }
        let shape_only = shape_only_nodes(&nodes, &outputs, &order);
        Ok(Graph {
            nodes,
            outputs,
            order,
            shape_only,
        })
    }

    /// All nodes, indexed by `NodeId::index()`.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// One node.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The network outputs, in the order they were marked.
    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// The network inputs ([`Op::Input`] nodes), in id order.
    pub fn inputs(&self) -> Vec<NodeId> {
        self.ids()
            .filter(|&i| matches!(self.node(i).op, Op::Input(_)))
            .collect()
    }

    /// Every node id in id order.
    pub fn ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// Processing order: every node after all of its inputs.
    pub fn order(&self) -> &[NodeId] {
        &self.order
    }

    /// The tensor a node writes (one per node, same number).
    pub fn tensor_of(&self, id: NodeId) -> TensorId {
        TensorId(id.0)
    }

    /// Looks up a node by label.
    pub fn find(&self, label: &str) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| n.label == label)
            .map(|i| NodeId(i as u32))
    }

    /// The nodes reading each node's output, indexed by `NodeId::index()`.
    pub fn users(&self) -> Vec<Vec<NodeId>> {
        let mut users = vec![Vec::new(); self.nodes.len()];
        for id in self.ids() {
            for &i in &self.node(id).inputs {
                // Ids come in order, so a node reading `i` twice finds itself last: a search
                // of the whole list would be quadratic in the users of one node (a `Sum` of
                // one input repeated many times, docs/benchmarks/2026-11-26-hostile-input.md).
                if users[i.index()].last() != Some(&id) {
                    users[i.index()].push(id);
                }
            }
        }
        users
    }

    /// Whether a node's output is only ever used as shape data (a [`Op::ShapeOf`] chain feeding
    /// a reshape's target): its values are computed on the host by [`Graph::infer_shapes`], so
    /// the runtime need not dispatch it nor give it device memory. Network outputs are never
    /// shape-only.
    pub fn is_shape_only(&self, id: NodeId) -> bool {
        self.shape_only[id.index()]
    }

    /// The position of each node in processing order, indexed by `NodeId::index()`.
    pub fn positions(&self) -> Vec<Position> {
        let mut pos = vec![Position(0); self.nodes.len()];
        for (k, &id) in self.order.iter().enumerate() {
            pos[id.index()] = Position(k as u32);
        }
        pos
    }

    /// The node at a position of the processing order.
    pub fn at(&self, p: Position) -> NodeId {
        self.order[p.index()]
    }

    /// The plain DAG of the processing order for the memory-dependency passes: position `k` is
    /// the `k`-th node of [`Graph::order`]; its inputs and the output flags are given as
    /// positions too (map back with [`Graph::at`]). Returns `(inputs, is_output)`.
    pub fn dag_in_order(&self) -> (Vec<Vec<Position>>, Vec<bool>) {
        let pos = self.positions();
        let inputs = self
            .order
            .iter()
            .map(|&id| {
                self.node(id)
                    .inputs
                    .iter()
                    .map(|i| pos[i.index()])
                    .collect()
            })
            .collect();
        let mut is_output = vec![false; self.nodes.len()];
        for o in &self.outputs {
            is_output[pos[o.index()].index()] = true;
        }
        (inputs, is_output)
    }

    /// [`Graph::dag_in_order`] as the planner's [`super::deps::DepGraph`] (positions in
    /// processing order: map back with `order()[k]`).
    pub fn dep_graph(&self) -> super::deps::DepGraph {
        let (inputs, is_output) = self.dag_in_order();
        super::deps::DepGraph { inputs, is_output }
    }
}
