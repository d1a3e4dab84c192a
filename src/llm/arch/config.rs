//! The hyper-parameters of a model, read from GGUF metadata alone and checked against the
//! shapes of its tensors.

use super::{architecture, architecture_names, Architecture};
use crate::gguf::{GgmlType, Gguf, GgufError};

/// How RoPE positions are scaled before the angles are taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Angles `p θ_i`.
    None,
    /// `{arch}.rope.scaling.type = "linear"`: angles `p θ_i / factor`
    /// (`{arch}.rope.scaling.factor`).
    Linear {
        /// The factor, above 0.
        factor: f32,
    },
}

/// A decoder (one of [`super::ARCHITECTURES`]) as its GGUF describes it. Every field
/// comes from the metadata (`{arch}.*` keys) or the tensor index; nothing is a constant of
/// one model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The architecture (`general.architecture`).
    pub arch: &'static Architecture,
    /// Decoder blocks (`{arch}.block_count`).
    pub num_layers: u32,
    /// Model width, the residual stream (`{arch}.embedding_length`).
    pub embedding_len: u32,
    /// Query heads (`{arch}.attention.head_count`).
    pub num_heads: u32,
    /// Key/value heads, fewer than `num_heads` for grouped-query attention
    /// (`{arch}.attention.head_count_kv`, else `num_heads`).
    pub num_kv_heads: u32,
    /// Elements per head (`{arch}.attention.key_length`, else `embedding_len / num_heads`).
    pub head_dim: u32,
    /// Hidden width of the SwiGLU feed-forward (`{arch}.feed_forward_length`).
    pub ffn_len: u32,
    /// RMSNorm epsilon (`{arch}.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// RoPE base frequency (`{arch}.rope.freq_base`, else 10000 as in llama.cpp).
    pub rope_base: f32,
    /// Elements of each head that RoPE rotates (`{arch}.rope.dimension_count`, else
    /// `head_dim`), in pairs as the architecture's builder says.
    pub rope_dim: u32,
    /// Position scaling (`{arch}.rope.scaling.*`).
    pub rope_scaling: RopeScaling,
    /// The file has `rope_freqs.weight` (`rope_dim / 2` f32 factors that divide the
    /// frequencies: Llama 3.1's long-context scaling, precomputed by the converter).
    pub rope_freq_factors: bool,
    /// Longest context the model was trained for, in tokens (`{arch}.context_length`).
    pub context_len: u32,
    /// Vocabulary size: rows of `token_embd.weight` (also `{arch}.vocab_size` and the token
    /// list's length when present, which must agree).
    pub vocab_size: u32,
    /// True when there is no `output.weight`: the head is `token_embd.weight` (tied).
    pub tied_output: bool,
    /// Type of `token_embd.weight` (the embedding, and the head when tied).
    pub embedding_type: GgmlType,
    /// Keys a local layer's query sees, its own included (`{arch}.attention.sliding_window`);
    /// 0 when every layer is global.
    pub sliding_window: u32,
    /// Layer `l` is local when `l % swa_pattern < swa_pattern - 1` (with a sliding window):
    /// [`super::SlidingWindowLayers::pattern`] or `{arch}.attention.sliding_window_pattern`.
    pub swa_pattern: u32,
    /// RoPE base of the local layers ([`super::SlidingWindowLayers::rope_base`] or
    /// `{arch}.rope.freq_base_swa`).
    pub rope_base_swa: f32,
}

