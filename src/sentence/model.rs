//! [`SentenceModel`]: the tokenizer, the compiled network and one request, and the batching
//! of many sentences by length.

use super::config::{BertConfig, Pipeline};
use super::graph::{append_pooling, build_bert, BertWeights, OUTPUT};
use super::SentenceError;
use crate::gpu::Engine;
use crate::graph::{Graph, GraphBuilder};
use crate::memory::predictor::{Policy, SizingSummary};
use crate::runtime::{InferRequest, Network, NetworkOptions, RunOptions, RunStats};
use crate::safetensors::SafeTensors;
use crate::shape::{DType, Shape};
use crate::tensor::{Backing, HostTensor};
use crate::tokenizer::WordPiece;

/// How [`SentenceModel::embed`] batches and how its request manages memory.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedOptions {
    /// The most sentences in one batch.
    pub max_batch: usize,
    /// The most tokens (sentences x padded length) in one batch: bounds the activations of
    /// one iteration (attention scores grow with batch x heads x length²).
    pub max_batch_tokens: usize,
    /// The request's memory options (preallocation policy, pool).
    pub run: RunOptions,
}

impl Default for EmbedOptions {
    /// Batches of up to 32 sentences and 8192 tokens, the adaptive policy, the pool on.
    fn default() -> Self {
        EmbedOptions {
            max_batch: 32,
            max_batch_tokens: 8192,
            run: RunOptions::new(Policy::Adaptive),
        }
    }
}

/// The vectors of a call of [`SentenceModel::embed`], in the order of its texts.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// Width of one vector.
    pub dim: usize,
    /// `texts x dim` values, row by row.
    pub values: Vec<f32>,
    /// Tokens of each text after truncation, special tokens included.
    pub tokens: Vec<usize>,
    /// Batches run.
    pub batches: usize,
    /// Padding tokens added to fill the batches.
    pub padding_tokens: usize,
}

impl Embeddings {
    /// The vector of text `i`.
    pub fn vector(&self, i: usize) -> &[f32] {
        &self.values[i * self.dim..(i + 1) * self.dim]
    }

    /// How many vectors.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Batches over sentences of `lengths` tokens: the indices of each batch, longest sentences
/// first, so a batch pads to its first sentence's length and its others are at most that
/// long. A batch holds at most `max_batch` sentences and `max_batch_tokens` padded tokens
/// (a sentence longer than that alone is a batch of one), and only sentences shorter than its
/// first by at most that length over [`PAD_FRACTION`] (or [`PAD_SLACK`] tokens): a length
/// bucket, so the padding stays a small part of the tokens.
pub fn plan_batches(
    lengths: &[usize],
    max_batch: usize,
    max_batch_tokens: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]).then(a.cmp(&b)));
    let mut batches: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match batches.last_mut() {
            Some(batch)
                if batch.len() < max_batch.max(1)
                    && (batch.len() + 1) * lengths[batch[0]] <= max_batch_tokens
                    && lengths[batch[0]] - lengths[i]
                        <= (lengths[batch[0]] / PAD_FRACTION).max(PAD_SLACK) =>
            {
                batch.push(i)
            }
            _ => batches.push(vec![i]),
        }
    }
    batches
}

/// A sentence joins a batch when it is at most `1 / PAD_FRACTION` of the batch's longest
/// shorter: at most about a sixth of a batch is padding.
pub const PAD_FRACTION: usize = 6;

/// ... or at most this many tokens shorter (short sentences: fewer, fuller batches).
pub const PAD_SLACK: usize = 8;

/// The inputs of [`super::graph::build_bert`]'s graph for `rows` of token ids, padded with
/// `pad` to the longest: `input_ids`, `attention_mask` (1 for tokens, 0 for padding) and
/// `position_ids`.
pub fn bert_inputs(rows: &[&[u32]], pad: u32) -> Vec<(String, HostTensor)> {
    let seq = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    bert_inputs_at(rows, pad, seq)
}

