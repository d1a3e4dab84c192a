//! [`InspectReport`]: what `dynrt inspect model.onnx` prints, computed without a device.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::file::{DataLocation, OnnxFile, Opset, ValueInfo};
use super::ops;
use super::tensor::TensorDType;

/// Nodes of one op type.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OpCount {
    /// Domain (`""` is the default ONNX domain).
    pub domain: String,
    /// Op type.
    pub op_type: String,
    /// The definition the model's opset selects (`since_version`, default domain only).
    pub version: Option<i64>,
    /// Number of nodes, subgraphs included.
    pub count: usize,
    /// Whether the importer maps it ([`super::import::refusal`] is `None`): a converter for
    /// the definition the model's opset selects.
    pub supported: bool,
}

/// A node whose op the importer does not map.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UnsupportedNode {
    /// The node's name, or `op_type#index` when it has none.
    pub node: String,
    /// Its domain.
    pub domain: String,
    /// Its op type.
    pub op_type: String,
    /// Why: `not in the importer's op list`, `not defined at opset N`, `domain ... not
    /// supported`, or the definition selected is older than the converter maps.
    pub reason: String,
}

/// Initializers of one element type.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DTypeBytes {
    /// Element type.
    pub dtype: TensorDType,
    /// Number of initializers.
    pub count: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Bytes read from one external-data file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExternalFile {
    /// The location as written in the model.
    pub location: String,
    /// Number of initializers stored there.
    pub count: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Initializer totals.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InitializerSummary {
    /// Number of initializers of the main graph.
    pub count: usize,
    /// Bytes stored in the model file.
    pub inline_bytes: u64,
    /// Bytes stored in external files.
    pub external_bytes: u64,
    /// Per external file.
    pub external_files: Vec<ExternalFile>,
    /// Per element type.
    pub by_dtype: Vec<DTypeBytes>,
}

/// The summary `dynrt inspect` prints (serialisable for `--json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InspectReport {
    /// ONNX IR version.
    pub ir_version: i64,
    /// Producer name and version.
    pub producer: String,
    /// Opset imports.
    pub opsets: Vec<Opset>,
    /// Inputs a caller feeds (declared inputs that are not initializers).
    pub inputs: Vec<ValueInfo>,
    /// Outputs.
    pub outputs: Vec<ValueInfo>,
    /// Symbolic dimension names of the inputs and outputs, sorted.
    pub symbols: Vec<String>,
    /// Number of nodes, subgraphs included.
    pub nodes: usize,
    /// Nodes per op type, most frequent first.
    pub op_histogram: Vec<OpCount>,
    /// Every node whose op the importer does not map, in graph order.
    pub unsupported: Vec<UnsupportedNode>,
    /// Initializer bytes.
    pub initializers: InitializerSummary,
}

