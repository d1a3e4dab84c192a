//! The protobuf messages into an [`OnnxGraph`], checked on the way: names defined once and
//! before use, opsets imported for every node's domain, attributes typed, initializers of the
//! right size (external data checked or read), subgraphs in their enclosing scope.

use std::collections::HashMap;

use super::graph::node_label;
use super::{
    normalize_domain, Attribute, AttributeValue, DataLocation, Initializer, LoadOptions, OnnxDim,
    OnnxGraph, OnnxNode, SparseInitializer, SparseTensor, TensorType, ValueInfo, ValueType,
};
use crate::onnx::error::OnnxError;
use crate::onnx::external::{ExternalData, ExternalRef};
use crate::onnx::proto::{self, attribute_type as at};
use crate::onnx::tensor::{self, HostTensor, TensorDType, TensorError};

/// Decodes and checks the main graph of a model whose opset imports name `domains`.
pub(super) fn main_graph(
    g: &proto::GraphProto,
    external: &dyn ExternalData,
    options: &LoadOptions,
    domains: Vec<String>,
) -> Result<OnnxGraph, OnnxError> {
    let ctx = Context {
        external,
        options,
        domains,
    };
    ctx.graph(g, None)
}

/// Value names visible in a graph: its own (with what defined them) and its enclosing graphs'.
struct Scope<'a> {
    names: HashMap<String, String>,
    parent: Option<&'a Scope<'a>>,
}

impl Scope<'_> {
    fn visible(&self, name: &str) -> bool {
        self.names.contains_key(name) || self.parent.is_some_and(|p| p.visible(name))
    }
}

struct Context<'a> {
    external: &'a dyn ExternalData,
    options: &'a LoadOptions,
    domains: Vec<String>,
}

