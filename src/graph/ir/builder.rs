//! [`GraphBuilder`]: a graph built node by node, with helpers for the common ops.

use super::{Dim, Graph, GraphError, Node};
use crate::graph::ops::{self, BinaryOp, Op, UnaryOp};
use crate::graph::NodeId;
use crate::shape::{DType, Shape};
use crate::tensor::ConstData;

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

    /// A builder that goes on from `graph`: its nodes, and none of its outputs (the caller
    /// names the outputs of the larger graph, e.g. a pooling appended to an imported
    /// encoder).
    pub fn extend(graph: Graph) -> Self {
        GraphBuilder {
            nodes: graph.nodes,
            outputs: Vec::new(),
        }
    }

    /// The element type of node `id` (`None` for an id this builder has not returned).
    pub fn dtype_of(&self, id: NodeId) -> Option<DType> {
        self.nodes.get(id.index()).map(|n| n.dtype)
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