impl InspectReport {
    /// Summarises a loaded model.
    pub fn new(model: &OnnxFile) -> Self {
        let graph = &model.graph;
        let nodes = graph.walk_nodes();
        let opset = model.opset("").unwrap_or(0);
        // Why the importer cannot take an op, or None when it can: its converter registry.
        let refusal = |domain: &str, op_type: &str| super::import::refusal(domain, op_type, opset);
        let mut hist: BTreeMap<(String, String), usize> = BTreeMap::new();
        let mut unsupported = Vec::new();
        for n in &nodes {
            *hist
                .entry((n.domain.clone(), n.op_type.clone()))
                .or_default() += 1;
            if let Some(reason) = refusal(&n.domain, &n.op_type) {
                unsupported.push(UnsupportedNode {
                    node: n.label(),
                    domain: n.domain.clone(),
                    op_type: n.op_type.clone(),
                    reason,
                });
            }
        }
        let mut op_histogram: Vec<OpCount> = hist
            .into_iter()
            .map(|((domain, op_type), count)| OpCount {
                supported: refusal(&domain, &op_type).is_none(),
                version: if domain.is_empty() {
                    ops::op_version(&op_type, opset)
                } else {
                    None
                },
                domain,
                op_type,
                count,
            })
            .collect();
        op_histogram.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.op_type.cmp(&b.op_type))
        });

        let mut by_dtype: BTreeMap<TensorDType, (usize, u64)> = BTreeMap::new();
        let mut files: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        let (mut inline_bytes, mut external_bytes) = (0u64, 0u64);
        for init in &graph.initializers {
            let e = by_dtype.entry(init.dtype).or_default();
            e.0 += 1;
            e.1 += init.size_bytes;
            match &init.location {
                DataLocation::Inline => inline_bytes += init.size_bytes,
                DataLocation::External(r) => {
                    external_bytes += init.size_bytes;
                    let f = files.entry(r.location.clone()).or_default();
                    f.0 += 1;
                    f.1 += init.size_bytes;
                }
            }
        }
        let inputs: Vec<ValueInfo> = graph.runtime_inputs().cloned().collect();
        let mut symbols: Vec<String> = inputs
            .iter()
            .chain(&graph.outputs)
            .filter_map(|v| v.ty.as_ref()?.as_tensor()?.dims.as_ref())
            .flatten()
            .filter_map(|d| match d {
                super::OnnxDim::Symbolic(s) => Some(s.clone()),
                _ => None,
            })
            .collect();
        symbols.sort();
        symbols.dedup();
        InspectReport {
            ir_version: model.ir_version,
            producer: format!("{} {}", model.producer_name, model.producer_version)
                .trim()
                .to_string(),
            opsets: model.opsets.clone(),
            inputs,
            outputs: graph.outputs.clone(),
            symbols,
            nodes: nodes.len(),
            op_histogram,
            unsupported,
            initializers: InitializerSummary {
                count: graph.initializers.len(),
                inline_bytes,
                external_bytes,
                external_files: files
                    .into_iter()
                    .map(|(location, (count, bytes))| ExternalFile {
                        location,
                        count,
                        bytes,
                    })
                    .collect(),
                by_dtype: by_dtype
                    .into_iter()
                    .map(|(dtype, (count, bytes))| DTypeBytes {
                        dtype,
                        count,
                        bytes,
                    })
                    .collect(),
            },
        }
    }

    /// The report as text for a terminal.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let value = |v: &ValueInfo| match &v.ty {
            Some(t) => format!("{}: {t}", v.name),
            None => format!("{}: (no type)", v.name),
        };
        let opsets: Vec<String> = self
            .opsets
            .iter()
            .map(|o| {
                let d = if o.domain.is_empty() {
                    "ai.onnx"
                } else {
                    &o.domain
                };
                format!("{d} {}", o.version)
            })
            .collect();
        let _ = writeln!(
            s,
            "ir_version {}, producer {}",
            self.ir_version, self.producer
        );
        let _ = writeln!(s, "opsets: {}", opsets.join(", "));
        let _ = writeln!(s, "inputs ({}):", self.inputs.len());
        for v in &self.inputs {
            let _ = writeln!(s, "  {}", value(v));
        }
        let _ = writeln!(s, "outputs ({}):", self.outputs.len());
        for v in &self.outputs {
            let _ = writeln!(s, "  {}", value(v));
        }
        if !self.symbols.is_empty() {
            let _ = writeln!(s, "symbolic dims: {}", self.symbols.join(", "));
        }
        let i = &self.initializers;
        let _ = writeln!(
            s,
            "initializers: {} ({} bytes inline, {} bytes external)",
            i.count, i.inline_bytes, i.external_bytes
        );
        for d in &i.by_dtype {
            let _ = writeln!(
                s,
                "  {:<8} {:>6} tensors {:>14} bytes",
                d.dtype.name(),
                d.count,
                d.bytes
            );
        }
        for f in &i.external_files {
            let _ = writeln!(
                s,
                "  external {}: {} tensors, {} bytes",
                f.location, f.count, f.bytes
            );
        }
        let _ = writeln!(s, "nodes: {}", self.nodes);
        for op in &self.op_histogram {
            let mut name = if op.domain.is_empty() {
                op.op_type.clone()
            } else {
                format!("{}:{}", op.domain, op.op_type)
            };
            if let Some(v) = op.version {
                let _ = write!(name, "-{v}");
            }
            let mark = if op.supported { "" } else { "  (unsupported)" };
            let _ = writeln!(s, "  {:>6}  {name}{mark}", op.count);
        }
        if self.unsupported.is_empty() {
            let _ = writeln!(s, "unsupported ops: none");
        } else {
            let _ = writeln!(s, "unsupported ops ({} nodes):", self.unsupported.len());
            for u in &self.unsupported {
                let d = if u.domain.is_empty() {
                    String::new()
                } else {
                    format!("{}:", u.domain)
                };
                let _ = writeln!(s, "  {}: {d}{} ({})", u.node, u.op_type, u.reason);
            }
        }
        s
    }
}