/// [`bert_inputs`] padded to `seq` tokens (at least the longest row's).
pub fn bert_inputs_at(rows: &[&[u32]], pad: u32, seq: usize) -> Vec<(String, HostTensor)> {
    let n = rows.len();
    let seq = seq.max(rows.iter().map(|r| r.len()).max().unwrap_or(0));
    let mut ids = Vec::with_capacity(n * seq);
    let mut mask = Vec::with_capacity(n * seq);
    for r in rows {
        ids.extend(r.iter().map(|&t| t as i32));
        ids.extend(std::iter::repeat_n(pad as i32, seq - r.len()));
        mask.extend(std::iter::repeat_n(1f32, r.len()));
        mask.extend(std::iter::repeat_n(0f32, seq - r.len()));
    }
    let shape = Shape::new(vec![n as u64, seq as u64]);
    let pos: Vec<i32> = (0..seq as i32).collect();
    vec![
        ("input_ids".into(), HostTensor::i32(shape.clone(), &ids)),
        ("attention_mask".into(), HostTensor::f32(shape, &mask)),
        (
            "position_ids".into(),
            HostTensor::i32(Shape::new(vec![seq as u64]), &pos),
        ),
    ]
}

/// The batch quantum of an [`Envelope`]: a grown envelope's batch is a multiple of it.
pub const ENVELOPE_BATCH: usize = 8;

/// The sequence quantum of an [`Envelope`].
pub const ENVELOPE_SEQ: usize = 32;

/// The `[batch, seq]` a request's buffers are sized for. A call inside it runs as it is,
/// on the buffers held. A call outside it grows it (each dimension to at least the call's,
/// rounded up to [`ENVELOPE_BATCH`] and [`ENVELOPE_SEQ`], capped at the largest call the
/// model takes): the request is then replaced by a fresh one (the old buffers freed first)
/// whose buffers are sized and packed by the pool for the whole envelope at once
/// ([`crate::runtime::InferRequest::reserve`]), and the call runs at its own shape on them.
///
/// Why: a request that grows buffer by buffer as calls of random `[batch, seq]` come holds
/// the pool's records at the sizes their first users needed, well above what its largest
/// call needs under every policy; grown by envelope it stays close to that need and replaces
/// its buffers a handful of times (figures:
/// docs/benchmarks/2026-11-28-embeddings-lavapipe.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    /// The batch the buffers hold (0 before the first call).
    pub batch: usize,
    /// The sequence the buffers hold.
    pub seq: usize,
    /// The largest batch a call has.
    pub max_batch: usize,
    /// The longest sequence a call has.
    pub max_seq: usize,
}

impl Envelope {
    /// An empty envelope for calls of at most `max_batch x max_seq`.
    pub fn new(max_batch: usize, max_seq: usize) -> Self {
        Envelope {
            batch: 0,
            seq: 0,
            max_batch: max_batch.max(1),
            max_seq: max_seq.max(1),
        }
    }

    /// `None` when a call of `batch x seq` fits; else grows and returns the new envelope, the
    /// shape to run the call at.
    pub fn fit(&mut self, batch: usize, seq: usize) -> Option<(usize, usize)> {
        if batch <= self.batch && seq <= self.seq {
            return None;
        }
        let grow = |have: usize, want: usize, quantum: usize, cap: usize| {
            (have.max(want).div_ceil(quantum) * quantum).min(cap.max(want))
        };
        self.batch = grow(self.batch, batch, ENVELOPE_BATCH, self.max_batch);
        self.seq = grow(self.seq, seq, ENVELOPE_SEQ, self.max_seq);
        Some((self.batch, self.seq))
    }
}

/// How the network's inputs are fed.
#[derive(Debug, Clone)]
enum Feed {
    /// [`build_bert`]'s inputs.
    Bert,
    /// An ONNX encoder's inputs, each with its role and element type.
    Onnx(Vec<(String, Role, DType)>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Ids,
    Mask,
    TokenTypes,
}

/// A sentence-embedding model on the device: tokenizer, network and one request.
pub struct SentenceModel {
    tokenizer: WordPiece,
    network: Network,
    request: InferRequest,
    /// The `[batch, seq]` the request's buffers are sized for.
    envelope: Envelope,
    /// Counters of the requests an envelope growth replaced.
    retired: Retired,
    feed: Feed,
    dim: usize,
    pipeline: Pipeline,
    options: EmbedOptions,
}

impl std::fmt::Debug for SentenceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentenceModel")
            .field("dim", &self.dim)
            .field("pipeline", &self.pipeline)
            .finish()
    }
}

