//! The built-in GPT-2 style decoder: configuration, deterministic weights, and the graph.
//!
//! Token embedding plus learned positions, `layers` pre-LayerNorm blocks (causal
//! self-attention over a growing KV cache, then a tanh-GELU MLP with 4x width), a final
//! LayerNorm and a separate LM head (a head tied to the token embedding makes greedy decoding
//! of random weights echo its input token forever: the residual stream is dominated by that
//! token's embedding). Weights come from
//! [`crate::rng::SplitMix64`] seeded with `seed`, so native and browser runs
//! produce the same numbers.
//!
//! The KV cache is laid out sequence-major, `[t, dim]` per layer, so that appending a step is a
//! contiguous byte range at the end of the cache (the in-place concatenation of docs/design.md):
//! with the reference's `[heads, t, head_dim]` layout each head's rows would be strided by the
//! current length and growth could not be an append.

use crate::graph::{Dim, Graph, GraphBuilder, GraphError, NodeId};
use crate::rng::SplitMix64;
use crate::shape::{DType, Shape};

/// Errors in a decoder configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A size that must be positive is zero.
    #[error("decoder {field} must be at least 1, got 0")]
    Zero {
        /// Which field.
        field: &'static str,
    },
    /// `dim` is not a multiple of `heads`.
    #[error("decoder dim {dim} is not a multiple of heads {heads}: choose dim = heads * head_dim")]
    HeadsDoNotDivide {
        /// Model width.
        dim: u32,
        /// Attention heads.
        heads: u32,
    },
    /// A size is beyond what the demo supports.
    #[error("decoder {field} = {value} exceeds the supported maximum {max}")]
    TooLarge {
        /// Which field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest accepted.
        max: u64,
    },
}

/// Shape of the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DecoderConfig {
    /// Transformer blocks.
    pub layers: u32,
    /// Attention heads per block.
    pub heads: u32,
    /// Model width (`heads * head_dim`).
    pub dim: u32,
    /// Vocabulary size (token ids are `0..vocab`).
    pub vocab: u32,
    /// Rows of the learned position table: the longest sequence the model can see.
    pub max_positions: u32,
    /// Seed of the weights.
    pub seed: u64,
}

impl Default for DecoderConfig {
    /// Small enough that a prefill and 32 decode steps take seconds on lavapipe (2 cores).
    fn default() -> Self {
        DecoderConfig {
            layers: 2,
            heads: 4,
            dim: 64,
            vocab: 256,
            max_positions: 1024,
            seed: 7,
        }
    }
}

impl DecoderConfig {
    /// Checks the sizes.
    ///
    /// # Errors
    /// [`ModelError`] naming the first bad field.
    pub fn validate(&self) -> Result<(), ModelError> {
        for (field, v) in [
            ("layers", self.layers),
            ("heads", self.heads),
            ("dim", self.dim),
            ("vocab", self.vocab),
            ("max_positions", self.max_positions),
        ] {
            if v == 0 {
                return Err(ModelError::Zero { field });
            }
        }
        if self.dim % self.heads != 0 {
            return Err(ModelError::HeadsDoNotDivide {
                dim: self.dim,
                heads: self.heads,
            });
        }
        for (field, v, max) in [
            ("layers", self.layers as u64, 64),
            ("dim", self.dim as u64, 4096),
            ("vocab", self.vocab as u64, 1 << 20),
            ("max_positions", self.max_positions as u64, 1 << 20),
        ] {
            if v > max {
                return Err(ModelError::TooLarge {
                    field,
                    value: v,
                    max,
                });
            }
        }
        Ok(())
    }

    /// Width of one head.
    pub fn head_dim(&self) -> u32 {
        self.dim / self.heads.max(1)
    }

    /// Hidden width of the MLP (4x, as GPT-2).
    pub fn mlp_dim(&self) -> u32 {
        4 * self.dim
    }
}

