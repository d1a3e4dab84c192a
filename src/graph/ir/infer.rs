//! Shape inference over a whole graph or one node: binding the symbols from the input
//! shapes, then every node's shape rule (and host value) in processing order.

use super::{Bindings, Dim, Graph, GraphError, InferredShapes};
use crate::graph::ops::{self, Op};
use crate::graph::NodeId;
use crate::shape::Shape;

impl Graph {
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
        let value =
            crate::graph::shape_data::evaluate(&node.op, node.dtype, &in_shapes, &data, &shape)
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