/// What the requests replaced by envelope growths did.
#[derive(Debug, Clone, Copy, Default)]
struct Retired {
    iterations: u64,
    allocations: u64,
    reallocations: u64,
    requests: u64,
}

/// The texts of a sentence-transformers folder (the weights apart).
#[derive(Debug, Clone, Copy)]
pub struct FolderTexts<'a> {
    /// `config.json`.
    pub config: &'a str,
    /// `tokenizer.json`.
    pub tokenizer: &'a str,
    /// `modules.json`.
    pub modules: &'a str,
    /// The pooling module's `config.json`.
    pub pooling: &'a str,
    /// `sentence_bert_config.json`, if the folder has one.
    pub sentence_bert: Option<&'a str>,
}

impl SentenceModel {
    /// A BERT sentence-transformers model from its folder's texts and its weights (`index`
    /// over `backing`, the whole `model.safetensors`), compiled for `engine`.
    ///
    /// # Errors
    /// [`SentenceError::Config`], [`SentenceError::Tokenizer`], [`SentenceError::Weights`]
    /// naming what is wrong; [`SentenceError::Run`] when compiling fails.
    pub fn from_bert(
        engine: &Engine,
        texts: FolderTexts<'_>,
        index: &SafeTensors,
        backing: Backing,
        options: EmbedOptions,
    ) -> Result<SentenceModel, SentenceError> {
        let config = BertConfig::from_json(texts.config)?;
        let pipeline = Pipeline::from_folder(
            texts.modules,
            texts.pooling,
            texts.sentence_bert,
            config.max_positions,
        )?;
        let mut tokenizer = WordPiece::from_json(texts.tokenizer)?;
        if tokenizer.vocab_size() > config.vocab_size {
            return Err(SentenceError::Config {
                file: "tokenizer.json".into(),
                reason: format!(
                    "{} entries, more than the model's vocab_size {}",
                    tokenizer.vocab_size(),
                    config.vocab_size
                ),
            });
        }
        tokenizer.set_max_length(Some(pipeline.max_seq_length))?;
        let weights = BertWeights::new(index, backing);
        let graph = build_bert(&config, &weights, &pipeline)?;
        Self::compile(
            engine,
            graph,
            tokenizer,
            Feed::Bert,
            config.hidden_size,
            pipeline,
            options,
        )
    }

    /// An ONNX encoder (`graph` imported from a file whose first f32 output of rank 3 is the
    /// last hidden state) with `pipeline` appended, and its tokenizer.
    ///
    /// # Errors
    /// [`SentenceError::Onnx`] for an input other than `input_ids`, `attention_mask` and
    /// `token_type_ids` or no rank-3 output; [`SentenceError::Run`] when compiling fails.
    pub fn from_onnx(
        engine: &Engine,
        imported: crate::onnx::ImportedGraph,
        mut tokenizer: WordPiece,
        pipeline: Pipeline,
        options: EmbedOptions,
    ) -> Result<SentenceModel, SentenceError> {
        // The encoder's f32 MatMul weights as `linear` ones: faster on a software adapter,
        // for a transposed copy of them on the host
        // (docs/benchmarks/2026-11-28-embeddings-lavapipe.md).
        let (imported, _) = crate::onnx::import::linear_weights(imported, true)
            .map_err(|e| SentenceError::Onnx(e.to_string()))?;
        let mut inputs = Vec::new();
        let mut mask = None;
        for v in &imported.inputs {
            let role = match v.name.as_str() {
                "input_ids" => Role::Ids,
                "attention_mask" => Role::Mask,
                "token_type_ids" => Role::TokenTypes,
                other => {
                    return Err(SentenceError::Onnx(format!(
                        "input `{other}`: an encoder takes input_ids, attention_mask and token_type_ids"
                    )))
                }
            };
            if !matches!(v.dtype, DType::I64 | DType::I32) {
                return Err(SentenceError::Onnx(format!(
                    "input `{}` is {}, not i64 or i32",
                    v.name, v.dtype
                )));
            }
            if role == Role::Mask {
                mask = Some(v.node);
            }
            inputs.push((v.name.clone(), role, v.dtype));
        }
        if !inputs.iter().any(|i| i.1 == Role::Ids) {
            return Err(SentenceError::Onnx(
                "the model has no input `input_ids`".into(),
            ));
        }
        let mask = mask
            .ok_or_else(|| SentenceError::Onnx("the model has no input `attention_mask`".into()))?;
        let graph = &imported.graph;
        let hidden = imported
            .outputs
            .iter()
            .filter(|o| o.dtype == DType::F32)
            .find(|o| {
                // The rank from the probes' shapes is not at hand here: a rank-3 output is one
                // whose node the graph can infer as such with batch 1, seq 2.
                infer_rank(graph, o.node) == Some(3)
            })
            .ok_or_else(|| {
                SentenceError::Onnx("no f32 output of rank 3 (the last hidden state)".into())
            })?;
        let (hidden_node, dim) = (hidden.node, infer_last_dim(graph, hidden.node).unwrap_or(0));
        if dim == 0 {
            return Err(SentenceError::Onnx(format!(
                "output `{}` has no fixed width",
                hidden.name
            )));
        }
        let mut b = GraphBuilder::extend(imported.graph);
        let mask_f32 = b.node(
            "pool/mask_f32",
            crate::graph::ops::Cast { to: DType::F32 },
            &[mask],
        );
        let out = append_pooling(&mut b, hidden_node, mask_f32, &pipeline)?;
        b.output(out);
        let graph = b.build()?;
        tokenizer.set_max_length(Some(pipeline.max_seq_length))?;
        Self::compile(
            engine,
            graph,
            tokenizer,
            Feed::Onnx(inputs),
            dim,
            pipeline,
            options,
        )
    }