/// Weights of one block, row-major, `x @ w` convention (`w` is `[in, out]`).
#[derive(Debug, Clone)]
pub struct BlockWeights {
    /// LayerNorm 1 scale and shift, `[dim]`.
    pub ln1_gamma: Vec<f32>,
    /// LayerNorm 1 shift, `[dim]`.
    pub ln1_beta: Vec<f32>,
    /// Query, key, value projections, `[dim, dim]` each.
    pub w_q: Vec<f32>,
    /// Key projection.
    pub w_k: Vec<f32>,
    /// Value projection.
    pub w_v: Vec<f32>,
    /// Query, key, value biases, `[dim]` each.
    pub b_q: Vec<f32>,
    /// Key bias.
    pub b_k: Vec<f32>,
    /// Value bias.
    pub b_v: Vec<f32>,
    /// Attention output projection `[dim, dim]` and bias `[dim]`.
    pub w_o: Vec<f32>,
    /// Attention output bias.
    pub b_o: Vec<f32>,
    /// LayerNorm 2 scale, `[dim]`.
    pub ln2_gamma: Vec<f32>,
    /// LayerNorm 2 shift, `[dim]`.
    pub ln2_beta: Vec<f32>,
    /// MLP up projection `[dim, 4 dim]` and bias.
    pub w_fc: Vec<f32>,
    /// MLP up bias, `[4 dim]`.
    pub b_fc: Vec<f32>,
    /// MLP down projection `[4 dim, dim]` and bias.
    pub w_proj: Vec<f32>,
    /// MLP down bias, `[dim]`.
    pub b_proj: Vec<f32>,
}

/// All weights of the decoder.
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    /// Token embedding `[vocab, dim]`.
    pub wte: Vec<f32>,
    /// LM head `[vocab, dim]` (logits = x @ lm_head^T).
    pub lm_head: Vec<f32>,
    /// Learned positions `[max_positions, dim]`.
    pub wpe: Vec<f32>,
    /// One entry per block.
    pub blocks: Vec<BlockWeights>,
    /// Final LayerNorm scale and shift, `[dim]`.
    pub lnf_gamma: Vec<f32>,
    /// Final LayerNorm shift.
    pub lnf_beta: Vec<f32>,
}

impl DecoderWeights {
    /// Deterministic weights for `config` (validate it first).
    ///
    /// Scales are chosen so activations stay O(1) through the blocks and the logits spread
    /// over several units, which keeps greedy argmax away from near ties.
    pub fn generate(config: &DecoderConfig) -> Self {
        let mut rng = SplitMix64::new(config.seed);
        let d = config.dim as usize;
        let m = config.mlp_dim() as usize;
        let mut uniform = |n: usize, scale: f32| -> Vec<f32> {
            (0..n).map(|_| rng.uniform(-scale, scale)).collect()
        };
        let proj = 1.0 / (d as f32).sqrt();
        let wte = uniform(config.vocab as usize * d, 1.0);
        // Positions come from their own stream so that every other weight, and the first rows
        // of this table, do not depend on `max_positions`: a longer run sees the same model.
        let mut pos_rng = SplitMix64::new(config.seed ^ 0x005E_ED0F_9051_7105);
        let wpe = (0..config.max_positions as usize * d)
            .map(|_| pos_rng.uniform(-0.3, 0.3))
            .collect();
        let mut blocks = Vec::with_capacity(config.layers as usize);
        for _ in 0..config.layers {
            let ln1_gamma = uniform(d, 0.1).into_iter().map(|v| 1.0 + v).collect();
            let ln1_beta = uniform(d, 0.1);
            let w_q = uniform(d * d, proj * 1.7);
            let w_k = uniform(d * d, proj * 1.7);
            let w_v = uniform(d * d, proj * 1.7);
            let b_q = uniform(d, 0.1);
            let b_k = uniform(d, 0.1);
            let b_v = uniform(d, 0.1);
            let w_o = uniform(d * d, proj);
            let b_o = uniform(d, 0.1);
            let ln2_gamma = uniform(d, 0.1).into_iter().map(|v| 1.0 + v).collect();
            let ln2_beta = uniform(d, 0.1);
            let w_fc = uniform(d * m, proj * 1.7);
            let b_fc = uniform(m, 0.1);
            let w_proj = uniform(m * d, 1.0 / (m as f32).sqrt());
            let b_proj = uniform(d, 0.1);
            blocks.push(BlockWeights {
                ln1_gamma,
                ln1_beta,
                w_q,
                w_k,
                w_v,
                b_q,
                b_k,
                b_v,
                w_o,
                b_o,
                ln2_gamma,
                ln2_beta,
                w_fc,
                b_fc,
                w_proj,
                b_proj,
            });
        }
        let lnf_gamma = uniform(d, 0.1).into_iter().map(|v| 1.0 + v).collect();
        let lnf_beta = uniform(d, 0.1);
        // Unit-variance LayerNorm output times this scale gives logits with a spread of a few
        // units: clear argmax winners, so GPU and CPU pick the same token.
        let lm_head = uniform(config.vocab as usize * d, 3.0 * proj);
        DecoderWeights {
            wte,
            lm_head,
            wpe,
            blocks,
            lnf_gamma,
            lnf_beta,
        }
    }
}