impl Context<'_> {
    fn graph(
        &self,
        g: &proto::GraphProto,
        parent: Option<&Scope<'_>>,
    ) -> Result<OnnxGraph, OnnxError> {
        let mut scope = Scope {
            names: HashMap::new(),
            parent,
        };
        let define = |scope: &mut Scope<'_>, name: &str, by: String| -> Result<(), OnnxError> {
            if let Some(first) = scope.names.get(name) {
                return Err(OnnxError::DuplicateName {
                    name: name.to_string(),
                    graph: g.name.clone(),
                    first: first.clone(),
                    second: by,
                });
            }
            scope.names.insert(name.to_string(), by);
            Ok(())
        };
        let mut initializers = Vec::with_capacity(g.initializer.len());
        for (index, t) in g.initializer.iter().enumerate() {
            if t.name.is_empty() {
                return Err(OnnxError::EmptyName {
                    kind: "initializer",
                    index,
                    graph: g.name.clone(),
                });
            }
            define(&mut scope, &t.name, "an initializer".to_string())?;
            initializers.push(self.initializer(t, &t.name)?);
        }
        let mut sparse_initializers = Vec::with_capacity(g.sparse_initializer.len());
        for (index, s) in g.sparse_initializer.iter().enumerate() {
            let name = s
                .values
                .as_ref()
                .map(|v| v.name.clone())
                .unwrap_or_default();
            if name.is_empty() {
                return Err(OnnxError::EmptyName {
                    kind: "sparse initializer",
                    index,
                    graph: g.name.clone(),
                });
            }
            define(&mut scope, &name, "a sparse initializer".to_string())?;
            let tensor = self.sparse(s, &name)?;
            sparse_initializers.push(SparseInitializer { name, tensor });
        }
        let mut inputs = Vec::with_capacity(g.input.len());
        for (index, v) in g.input.iter().enumerate() {
            let info = value_info(v, "input", index, &g.name)?;
            // An input that is also an initializer is that initializer's overridable default.
            let is_init = scope
                .names
                .get(&info.name)
                .is_some_and(|by| by == "an initializer" || by == "a sparse initializer");
            if !is_init {
                define(&mut scope, &info.name, "a graph input".to_string())?;
            }
            inputs.push(info);
        }
        let mut nodes = Vec::with_capacity(g.node.len());
        for (index, n) in g.node.iter().enumerate() {
            let label = node_label(&n.name, &n.op_type, index);
            let domain = normalize_domain(&n.domain);
            if !self.domains.contains(&domain) {
                return Err(OnnxError::MissingOpset {
                    node: label,
                    op_type: n.op_type.clone(),
                    domain,
                });
            }
            for input in n.input.iter().filter(|i| !i.is_empty()) {
                if !scope.visible(input) {
                    return Err(OnnxError::UndefinedInput {
                        node: label,
                        op_type: n.op_type.clone(),
                        input: input.clone(),
                    });
                }
            }
            let mut attributes: Vec<Attribute> = Vec::with_capacity(n.attribute.len());
            for a in &n.attribute {
                let attr = self.attribute(a, &label, &scope)?;
                if attributes.iter().any(|b| b.name == attr.name) {
                    return Err(OnnxError::Attribute {
                        node: label,
                        attribute: attr.name,
                        reason: "appears twice".to_string(),
                    });
                }
                attributes.push(attr);
            }
            for output in n.output.iter().filter(|o| !o.is_empty()) {
                define(&mut scope, output, format!("node `{label}`"))?;
            }
            let node = OnnxNode {
                name: n.name.clone(),
                op_type: n.op_type.clone(),
                domain,
                inputs: n.input.clone(),
                outputs: n.output.clone(),
                attributes,
                index,
            };
            if node.op_type == "Constant" && node.domain.is_empty() {
                node.constant_value()?;
            }
            nodes.push(node);
        }
        let mut outputs = Vec::with_capacity(g.output.len());
        for (index, v) in g.output.iter().enumerate() {
            let info = value_info(v, "output", index, &g.name)?;
            if !scope.visible(&info.name) {
                return Err(OnnxError::UndefinedOutput {
                    output: info.name,
                    graph: g.name.clone(),
                });
            }
            outputs.push(info);
        }
        let value_info = g
            .value_info
            .iter()
            .enumerate()
            .map(|(i, v)| value_info(v, "value_info", i, &g.name))
            .collect::<Result<_, _>>()?;
        Ok(OnnxGraph {
            name: g.name.clone(),
            inputs,
            outputs,
            value_info,
            initializers,
            sparse_initializers,
            nodes,
        })
    }

    /// An initializer (or tensor attribute): inline data decoded, external data read or
    /// checked.
    fn initializer(&self, t: &proto::TensorProto, name: &str) -> Result<Initializer, OnnxError> {
        let tensor_err = |cause| OnnxError::Tensor {
            tensor: name.to_string(),
            cause,
        };
        if t.data_location != proto::data_location::EXTERNAL {
            let tensor = tensor::decode_inline(t).map_err(tensor_err)?;
            return Ok(Initializer {
                name: name.to_string(),
                dtype: tensor.dtype(),
                dims: tensor.dims().to_vec(),
                size_bytes: tensor.size_bytes(),
                location: DataLocation::Inline,
                tensor: Some(tensor),
            });
        }
        if t.segment.is_some() {
            return Err(tensor_err(TensorError::Segmented));
        }
        let dtype = TensorDType::from_onnx(t.data_type).map_err(tensor_err)?;
        let dims = tensor::dims_from_onnx(&t.dims).map_err(tensor_err)?;
        let (_, expected) =
            HostTensor::expected_bytes(dtype, &dims, "external data").map_err(tensor_err)?;
        let ext_err = |cause| OnnxError::External {
            initializer: name.to_string(),
            cause,
        };
        let r = ExternalRef::from_entries(
            t.external_data
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str())),
        )
        .map_err(ext_err)?;
        // Check the length before reading, so a wrong model does not read a large range.
        let length = self.external.check(&r).map_err(ext_err)?;
        if length != expected {
            return Err(tensor_err(TensorError::DataLength {
                dtype,
                dims,
                field: "external data",
                expected,
                actual: length,
                unit: "bytes",
            }));
        }
        let tensor = if self.options.read_external {
            let bytes = self.external.read(&r).map_err(ext_err)?;
            Some(
                HostTensor::from_bytes_field(dtype, dims.clone(), bytes, "external data")
                    .map_err(tensor_err)?,
            )
        } else {
            None
        };
        Ok(Initializer {
            name: name.to_string(),
            dtype,
            dims,
            size_bytes: expected,
            location: DataLocation::External(r),
            tensor,
        })
    }

    fn tensor(&self, t: &proto::TensorProto, name: &str) -> Result<HostTensor, OnnxError> {
        let init = self.initializer(t, name)?;
        // Attribute tensors are values the graph needs: read them even in check-only mode.
        match init.tensor {
            Some(t) => Ok(t),
            None => {
                let DataLocation::External(r) = &init.location else {
                    unreachable!("inline tensors are always decoded")
                };
                let bytes = self.external.read(r).map_err(|cause| OnnxError::External {
                    initializer: name.to_string(),
                    cause,
                })?;
                HostTensor::from_bytes_field(init.dtype, init.dims, bytes, "external data").map_err(
                    |cause| OnnxError::Tensor {
                        tensor: name.to_string(),
                        cause,
                    },
                )
            }
        }
    }

    fn sparse(&self, s: &proto::SparseTensorProto, name: &str) -> Result<SparseTensor, OnnxError> {
        let bad = |reason: String| OnnxError::Sparse {
            tensor: name.to_string(),
            reason,
        };
        let dims = tensor::dims_from_onnx(&s.dims).map_err(|cause| OnnxError::Tensor {
            tensor: name.to_string(),
            cause,
        })?;
        let values = match &s.values {
            Some(v) => self.tensor(v, name)?,
            None => return Err(bad("sparse tensor without values".to_string())),
        };
        let indices_t = match &s.indices {
            Some(i) => self.tensor(i, name)?,
            None => return Err(bad("sparse tensor without indices".to_string())),
        };
        SparseTensor::checked(dims, values, &indices_t).map_err(bad)
    }

    fn value_type(&self, t: &proto::TypeProto, value: &str) -> Result<ValueType, OnnxError> {
        convert_type(t, value)
    }

    fn attribute(
        &self,
        a: &proto::AttributeProto,
        node: &str,
        scope: &Scope<'_>,
    ) -> Result<Attribute, OnnxError> {
        let err = |reason: String| OnnxError::Attribute {
            node: node.to_string(),
            attribute: a.name.clone(),
            reason,
        };
        if a.name.is_empty() {
            return Err(err("has no name".to_string()));
        }
        if !a.ref_attr_name.is_empty() {
            return Err(err(format!(
                "refers to function attribute `{}`, which only a function body may do",
                a.ref_attr_name
            )));
        }
        let mut ty = a.r#type;
        if ty == at::UNDEFINED {
            // Old writers leave `type` unset: take the one field that is present.
            let present: Vec<i32> = [
                (a.f.is_some(), at::FLOAT),
                (a.i.is_some(), at::INT),
                (a.s.is_some(), at::STRING),
                (a.t.is_some(), at::TENSOR),
                (a.g.is_some(), at::GRAPH),
                (a.sparse_tensor.is_some(), at::SPARSE_TENSOR),
                (a.tp.is_some(), at::TYPE_PROTO),
                (!a.floats.is_empty(), at::FLOATS),
                (!a.ints.is_empty(), at::INTS),
                (!a.strings.is_empty(), at::STRINGS),
                (!a.tensors.is_empty(), at::TENSORS),
                (!a.graphs.is_empty(), at::GRAPHS),
                (!a.sparse_tensors.is_empty(), at::SPARSE_TENSORS),
                (!a.type_protos.is_empty(), at::TYPE_PROTOS),
            ]
            .into_iter()
            .filter_map(|(p, t)| p.then_some(t))
            .collect();
            match present.as_slice() {
                [t] => ty = *t,
                [] => return Err(err("has no type and no value".to_string())),
                _ => return Err(err("has no type and several values".to_string())),
            }
        }
        let what = format!("{node}/{}", a.name);
        let missing = |kind: &str| err(format!("is of type {kind} but has no value"));
        let value = match ty {
            // proto2 writers always set the field; a missing scalar reads as protobuf's default.
            at::FLOAT => AttributeValue::Float(a.f.unwrap_or(0.0)),
            at::INT => AttributeValue::Int(a.i.unwrap_or(0)),
            at::STRING => AttributeValue::String(a.s.clone().unwrap_or_default()),
            at::TENSOR => AttributeValue::Tensor(
                self.tensor(a.t.as_ref().ok_or_else(|| missing("TENSOR"))?, &what)?,
            ),
            at::GRAPH => AttributeValue::Graph(Box::new(
                self.graph(a.g.as_ref().ok_or_else(|| missing("GRAPH"))?, Some(scope))?,
            )),
            at::SPARSE_TENSOR => AttributeValue::SparseTensor(
                self.sparse(
                    a.sparse_tensor
                        .as_ref()
                        .ok_or_else(|| missing("SPARSE_TENSOR"))?,
                    &what,
                )?,
            ),
            at::TYPE_PROTO => AttributeValue::Type(
                self.value_type(a.tp.as_ref().ok_or_else(|| missing("TYPE_PROTO"))?, &what)?,
            ),
            at::FLOATS => AttributeValue::Floats(a.floats.clone()),
            at::INTS => AttributeValue::Ints(a.ints.clone()),
            at::STRINGS => AttributeValue::Strings(a.strings.clone()),
            at::TENSORS => AttributeValue::Tensors(
                a.tensors
                    .iter()
                    .map(|t| self.tensor(t, &what))
                    .collect::<Result<_, _>>()?,
            ),
            at::GRAPHS => AttributeValue::Graphs(
                a.graphs
                    .iter()
                    .map(|g| self.graph(g, Some(scope)))
                    .collect::<Result<_, _>>()?,
            ),
            at::SPARSE_TENSORS => AttributeValue::SparseTensors(
                a.sparse_tensors
                    .iter()
                    .map(|s| self.sparse(s, &what))
                    .collect::<Result<_, _>>()?,
            ),
            at::TYPE_PROTOS => AttributeValue::Types(
                a.type_protos
                    .iter()
                    .map(|t| self.value_type(t, &what))
                    .collect::<Result<_, _>>()?,
            ),
            other => return Err(err(format!("has unknown type code {other}"))),
        };
        Ok(Attribute {
            name: a.name.clone(),
            value,
        })
    }
}

