//! Choosing the next token on the device: the `sample` op after a model's head, so that only
//! token ids come back to the host (issue 31). One row of logits per sequence (`[batch,
//! vocab]`) and one row of parameters per sequence ([`SampleRow`], `[batch, 8]` u32), so a
//! batched step samples every sequence with its own settings in the same dispatches.
//!
//! What a row does, by its parameters:
//!
//! * **greedy** (temperature 0): the largest logit, the first of equals; NaN never wins and a
//!   row with no value above -inf gives token 0 (exactly [`crate::llm::sample::argmax`]).
//! * **full vocabulary** (`top_k` 0, `top_p` 1): a draw from `softmax(logits / temperature)`
//!   restricted by `min_p` (tokens whose probability is at least `min_p` times the largest),
//!   by the Gumbel-max trick: the token maximising `logit / T + g`, with `g = -ln(-ln u)` and
//!   `u` uniform from a counter-based hash of (seed, step, token). One pass over the
//!   vocabulary, split across workgroups, gives an exact draw from that distribution.
//! * **top-k** (`top_k` 1..=[`TOP_K_MAX`]): the `top_k` largest logits (by value, then lower
//!   index), their softmax at the temperature, the shortest prefix whose mass reaches `top_p`
//!   and the prefix whose probabilities are at least `min_p` times the first (the shorter of
//!   the two), then an inverse-CDF draw with one uniform from the hash of (seed, step).
//!
//! Parameters outside these (`top_k` 0 with `top_p` below 1, or `top_k` above
//! [`TOP_K_MAX`]) are not what the op is for ([`SampleRow::covered`] is false): callers send
//! such rows to the CPU sampler with the logits. The op still gives a token for them (their
//! `top_k` taken as [`TOP_K_MAX`]), the same on the device and in the reference.
//!
//! The random numbers depend only on (seed, step, token): the same seed and step give the
//! same token whatever ran before, which makes a step that is computed again (a rolled-back
//! decode step) draw the same token.

use super::{DTypeError, InferError, OpDef};
use crate::graph::reference::{RefError, RefTensor, Values};
use crate::shape::{DType, Shape};

/// Most `top_k` the op takes (a row asking for more is not [`SampleRow::covered`]).
pub const TOP_K_MAX: u32 = 64;

/// Words of one row of the parameter input.
pub const PARAM_WORDS: usize = 8;

/// Samples one token per row of logits. Inputs: logits `[batch, vocab]` f32, parameters
/// `[batch, 8]` u32 ([`SampleRow::to_words`]). Output: tokens `[batch]` i32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample;

/// The sampling parameters of one row, as the op reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRow {
    /// 0: greedy. Above 0: sample from `softmax(logits / temperature)`.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: u32,
    /// Keep the shortest prefix whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Keep tokens at least `min_p` times as likely as the most likely one (0: all).
    pub min_p: f32,
    /// Seed of the random numbers.
    pub seed: u64,
    /// Counter of the draw (a sequence's position): with the seed, the only input of the
    /// random numbers.
    pub step: u32,
}

impl SampleRow {
    /// A greedy row.
    pub fn greedy() -> SampleRow {
        SampleRow {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            step: 0,
        }
    }

    /// The row as the op's parameter words: temperature, top_k, top_p, min_p (f32 bits),
    /// seed low and high words, step, 0.
    pub fn to_words(&self) -> [u32; PARAM_WORDS] {
        [
            self.temperature.to_bits(),
            self.top_k,
            self.top_p.to_bits(),
            self.min_p.to_bits(),
            self.seed as u32,
            (self.seed >> 32) as u32,
            self.step,
            0,
        ]
    }

    /// The row of parameter words `w` (the inverse of [`SampleRow::to_words`]).
    pub fn from_words(w: &[u32; PARAM_WORDS]) -> SampleRow {
        SampleRow {
            temperature: f32::from_bits(w[0]),
            top_k: w[1],
            top_p: f32::from_bits(w[2]),
            min_p: f32::from_bits(w[3]),
            seed: u64::from(w[4]) | (u64::from(w[5]) << 32),
            step: w[6],
        }
    }