/// Labels of the decoder graph's inputs and outputs.
pub mod labels {
    /// Token ids of the step, `[seq]` i32.
    pub const TOKENS: &str = "tokens";
    /// Absolute positions of the step's tokens, `[seq]` i32 (`past..past+seq`).
    pub const POSITIONS: &str = "positions";
    /// Logits of every token of the step, `[seq, vocab]` f32.
    pub const LOGITS: &str = "logits";

    /// Label of layer `l`'s past keys input, `[past, dim]`.
    pub fn past_k(l: u32) -> String {
        format!("l{l}.past_k")
    }
    /// Label of layer `l`'s past values input.
    pub fn past_v(l: u32) -> String {
        format!("l{l}.past_v")
    }
    /// Label of layer `l`'s present keys output (`past_k` with the step's rows appended).
    pub fn present_k(l: u32) -> String {
        format!("l{l}.present_k")
    }
    /// Label of layer `l`'s present values output.
    pub fn present_v(l: u32) -> String {
        format!("l{l}.present_v")
    }
}

/// The decoder as a graph, with the pairs of labels that carry the KV cache from one step to
/// the next (`(past input, present output)`).
#[derive(Debug, Clone)]
pub struct DecoderGraph {
    /// The graph: inputs `tokens`, `positions` and per layer `past_k`/`past_v`; outputs
    /// `logits` then per layer `present_k`/`present_v`.
    pub graph: Graph,
    /// `(past input label, present output label)` per cache tensor.
    pub states: Vec<(String, String)>,
}

impl DecoderGraph {
    /// The states as the runtime takes them ([`NetworkOptions::states`](crate::runtime::NetworkOptions::states)).
    pub fn state_bindings(&self) -> Vec<crate::runtime::StateBinding> {
        self.states
            .iter()
            .map(|(past, present)| crate::runtime::StateBinding {
                past: past.clone(),
                present: present.clone(),
            })
            .collect()
    }
}

