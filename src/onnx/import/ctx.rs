//! The importer's context ([`Ctx`]): what every converter gets to look values up, add nodes
//! (their dtype rule checked, their shape rule run on the two probe bindings of the symbols)
//! and read attributes.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::{dtype_of, ImportError};
use crate::graph::ops::{InferError, Input, Op};
use crate::graph::{shape_data, Dim, Node, NodeId};
use crate::onnx::file::{AttributeValue, Initializer, OnnxDim, OnnxFile, OnnxNode, ValueType};
use crate::onnx::tensor::HostTensor;
use crate::shape::{DType, Shape};
use crate::tensor::ConstData;

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
    pub(super) version: i64,
    pub(super) nodes: Vec<Node>,
    known: Vec<Known>,
    pub(super) values: HashMap<String, NodeId>,
    pub(super) labels: HashSet<String>,
    /// Every value name of the model: generated labels avoid them.
    names: HashSet<&'m str>,
    pub(super) initializers: HashMap<&'m str, &'m Initializer>,
    /// Probe bindings of the symbols.
    probes: [HashMap<String, u64>; 2],
}

impl<'m> Ctx<'m> {
    pub(super) fn new(model: &'m OnnxFile, opset: i64) -> Ctx<'m> {
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

    pub(super) fn graph_input(
        &mut self,
        name: &str,
        ty: Option<&ValueType>,
    ) -> Result<NodeId, ImportError> {
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

    pub(super) fn initializer_constant(
        &mut self,
        init: &Initializer,
    ) -> Result<NodeId, ImportError> {
        let (dtype, t) = initializer_tensor(init)?;
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
    pub(super) fn fresh_label(&self, hint: &str) -> String {
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

    pub(super) fn add_labelled(
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

/// An initializer's dynrt element type and tensor.
///
/// # Errors
/// [`ImportError::UnsupportedDType`] for a type dynrt does not hold, [`ImportError::Input`]
/// when its external data was not read.
pub(super) fn initializer_tensor(init: &Initializer) -> Result<(DType, &HostTensor), ImportError> {
    let dtype = dtype_of(init.dtype).ok_or_else(|| ImportError::UnsupportedDType {
        value: init.name.clone(),
        dtype: init.dtype,
    })?;
    let t = init.tensor().ok_or_else(|| ImportError::Input {
        input: init.name.clone(),
        reason: "external data was not read (LoadOptions::read_external is off)".into(),
    })?;
    Ok((dtype, t))
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