    fn compile(
        engine: &Engine,
        graph: Graph,
        tokenizer: WordPiece,
        feed: Feed,
        dim: usize,
        pipeline: Pipeline,
        options: EmbedOptions,
    ) -> Result<SentenceModel, SentenceError> {
        let network = Network::compile(
            engine,
            graph,
            NetworkOptions {
                // One request: room for one copy of the inputs and outputs.
                inflight: 1,
                ..NetworkOptions::default()
            },
        )?;
        let request = InferRequest::new(&network, options.run)?;
        let envelope = Envelope::new(options.max_batch, pipeline.max_seq_length);
        Ok(SentenceModel {
            tokenizer,
            network,
            request,
            envelope,
            retired: Retired::default(),
            feed,
            dim,
            pipeline,
            options,
        })
    }

    /// Width of the vectors.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The steps after the transformer.
    pub fn pipeline(&self) -> Pipeline {
        self.pipeline
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &WordPiece {
        &self.tokenizer
    }

    /// The batching and memory options.
    pub fn options(&self) -> &EmbedOptions {
        &self.options
    }

    /// The compiled network.
    pub fn network(&self) -> &Network {
        &self.network
    }

    /// The counters of the request since the last envelope growth, with `iterations`,
    /// `allocations` and `reallocations` counted since the model was loaded: the buffers a
    /// growth replaced count as reallocations.
    pub fn stats(&self) -> RunStats {
        let mut s = self.request.stats();
        let r = self.retired;
        s.iterations += r.iterations;
        s.allocations += r.allocations;
        // Every buffer of a request after the first replaces one of an earlier request.
        let fresh = if r.requests > 0 {
            s.allocations.saturating_sub(s.reallocations)
        } else {
            0
        };
        s.reallocations += r.reallocations + fresh;
        s
    }

    /// The `[batch, seq]` the request's buffers are sized for.
    pub fn envelope(&self) -> Envelope {
        self.envelope
    }

    /// What the request's sizer decided since the model was loaded.
    pub fn sizing(&self) -> SizingSummary {
        self.request.sizing()
    }

    /// The ids of each text (truncated, special tokens included).
    pub fn tokenize(&self, texts: &[&str]) -> Vec<Vec<u32>> {
        texts.iter().map(|t| self.tokenizer.encode(t)).collect()
    }

    /// The vectors of `texts`, in order: tokenized, batched by length ([`plan_batches`]),
    /// one iteration per batch.
    ///
    /// # Errors
    /// [`SentenceError::Run`] when an iteration fails (the model stays usable).
    pub async fn embed(&mut self, texts: &[&str]) -> Result<Embeddings, SentenceError> {
        let ids = self.tokenize(texts);
        self.embed_ids(&ids).await
    }

    /// [`SentenceModel::embed`] from token ids (each as the tokenizer gives them).
    ///
    /// # Errors
    /// As [`SentenceModel::embed`].
    pub async fn embed_ids(&mut self, ids: &[Vec<u32>]) -> Result<Embeddings, SentenceError> {
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        let plan = plan_batches(
            &lengths,
            self.options.max_batch,
            self.options.max_batch_tokens,
        );
        let mut values = vec![0f32; ids.len() * self.dim];
        let mut padding = 0;
        for batch in &plan {
            let rows: Vec<&[u32]> = batch.iter().map(|&i| ids[i].as_slice()).collect();
            padding += rows.len() * rows[0].len() - rows.iter().map(|r| r.len()).sum::<usize>();
            let out = self.run_batch(&rows).await?;
            for (j, &i) in batch.iter().enumerate() {
                values[i * self.dim..(i + 1) * self.dim]
                    .copy_from_slice(&out[j * self.dim..(j + 1) * self.dim]);
            }
        }
        Ok(Embeddings {
            dim: self.dim,
            values,
            tokens: lengths,
            batches: plan.len(),
            padding_tokens: padding,
        })
    }

    /// One iteration over `rows` (padded to the longest): `rows x dim` values.
    ///
    /// # Errors
    /// As [`SentenceModel::embed`].
    pub async fn run_batch(&mut self, rows: &[&[u32]]) -> Result<Vec<f32>, SentenceError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let (n, longest) = (rows.len(), rows.iter().map(|r| r.len()).max().unwrap_or(0));
        if let Some((batch, seq)) = self.envelope.fit(n, longest) {
            self.replace_request()?;
            // Sized for the whole envelope, run at the call's own shape: rows beyond the
            // call's repeat its first (never a row without tokens).
            let padded: Vec<&[u32]> = (0..batch)
                .map(|i| rows[if i < n { i } else { 0 }])
                .collect();
            let tensors = self.inputs(&padded, seq)?;
            let feeds: Vec<(&str, &HostTensor)> =
                tensors.iter().map(|(l, t)| (l.as_str(), t)).collect();
            self.request.reserve(&feeds)?;
        }
        let tensors = self.inputs(rows, longest)?;
        let feeds: Vec<(&str, &HostTensor)> =
            tensors.iter().map(|(l, t)| (l.as_str(), t)).collect();
        let out = self.request.infer(&feeds, &[OUTPUT]).await?;
        let values = out.first().map(HostTensor::to_f32).unwrap_or_default();
        if values.len() != n * self.dim {
            return Err(SentenceError::Output {
                got: values.len(),
                sentences: n,
                dim: self.dim,
            });
        }
        Ok(values)
    }

