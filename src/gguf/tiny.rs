//! A tiny llama (or qwen2, qwen3, gemma3) GGUF with random weights: a whole model in kilobytes, for tests of
//! the parser, the tokenizer, kernels and the forward pass (`scripts/smollm2_ref.py` runs on
//! it as on the real model).

use super::{quantize, GgmlType, GgufBuilder, GgufError, MetaArray, MetaValue};
use crate::rng::SplitMix64;

/// The shape of a [`TinyLlama`] model. Dims must make whole quantization blocks (32) for
/// the quantized tensors: `embedding_len`, `ffn_len` and `num_heads * head_dim` multiples
/// of 32.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyLlama {
    /// `general.architecture` and the metadata keys' prefix: `llama`, `qwen2` (adds the
    /// Q/K/V biases), `qwen3` (adds the Q/K norms) or `gemma3` (adds the Q/K norms and the
    /// post-norms).
    pub architecture: &'static str,
    /// Decoder blocks.
    pub num_layers: u32,
    /// Model width.
    pub embedding_len: u32,
    /// Query heads.
    pub num_heads: u32,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: u32,
    /// Elements per head (`embedding_len / num_heads` unless set otherwise; written as
    /// `attention.key_length` when it differs).
    pub head_dim: u32,
    /// SwiGLU hidden width.
    pub ffn_len: u32,
    /// Context length written in the metadata.
    pub context_len: u32,
    /// RoPE base.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Type of the projections (`Q4_1` like SmolLM2, or any type of `dynrt::formats`; the
    /// k-quants need widths that are multiples of 256).
    pub projection_type: GgmlType,
    /// Type of the embedding (`Q8_0` like SmolLM2).
    pub embedding_type: GgmlType,
    /// Write a separate `output.weight` (untied head) instead of sharing the embedding.
    pub untied_output: bool,
    /// Write `rope_freqs.weight` (Llama 3.1's per-frequency divisors, here 1 to 8).
    pub rope_freqs: bool,
    /// `{arch}.attention.sliding_window` when above 0 (gemma3: local layers see this many
    /// keys).
    pub sliding_window: u32,
}

impl Default for TinyLlama {
    /// 2 layers, width 64, 4 heads of 16 over 2 KV heads, FFN 96: SmolLM2's structure
    /// (grouped-query attention, Q4_1 projections, a tied Q8_0 embedding) at toy size.
    fn default() -> Self {
        TinyLlama {
            architecture: "llama",
            num_layers: 2,
            embedding_len: 64,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            ffn_len: 96,
            context_len: 256,
            rope_base: 100_000.0,
            rms_eps: 1e-5,
            projection_type: GgmlType::Q4_1,
            embedding_type: GgmlType::Q8_0,
            untied_output: false,
            rope_freqs: false,
            sliding_window: 0,
        }
    }
}

/// The control tokens of the tiny vocabulary, after the 256 byte tokens and the merges.
pub const TINY_SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Merge rules of the tiny vocabulary, highest priority first.
const TINY_MERGES: [&str; 6] = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r"];

/// SmolLM2's chat template (ChatML with a default system prompt).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

type TensorSpec = (String, GgmlType, Vec<u64>, Vec<u8>);

/// A weight of `dims` (innermost first), uniform in ±1.7/sqrt(fan-in), quantized to `ty`.
fn weight(
    rng: &mut SplitMix64,
    name: &str,
    ty: GgmlType,
    dims: [u64; 2],
) -> Result<TensorSpec, GgufError> {
    let scale = 1.7 / (dims[0] as f32).sqrt();
    let x: Vec<f32> = (0..dims[0] * dims[1])
        .map(|_| rng.uniform(-scale, scale))
        .collect();
    Ok((name.to_owned(), ty, dims.to_vec(), quantize(name, ty, &x)?))
}

/// An F32 bias of `n` elements in ±0.5.
fn bias(rng: &mut SplitMix64, name: String, n: u64) -> TensorSpec {
    let x: Vec<u8> = (0..n)
        .flat_map(|_| rng.uniform(-0.5, 0.5).to_le_bytes())
        .collect();
    (name, GgmlType::F32, vec![n], x)
}

/// An F32 norm weight of `w` elements around 1.
fn norm(rng: &mut SplitMix64, name: String, w: u64) -> TensorSpec {
    let x: Vec<u8> = (0..w)
        .flat_map(|_| rng.uniform(0.8, 1.2).to_le_bytes())
        .collect();
    (name, GgmlType::F32, vec![w], x)
}

impl TinyLlama {
    /// The vocabulary: 256 byte tokens, the merged tokens, then [`TINY_SPECIAL_TOKENS`].
    pub fn tokens() -> Vec<String> {
        let mut tokens = crate::tokenizer::byte_level_tokens();
        tokens.extend(TINY_MERGES.iter().map(|m| m.replace(' ', "")));
        tokens.extend(TINY_SPECIAL_TOKENS.iter().map(|s| s.to_string()));
        tokens
    }

