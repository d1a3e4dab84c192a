//! Checking a run's inputs against a model: what `dynrt run model.onnx --input NAME=FILE.npy`
//! does before anything is allocated.

use std::collections::BTreeMap;

use super::file::{OnnxDim, OnnxGraph, ValueType};
use super::tensor::HostTensor;
use super::OnnxError;

/// Splits an `--input` argument `NAME=PATH` at its first `=`.
///
/// # Errors
/// [`OnnxError::InputArg`] when there is no `=` or either side is empty.
pub fn parse_input_arg(arg: &str) -> Result<(String, String), OnnxError> {
    match arg.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), path.to_string()))
        }
        _ => Err(OnnxError::InputArg {
            arg: arg.to_string(),
        }),
    }
}

/// Checks `feeds` against the graph's declared inputs and binds its symbolic dims: every
/// input that has no initializer default and is not optional must be fed exactly once, with
/// the declared element type and rank, fixed dims equal, and each symbol (`dim_param`) the
/// same extent wherever it appears. Zero-length dims are valid (an empty `past_key_values`).
/// Returns the symbols' extents.
///
/// # Errors
/// [`OnnxError::UnknownInput`], [`OnnxError::DuplicateInput`], [`OnnxError::MissingInput`],
/// [`OnnxError::InputType`], [`OnnxError::InputRank`], [`OnnxError::InputDim`],
/// [`OnnxError::SymbolConflict`], each naming the input.
pub fn bind_inputs(
    graph: &OnnxGraph,
    feeds: &[(String, HostTensor)],
) -> Result<BTreeMap<String, u64>, OnnxError> {
    bind_inputs_carried(graph, feeds, &[])
}

/// [`bind_inputs`] where the inputs named in `carried` may be left out (a session carries
/// them from its previous run: the KV caches' pasts). Given ones are checked like any other.
///
/// # Errors
/// As [`bind_inputs`].
pub fn bind_inputs_carried(
    graph: &OnnxGraph,
    feeds: &[(String, HostTensor)],
    carried: &[&str],
) -> Result<BTreeMap<String, u64>, OnnxError> {
    let mut symbols: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for (k, (name, tensor)) in feeds.iter().enumerate() {
        if feeds[..k].iter().any(|(n, _)| n == name) {
            return Err(OnnxError::DuplicateInput {
                input: name.clone(),
            });
        }
        let info = graph
            .inputs
            .iter()
            .find(|i| &i.name == name)
            .ok_or_else(|| OnnxError::UnknownInput {
                input: name.clone(),
            })?;
        let ty = match &info.ty {
            Some(ValueType::Tensor(t)) => t,
            Some(ValueType::Optional(Some(inner))) if inner.as_tensor().is_some() => {
                inner.as_tensor().expect("checked")
            }
            None => continue,
            Some(other) => {
                return Err(OnnxError::InputType {
                    input: name.clone(),
                    expected: other.to_string(),
                    actual: format!("{} tensor", tensor.dtype()),
                })
            }
        };
        if let Some(d) = ty.dtype.filter(|&d| d != tensor.dtype()) {
            return Err(OnnxError::InputType {
                input: name.clone(),
                expected: d.to_string(),
                actual: tensor.dtype().to_string(),
            });
        }
        let Some(dims) = &ty.dims else { continue };
        if dims.len() != tensor.dims().len() {
            return Err(OnnxError::InputRank {
                input: name.clone(),
                expected: dims.len(),
                actual: tensor.dims().len(),
            });
        }
        for (index, (d, &actual)) in dims.iter().zip(tensor.dims()).enumerate() {
            match d {
                OnnxDim::Fixed(expected) if *expected != actual => {
                    return Err(OnnxError::InputDim {
                        input: name.clone(),
                        index,
                        expected: *expected,
                        actual,
                    })
                }
                OnnxDim::Symbolic(s) => match symbols.get(s) {
                    Some((value, first_input)) if *value != actual => {
                        return Err(OnnxError::SymbolConflict {
                            symbol: s.clone(),
                            first_input: first_input.clone(),
                            first_value: *value,
                            input: name.clone(),
                            value: actual,
                        })
                    }
                    Some(_) => {}
                    None => {
                        symbols.insert(s.clone(), (actual, name.clone()));
                    }
                },
                _ => {}
            }
        }
    }
    for info in graph.runtime_inputs() {
        let optional = matches!(info.ty, Some(ValueType::Optional(_)));
        let given = feeds.iter().any(|(n, _)| *n == info.name);
        if !optional && !given && !carried.contains(&info.name.as_str()) {
            return Err(OnnxError::MissingInput {
                input: info.name.clone(),
            });
        }
    }
    Ok(symbols.into_iter().map(|(s, (v, _))| (s, v)).collect())
}