impl ModelConfig {
    /// Reads the configuration of `gguf` and checks every tensor the forward pass uses:
    /// present, with the shape the metadata implies.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], [`GgufError::WrongType`], [`GgufError::ValueOutOfRange`]
    /// (zero sizes, a negative epsilon, a RoPE scaling other than none or linear),
    /// [`GgufError::UnsupportedArchitecture`],
    /// [`GgufError::Inconsistent`] (heads that do not divide, vocabulary sizes that
    /// disagree), [`GgufError::MissingTensor`] and [`GgufError::TensorShape`].
    pub fn from_gguf(gguf: &Gguf) -> Result<ModelConfig, GgufError> {
        let name = gguf.get_str("general.architecture")?;
        let arch = architecture(name).ok_or_else(|| GgufError::UnsupportedArchitecture {
            architecture: name.to_owned(),
            supported: architecture_names(),
        })?;
        let arch_name = arch.name;
        let key = |k: &str| format!("{arch_name}.{k}");
        let positive = |k: &str| -> Result<u32, GgufError> {
            let full = key(k);
            match gguf.get_u32(&full)? {
                0 => Err(GgufError::ValueOutOfRange {
                    key: full,
                    value: "0".into(),
                    reason: "must be positive".into(),
                }),
                v => Ok(v),
            }
        };
        let num_layers = positive("block_count")?;
        let embedding_len = positive("embedding_length")?;
        let num_heads = positive("attention.head_count")?;
        let num_kv_heads = match gguf.opt_u32(&key("attention.head_count_kv"))? {
            None => num_heads,
            Some(_) => positive("attention.head_count_kv")?,
        };
        let ffn_len = positive("feed_forward_length")?;
        let context_len = positive("context_length")?;
        let head_dim = match gguf.opt_u32(&key("attention.key_length"))? {
            Some(_) => positive("attention.key_length")?,
            None => {
                if embedding_len % num_heads != 0 {
                    return Err(GgufError::Inconsistent {
                        reason: format!(
                            "embedding_length {embedding_len} is not a multiple of head_count \
                             {num_heads} and attention.key_length is absent"
                        ),
                    });
                }
                embedding_len / num_heads
            }
        };
        if let Some(v) = gguf.opt_u32(&key("attention.value_length"))? {
            if v != head_dim {
                return Err(GgufError::Inconsistent {
                    reason: format!(
                        "attention.value_length {v} differs from the key length {head_dim}"
                    ),
                });
            }
        }
        if num_heads % num_kv_heads != 0 {
            return Err(GgufError::Inconsistent {
                reason: format!(
                    "head_count {num_heads} is not a multiple of head_count_kv {num_kv_heads}"
                ),
            });
        }
        let rms_eps = gguf.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(GgufError::ValueOutOfRange {
                key: key("attention.layer_norm_rms_epsilon"),
                value: rms_eps.to_string(),
                reason: "must be a finite non-negative number".into(),
            });
        }
        let rope_base = gguf.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        if !(rope_base.is_finite() && rope_base > 1.0) {
            return Err(GgufError::ValueOutOfRange {
                key: key("rope.freq_base"),
                value: rope_base.to_string(),
                reason: "must be a finite number above 1".into(),
            });
        }
        let rope_dim = gguf
            .opt_u32(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        if rope_dim == 0 || rope_dim % 2 != 0 || rope_dim > head_dim {
            return Err(GgufError::ValueOutOfRange {
                key: key("rope.dimension_count"),
                value: rope_dim.to_string(),
                reason: format!("must be even, positive and at most the head dim {head_dim}"),
            });
        }
        let rope_scaling = match gguf.opt_str(&key("rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => {
                let factor = gguf.get_f32(&key("rope.scaling.factor"))?;
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(GgufError::ValueOutOfRange {
                        key: key("rope.scaling.factor"),
                        value: factor.to_string(),
                        reason: "must be a finite number above 0".into(),
                    });
                }
                RopeScaling::Linear { factor }
            }
            Some(other) => {
                return Err(GgufError::ValueOutOfRange {
                    key: key("rope.scaling.type"),
                    value: other.to_owned(),
                    reason: "dynrt applies RoPE scaling of type none or linear (and Llama \
                             3.1's frequency factors, rope_freqs.weight)"
                        .into(),
                })
            }
        };
        let rope_freq_factors = match gguf.tensor("rope_freqs.weight") {
            None => false,
            Some(t) => {
                if t.ggml_type() != GgmlType::F32 || t.dims() != [u64::from(rope_dim / 2)] {
                    return Err(GgufError::TensorShape {
                        tensor: "rope_freqs.weight".into(),
                        expected: vec![u64::from(rope_dim / 2)],
                        found: t.dims().to_vec(),
                    });
                }
                true
            }
        };

        let (sliding_window, swa_pattern, rope_base_swa) = match arch.sliding_window {
            None => (0, 0, rope_base),
            Some(rules) => {
                let window = gguf.opt_u32(&key("attention.sliding_window"))?.unwrap_or(0);
                let pattern = match gguf.opt_u32(&key("attention.sliding_window_pattern"))? {
                    None => rules.pattern,
                    Some(_) => positive("attention.sliding_window_pattern")?,
                };
                let base = gguf
                    .opt_f32(&key("rope.freq_base_swa"))?
                    .unwrap_or(rules.rope_base);
                if !(base.is_finite() && base > 1.0) {
                    return Err(GgufError::ValueOutOfRange {
                        key: key("rope.freq_base_swa"),
                        value: base.to_string(),
                        reason: "must be a finite number above 1".into(),
                    });
                }
                (window, pattern, base)
            }
        };