    /// The model as GGUF bytes, weights drawn from `seed` (uniform, scaled by 1/sqrt(fan-in)
    /// so activations stay of order one), norms around 1.
    ///
    /// # Errors
    /// [`GgufError::PartialBlock`] when a dim is not a whole number of blocks;
    /// [`GgufError::UnsupportedTensorType`] for a type [`quantize`] does not write.
    pub fn build(&self, seed: u64) -> Result<Vec<u8>, GgufError> {
        let mut rng = SplitMix64::new(seed);
        let tokens = Self::tokens();
        let vocab = tokens.len() as u64;
        let n_normal = tokens.len() - TINY_SPECIAL_TOKENS.len();
        let mut types = vec![1i32; n_normal];
        types.extend([3; TINY_SPECIAL_TOKENS.len()]);
        let (w, q, kv, f) = (
            u64::from(self.embedding_len),
            u64::from(self.num_heads * self.head_dim),
            u64::from(self.num_kv_heads * self.head_dim),
            u64::from(self.ffn_len),
        );
        let eos = (n_normal + 2) as u32;
        let arch = self.architecture;
        let key = |k: &str| format!("{arch}.{k}");
        let mut b = GgufBuilder::new()
            .metadata("general.architecture", MetaValue::Str(arch.into()))
            .metadata("general.name", MetaValue::Str("dynrt tiny llama".into()))
            .metadata(key("block_count"), MetaValue::U32(self.num_layers))
            .metadata(key("context_length"), MetaValue::U32(self.context_len))
            .metadata(key("embedding_length"), MetaValue::U32(self.embedding_len))
            .metadata(key("feed_forward_length"), MetaValue::U32(self.ffn_len))
            .metadata(key("attention.head_count"), MetaValue::U32(self.num_heads))
            .metadata(
                key("attention.head_count_kv"),
                MetaValue::U32(self.num_kv_heads),
            )
            .metadata(key("rope.freq_base"), MetaValue::F32(self.rope_base))
            .metadata(
                key("attention.layer_norm_rms_epsilon"),
                MetaValue::F32(self.rms_eps),
            )
            .metadata(key("rope.dimension_count"), MetaValue::U32(self.head_dim))
            .metadata(key("vocab_size"), MetaValue::U32(vocab as u32))
            .metadata("tokenizer.ggml.model", MetaValue::Str("gpt2".into()))
            .metadata("tokenizer.ggml.pre", MetaValue::Str("smollm".into()))
            .metadata(
                "tokenizer.ggml.tokens",
                MetaValue::Array(MetaArray::Str(tokens)),
            )
            .metadata(
                "tokenizer.ggml.token_type",
                MetaValue::Array(MetaArray::I32(types)),
            )
            .metadata(
                "tokenizer.ggml.merges",
                MetaValue::Array(MetaArray::Str(
                    TINY_MERGES.iter().map(|m| m.to_string()).collect(),
                )),
            )
            .metadata("tokenizer.ggml.bos_token_id", MetaValue::U32(eos - 1))
            .metadata("tokenizer.ggml.eos_token_id", MetaValue::U32(eos))
            .metadata("tokenizer.ggml.add_bos_token", MetaValue::Bool(false))
            .metadata(
                "tokenizer.chat_template",
                MetaValue::Str(CHATML_TEMPLATE.into()),
            );
        if self.sliding_window > 0 {
            b = b.metadata(
                key("attention.sliding_window"),
                MetaValue::U32(self.sliding_window),
            );
        }
        if self.num_heads * self.head_dim != self.embedding_len {
            b = b.metadata(key("attention.key_length"), MetaValue::U32(self.head_dim));
            b = b.metadata(key("attention.value_length"), MetaValue::U32(self.head_dim));
        }
        let rng = &mut rng;
        let mut tensors = vec![weight(
            rng,
            "token_embd.weight",
            self.embedding_type,
            [w, vocab],
        )?];
        if self.untied_output {
            tensors.push(weight(
                rng,
                "output.weight",
                self.embedding_type,
                [w, vocab],
            )?);
        }
        tensors.push(norm(rng, "output_norm.weight".into(), w));
        if self.rope_freqs {
            let half = u64::from(self.head_dim / 2);
            let x: Vec<u8> = (0..half)
                .flat_map(|_| rng.uniform(1.0, 8.0).to_le_bytes())
                .collect();
            tensors.push(("rope_freqs.weight".into(), GgmlType::F32, vec![half], x));
        }
        let p = self.projection_type;
        for l in 0..self.num_layers {
            let t = |s: &str| format!("blk.{l}.{s}.weight");
            tensors.push(norm(rng, t("attn_norm"), w));
            tensors.push(weight(rng, &t("attn_q"), p, [w, q])?);
            tensors.push(weight(rng, &t("attn_k"), p, [w, kv])?);
            tensors.push(weight(rng, &t("attn_v"), p, [w, kv])?);
            tensors.push(weight(rng, &t("attn_output"), p, [q, w])?);
            if arch == "qwen2" {
                for (name, n) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                    tensors.push(bias(rng, format!("blk.{l}.{name}.bias"), n));
                }
            }
            if arch == "gemma3" || arch == "qwen3" {
                let d = u64::from(self.head_dim);
                tensors.push(norm(rng, t("attn_q_norm"), d));
                tensors.push(norm(rng, t("attn_k_norm"), d));
            }
            if arch == "gemma3" {
                tensors.push(norm(rng, t("post_attention_norm"), w));
                tensors.push(norm(rng, t("post_ffw_norm"), w));
            }
            tensors.push(norm(rng, t("ffn_norm"), w));
            tensors.push(weight(rng, &t("ffn_gate"), p, [w, f])?);
            tensors.push(weight(rng, &t("ffn_up"), p, [w, f])?);
            tensors.push(weight(rng, &t("ffn_down"), p, [f, w])?);
        }
        for (name, ty, dims, data) in tensors {
            b = b.tensor(name, ty, &dims, data);
        }
        b.build()
    }
}