fn value_info(
    v: &proto::ValueInfoProto,
    kind: &'static str,
    index: usize,
    graph: &str,
) -> Result<ValueInfo, OnnxError> {
    if v.name.is_empty() {
        return Err(OnnxError::EmptyName {
            kind,
            index,
            graph: graph.to_string(),
        });
    }
    let ty = v
        .r#type
        .as_ref()
        .map(|t| convert_type(t, &v.name))
        .transpose()?;
    Ok(ValueInfo {
        name: v.name.clone(),
        ty,
    })
}

/// Converts a `TypeProto`.
fn convert_type(t: &proto::TypeProto, value: &str) -> Result<ValueType, OnnxError> {
    use proto::TypeValue;
    let err = |reason: String| OnnxError::Type {
        value: value.to_string(),
        reason,
    };
    let dtype = |code: i32| -> Result<Option<TensorDType>, OnnxError> {
        if code == 0 {
            Ok(None)
        } else {
            TensorDType::from_onnx(code)
                .map(Some)
                .map_err(|e| err(e.to_string()))
        }
    };
    let tensor_type = |t: &proto::TypeProtoTensor| -> Result<TensorType, OnnxError> {
        let dims = match &t.shape {
            None => None,
            Some(s) => Some(
                s.dim
                    .iter()
                    .enumerate()
                    .map(|(i, d)| match &d.value {
                        Some(proto::DimensionValue::DimValue(v)) => u64::try_from(*v)
                            .map(OnnxDim::Fixed)
                            .map_err(|_| err(format!("dimension {i} is negative ({v})"))),
                        Some(proto::DimensionValue::DimParam(p)) if !p.is_empty() => {
                            Ok(OnnxDim::Symbolic(p.clone()))
                        }
                        _ => Ok(OnnxDim::Unknown),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(TensorType {
            dtype: dtype(t.elem_type)?,
            dims,
        })
    };
    let inner = |t: &Option<Box<proto::TypeProto>>| -> Result<Option<Box<ValueType>>, OnnxError> {
        t.as_ref()
            .map(|t| convert_type(t, value).map(Box::new))
            .transpose()
    };
    match &t.value {
        Some(TypeValue::Tensor(tt)) => Ok(ValueType::Tensor(tensor_type(tt)?)),
        Some(TypeValue::SparseTensor(tt)) => Ok(ValueType::SparseTensor(tensor_type(tt)?)),
        Some(TypeValue::Sequence(s)) => Ok(ValueType::Sequence(inner(&s.elem_type)?)),
        Some(TypeValue::Optional(o)) => Ok(ValueType::Optional(inner(&o.elem_type)?)),
        Some(TypeValue::Map(m)) => Ok(ValueType::Map {
            key: dtype(m.key_type)?.ok_or_else(|| err("map without key type".to_string()))?,
            value: inner(&m.value_type)?,
        }),
        None => Err(err(
            "type without a value (tensor, sequence, ...)".to_string()
        )),
    }
}
