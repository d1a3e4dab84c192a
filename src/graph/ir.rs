//! The graph: nodes, symbolic input dimensions, the builder, processing order and whole-graph
//! shape inference.
//!
//! Every node has exactly one output tensor, so `TensorId(n)` is the output of `NodeId(n)`.

use std::collections::BTreeMap;

use super::ops::{self, BinaryOp, InferError, Op, UnaryOp};
use super::{NodeId, Position, TensorId};
use crate::shape::{DType, Shape};
use crate::tensor::ConstData;

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
                // of the whole list was quadratic in the users of one node (a `Sum` of one
                // input repeated 100k times).
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

    /// Binds the symbols from concrete input shapes, checking them against the declarations
    /// (fixed dimensions equal, one value per symbol across all inputs).
    ///
    /// # Errors
    /// [`GraphError::UnknownInput`], [`GraphError::MissingInput`], [`GraphError::InputShape`].
    pub fn bind(&self, inputs: &[(&str, &Shape)]) -> Result<Bindings, GraphError> {
        let mut b = Bindings::new();
        for &(label, _) in inputs {
            match self.find(label) {
                Some(id) if matches!(self.node(id).op, Op::Input(_)) => {}
                _ => {
                    return Err(GraphError::UnknownInput {
                        label: label.to_string(),
                    })
                }
            }
        }
        for id in self.inputs() {
            let node = self.node(id);
            let Op::Input(ops::Input { dims, .. }) = &node.op else {
                continue;
            };
            let Some(&(_, shape)) = inputs.iter().find(|(l, _)| *l == node.label) else {
                return Err(GraphError::MissingInput {
                    label: node.label.clone(),
                });
            };
            let bad = |reason: String| GraphError::InputShape {
                node: node.label.clone(),
                declared: join_dims(dims),
                got: shape.clone(),
                reason,
            };
            if shape.rank() != dims.len() {
                return Err(bad(format!("rank {} vs {}", shape.rank(), dims.len())));
            }
            for (d, &v) in dims.iter().zip(shape.dims()) {
                match d {
                    Dim::Fixed(n) if *n != v => {
                        return Err(bad(format!("fixed dimension {n} given as {v}")))
                    }
                    Dim::Fixed(_) => {}
                    Dim::Sym(s) => match b.get(s) {
                        Some(&prev) if prev != v => {
                            return Err(bad(format!("symbol `{s}` is {prev} elsewhere, {v} here")))
                        }
                        _ => {
                            b.insert(s.clone(), v);
                        }
                    },
                }
            }
        }
        Ok(b)
    }

    /// The concrete shape of an input for a run.
    ///
    /// # Errors
    /// [`GraphError::UnboundSymbol`].
    pub fn input_shape(&self, id: NodeId, bindings: &Bindings) -> Result<Shape, GraphError> {
        let node = self.node(id);
        let Op::Input(ops::Input { dims, .. }) = &node.op else {
            return Err(GraphError::UnknownInput {
                label: node.label.clone(),
            });
        };
        dims.iter()
            .map(|d| match d {
                Dim::Fixed(n) => Ok(*n),
                Dim::Sym(s) => bindings
                    .get(s)
                    .copied()
                    .ok_or_else(|| GraphError::UnboundSymbol {
                        node: node.label.clone(),
                        symbol: s.clone(),
                    }),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Shape)
    }

    /// Infers one node's output shape from already-inferred input shapes and host values —
    /// what the runtime's `update_shape` calls for a node whose inputs changed. Also computes
    /// the node's host value when it is an integer tensor derived from shapes.
    ///
    /// # Errors
    /// [`GraphError::Infer`] naming the node; [`GraphError::UnboundSymbol`] for inputs.
    pub fn infer_node(
        &self,
        id: NodeId,
        bindings: &Bindings,
        shapes: &[Shape],
        values: &[Option<Vec<i64>>],
    ) -> Result<(Shape, Option<Vec<i64>>), GraphError> {
        let node = self.node(id);
        if matches!(node.op, Op::Input(_)) {
            return Ok((self.input_shape(id, bindings)?, None));
        }
        let in_shapes: Vec<&Shape> = node.inputs.iter().map(|i| &shapes[i.index()]).collect();
        let data: Vec<Option<&[i64]>> = node
            .inputs
            .iter()
            .map(|i| values[i.index()].as_deref())
            .collect();
        let wrap = |source| GraphError::Infer {
            node: node.label.clone(),
            op: node.op.name(),
            cause: source,
        };
        let shape = node.op.infer(&in_shapes, &data).map_err(wrap)?;
        let value = super::shape_data::evaluate(&node.op, node.dtype, &in_shapes, &data, &shape)
            .map_err(wrap)?;
        Ok((shape, value))
    }

    /// Shapes (and host values of shape data) of every node for one run, in processing order.
    ///
    /// # Errors
    /// The first node whose inference fails, as [`GraphError::Infer`] with its label and the
    /// shapes involved; [`GraphError::UnboundSymbol`] for an input whose symbol is not bound.
    pub fn infer_shapes(&self, bindings: &Bindings) -> Result<InferredShapes, GraphError> {
        self.infer_shapes_fed(bindings, &[])
    }

    /// [`Graph::infer_shapes`] with the values of some integer inputs known (a reshape target
    /// fed as an input is shape data): `fed` pairs an input's id with its values.
    ///
    /// # Errors
    /// As [`Graph::infer_shapes`].
    pub fn infer_shapes_fed(
        &self,
        bindings: &Bindings,
        fed: &[(NodeId, Vec<i64>)],
    ) -> Result<InferredShapes, GraphError> {
        let mut shapes = vec![Shape::default(); self.nodes.len()];
        let mut values = vec![None; self.nodes.len()];
        for &id in &self.order {
            let (s, v) = self.infer_node(id, bindings, &shapes, &values)?;
            shapes[id.index()] = s;
            values[id.index()] = fed
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, v)| v.clone())
                .or(v);
        }
        Ok(InferredShapes { shapes, values })
    }
}

