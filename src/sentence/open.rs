//! Opening a sentence model natively: a sentence-transformers folder, an ONNX file, or a
//! name of [`crate::models::EMBEDDING_MODELS`] in the cache.

use super::config::{Pipeline, Pooling};
use super::model::{EmbedOptions, FolderTexts, SentenceModel};
use super::SentenceError;
use crate::fileio::read_bounded_text;
use crate::gpu::Engine;
use crate::models::{find_embedding_model, EmbeddingFormat, EmbeddingSpec};
use crate::safetensors::MappedSafeTensors;
use crate::tokenizer::WordPiece;
use std::path::{Path, PathBuf};

/// The largest JSON file of a folder read (a `tokenizer.json` is about 0.5 MB; multilingual
/// ones reach 20 MB).
const MAX_JSON_BYTES: u64 = 64 << 20;

/// What an ONNX file needs besides itself.
#[derive(Debug, Clone, PartialEq)]
pub struct OnnxParts {
    /// Its `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// The pooling, normalization and length.
    pub pipeline: Pipeline,
}

fn text(folder: &Path, name: &str) -> Result<String, SentenceError> {
    Ok(read_bounded_text(
        &folder.join(name),
        MAX_JSON_BYTES,
        "a JSON file",
    )?)
}

impl SentenceModel {
    /// A sentence-transformers folder: `config.json`, `tokenizer.json`, `modules.json`, the
    /// pooling module's `config.json` (where `modules.json` puts it), `model.safetensors`
    /// (memory-mapped) and, if present, `sentence_bert_config.json`.
    ///
    /// # Errors
    /// [`SentenceError::File`] for a file that is missing or not a regular file; as
    /// [`SentenceModel::from_bert`].
    pub fn open_folder(
        engine: &Engine,
        folder: &Path,
        options: EmbedOptions,
    ) -> Result<SentenceModel, SentenceError> {
        let modules = text(folder, "modules.json")?;
        let pooling_dir = pooling_path(&modules)?;
        let pooling = text(folder, &format!("{pooling_dir}/config.json"))?;
        let sentence_bert = match text(folder, "sentence_bert_config.json") {
            Ok(t) => Some(t),
            Err(SentenceError::File(crate::fileio::FileError::Io { cause, .. }))
                if cause.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        let config = text(folder, "config.json")?;
        let tokenizer = text(folder, "tokenizer.json")?;
        let weights = MappedSafeTensors::open(folder.join("model.safetensors"))?;
        SentenceModel::from_bert(
            engine,
            FolderTexts {
                config: &config,
                tokenizer: &tokenizer,
                modules: &modules,
                pooling: &pooling,
                sentence_bert: sentence_bert.as_deref(),
            },
            weights.index(),
            weights.backing(),
            options,
        )
    }

    /// An ONNX encoder file with `parts`' tokenizer and pipeline.
    ///
    /// # Errors
    /// [`SentenceError::Onnx`] when the file cannot be loaded or imported; as
    /// [`SentenceModel::from_onnx`].
    pub fn open_onnx(
        engine: &Engine,
        file: &Path,
        parts: &OnnxParts,
        options: EmbedOptions,
    ) -> Result<SentenceModel, SentenceError> {
        let tokenizer = WordPiece::from_json(&read_bounded_text(
            &parts.tokenizer,
            MAX_JSON_BYTES,
            "a tokenizer.json",
        )?)?;
        let model = crate::onnx::OnnxFile::load(file, &crate::onnx::LoadOptions::default())
            .map_err(|e| SentenceError::Onnx(format!("{}: {e}", file.display())))?;
        let imported = crate::onnx::import(&model)
            .map_err(|e| SentenceError::Onnx(format!("{}: {e}", file.display())))?;
        SentenceModel::from_onnx(engine, imported, tokenizer, parts.pipeline, options)
    }

    /// The embedding model `spec` from its folder in the cache (`folder`); an ONNX one takes
    /// the tokenizer of the model it names from `cache`.
    ///
    /// # Errors
    /// As [`SentenceModel::open_folder`] and [`SentenceModel::open_onnx`].
    pub fn open_spec(
        engine: &Engine,
        spec: &EmbeddingSpec,
        folder: &Path,
        cache: &Path,
        options: EmbedOptions,
    ) -> Result<SentenceModel, SentenceError> {
        match spec.format {
            EmbeddingFormat::SentenceTransformers => Self::open_folder(engine, folder, options),
            EmbeddingFormat::Onnx { file } => {
                let tokenizer = match spec.tokenizer_from.and_then(find_embedding_model) {
                    Some(from) => cache.join(from.dir_name).join("tokenizer.json"),
                    None => folder.join("tokenizer.json"),
                };
                let parts = OnnxParts {
                    tokenizer,
                    pipeline: spec_pipeline(spec)?,
                };
                Self::open_onnx(engine, &folder.join(file), &parts, options)
            }
        }
    }
}

/// The pipeline an [`EmbeddingSpec`] records.
///
/// # Errors
/// [`SentenceError::Config`] for a pooling name that is none of `cls`, `mean`, `max`.
pub fn spec_pipeline(spec: &EmbeddingSpec) -> Result<Pipeline, SentenceError> {
    Ok(Pipeline {
        pooling: Pooling::parse(spec.pooling).ok_or_else(|| SentenceError::Config {
            file: spec.name.into(),
            reason: format!("pooling `{}`", spec.pooling),
        })?,
        normalize: spec.normalize,
        max_seq_length: spec.max_seq_length as usize,
    })
}

/// The folder of the Pooling module in `modules.json` (`1_Pooling`), which must be a plain
/// relative name.
fn pooling_path(modules: &str) -> Result<String, SentenceError> {
    let v: serde_json::Value =
        serde_json::from_str(modules).map_err(|e| SentenceError::Config {
            file: "modules.json".into(),
            reason: e.to_string(),
        })?;
    let path = v
        .as_array()
        .and_then(|a| {
            a.iter().find(|m| {
                m.get("type")
                    .and_then(|t| t.as_str())
                    .is_some_and(|t| t.ends_with("Pooling"))
            })
        })
        .and_then(|m| m.get("path"))
        .and_then(|p| p.as_str())
        .unwrap_or("1_Pooling");
    let plain = !path.is_empty()
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !plain {
        return Err(SentenceError::Config {
            file: "modules.json".into(),
            reason: format!("pooling path `{path}` is not a plain folder name"),
        });
    }
    Ok(path.to_string())
}

/// The graph of a sentence-transformers folder (as [`SentenceModel::open_folder`] builds it,
/// over the memory-mapped weights), its tokenizer's vocabulary size and padding id, without
/// a device: for [`crate::runtime::replay_on_host`].
///
/// # Errors
/// As [`SentenceModel::open_folder`].
pub fn folder_graph(folder: &Path) -> Result<(crate::graph::Graph, usize, u32), SentenceError> {
    let modules = text(folder, "modules.json")?;
    let pooling = text(folder, &format!("{}/config.json", pooling_path(&modules)?))?;
    let sentence_bert = text(folder, "sentence_bert_config.json").ok();
    let config = super::BertConfig::from_json(&text(folder, "config.json")?)?;
    let pipeline = Pipeline::from_folder(
        &modules,
        &pooling,
        sentence_bert.as_deref(),
        config.max_positions,
    )?;
    let tokenizer = WordPiece::from_json(&text(folder, "tokenizer.json")?)?;
    let weights = MappedSafeTensors::open(folder.join("model.safetensors"))?;
    let graph = super::graph::build_bert(
        &config,
        &super::graph::BertWeights::new(weights.index(), weights.backing()),
        &pipeline,
    )?;
    Ok((graph, tokenizer.vocab_size(), tokenizer.pad_id()))
}