    /// The network's inputs for `rows` of token ids padded to `seq` tokens (at least the
    /// longest row's), named and typed as the network takes them: what one iteration of
    /// [`SentenceModel::run_batch`] feeds.
    ///
    /// # Errors
    /// [`SentenceError::Onnx`] when an ONNX input's type cannot hold the ids.
    pub fn inputs(
        &self,
        rows: &[&[u32]],
        seq: usize,
    ) -> Result<Vec<(String, HostTensor)>, SentenceError> {
        let pad = self.tokenizer.pad_id();
        let n = rows.len();
        let seq = seq.max(rows.iter().map(|r| r.len()).max().unwrap_or(0));
        let inputs = match &self.feed {
            Feed::Bert => return Ok(bert_inputs_at(rows, pad, seq)),
            Feed::Onnx(inputs) => inputs,
        };
        let mut ids = Vec::with_capacity(n * seq);
        let mut mask = Vec::with_capacity(n * seq);
        for r in rows {
            ids.extend(r.iter().map(|&t| i64::from(t)));
            ids.extend(std::iter::repeat_n(i64::from(pad), seq - r.len()));
            mask.extend(std::iter::repeat_n(1i64, r.len()));
            mask.extend(std::iter::repeat_n(0i64, seq - r.len()));
        }
        let shape = Shape::new(vec![n as u64, seq as u64]);
        let zeros = vec![0i64; n * seq];
        inputs
            .iter()
            .map(|(name, role, dtype)| {
                let values: &[i64] = match role {
                    Role::Ids => &ids,
                    Role::Mask => &mask,
                    Role::TokenTypes => &zeros,
                };
                let bytes = crate::tensor::encode_i64(*dtype, values)
                    .map_err(|e| SentenceError::Onnx(format!("input `{name}`: {e}")))?;
                Ok((
                    name.clone(),
                    HostTensor {
                        shape: shape.clone(),
                        dtype: *dtype,
                        bytes,
                    },
                ))
            })
            .collect()
    }