    /// Whether the op draws from the distribution these parameters ask for: greedy, the full
    /// vocabulary with `top_p` 1, or `top_k` in 1..=[`TOP_K_MAX`].
    pub fn covered(&self) -> bool {
        self.mode() != Mode::TopK || (1..=TOP_K_MAX).contains(&self.top_k)
    }

    fn mode(&self) -> Mode {
        // `!(t > 0)` also catches NaN: greedy.
        if self.temperature.is_nan() || self.temperature <= 0.0 {
            Mode::Greedy
        } else if self.top_k == 0 && self.top_p >= 1.0 {
            Mode::Full
        } else {
            Mode::TopK
        }
    }

    /// `top_k` as the op uses it in top-k mode: 0 or above [`TOP_K_MAX`] is [`TOP_K_MAX`].
    fn k(&self) -> u32 {
        match self.top_k {
            0 => TOP_K_MAX,
            k => k.min(TOP_K_MAX),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Greedy,
    Full,
    TopK,
}

/// The index no candidate has (an empty slot).
const NONE: u32 = u32::MAX;

/// A 32-bit integer hash (Wellons' lowbias32): every input bit reaches every output bit.
/// `shaders/sample.wgsl` has the same function.
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The random word of (seed, step, counter `i`): a hash of the four words chained, so it
/// depends on nothing else (a counter-based generator).
pub fn random_u32(seed: u64, step: u32, i: u32) -> u32 {
    let h = mix32((seed as u32) ^ 0x9e37_79b9);
    let h = mix32(h ^ (seed >> 32) as u32);
    let h = mix32(h ^ step);
    mix32(h ^ i)
}

/// A uniform number in (0, 1) from the top 24 bits of `r` (never 0 or 1, so both logarithms
/// of the Gumbel noise are finite).
pub fn uniform(r: u32) -> f32 {
    ((r >> 8) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

/// Gumbel noise `-ln(-ln u)` of a uniform `u`.
pub fn gumbel(u: f32) -> f32 {
    -(-u.ln()).ln()
}

/// `(v, i)` beats `(bv, bi)`: a larger value, or an equal one at a lower index. NaN beats
/// nothing.
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    v > bv || (v == bv && i < bi)
}

/// What the reference chose for a row, and how clear the choice was.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// The token.
    pub token: u32,
    /// How far the choice was from another: greedy and full-vocabulary rows, the gap between
    /// the winning key and the next one; top-k rows, the distance of the draw from the
    /// nearest edge of the chosen token's interval (in probability). `f32::INFINITY` when
    /// there was no other candidate. Tests compare the device's tokens where it is clear.
    pub margin: f32,
}

/// The token the op chooses for one row of logits (the CPU reference, in plain loops).
pub fn sample_row(logits: &[f32], row: &SampleRow) -> Choice {
    let argmax = |key: &dyn Fn(usize, f32) -> Option<f32>| {
        let (mut bv, mut bi) = (f32::NEG_INFINITY, NONE);
        let mut second = f32::NEG_INFINITY;
        for (i, &v) in logits.iter().enumerate() {
            let Some(k) = key(i, v) else { continue };
            if better(k, i as u32, bv, bi) {
                second = bv;
                bv = k;
                bi = i as u32;
            } else if k > second {
                second = k;
            }
        }
        (bv, bi, bv - second)
    };
    let (m, mi, gap) = argmax(&|_, v| Some(v));
    let greedy = Choice {
        token: if m == f32::NEG_INFINITY || mi == NONE {
            0
        } else {
            mi
        },
        margin: gap,
    };
    match row.mode() {
        Mode::Greedy => greedy,
        Mode::Full => {
            let t = row.temperature;
            let floor = if row.min_p > 0.0 {
                m + t * row.min_p.ln()
            } else {
                f32::NEG_INFINITY
            };
            let (_, bi, gap) = argmax(&|i, v| {
                (v >= floor)
                    .then(|| v / t + gumbel(uniform(random_u32(row.seed, row.step, i as u32))))
            });
            if bi == NONE {
                greedy
            } else {
                Choice {
                    token: bi,
                    margin: gap,
                }
            }
        }
        Mode::TopK => {
            // The k largest (value, then lower index), NaN left out.
            let mut order: Vec<u32> = (0..logits.len() as u32)
                .filter(|&i| !logits[i as usize].is_nan())
                .collect();
            order.sort_by(|&a, &b| {
                logits[b as usize]
                    .total_cmp(&logits[a as usize])
                    .then(a.cmp(&b))
            });
            order.truncate(row.k() as usize);
            draw(
                &order
                    .iter()
                    .map(|&i| (logits[i as usize], i))
                    .collect::<Vec<_>>(),
                row,
            )
            .unwrap_or(greedy)
        }
    }
}

/// The top-k draw over `top` (the candidates, best first), as `sample_pick` of
/// `shaders/sample.wgsl` does it: f32 probabilities relative to the first, the top-p and
/// min-p prefixes, one uniform.
fn draw(top: &[(f32, u32)], row: &SampleRow) -> Option<Choice> {
    let &(v0, _) = top.first()?;
    let t = row.temperature;
    let p: Vec<f32> = top.iter().map(|&(v, _)| ((v - v0) / t).exp()).collect();
    let total: f32 = p.iter().sum();
    let mut keep = p.len();
    if row.top_p < 1.0 {
        let mut acc = 0.0f32;
        for (j, &pj) in p.iter().enumerate() {
            acc += pj / total;
            if acc >= row.top_p {
                keep = keep.min(j + 1);
                break;
            }
        }
    }
    if row.min_p > 0.0 {
        // p[0] is 1: the most likely token's probability, relative.
        if let Some(j) = p.iter().position(|&pj| pj < row.min_p) {
            keep = keep.min(j.max(1));
        }
    }
    let mass: f32 = p[..keep].iter().sum();
    let u = uniform(random_u32(row.seed, row.step, NONE)) * mass;
    let mut acc = 0.0f32;
    for (j, &pj) in p[..keep].iter().enumerate() {
        let before = acc;
        acc += pj;
        if u < acc {
            let margin = (u - before).min(acc - u) / mass;
            return Some(Choice {
                token: top[j].1,
                margin,
            });
        }
    }
    Some(Choice {
        token: top[keep - 1].1,
        margin: 0.0,
    })
}

impl OpDef for Sample {
    fn name(&self) -> &'static str {
        "sample"
    }
    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        if inputs[0] != DType::F32 {
            return Err(DTypeError::at(0, "f32 logits"));
        }
        if inputs[1] != DType::U32 {
            return Err(DTypeError::at(1, "u32 sampling parameters"));
        }
        Ok(DType::I32)
    }
    fn infer(&self, inputs: &[&Shape], _: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        let (logits, params) = (inputs[0], inputs[1]);
        if logits.rank() != 2 {
            return Err(InferError::Rank {
                input: 0,
                shape: logits.clone(),
                expected: "logits [batch, vocab]",
            });
        }
        let batch = logits.dims()[0];
        if params.dims() != [batch, PARAM_WORDS as u64] {
            return Err(InferError::Mismatch {
                what: "sample parameters must be [batch, 8] for logits [batch, vocab]",
                left: logits.clone(),
                right: params.clone(),
            });
        }
        if logits.dims()[1] > u64::from(u32::MAX - 1) {
            return Err(InferError::Invalid {
                op: "sample",
                reason: format!("a vocabulary of {} is above u32", logits.dims()[1]),
            });
        }
        Ok(Shape::new(vec![batch]))
    }
    fn reference(&self, inputs: &[&RefTensor], out: &Shape, _: DType) -> Result<Values, RefError> {
        let logits = inputs[0].floats("sample")?;
        let params = inputs[1].ints("sample")?;
        let batch = out.dims()[0] as usize;
        let vocab = inputs[0].shape.dims()[1] as usize;
        let mut tokens = Vec::with_capacity(batch);
        for b in 0..batch {
            let mut w = [0u32; PARAM_WORDS];
            for (k, x) in w.iter_mut().enumerate() {
                *x = params[b * PARAM_WORDS + k] as u32;
            }
            let row = &logits[b * vocab..(b + 1) * vocab];
            tokens.push(i64::from(sample_row(row, &SampleRow::from_words(&w)).token));
        }
        Ok(Values::Int(tokens))
    }
}

