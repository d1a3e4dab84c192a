//! The checks [`Graph::from_nodes`](super::Graph::from_nodes) makes and what it computes once: processing order, each
//! node's arity and types, the shape-only nodes.

use super::{GraphError, Node};
use crate::graph::ops::{InferError, Op};
use crate::graph::NodeId;
use crate::shape::DType;

/// Kahn's algorithm, smallest ready id first.
pub(super) fn processing_order(nodes: &[Node]) -> Result<Vec<NodeId>, GraphError> {
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
pub(super) fn check_node(node: &Node, nodes: &[Node]) -> Result<(), GraphError> {
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
pub(super) fn shape_only_nodes(nodes: &[Node], outputs: &[NodeId], order: &[NodeId]) -> Vec<bool> {
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