        let embd = gguf.require_tensor("token_embd.weight")?;
        let vocab_size = match embd.dims() {
            [w, v] if *w == u64::from(embedding_len) && u32::try_from(*v).is_ok_and(|v| v > 0) => {
                *v as u32
            }
            found => {
                return Err(GgufError::TensorShape {
                    tensor: "token_embd.weight".into(),
                    expected: vec![embedding_len.into(), 0],
                    found: found.to_vec(),
                })
            }
        };
        if let Some(v) = gguf.opt_u32(&key("vocab_size"))? {
            if v != vocab_size {
                return Err(GgufError::Inconsistent {
                    reason: format!(
                        "{arch_name}.vocab_size {v} but token_embd.weight has {vocab_size} rows"
                    ),
                });
            }
        }
        if gguf.get("tokenizer.ggml.tokens").is_some() {
            let n = gguf.get_str_array("tokenizer.ggml.tokens")?.len();
            if n != vocab_size as usize {
                return Err(GgufError::Inconsistent {
                    reason: format!(
                        "tokenizer.ggml.tokens has {n} tokens but token_embd.weight has {vocab_size} rows"
                    ),
                });
            }
        }

        let config = ModelConfig {
            arch,
            num_layers,
            embedding_len,
            num_heads,
            num_kv_heads,
            head_dim,
            ffn_len,
            rms_eps,
            rope_base,
            rope_dim,
            rope_scaling,
            rope_freq_factors,
            context_len,
            vocab_size,
            tied_output: gguf.tensor("output.weight").is_none(),
            embedding_type: embd.ggml_type(),
            sliding_window,
            swa_pattern,
            rope_base_swa,
        };
        for (name, dims) in config.expected_tensors() {
            let t = gguf.require_tensor(&name)?;
            if t.dims() != dims.as_slice() {
                return Err(GgufError::TensorShape {
                    tensor: name,
                    expected: dims,
                    found: t.dims().to_vec(),
                });
            }
        }
        // A block the metadata does not count would be loaded and never run: the file
        // disagrees with itself, so it is refused rather than half used.
        for t in gguf.tensors() {
            let block = t
                .name()
                .strip_prefix("blk.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(block) = block.filter(|&b| b >= u64::from(num_layers)) {
                return Err(GgufError::Inconsistent {
                    reason: format!(
                        "tensor {} belongs to block {block} but {}.block_count says there \
                         are {num_layers} blocks",
                        t.name(),
                        arch_name
                    ),
                });
            }
        }
        Ok(config)
    }

    /// Whether layer `l` attends within the sliding window (a local layer).
    pub fn is_local(&self, l: u32) -> bool {
        self.sliding_window > 0
            && self.swa_pattern > 0
            && l % self.swa_pattern < self.swa_pattern - 1
    }

    /// The local (sliding-window) layers, in order.
    pub fn local_layers(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.num_layers).filter(|&l| self.is_local(l))
    }

    /// Keys layer `l`'s queries see: [`ModelConfig::sliding_window`] for a local layer, 0
    /// (all) for a global one.
    pub fn window_of(&self, l: u32) -> u32 {
        if self.is_local(l) {
            self.sliding_window
        } else {
            0
        }
    }

    /// Query heads that share one key/value head.
    pub fn group_size(&self) -> u32 {
        self.num_heads / self.num_kv_heads
    }

    /// Width of all query heads together: `num_heads * head_dim`.
    pub fn q_len(&self) -> u32 {
        self.num_heads * self.head_dim
    }

    /// Width of the keys (and of the values) of one token in one layer:
    /// `num_kv_heads * head_dim`.
    pub fn kv_len(&self) -> u32 {
        self.num_kv_heads * self.head_dim
    }

    /// Every tensor the forward pass reads and its dims in ggml order (innermost first): a
    /// projection from `n_in` to `n_out` is `[n_in, n_out]`. The architecture's builder,
    /// run without a file, lists them in the order it reads them: the embedding, each
    /// layer's, the head's (`output.weight` only when not tied).
    pub fn expected_tensors(&self) -> Vec<(String, Vec<u64>)> {
        crate::llm::graph::tensors_read(self)
    }
}