    /// A fresh request in place of the current one, whose buffers are freed first (an
    /// envelope growth).
    fn replace_request(&mut self) -> Result<(), SentenceError> {
        let old = self.request.stats();
        if old.iterations > 0 {
            self.retired.iterations += old.iterations;
            self.retired.allocations += old.allocations;
            let fresh = if self.retired.requests > 0 {
                old.allocations.saturating_sub(old.reallocations)
            } else {
                0
            };
            self.retired.reallocations += old.reallocations + fresh;
            self.retired.requests += 1;
        }
        // A new request allocates only its static arena (every activation here depends on
        // batch or seq); its activations come at its first iteration, after the old request
        // and its buffers are gone.
        let fresh = InferRequest::new(&self.network, self.options.run)?;
        let old = std::mem::replace(&mut self.request, fresh);
        drop(old);
        Ok(())
    }

    /// [`SentenceModel::embed`], blocking (native only).
    ///
    /// # Errors
    /// As [`SentenceModel::embed`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn embed_blocking(&mut self, texts: &[&str]) -> Result<Embeddings, SentenceError> {
        pollster::block_on(self.embed(texts))
    }
}

/// The rank of node `id`'s output with `batch = 1` and every other symbol 2 (`None` when
/// that does not infer).
fn infer_rank(graph: &Graph, id: crate::graph::NodeId) -> Option<usize> {
    probe(graph).map(|shapes| shapes[id.index()].rank())
}

/// The last dimension of node `id`'s output, when it is the same under two probes.
fn infer_last_dim(graph: &Graph, id: crate::graph::NodeId) -> Option<usize> {
    let a = probe_with(graph, 1, 2)?[id.index()]
        .dims()
        .last()
        .copied()?;
    let b = probe_with(graph, 2, 3)?[id.index()]
        .dims()
        .last()
        .copied()?;
    (a == b).then_some(a as usize)
}

fn probe(graph: &Graph) -> Option<Vec<Shape>> {
    probe_with(graph, 1, 2)
}

/// Every node's shape with every symbol bound to `batch` where it names a batch and `seq`
/// otherwise.
fn probe_with(graph: &Graph, batch: u64, seq: u64) -> Option<Vec<Shape>> {
    let mut bindings = crate::graph::Bindings::new();
    for id in graph.inputs() {
        if let crate::graph::ops::Op::Input(input) = &graph.node(id).op {
            for (axis, d) in input.dims.iter().enumerate() {
                if let crate::graph::Dim::Sym(s) = d {
                    bindings
                        .entry(s.clone())
                        .or_insert(if axis == 0 { batch } else { seq });
                }
            }
        }
    }
    let shapes = graph.infer_shapes(&bindings).ok()?;
    Some(shapes.shapes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_length_buckets_in_order() {
        let lengths = [3, 256, 40, 41, 255, 8, 12, 100, 90, 5];
        let b = plan_batches(&lengths, 3, 10_000);
        assert_eq!(
            b,
            vec![vec![1, 4], vec![7, 8], vec![3, 2], vec![6, 5, 9], vec![0]]
        );
        // Every sentence once.
        let mut all: Vec<usize> = b.concat();
        all.sort_unstable();
        assert_eq!(all, (0..lengths.len()).collect::<Vec<_>>());
        // The token bound splits a bucket; a sentence over it is a batch of its own.
        assert_eq!(
            plan_batches(&[10, 10, 10], 8, 20),
            vec![vec![0, 1], vec![2]]
        );
        assert_eq!(plan_batches(&[50, 10], 8, 20), vec![vec![0], vec![1]]);
        assert!(plan_batches(&[], 8, 20).is_empty());
    }
}