impl crate::graph::GraphBuilder {
    /// `sample(logits, params)`: one token per row of logits ([`Sample`]).
    pub fn sample(
        &mut self,
        label: impl Into<String>,
        logits: crate::graph::NodeId,
        params: crate::graph::NodeId,
    ) -> crate::graph::NodeId {
        self.node(label, Sample, &[logits, params])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(temperature: f32, top_k: u32, top_p: f32, min_p: f32, step: u32) -> SampleRow {
        SampleRow {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 7,
            step,
        }
    }

    #[test]
    fn greedy_is_the_cpu_argmax() {
        let g = SampleRow::greedy();
        for l in [
            vec![0.1, 3.0, 3.0, -1.0],
            vec![f32::NAN, -5.0, -4.0],
            vec![f32::NAN, f32::NEG_INFINITY],
            vec![f32::NEG_INFINITY; 3],
            vec![f32::NAN; 2],
        ] {
            assert_eq!(
                sample_row(&l, &g).token,
                crate::llm::sample::argmax(&l),
                "{l:?}"
            );
        }
    }

    #[test]
    fn words_round_trip_and_coverage() {
        let r = SampleRow {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            seed: 0x1234_5678_9abc_def0,
            step: 99,
        };
        assert_eq!(SampleRow::from_words(&r.to_words()), r);
        assert!(r.covered());
        assert!(row(1.0, 0, 1.0, 0.1, 0).covered());
        assert!(!row(1.0, 0, 0.9, 0.0, 0).covered());
        assert!(!row(1.0, 65, 1.0, 0.0, 0).covered());
        assert!(row(0.0, 1000, 0.5, 0.0, 0).covered());
    }

    /// Both random modes follow the softmax: logits ln 3, 0, ln 2 at temperature 1 give
    /// probabilities 1/2, 1/6, 1/3 (a chi-square test over 6000 steps, 2 degrees of freedom:
    /// 13.8 is its 0.1% tail).
    #[test]
    fn draws_follow_the_softmax() {
        let logits = [3f32.ln(), 0.0, 2f32.ln()];
        let expect = [0.5, 1.0 / 6.0, 1.0 / 3.0];
        for (top_k, min_p) in [(0, 0.0), (3, 0.0), (0, 0.1)] {
            let mut counts = [0f64; 3];
            let n = 6000;
            for step in 0..n {
                counts[sample_row(&logits, &row(1.0, top_k, 1.0, min_p, step)).token as usize] +=
                    1.0;
            }
            let chi2: f64 = counts
                .iter()
                .zip(expect)
                .map(|(&c, p)| (c - p * f64::from(n)).powi(2) / (p * f64::from(n)))
                .sum();
            assert!(chi2 < 13.8, "top_k {top_k}: {counts:?} chi2 {chi2}");
        }
        // min_p 0.4 drops the token at 1/6 (a third of the largest): 3/5 and 2/5 remain.
        for top_k in [0, 3] {
            assert!((0..500).all(|s| sample_row(&logits, &row(1.0, top_k, 1.0, 0.4, s)).token != 1));
        }
        // top_p 0.5 keeps the first token only; top_k 1 likewise.
        assert!((0..200).all(|s| sample_row(&logits, &row(1.0, 3, 0.5, 0.0, s)).token == 0));
        assert!((0..200).all(|s| sample_row(&logits, &row(5.0, 1, 1.0, 0.0, s)).token == 0));
    }

    #[test]
    fn the_same_seed_and_step_give_the_same_token() {
        let logits: Vec<f32> = (0..500).map(|i| ((i * 37) % 101) as f32 / 25.0).collect();
        for (k, p) in [(0, 1.0), (20, 0.9)] {
            let a: Vec<u32> = (0..50)
                .map(|s| sample_row(&logits, &row(1.0, k, p, 0.0, s)).token)
                .collect();
            let b: Vec<u32> = (0..50)
                .map(|s| sample_row(&logits, &row(1.0, k, p, 0.0, s)).token)
                .collect();
            assert_eq!(a, b);
            let other = SampleRow {
                seed: 8,
                ..row(1.0, k, p, 0.0, 0)
            };
            let c: Vec<u32> = (0..50)
                .map(|s| sample_row(&logits, &SampleRow { step: s, ..other }).token)
                .collect();
            assert_ne!(a, c);
        }
    }
}