fn join_dims(dims: &[Dim]) -> String {
    dims.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Kahn's algorithm, smallest ready id first.
fn processing_order(nodes: &[Node]) -> Result<Vec<NodeId>, GraphError> {
    let n = nodes.len();
    let mut pending = vec![0usize; n];
    let mut users = vec![Vec::new(); n];
    for (i, node) in nodes.iter().enumerate() {
        pending[i] = node.inputs.len();
        for &inp in &node.inputs {
            users[inp.index()].push(i);
        }
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
        .filter(|&i| pending[i] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(NodeId(i as u32));
        for &u in &users[i] {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.push(std::cmp::Reverse(u));
            }
        }
    }
    if order.len() < n {
        let stuck = (0..n).find(|&i| pending[i] > 0).unwrap_or(0);
        return Err(GraphError::Cycle {
            node: nodes[stuck].label.clone(),
        });
    }
    Ok(order)
}

/// Arity, the op's dtype rule, the node's declared type and constant lengths.
fn check_node(node: &Node, nodes: &[Node]) -> Result<(), GraphError> {
    let (min, max) = node.op.arity();
    if node.inputs.len() < min || node.inputs.len() > max {
        return Err(GraphError::Arity {
            node: node.label.clone(),
            op: node.op.name(),
            got: node.inputs.len(),
            min,
            max,
        });
    }
    if let Op::Constant(c) = &node.op {
        let expected = c.shape.size_bytes(c.dtype).map_err(|_| GraphError::Infer {
            node: node.label.clone(),
            op: "constant",
            cause: InferError::Overflow {
                shape: c.shape.to_string(),
            },
        })?;
        if expected != c.data.len() as u64 {
            return Err(GraphError::ConstantLength {
                node: node.label.clone(),
                shape: c.shape.clone(),
                dtype: c.dtype,
                expected,
                got: c.data.len(),
            });
        }
    }
    let dtypes: Vec<DType> = node.inputs.iter().map(|i| nodes[i.index()].dtype).collect();
    let derived = node
        .op
        .output_dtype(&dtypes)
        .map_err(|e| GraphError::DType {
            node: node.label.clone(),
            input: e.input,
            got: dtypes.get(e.input).copied().unwrap_or(DType::F32),
            expected: e.expected,
        })?;
    if derived != node.dtype {
        return Err(GraphError::OutputDType {
            node: node.label.clone(),
            declared: node.dtype,
            derived,
        });
    }
    Ok(())
}

/// Marks nodes whose outputs reach only shape-data inputs. Walks users before producers: a
/// node is shape-only when it is an integer tensor the host can compute, has users, is not a
/// network output, and no *dispatched* (not shape-only) user reads its values.
fn shape_only_nodes(nodes: &[Node], outputs: &[NodeId], order: &[NodeId]) -> Vec<bool> {
    let n = nodes.len();
    let mut read_on_device = vec![false; n];
    for o in outputs {
        read_on_device[o.index()] = true;
    }
    let mut has_users = vec![false; n];
    let mut shape_only = vec![false; n];
    for &id in order.iter().rev() {
        let k = id.index();
        let def = nodes[k].op.def();
        shape_only[k] =
            nodes[k].dtype.is_int() && has_users[k] && !read_on_device[k] && def.host_evaluable();
        for (pos, &i) in nodes[k].inputs.iter().enumerate() {
            has_users[i.index()] = true;
            if def.reads_input(pos) && !shape_only[k] {
                read_on_device[i.index()] = true;
            }
        }
    }
    shape_only
}

/// Builds a [`Graph`] node by node. Every method takes the node's label and returns its id;
/// inputs must be ids returned earlier by the same builder.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    nodes: Vec<Node>,
    outputs: Vec<NodeId>,
}