/// Builds the decoder graph for `config` with `weights`.
///
/// Symbols: `seq` (tokens this step) and `past` (tokens in the cache before it). The KV cache
/// is sequence-major (`[t, dim]`) so the concatenation of a step is an append (module docs).
///
/// # Errors
/// [`GraphError`] if the graph does not validate (a bug here, reported rather than panicking).
pub fn build_graph(
    config: &DecoderConfig,
    weights: &DecoderWeights,
) -> Result<DecoderGraph, GraphError> {
    let d = config.dim as u64;
    let h = config.heads as u64;
    let hd = config.head_dim() as u64;
    let m = config.mlp_dim() as u64;
    let mut b = GraphBuilder::new();
    let seq = Dim::sym("seq");
    let past = Dim::sym("past");
    let tokens = b.input(labels::TOKENS, std::slice::from_ref(&seq), DType::I32);
    let positions = b.input(labels::POSITIONS, std::slice::from_ref(&seq), DType::I32);
    let wte = b.constant(
        "wte",
        Shape::new(vec![config.vocab as u64, d]),
        weights.wte.clone(),
    );
    let wpe = b.constant(
        "wpe",
        Shape::new(vec![config.max_positions as u64, d]),
        weights.wpe.clone(),
    );
    let scale = b.constant(
        "attn_scale",
        Shape::new(vec![1]),
        vec![1.0 / (hd as f32).sqrt()],
    );
    let te = b.gather("tok_emb", wte, tokens);
    let pe = b.gather("pos_emb", wpe, positions);
    let mut x = b.add("embed", te, pe);
    let mut presents: Vec<NodeId> = Vec::new();
    let mut states = Vec::new();
    let vec_c = |b: &mut GraphBuilder, label: String, v: &[f32]| {
        b.constant(label, Shape::new(vec![v.len() as u64]), v.to_vec())
    };
    for (l, w) in weights.blocks.iter().enumerate() {
        let l = l as u32;
        let p = |name: &str| format!("l{l}.{name}");
        let past_k = b.input(
            labels::past_k(l),
            &[past.clone(), Dim::Fixed(d)],
            DType::F32,
        );
        let past_v = b.input(
            labels::past_v(l),
            &[past.clone(), Dim::Fixed(d)],
            DType::F32,
        );
        let g1 = vec_c(&mut b, p("ln1.gamma"), &w.ln1_gamma);
        let b1 = vec_c(&mut b, p("ln1.beta"), &w.ln1_beta);
        let hn = b.layer_norm(p("ln1"), x, g1, b1, 1e-5);
        let proj = |b: &mut GraphBuilder,
                    name: &str,
                    input: NodeId,
                    wm: &[f32],
                    bias: &[f32],
                    rows: u64,
                    cols: u64| {
            let wn = b.constant(
                p(&format!("{name}.w")),
                Shape::new(vec![rows, cols]),
                wm.to_vec(),
            );
            let bn = vec_c(b, p(&format!("{name}.b")), bias);
            let mm = b.matmul(p(&format!("{name}.mm")), input, wn, false);
            b.add(p(name), mm, bn)
        };
        let q = proj(&mut b, "q", hn, &w.w_q, &w.b_q, d, d);
        let k = proj(&mut b, "k", hn, &w.w_k, &w.b_k, d, d);
        let v = proj(&mut b, "v", hn, &w.w_v, &w.b_v, d, d);
        // In-place concatenation target: the runtime appends k/v to the cache buffer.
        let kc = b.concat(labels::present_k(l), &[past_k, k], 0);
        let vc = b.concat(labels::present_v(l), &[past_v, v], 0);
        presents.push(kc);
        presents.push(vc);
        states.push((labels::past_k(l), labels::present_k(l)));
        states.push((labels::past_v(l), labels::present_v(l)));
        let heads = |b: &mut GraphBuilder, name: &str, t: NodeId| {
            let r = b.reshape(p(&format!("{name}.split")), t, &[0, h as i64, hd as i64]);
            b.transpose(p(&format!("{name}.heads")), r, &[1, 0, 2])
        };
        let qh = heads(&mut b, "q", q);
        let kh = heads(&mut b, "k", kc);
        let vh = heads(&mut b, "v", vc);
        let scores = b.matmul(p("scores"), qh, kh, true);
        let scaled = b.mul(p("scaled"), scores, scale);
        let masked = b.causal_mask(p("masked"), scaled);
        let probs = b.softmax(p("probs"), masked);
        let ctx = b.matmul(p("ctx"), probs, vh, false);
        let ctx_t = b.transpose(p("ctx.merge"), ctx, &[1, 0, 2]);
        let ctx_m = b.reshape(p("ctx.flat"), ctx_t, &[0, d as i64]);
        let attn = proj(&mut b, "o", ctx_m, &w.w_o, &w.b_o, d, d);
        let x1 = b.add(p("res1"), x, attn);
        let g2 = vec_c(&mut b, p("ln2.gamma"), &w.ln2_gamma);
        let b2 = vec_c(&mut b, p("ln2.beta"), &w.ln2_beta);
        let h2 = b.layer_norm(p("ln2"), x1, g2, b2, 1e-5);
        let fc = proj(&mut b, "fc", h2, &w.w_fc, &w.b_fc, d, m);
        let act = b.gelu(p("gelu"), fc);
        let down = proj(&mut b, "proj", act, &w.w_proj, &w.b_proj, m, d);
        x = b.add(p("res2"), x1, down);
    }
    let gf = b.constant("lnf.gamma", Shape::new(vec![d]), weights.lnf_gamma.clone());
    let bf = b.constant("lnf.beta", Shape::new(vec![d]), weights.lnf_beta.clone());
    let xf = b.layer_norm("lnf", x, gf, bf, 1e-5);
    let head = b.constant(
        "lm_head",
        Shape::new(vec![config.vocab as u64, d]),
        weights.lm_head.clone(),
    );
    let logits = b.matmul(labels::LOGITS, xf, head, true);
    b.output(logits);
    for pnode in presents {
        b.output(pnode);
    }
    Ok(DecoderGraph {
        graph: b.build()?,
        states,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_name_the_field() {
        assert!(DecoderConfig::default().validate().is_ok());
        let c = DecoderConfig {
            heads: 3,
            ..DecoderConfig::default()
        };
        assert_eq!(
            c.validate(),
            Err(ModelError::HeadsDoNotDivide { dim: 64, heads: 3 })
        );
        let c = DecoderConfig {
            vocab: 0,
            ..DecoderConfig::default()
        };
        assert_eq!(c.validate(), Err(ModelError::Zero { field: "vocab" }));
    }

    #[test]
    fn weights_are_deterministic_and_seed_dependent() {
        let c = DecoderConfig::default();
        let a = DecoderWeights::generate(&c);
        let b = DecoderWeights::generate(&c);
        assert_eq!(a.wte, b.wte);
        assert_eq!(a.blocks[1].w_fc, b.blocks[1].w_fc);
        assert_eq!(a.blocks.len(), 2);
        assert_eq!(a.blocks[0].w_fc.len(), 64 * 256);
        let other = DecoderWeights::generate(&DecoderConfig { seed: 8, ..c });
        assert_ne!(a.wte, other.wte);
        // A longer position table changes nothing else.
        let longer = DecoderWeights::generate(&DecoderConfig {
            max_positions: 2048,
            ..c
        });
        assert_eq!(longer.blocks[1].w_proj, a.blocks[1].w_proj);
        assert_eq!(longer.wpe[..a.wpe.len()], a.wpe[..]);
    }

    #[test]
    fn graph_infers_prefill_and_decode_shapes() {
        let c = DecoderConfig::default();
        let g = build_graph(&c, &DecoderWeights::generate(&c)).unwrap();
        assert_eq!(g.states.len(), 4);
        let logits = g.graph.find(labels::LOGITS).unwrap();
        let present = g.graph.find(&labels::present_k(1)).unwrap();
        for (past, seq) in [(0u64, 8u64), (8, 1), (30, 1)] {
            let bind = crate::graph::Bindings::from([
                ("past".to_string(), past),
                ("seq".to_string(), seq),
            ]);
            let s = g.graph.infer_shapes(&bind).unwrap();
            assert_eq!(s.shapes[logits.index()].dims(), &[seq, 256]);
            assert_eq!(s.shapes[present.index()].dims(), &[past + seq, 64]);
        }
    }
}
