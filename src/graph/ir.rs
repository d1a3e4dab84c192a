//! The graph: nodes, symbolic input dimensions, the builder, processing order and whole-graph
//! shape inference.
//!
//! Every node has exactly one output tensor, so `TensorId(n)` is the output of `NodeId(n)`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::ops::{movement, BinaryOp, InferError, Op, UnaryOp};
use super::{NodeId, TensorId};
use crate::shape::{DType, Shape};

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
    /// A constant's data length differs from its shape's element count.
    #[error("constant `{node}` has {got} values, its shape {shape} needs {expected}")]
    ConstantLength {
        /// Label of the node.
        node: String,
        /// Its shape.
        shape: Shape,
        /// Values needed.
        expected: u64,
        /// Values given.
        got: usize,
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
    #[error("node `{node}` ({op}): {source}")]
    Infer {
        /// Label of the node.
        node: String,
        /// The op name.
        op: &'static str,
        /// Why.
        source: InferError,
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
            .filter(|&i| matches!(self.node(i).op, Op::Input { .. }))
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
                if !users[i.index()].contains(&id) {
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

    /// The plain DAG of the processing order for the memory-dependency passes: position `k` is
    /// the `k`-th node of [`Graph::order`]; its inputs and the output flags are given as
    /// positions too (`NodeId(k)` = `order()[k]`). Returns `(inputs, is_output)`.
    pub fn dag_in_order(&self) -> (Vec<Vec<NodeId>>, Vec<bool>) {
        let mut pos = vec![0u32; self.nodes.len()];
        for (k, &id) in self.order.iter().enumerate() {
            pos[id.index()] = k as u32;
        }
        let inputs = self
            .order
            .iter()
            .map(|&id| {
                self.node(id)
                    .inputs
                    .iter()
                    .map(|i| NodeId(pos[i.index()]))
                    .collect()
            })
            .collect();
        let mut is_output = vec![false; self.nodes.len()];
        for o in &self.outputs {
            is_output[pos[o.index()] as usize] = true;
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
                Some(id) if matches!(self.node(id).op, Op::Input { .. }) => {}
                _ => {
                    return Err(GraphError::UnknownInput {
                        label: label.to_string(),
                    })
                }
            }
        }
        for id in self.inputs() {
            let node = self.node(id);
            let Op::Input { dims } = &node.op else {
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
        let Op::Input { dims } = &node.op else {
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
        if matches!(node.op, Op::Input { .. }) {
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
            source,
        };
        let shape = node.op.infer(&in_shapes, &data).map_err(wrap)?;
        let value = host_value(node, &in_shapes, &data, &shape).map_err(wrap)?;
        Ok((shape, value))
    }

    /// Shapes (and host values of shape data) of every node for one run, in processing order.
    ///
    /// # Errors
    /// The first node whose inference fails, as [`GraphError::Infer`] with its label and the
    /// shapes involved; [`GraphError::UnboundSymbol`] for an input whose symbol is not bound.
    pub fn infer_shapes(&self, bindings: &Bindings) -> Result<InferredShapes, GraphError> {
        let mut shapes = vec![Shape::default(); self.nodes.len()];
        let mut values = vec![None; self.nodes.len()];
        for &id in &self.order {
            let (s, v) = self.infer_node(id, bindings, &shapes, &values)?;
            shapes[id.index()] = s;
            values[id.index()] = v;
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

fn is_int(d: DType) -> bool {
    matches!(d, DType::I32 | DType::U32)
}

/// Per-op arity and element-type checks.
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
    if let Op::Constant { shape, data } = &node.op {
        let expected = shape.num_elements().map_err(|_| GraphError::Infer {
            node: node.label.clone(),
            op: "constant",
            source: InferError::Overflow {
                shape: shape.to_string(),
            },
        })?;
        if expected != data.len() as u64 {
            return Err(GraphError::ConstantLength {
                node: node.label.clone(),
                shape: shape.clone(),
                expected,
                got: data.len(),
            });
        }
    }
    let dt = |k: usize| nodes[node.inputs[k].index()].dtype;
    let bad = |input: usize, expected: &'static str| GraphError::DType {
        node: node.label.clone(),
        input,
        got: dt(input),
        expected,
    };
    match &node.op {
        Op::Input { .. } | Op::Constant { .. } | Op::ShapeOf => {}
        // Data movement works on any 32-bit element (shape tensors are i32).
        Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. } | Op::Concat { .. } => {
            for k in 0..node.inputs.len() {
                if dt(k).bits() != 32 {
                    return Err(bad(k, "a 32-bit type"));
                }
                if dt(k) != dt(0) {
                    return Err(bad(k, "the same type as input 0"));
                }
            }
        }
        Op::ReshapeTo => {
            if dt(0).bits() != 32 {
                return Err(bad(0, "a 32-bit type"));
            }
            if !is_int(dt(1)) {
                return Err(bad(1, "i32 or u32 (a shape tensor)"));
            }
        }
        Op::Gather => {
            if dt(0).bits() != 32 {
                return Err(bad(0, "a 32-bit type"));
            }
            if !is_int(dt(1)) {
                return Err(bad(1, "i32 or u32 (ids)"));
            }
        }
        Op::Where => {
            if dt(0).bits() != 32 {
                return Err(bad(0, "a 32-bit condition"));
            }
            for k in 1..3 {
                if dt(k) != DType::F32 {
                    return Err(bad(k, "f32"));
                }
            }
        }
        Op::Binary(_) => {
            // Integer arithmetic is allowed on the host path for shape data only.
            if dt(0) != dt(1) || !(dt(0) == DType::F32 || is_int(dt(0))) {
                return Err(bad(1, "f32 on both sides (or the same integer type)"));
            }
        }
        _ => {
            for k in 0..node.inputs.len() {
                if dt(k) != DType::F32 {
                    return Err(bad(k, "f32"));
                }
            }
        }
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
        shape_only[k] = is_int(nodes[k].dtype)
            && has_users[k]
            && !read_on_device[k]
            && host_computable(&nodes[k].op);
        let node = &nodes[k];
        let shape_inputs = node.op.shape_data_inputs();
        for (pos, &i) in node.inputs.iter().enumerate() {
            has_users[i.index()] = true;
            // ShapeOf reads only its input's shape, never its values.
            let reads_values = !shape_inputs.contains(&pos) && !matches!(node.op, Op::ShapeOf);
            if reads_values && !shape_only[k] {
                read_on_device[i.index()] = true;
            }
        }
    }
    shape_only
}

fn host_computable(op: &Op) -> bool {
    matches!(
        op,
        Op::ShapeOf
            | Op::Constant { .. }
            | Op::Concat { .. }
            | Op::Slice { .. }
            | Op::Gather
            | Op::Reshape { .. }
            | Op::Binary(_)
    )
}

/// The host value of an integer node derived from shapes and integer constants, if computable.
fn host_value(
    node: &Node,
    in_shapes: &[&Shape],
    data: &[Option<&[i64]>],
    out: &Shape,
) -> Result<Option<Vec<i64>>, InferError> {
    if !is_int(node.dtype) || !host_computable(&node.op) {
        return Ok(None);
    }
    if let Op::ShapeOf = node.op {
        return Ok(Some(
            in_shapes[0].dims().iter().map(|&d| d as i64).collect(),
        ));
    }
    if let Op::Constant { data, .. } = &node.op {
        return Ok(Some(data.iter().map(|&v| v as i64).collect()));
    }
    // Shape data is small; refuse to compute big integer tensors on the host.
    if out.checked_num_elements().is_none_or(|n| n > 4096) {
        return Ok(None);
    }
    let Some(vals) = data.iter().copied().collect::<Option<Vec<&[i64]>>>() else {
        return Ok(None);
    };
    let v = match &node.op {
        Op::Concat { axis } => super::reference::concat(&vals, in_shapes, *axis),
        Op::Slice {
            axes,
            starts,
            ends,
            steps,
        } => {
            let r = movement::slice_ranges(in_shapes[0], axes, starts, ends, steps)?;
            super::reference::slice(vals[0], in_shapes[0], &r)
        }
        Op::Gather => super::reference::gather(vals[0], in_shapes[0], vals[1], in_shapes[1]),
        Op::Reshape { .. } => vals[0].to_vec(),
        Op::Binary(b) => super::reference::broadcast_binary(
            vals[0],
            in_shapes[0],
            vals[1],
            in_shapes[1],
            out,
            |x, y| match b {
                BinaryOp::Add => x.wrapping_add(y),
                BinaryOp::Sub => x.wrapping_sub(y),
                BinaryOp::Mul => x.wrapping_mul(y),
                BinaryOp::Div => x.checked_div(y).unwrap_or(0),
            },
        ),
        _ => return Ok(None),
    };
    Ok(Some(v))
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

    /// Adds a node with an explicit op and inputs; the output dtype follows [`Op::output_dtype`]
    /// (inputs that are not nodes yet count as f32 and are reported by [`GraphBuilder::build`]).
    pub fn add(&mut self, label: impl Into<String>, op: Op, inputs: &[NodeId]) -> NodeId {
        let dts: Vec<DType> = inputs
            .iter()
            .map(|i| self.nodes.get(i.index()).map_or(DType::F32, |n| n.dtype))
            .collect();
        let dtype = op.output_dtype(&dts);
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
        self.push(
            label.into(),
            Op::Input {
                dims: dims.to_vec(),
            },
            vec![],
            dtype,
        )
    }

    /// An f32 constant (weights); `data` is row-major, `shape.num_elements()` values (checked by
    /// [`GraphBuilder::build`]).
    pub fn constant(&mut self, label: impl Into<String>, shape: Shape, data: Vec<f32>) -> NodeId {
        self.push(
            label.into(),
            Op::Constant {
                shape,
                data: Arc::new(data),
            },
            vec![],
            DType::F32,
        )
    }

    /// An integer constant (i32), e.g. a reshape target or ids; values are carried as f32 and
    /// must be exact (|v| < 2^24).
    pub fn constant_i32(&mut self, label: impl Into<String>, shape: Shape, data: &[i32]) -> NodeId {
        self.push(
            label.into(),
            Op::Constant {
                shape,
                data: Arc::new(data.iter().map(|&v| v as f32).collect()),
            },
            vec![],
            DType::I32,
        )
    }

    /// `a @ b` (batched; `transpose_b`: b is `[..., N, K]`).
    pub fn matmul(
        &mut self,
        label: impl Into<String>,
        a: NodeId,
        b: NodeId,
        transpose_b: bool,
    ) -> NodeId {
        self.add(label, Op::MatMul { transpose_b }, &[a, b])
    }

    /// Elementwise binary op with broadcasting.
    pub fn binary(
        &mut self,
        label: impl Into<String>,
        op: BinaryOp,
        a: NodeId,
        b: NodeId,
    ) -> NodeId {
        self.add(label, Op::Binary(op), &[a, b])
    }

    /// `a + b` with broadcasting.
    pub fn add_(&mut self, label: impl Into<String>, a: NodeId, b: NodeId) -> NodeId {
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
        self.add(label, Op::Unary(op), &[x])
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
        self.add(label, Op::Softmax, &[x])
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
        self.add(label, Op::LayerNorm { eps }, &[x, gamma, beta])
    }

    /// RMS norm over the last axis.
    pub fn rms_norm(
        &mut self,
        label: impl Into<String>,
        x: NodeId,
        gamma: NodeId,
        eps: f32,
    ) -> NodeId {
        self.add(label, Op::RmsNorm { eps }, &[x, gamma])
    }

    /// Reshape to a static target (`0` copies, `-1` infers).
    pub fn reshape(&mut self, label: impl Into<String>, x: NodeId, target: &[i64]) -> NodeId {
        self.add(
            label,
            Op::Reshape {
                target: target.to_vec(),
            },
            &[x],
        )
    }

    /// Reshape to the shape held in an integer tensor (a shape-inference data dependency).
    pub fn reshape_to(&mut self, label: impl Into<String>, x: NodeId, shape: NodeId) -> NodeId {
        self.add(label, Op::ReshapeTo, &[x, shape])
    }

    /// Permute dimensions.
    pub fn transpose(&mut self, label: impl Into<String>, x: NodeId, perm: &[usize]) -> NodeId {
        self.add(
            label,
            Op::Transpose {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    /// Concatenate along `axis`.
    pub fn concat(&mut self, label: impl Into<String>, xs: &[NodeId], axis: usize) -> NodeId {
        self.add(label, Op::Concat { axis }, xs)
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
        self.add(
            label,
            Op::Slice {
                axes: axes.to_vec(),
                starts: starts.to_vec(),
                ends: ends.to_vec(),
                steps: steps.to_vec(),
            },
            &[x],
        )
    }

    /// Embedding lookup: rows of `table` picked by integer `ids`.
    pub fn gather(&mut self, label: impl Into<String>, table: NodeId, ids: NodeId) -> NodeId {
        self.add(label, Op::Gather, &[table, ids])
    }

    /// `cond ? a : b` with broadcasting.
    pub fn where_(
        &mut self,
        label: impl Into<String>,
        cond: NodeId,
        a: NodeId,
        b: NodeId,
    ) -> NodeId {
        self.add(label, Op::Where, &[cond, a, b])
    }

    /// Causal mask over scores `[..., S, P + S]`.
    pub fn causal_mask(&mut self, label: impl Into<String>, scores: NodeId) -> NodeId {
        self.add(label, Op::CausalMask, &[scores])
    }

    /// The shape of `x` as an i32 tensor.
    pub fn shape_of(&mut self, label: impl Into<String>, x: NodeId) -> NodeId {
        self.add(label, Op::ShapeOf, &[x])
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