impl GraphBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a node with an explicit op and inputs; the output dtype follows
    /// [`Op::output_dtype`] (a type the op refuses, or an input that is not a node yet, is
    /// reported by [`GraphBuilder::build`] naming the node).
    pub fn node(
        &mut self,
        label: impl Into<String>,
        op: impl Into<Op>,
        inputs: &[NodeId],
    ) -> NodeId {
        let op = op.into();
        let dts: Vec<DType> = inputs
            .iter()
            .map(|i| self.nodes.get(i.index()).map_or(DType::F32, |n| n.dtype))
            .collect();
        let dtype = op.output_dtype(&dts).unwrap_or(DType::F32);
        self.push(label.into(), op, inputs.to_vec(), dtype)
    }

    fn push(&mut self, label: String, op: Op, inputs: Vec<NodeId>, dtype: DType) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            label,
            op,
            inputs,
            dtype,
        });
        id
    }

    /// A network input with declared (possibly symbolic) dimensions.
    pub fn input(&mut self, label: impl Into<String>, dims: &[Dim], dtype: DType) -> NodeId {
        self.node(label, ops::Input::new(dims.to_vec(), dtype), &[])
    }

    /// A constant of any type from its little-endian bytes, possibly a range of a shared
    /// backing (a model file): nothing is copied or expanded. The length is checked by
    /// [`GraphBuilder::build`].
    pub fn constant_bytes(
        &mut self,
        label: impl Into<String>,
        shape: Shape,
        dtype: DType,
        data: ConstData,
    ) -> NodeId {
        self.node(label, ops::Constant { shape, dtype, data }, &[])
    }

    /// An f32 constant (weights); `data` is row-major, `shape.num_elements()` values (checked by
    /// [`GraphBuilder::build`]).
    pub fn constant(&mut self, label: impl Into<String>, shape: Shape, data: Vec<f32>) -> NodeId {
        self.constant_bytes(label, shape, DType::F32, ConstData::from_f32(&data))
    }

    /// An i32 constant (a reshape target, ids), stored as its real 32-bit integers.
    pub fn constant_i32(&mut self, label: impl Into<String>, shape: Shape, data: &[i32]) -> NodeId {
        self.constant_bytes(label, shape, DType::I32, ConstData::from_i32(data))
    }

    /// `a @ b` (batched; `transpose_b`: b is `[..., N, K]`).
    pub fn matmul(
        &mut self,
        label: impl Into<String>,
        a: NodeId,
        b: NodeId,
        transpose_b: bool,
    ) -> NodeId {
        self.node(label, ops::MatMul { transpose_b }, &[a, b])
    }

    /// Elementwise binary op with broadcasting.
    pub fn binary(
        &mut self,
        label: impl Into<String>,
        op: BinaryOp,
        a: NodeId,
        b: NodeId,
    ) -> NodeId {
        self.node(label, op, &[a, b])
    }

    /// `a + b` with broadcasting.
    pub fn add(&mut self, label: impl Into<String>, a: NodeId, b: NodeId) -> NodeId {
        self.binary(label, BinaryOp::Add, a, b)
    }

    /// `a - b` with broadcasting.
    pub fn sub(&mut self, label: impl Into<String>, a: NodeId, b: NodeId) -> NodeId {
        self.binary(label, BinaryOp::Sub, a, b)
    }

    /// `a * b` with broadcasting.
    pub fn mul(&mut self, label: impl Into<String>, a: NodeId, b: NodeId) -> NodeId {
        self.binary(label, BinaryOp::Mul, a, b)
    }

    /// `a / b` with broadcasting.
    pub fn div(&mut self, label: impl Into<String>, a: NodeId, b: NodeId) -> NodeId {
        self.binary(label, BinaryOp::Div, a, b)
    }

    /// Elementwise unary op.
    pub fn unary(&mut self, label: impl Into<String>, op: UnaryOp, x: NodeId) -> NodeId {
        self.node(label, op, &[x])
    }

    /// `max(x, 0)`.
    pub fn relu(&mut self, label: impl Into<String>, x: NodeId) -> NodeId {
        self.unary(label, UnaryOp::Relu, x)
    }

    /// GELU, tanh form.
    pub fn gelu(&mut self, label: impl Into<String>, x: NodeId) -> NodeId {
        self.unary(label, UnaryOp::Gelu, x)
    }

    /// `x * sigmoid(x)`.
    pub fn silu(&mut self, label: impl Into<String>, x: NodeId) -> NodeId {
        self.unary(label, UnaryOp::Silu, x)
    }

    /// `exp(x)`.
    pub fn exp(&mut self, label: impl Into<String>, x: NodeId) -> NodeId {
        self.unary(label, UnaryOp::Exp, x)
    }

    /// Softmax over the last axis.
    pub fn softmax(&mut self, label: impl Into<String>, x: NodeId) -> NodeId {
        self.node(label, ops::Softmax::LAST, &[x])
    }

    /// Layer norm over the last axis.
    pub fn layer_norm(
        &mut self,
        label: impl Into<String>,
        x: NodeId,
        gamma: NodeId,
        beta: NodeId,
        eps: f32,
    ) -> NodeId {
        self.node(label, ops::LayerNorm { eps, axis: -1 }, &[x, gamma, beta])
    }

    /// RMS norm over the last axis.
    pub fn rms_norm(
        &mut self,
        label: impl Into<String>,
        x: NodeId,
        gamma: NodeId,
        eps: f32,
    ) -> NodeId {
        self.node(label, ops::RmsNorm { eps, axis: -1 }, &[x, gamma])
    }

    /// Reshape to a static target (`0` copies, `-1` infers).
    pub fn reshape(&mut self, label: impl Into<String>, x: NodeId, target: &[i64]) -> NodeId {
        self.node(
            label,
            ops::Reshape {
                target: target.to_vec(),
            },
            &[x],
        )
    }

    /// Reshape to the shape held in an integer tensor (a shape-inference data dependency).
    pub fn reshape_to(&mut self, label: impl Into<String>, x: NodeId, shape: NodeId) -> NodeId {
        self.node(label, ops::ReshapeTo::default(), &[x, shape])
    }

    /// Permute dimensions.
    pub fn transpose(&mut self, label: impl Into<String>, x: NodeId, perm: &[usize]) -> NodeId {
        self.node(
            label,
            ops::Transpose {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    /// Concatenate along `axis`.
    pub fn concat(&mut self, label: impl Into<String>, xs: &[NodeId], axis: usize) -> NodeId {
        self.node(label, ops::Concat { axis: axis as i64 }, xs)
    }

    /// Slice `axes` with `starts`/`ends`/`steps` (ONNX rules).
    pub fn slice(
        &mut self,
        label: impl Into<String>,
        x: NodeId,
        axes: &[usize],
        starts: &[i64],
        ends: &[i64],
        steps: &[i64],
    ) -> NodeId {
        self.node(
            label,
            ops::Slice {
                axes: axes.iter().map(|&a| a as i64).collect(),
                starts: starts.to_vec(),
                ends: ends.to_vec(),
                steps: steps.to_vec(),
            },
            &[x],
        )
    }

    /// Embedding lookup: rows of `table` picked by integer `ids`.
    pub fn gather(&mut self, label: impl Into<String>, table: NodeId, ids: NodeId) -> NodeId {
        self.node(label, ops::Gather::default(), &[table, ids])
    }

    /// `cond ? a : b` with broadcasting.
    pub fn where_(
        &mut self,
        label: impl Into<String>,
        cond: NodeId,
        a: NodeId,
        b: NodeId,
    ) -> NodeId {
        self.node(label, ops::Where, &[cond, a, b])
    }

    /// Causal mask over scores `[..., S, P + S]`.
    pub fn causal_mask(&mut self, label: impl Into<String>, scores: NodeId) -> NodeId {
        self.node(label, ops::CausalMask, &[scores])
    }

    /// The shape of `x` as an i32 tensor.
    pub fn shape_of(&mut self, label: impl Into<String>, x: NodeId) -> NodeId {
        self.node(label, ops::ShapeOf::default(), &[x])
    }

    /// Marks a node as a network output.
    pub fn output(&mut self, id: NodeId) -> &mut Self {
        self.outputs.push(id);
        self
    }

    /// Validates and finishes the graph.
    ///
    /// # Errors
    /// As [`Graph::from_nodes`].
    pub fn build(self) -> Result<Graph, GraphError> {
        Graph::from_nodes(self.nodes, self.outputs)
    }
}
