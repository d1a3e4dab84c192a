//! `POST /v1/embeddings` of `dynrt serve --embedding-model DIR|FILE|NAME`: OpenAI's
//! embeddings endpoint beside the chat model.
//!
//! The sentence model lives on a thread of its own (its GPU work blocks), which takes jobs
//! from a channel in arrival order; each request's texts are batched by length there
//! ([`dynrt::sentence::SentenceModel::embed`]), so the model's one request sees every call
//! and its predictor and pool serve all of them.
//!
//! Body: `input` (a string or a list of at most [`MAX_INPUTS`] strings), `model` (the
//! embedding model's id, optional), `encoding_format` (`float`, the default, or `base64`:
//! the little-endian f32 bytes), `dimensions` (only the model's own width). Answer:
//! `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
//! "usage": {"prompt_tokens", "total_tokens"}}` with the tokens after truncation, special
//! tokens included. Token arrays as input, an unknown model, other formats and widths are a
//! 400 or 404 that says why.

use super::serve_api::{self, ApiError};
use super::shared::sentence::{open_model, ModelArgs};
use axum::Json;
use serde_json::{json, Value};
use std::sync::{mpsc, Arc, Mutex};

/// The most texts one request may embed (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// The embedding model's arguments of `dynrt serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Also serve POST /v1/embeddings with this sentence model: a sentence-transformers
    /// folder, an ONNX encoder file, or an embedding model's name (`dynrt fetch --list`).
    #[arg(long = "embedding-model", value_name = "DIR|FILE|NAME")]
    pub embedding_model: Option<String>,
    /// The most sentences per batch of the embedding model.
    #[arg(long = "embedding-batch", default_value_t = 32)]
    pub embedding_batch: usize,
}

type Reply = futures::channel::oneshot::Sender<Result<Embedded, String>>;

struct Job {
    texts: Vec<String>,
    reply: Reply,
}

struct Embedded {
    dim: usize,
    values: Vec<f32>,
    tokens: usize,
}

/// The embedding endpoint's state: the job channel and the model's id.
pub struct Embedder {
    jobs: Mutex<mpsc::Sender<Job>>,
    model_id: String,
    dim: usize,
}

/// Loads the embedding model on `engine` and starts its thread; `None` without
/// `--embedding-model`.
///
/// # Errors
/// When the model cannot be loaded.
pub fn start(engine: &dynrt::gpu::Engine, args: &Args) -> anyhow::Result<Option<Arc<Embedder>>> {
    let Some(name) = &args.embedding_model else {
        return Ok(None);
    };
    let margs = ModelArgs {
        tokenizer: None,
        pooling: "mean".into(),
        normalize: true,
        max_length: 512,
        batch: args.embedding_batch,
        policy: "adaptive".into(),
    };
    let mut model = open_model(engine, name, &margs)?;
    let model_id = std::path::Path::new(name)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| name.clone());
    eprintln!(
        "serving embeddings of {model_id} ({} dims, {} pooling{}) at /v1/embeddings",
        model.dim(),
        model.pipeline().pooling.name(),
        if model.pipeline().normalize {
            ", normalized"
        } else {
            ""
        }
    );
    let dim = model.dim();
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("dynrt-embed".into())
        .spawn(move || {
            for job in rx {
                let refs: Vec<&str> = job.texts.iter().map(String::as_str).collect();
                let result = model
                    .embed_blocking(&refs)
                    .map(|e| Embedded {
                        dim: e.dim,
                        tokens: e.tokens.iter().sum(),
                        values: e.values,
                    })
                    .map_err(|e| e.to_string());
                // A client that went away dropped its receiver: nothing to tell.
                let _ = job.reply.send(result);
            }
        })?;
    Ok(Some(Arc::new(Embedder {
        jobs: Mutex::new(tx),
        model_id,
        dim,
    })))
}

/// The request's texts, or the 400 that says what is wrong.
fn texts(body: &Value) -> Result<Vec<String>, ApiError> {
    let input = body
        .get("input")
        .ok_or_else(|| ApiError::bad("`input` is required", Some("input")))?;
    let list = match input {
        Value::String(s) => return Ok(vec![s.clone()]),
        Value::Array(a) => a,
        _ => {
            return Err(ApiError::bad(
                "`input` must be a string or a list of strings",
                Some("input"),
            ))
        }
    };
    if list.is_empty() {
        return Err(ApiError::bad("`input` is an empty list", Some("input")));
    }
    if list.len() > MAX_INPUTS {
        return Err(ApiError::bad(
            format!("`input` has {} items, at most {MAX_INPUTS}", list.len()),
            Some("input"),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(_) | Value::Array(_) => Err(ApiError::bad(
                "token arrays are not supported: send the text (this model has its own tokenizer)",
                Some("input"),
            )),
            _ => Err(ApiError::bad(
                format!("`input[{i}]` is not a string"),
                Some("input"),
            )),
        })
        .collect()
}

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The answer to one `POST /v1/embeddings` body (read by the server within its limits).
///
/// # Errors
/// A 400 or 404 that says what is wrong with the request; a 500 when the model failed.
pub async fn answer(e: &Embedder, body: &[u8]) -> Result<Json<Value>, ApiError> {
    let body: Value = serve_api::parse(body)?;
    if !body.is_object() {
        return Err(ApiError::bad("the body must be a JSON object", None));
    }
    if let Some(m) = body.get("model") {
        match m.as_str() {
            Some(m) if m == e.model_id => {}
            Some(m) => return Err(ApiError::unknown_model(m, &e.model_id)),
            None => return Err(ApiError::bad("`model` must be a string", Some("model"))),
        }
    }
    let base64_format = match body.get("encoding_format").map(|f| f.as_str()) {
        None | Some(Some("float")) => false,
        Some(Some("base64")) => true,
        _ => {
            return Err(ApiError::bad(
                "`encoding_format` must be \"float\" or \"base64\"",
                Some("encoding_format"),
            ))
        }
    };
    if let Some(d) = body.get("dimensions") {
        if d.as_u64() != Some(e.dim as u64) {
            return Err(ApiError::bad(
                format!("`dimensions` must be {} (the model's width)", e.dim),
                Some("dimensions"),
            ));
        }
    }
    let texts = texts(&body)?;
    let count = texts.len();
    let (tx, rx) = futures::channel::oneshot::channel();
    e.jobs
        .lock()
        .map_err(|_| ApiError::server("the embedding thread is gone"))?
        .send(Job { texts, reply: tx })
        .map_err(|_| ApiError::server("the embedding thread is gone"))?;
    let out = rx
        .await
        .map_err(|_| ApiError::server("the embedding thread is gone"))?
        .map_err(ApiError::server)?;
    let data: Vec<Value> = (0..count)
        .map(|i| {
            let v = &out.values[i * out.dim..(i + 1) * out.dim];
            let embedding = if base64_format {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": e.model_id,
        "usage": {"prompt_tokens": out.tokens, "total_tokens": out.tokens},
    })))
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(super::base64(&[255, 254, 253]), "//79");
    }
}
