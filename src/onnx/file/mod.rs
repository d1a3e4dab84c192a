//! [`OnnxFile`]: a decoded and checked ONNX model.
//!
//! Files: this one (the model, its opsets, how it is loaded), `graph` (graphs, nodes,
//! attributes and declared value types), `initializer` (dense and sparse constant tensors),
//! `decode` (the protobuf messages into these types, every check the loader makes).

mod decode;
mod graph;
mod initializer;

pub use graph::{
    Attribute, AttributeValue, OnnxDim, OnnxGraph, OnnxNode, TensorType, ValueInfo, ValueType,
};
pub use initializer::{
    DataLocation, Initializer, SparseInitializer, SparseTensor, MAX_DENSE_BYTES,
};

use bytes::Bytes;
use prost::Message;
use std::ops::RangeInclusive;

use super::error::OnnxError;
use super::external::ExternalData;
use super::ops::DEFAULT_DOMAIN_OPSETS;
use super::proto;

/// How [`OnnxFile::from_bytes`] treats the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// Read external tensor data (`true`, the default), or only check that each file exists
    /// and holds the range (`false`: [`Initializer::tensor`] is then `None` for external
    /// initializers; what `dynrt inspect` uses, so a large model is not read to be listed).
    pub read_external: bool,
    /// Opset versions accepted for the default domain (`""` / `ai.onnx`); other domains are
    /// accepted at any version and their ops reported unsupported by
    /// [`crate::onnx::ops::is_supported`]. Default [`DEFAULT_DOMAIN_OPSETS`].
    pub default_domain_opsets: RangeInclusive<i64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            read_external: true,
            default_domain_opsets: DEFAULT_DOMAIN_OPSETS,
        }
    }
}

/// One opset import: a domain (`""` for the default ONNX domain, also when the file says
/// `ai.onnx`) and its version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Opset {
    /// The domain.
    pub domain: String,
    /// The version.
    pub version: i64,
}

/// A model-local function (`ModelProto.functions`): only its identity is kept, so that nodes
/// calling it are recognised; dynrt does not inline functions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LocalFunction {
    /// Its domain.
    pub domain: String,
    /// Its name (the `op_type` that calls it).
    pub name: String,
}

/// A decoded, checked ONNX model. Made by [`OnnxFile::from_bytes`] or (native)
/// [`OnnxFile::load`]; holds the data of its initializers (slices of the model buffer when
/// they were `raw_data`, so the buffer lives as long as they do).
#[derive(Debug, Clone, PartialEq)]
pub struct OnnxFile {
    /// ONNX IR version of the file.
    pub ir_version: i64,
    /// The tool that wrote it.
    pub producer_name: String,
    /// Its version.
    pub producer_version: String,
    /// Opset imports, default domain as `""`.
    pub opsets: Vec<Opset>,
    /// `metadata_props` key/value pairs.
    pub metadata: Vec<(String, String)>,
    /// The main graph.
    pub graph: OnnxGraph,
    /// Model-local functions.
    pub functions: Vec<LocalFunction>,
}

impl OnnxFile {
    /// Decodes and checks a model from its bytes (works on every target). Initializers stored
    /// as `raw_data` become slices of `bytes` (no copy); external data comes from `external`.
    ///
    /// # Errors
    /// [`OnnxError::Decode`] for bytes that are not a model (truncated, malformed);
    /// [`OnnxError::UnsupportedOpset`], [`OnnxError::MissingOpset`],
    /// [`OnnxError::DuplicateOpset`]; [`OnnxError::Tensor`] and [`OnnxError::External`] for
    /// initializers; [`OnnxError::UndefinedInput`], [`OnnxError::DuplicateName`],
    /// [`OnnxError::UndefinedOutput`], [`OnnxError::Attribute`], [`OnnxError::Constant`],
    /// [`OnnxError::Type`] for the graph.
    pub fn from_bytes(
        bytes: Bytes,
        external: &dyn ExternalData,
        options: &LoadOptions,
    ) -> Result<Self, OnnxError> {
        let m = proto::ModelProto::decode(bytes).map_err(|cause| OnnxError::Decode {
            what: "model".to_string(),
            cause,
        })?;
        let mut opsets: Vec<Opset> = Vec::new();
        for o in &m.opset_import {
            let domain = normalize_domain(&o.domain);
            if let Some(prev) = opsets.iter().find(|p| p.domain == domain) {
                return Err(OnnxError::DuplicateOpset {
                    domain,
                    first: prev.version,
                    second: o.version,
                });
            }
            let range = if domain.is_empty() {
                options.default_domain_opsets.clone()
            } else {
                1..=i64::MAX
            };
            if !range.contains(&o.version) {
                return Err(OnnxError::UnsupportedOpset {
                    domain,
                    version: o.version,
                    min: *range.start(),
                    max: *range.end(),
                });
            }
            opsets.push(Opset {
                domain,
                version: o.version,
            });
        }
        let graph = m.graph.as_ref().ok_or(OnnxError::NoGraph)?;
        let domains = opsets.iter().map(|o| o.domain.clone()).collect();
        let graph = decode::main_graph(graph, external, options, domains)?;
        Ok(OnnxFile {
            ir_version: m.ir_version,
            producer_name: m.producer_name,
            producer_version: m.producer_version,
            opsets,
            metadata: m
                .metadata_props
                .into_iter()
                .map(|e| (e.key, e.value))
                .collect(),
            graph,
            functions: m
                .functions
                .into_iter()
                .map(|f| LocalFunction {
                    domain: normalize_domain(&f.domain),
                    name: f.name,
                })
                .collect(),
        })
    }

    /// Reads `path` and decodes it, external data from the model's folder (native only). The
    /// file is read once into memory; `raw_data` initializers are slices of that buffer. It
    /// must be a regular file of at most [`crate::fileio::MAX_ONNX_BYTES`] bytes (protobuf's
    /// limit on one message; larger models keep their weights as external data).
    ///
    /// # Errors
    /// [`OnnxError::Io`] when the file cannot be read, [`OnnxError::File`] when it is not a
    /// regular file or is too large, then as [`OnnxFile::from_bytes`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(
        path: impl AsRef<std::path::Path>,
        options: &LoadOptions,
    ) -> Result<Self, OnnxError> {
        let path = path.as_ref();
        let bytes =
            crate::fileio::read_bounded(path, crate::fileio::MAX_ONNX_BYTES, "an ONNX model")?;
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let resolver = super::external::FolderResolver::new(folder);
        Self::from_bytes(Bytes::from(bytes), &resolver, options)
    }

    /// The imported version of `domain` (`""` or `ai.onnx` for the default domain).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let domain = normalize_domain(domain);
        self.opsets
            .iter()
            .find(|o| o.domain == domain)
            .map(|o| o.version)
    }
}

/// `ai.onnx` and `""` name the same domain; dynrt writes `""`.
pub(crate) fn normalize_domain(domain: &str) -> String {
    if domain == "ai.onnx" {
        String::new()
    } else {
        domain.to_string()
    }
}
