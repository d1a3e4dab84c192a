//! Choosing the next token from a row of logits: greedy by default, or sampling with a
//! temperature, top-k, top-p (nucleus) and min-p, seeded so a run can be repeated; with
//! penalties on recent tokens, a bias per token, a structured-output constraint and the
//! log-probabilities of the choice when a request asks for them. Device-free: this is the
//! reference every other sampler is checked against.
//!
//! The order of the steps: the bias is added, the constraint masks the tokens it refuses, the
//! penalties apply (llama.cpp's: the repeat penalty divides a positive logit and multiplies
//! a negative one, then `count * frequency + presence` is subtracted, over the last
//! [`Penalties::last_n`] tokens the sampler saw, the prompt's included); then greedy takes the
//! largest, or sampling divides by the temperature, keeps the `top_k` largest, the nucleus of
//! mass `top_p` and the tokens at least `min_p` times as likely as the most likely (the order
//! of Hugging Face `transformers`' warpers), and draws. Log-probabilities are those of the
//! model: the log-softmax of the logits before any of these steps.

use super::LlmError;
use crate::graph::ops::SampleRow;
use crate::rng::SplitMix64;
use crate::structured::Constraint;
use std::collections::{HashMap, VecDeque};

/// Penalties on the tokens seen recently (llama.cpp's, as llama-server applies them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// Tokens looked back over, prompt tokens included (0: none, so no penalty).
    pub last_n: usize,
    /// Divides the positive logits and multiplies the negative ones of the tokens in the
    /// window (1: off).
    pub repeat: f32,
    /// Subtracted from the logit of every token in the window (0: off; OpenAI's
    /// `presence_penalty`).
    pub presence: f32,
    /// Subtracted from a token's logit once per time it is in the window (0: off; OpenAI's
    /// `frequency_penalty`).
    pub frequency: f32,
}

impl Default for Penalties {
    /// Off, over llama-server's window of 64 tokens.
    fn default() -> Self {
        Penalties {
            last_n: 64,
            repeat: 1.0,
            presence: 0.0,
            frequency: 0.0,
        }
    }
}

impl Penalties {
    /// Whether they change no logit.
    pub fn is_off(&self) -> bool {
        self.last_n == 0 || (self.repeat == 1.0 && self.presence == 0.0 && self.frequency == 0.0)
    }
}

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 (the default): greedy, the largest logit (the first of equals). Above 0: sample
    /// from `softmax(logits / temperature)` restricted by `top_k`, `top_p` and `min_p`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities add up to at least `top_p`
    /// (1: all).
    pub top_p: f32,
    /// Keep only the tokens at least `min_p` times as likely as the most likely one
    /// (0: all).
    pub min_p: f32,
    /// Seed of the random stream (the same seed and logits give the same tokens).
    pub seed: u64,
    /// Penalties on recent tokens (off by default).
    pub penalties: Penalties,
    /// Report the chosen token's log-probability and those of the `n` most likely tokens
    /// (`None`: nothing; at most [`MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<usize>,
}

/// The most alternatives [`SamplingParams::logprobs`] may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Default for SamplingParams {
    /// Greedy.
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            penalties: Penalties::default(),
            logprobs: None,
        }
    }
}

fn bad(name: &'static str, value: impl ToString, reason: &'static str) -> LlmError {
    LlmError::BadParameter {
        name,
        value: value.to_string(),
        reason,
    }
}

impl SamplingParams {
    /// Checks the ranges.
    ///
    /// # Errors
    /// [`LlmError::BadParameter`] for a negative or non-finite temperature, a `top_p`
    /// outside `(0, 1]`, a `min_p` outside `[0, 1]`, a repeat penalty that is not positive
    /// and finite, a presence or frequency penalty outside `[-2, 2]`, or more than
    /// [`MAX_TOP_LOGPROBS`] log-probabilities.
    pub fn validate(&self) -> Result<(), LlmError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(bad(
                "temperature",
                self.temperature,
                "must be a finite number >= 0 (0 is greedy)",
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad(
                "top_p",
                self.top_p,
                "must be in (0, 1] (1 keeps every token)",
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad(
                "min_p",
                self.min_p,
                "must be in [0, 1] (0 keeps every token)",
            ));
        }
        let p = &self.penalties;
        if !(p.repeat.is_finite() && p.repeat > 0.0) {
            return Err(bad(
                "repeat_penalty",
                p.repeat,
                "must be a finite number > 0 (1 is off)",
            ));
        }
        if !(-2.0..=2.0).contains(&p.presence) {
            return Err(bad("presence_penalty", p.presence, "must be in [-2, 2]"));
        }
        if !(-2.0..=2.0).contains(&p.frequency) {
            return Err(bad("frequency_penalty", p.frequency, "must be in [-2, 2]"));
        }
        if let Some(n) = self.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return Err(bad("top_logprobs", n, "must be at most 20"));
        }
        Ok(())
    }

    /// Whether tokens are chosen greedily.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The row of the device's `sample` op ([`crate::graph::ops::sample`]) that draws the
    /// token at position `step` as these parameters ask, or `None` where the op does not:
    /// penalties or log-probabilities (they need the whole row of logits on the host), top-k 0
    /// with top-p below 1, top-k above 64. Then only this CPU sampler can, and it needs the
    /// logits. Greedy rows give the same tokens on both; sampled ones the same distribution
    /// from other random numbers (the device's depend on the seed and the position only). A
    /// parameter that only the CPU sampler applies must make this `None` (a bias or a
    /// constraint lives in [`LogitRules`]: see [`Sampler::needs_logits`]).
    pub fn device_row(&self, step: u32) -> Option<SampleRow> {
        if !self.penalties.is_off() || self.logprobs.is_some() {
            return None;
        }
        let row = SampleRow {
            temperature: self.temperature,
            top_k: u32::try_from(self.top_k).unwrap_or(u32::MAX),
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            step,
        };
        row.covered().then_some(row)
    }

    /// Whether choosing a token needs the logits on the host ([`SamplingParams::device_row`]
    /// is `None`). See also [`Sampler::needs_logits`].
    pub fn needs_logits(&self) -> bool {
        self.device_row(0).is_none()
    }
}

/// The sampling settings a model file recommends: llama.cpp's `general.sampling.*` keys
/// (`temp`, `top_k`, `top_p`, `min_p`, `penalty_repeat`, `penalty_last_n`), each `None`
/// where the file has no such key or a value out of range.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Recommended {
    /// `general.sampling.temp`.
    pub temperature: Option<f32>,
    /// `general.sampling.top_k`.
    pub top_k: Option<usize>,
    /// `general.sampling.top_p`.
    pub top_p: Option<f32>,
    /// `general.sampling.min_p`.
    pub min_p: Option<f32>,
    /// `general.sampling.penalty_repeat`.
    pub repeat_penalty: Option<f32>,
    /// `general.sampling.penalty_last_n`.
    pub repeat_last_n: Option<usize>,
}

impl Recommended {
    /// The keys of `gguf` (numbers of any GGUF type; a value out of its range is left out).
    pub fn from_gguf(gguf: &crate::gguf::Gguf) -> Recommended {
        let number = |key: &str| -> Option<f64> {
            let v = gguf.get(&format!("general.sampling.{key}"))?;
            v.as_float().or_else(|| v.as_integer().map(|i| i as f64))
        };
        let real = |key: &str, ok: fn(f64) -> bool| {
            number(key)
                .filter(|v| v.is_finite() && ok(*v))
                .map(|v| v as f32)
        };
        let count = |key: &str| {
            number(key)
                .filter(|v| *v >= 0.0 && v.fract() == 0.0)
                .map(|v| v.min(u32::MAX as f64) as usize)
        };
        Recommended {
            temperature: real("temp", |v| v >= 0.0),
            top_k: count("top_k"),
            top_p: real("top_p", |v| v > 0.0 && v <= 1.0),
            min_p: real("min_p", |v| (0.0..=1.0).contains(&v)),
            repeat_penalty: real("penalty_repeat", |v| v > 0.0),
            repeat_last_n: count("penalty_last_n"),
        }
    }
}

/// What a request adds to the logits beyond [`SamplingParams`]: a bias per token and a
/// structured-output constraint. Not `Copy`: a constraint carries its automaton's state.
#[derive(Debug, Clone, Default)]
pub struct LogitRules {
    /// Added to the logits of these tokens (OpenAI's `logit_bias`: -100 bans a token, 100
    /// all but forces it). Ids outside the row are ignored.
    pub bias: Vec<(u32, f32)>,
    /// The structured output the tokens must follow.
    pub constraint: Option<Constraint>,
}

impl LogitRules {
    /// Whether the rules change nothing.
    pub fn is_empty(&self) -> bool {
        self.bias.is_empty() && self.constraint.is_none()
    }
}

/// The log-probabilities of one choice: the model's, before bias, constraint, penalties and
/// temperature.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenLogprobs {
    /// Of the chosen token.
    pub logprob: f32,
    /// The most likely tokens and theirs, most likely first (as many as
    /// [`SamplingParams::logprobs`] asked).
    pub top: Vec<(u32, f32)>,
}

/// A choice of [`Sampler::next`].
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// Its log-probabilities, when asked for.
    pub logprobs: Option<TokenLogprobs>,
}

/// A sampler: [`SamplingParams`], [`LogitRules`], the random stream and the tokens the
/// penalties look back over.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rules: LogitRules,
    rng: SplitMix64,
    /// The last `penalties.last_n` tokens seen, and how often each is among them.
    window: VecDeque<u32>,
    counts: HashMap<u32, u32>,
    /// The row being processed (reused between calls).
    work: Vec<f32>,
}

/// The index of the largest value (the first of equals); NaN never wins.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// The log-softmax of `row` at `token`, and the `n` largest, from the row's maximum and
/// log-sum-exp (f64). NaN logits count as minus infinity.
fn logprobs_of(row: &[f32], token: u32, n: usize) -> TokenLogprobs {
    let max = row
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let max = f64::from(max);
    let sum: f64 = row
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| (f64::from(v) - max).exp())
        .sum();
    let lse = max + sum.ln();
    let lp = |t: u32| match row.get(t as usize) {
        Some(v) if !v.is_nan() => (f64::from(*v) - lse) as f32,
        _ => f32::NEG_INFINITY,
    };
    let mut top: Vec<u32> = (0..row.len() as u32).collect();
    let by = |a: &u32, b: &u32| lp(*b).total_cmp(&lp(*a)).then(a.cmp(b));
    let n = n.min(top.len());
    if n > 0 && n < top.len() {
        top.select_nth_unstable_by(n - 1, by);
    }
    top.truncate(n);
    top.sort_by(by);
    TokenLogprobs {
        logprob: lp(token),
        top: top.into_iter().map(|t| (t, lp(t))).collect(),
    }
}

impl Sampler {
    /// A sampler with `params`.
    ///
    /// # Errors
    /// As [`SamplingParams::validate`].
    pub fn new(params: SamplingParams) -> Result<Sampler, LlmError> {
        Sampler::with_rules(params, LogitRules::default())
    }

    /// A sampler with `params` and `rules`.
    ///
    /// # Errors
    /// As [`SamplingParams::validate`]; [`LlmError::BadParameter`] for a bias that is not
    /// finite.
    pub fn with_rules(params: SamplingParams, rules: LogitRules) -> Result<Sampler, LlmError> {
        params.validate()?;
        if let Some((_, b)) = rules.bias.iter().find(|(_, b)| !b.is_finite()) {
            return Err(bad("logit_bias", b, "biases must be finite numbers"));
        }
        Ok(Sampler {
            params,
            rules,
            rng: SplitMix64::new(params.seed),
            window: VecDeque::new(),
            counts: HashMap::new(),
            work: Vec::new(),
        })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether this sampler needs the whole row of logits on the host: its parameters do
    /// ([`SamplingParams::needs_logits`]), or it has a bias or a constraint.
    pub fn needs_logits(&self) -> bool {
        self.params.needs_logits() || !self.rules.is_empty()
    }

    /// Shows the sampler tokens that came before (a prompt): the penalties count them.
    pub fn observe(&mut self, tokens: &[u32]) {
        let n = self.params.penalties.last_n;
        if n == 0 || self.params.penalties.is_off() {
            return;
        }
        for &t in &tokens[tokens.len().saturating_sub(n)..] {
            self.push(t);
        }
    }

    fn push(&mut self, token: u32) {
        let n = self.params.penalties.last_n;
        if n == 0 || self.params.penalties.is_off() {
            return;
        }
        if self.window.len() == n {
            if let Some(old) = self.window.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.window.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// The next token from `logits` (one row, vocabulary-long); on an error (an empty row,
    /// a constraint that allows no token) the row's largest.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.next(logits)
            .map_or_else(|_| argmax(logits), |s| s.token)
    }

    /// The next token from `logits` (one row, vocabulary-long) and its log-probabilities
    /// when asked for; the token is recorded (penalties, constraint).
    ///
    /// # Errors
    /// [`LlmError::NoToken`] when the row is empty or every token is excluded (a
    /// constraint that allows none of the row's tokens, logits all NaN).
    pub fn next(&mut self, logits: &[f32]) -> Result<Sampled, LlmError> {
        if logits.is_empty() {
            return Err(LlmError::NoToken {
                reason: "the row of logits is empty",
            });
        }
        let plain = self.rules.is_empty() && self.params.penalties.is_off();
        let token = if plain {
            if self.params.is_greedy() {
                Some(argmax(logits))
            } else {
                self.draw(logits)
            }
        } else {
            let mut row = std::mem::take(&mut self.work);
            row.clear();
            row.extend_from_slice(logits);
            self.process(&mut row);
            let t = if self.params.is_greedy() {
                let t = argmax(&row);
                (row[t as usize] > f32::NEG_INFINITY).then_some(t)
            } else {
                self.draw(&row)
            };
            self.work = row;
            t
        };
        let token = token.ok_or(LlmError::NoToken {
            reason: "no token of the row is allowed (all excluded or not numbers)",
        })?;
        if let Some(c) = &mut self.rules.constraint {
            c.accept(token).map_err(|_| LlmError::NoToken {
                reason: "the chosen token does not continue the structured output",
            })?;
        }
        self.push(token);
        let logprobs = self.params.logprobs.map(|n| logprobs_of(logits, token, n));
        Ok(Sampled { token, logprobs })
    }

    /// Bias, constraint and penalties on `row`.
    fn process(&mut self, row: &mut [f32]) {
        for &(t, b) in &self.rules.bias {
            if let Some(l) = row.get_mut(t as usize) {
                *l += b;
            }
        }
        let p = self.params.penalties;
        if !p.is_off() {
            for (&t, &count) in &self.counts {
                if let Some(l) = row.get_mut(t as usize) {
                    if *l <= 0.0 {
                        *l *= p.repeat;
                    } else {
                        *l /= p.repeat;
                    }
                    *l -= count as f32 * p.frequency + p.presence;
                }
            }
        }
        let k = match self.params.top_k {
            _ if self.params.is_greedy() => 1,
            k => k,
        };
        if let Some(c) = &mut self.rules.constraint {
            if !(k > 0 && keep_top_allowed(row, k, c)) {
                c.apply(row);
            }
        }
    }

    /// Samples from `row` (temperature, top-k, top-p, min-p); `None` when no token has a
    /// logit above minus infinity.
    fn draw(&mut self, row: &[f32]) -> Option<u32> {
        // Candidates by decreasing logit (minus infinity and NaN never chosen).
        let mut order: Vec<u32> = (0..row.len() as u32)
            .filter(|&i| row[i as usize] > f32::NEG_INFINITY)
            .collect();
        if order.is_empty() {
            return None;
        }
        let by_logit = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]);
        let k = match self.params.top_k {
            0 => order.len(),
            k => k.min(order.len()),
        };
        if k < order.len() {
            order.select_nth_unstable_by(k - 1, by_logit);
            order.truncate(k);
        }
        order.sort_by(|a, b| by_logit(a, b).then(a.cmp(b)));
        let inv_t = 1.0 / f64::from(self.params.temperature);
        let max = f64::from(row[order[0] as usize]);
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| ((f64::from(row[i as usize]) - max) * inv_t).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        // Nucleus: the shortest prefix whose mass reaches top_p.
        let mut keep = probs.len();
        if self.params.top_p < 1.0 {
            let mut acc = 0.0;
            for (n, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= f64::from(self.params.top_p) {
                    keep = n + 1;
                    break;
                }
            }
        }
        // Min-p: at least min_p times the most likely (the first, never dropped).
        if self.params.min_p > 0.0 {
            let floor = probs[0] * f64::from(self.params.min_p);
            keep = keep.min(probs.partition_point(|&p| p >= floor).max(1));
        }
        let mass: f64 = probs[..keep].iter().sum();
        // A uniform draw in [0, mass) from 53 random bits.
        let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * mass;
        let mut acc = 0.0;
        for (n, p) in probs[..keep].iter().enumerate() {
            acc += p;
            if u < acc {
                return Some(order[n]);
            }
        }
        Some(order[keep - 1])
    }
}

/// Keeps in `row` only the `k` tokens of largest logit that `c` allows (the rest set to minus
/// infinity) when they are among the largest `4k + 64`: then they are exactly the `k`
/// largest allowed, found without the whole mask. `false` (the row unchanged) otherwise.
fn keep_top_allowed(row: &mut [f32], k: usize, c: &Constraint) -> bool {
    let look = (4 * k + 64).min(row.len());
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    let by = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if look < order.len() {
        order.select_nth_unstable_by(look - 1, by);
        order.truncate(look);
    }
    order.sort_by(by);
    let mut kept = Vec::with_capacity(k);
    for &t in &order {
        // Minus infinity and NaN: nothing further down is allowed either.
        if row[t as usize].is_nan() || row[t as usize] == f32::NEG_INFINITY {
            break;
        }
        if c.allows(t) {
            kept.push(t);
            if kept.len() == k {
                break;
            }
        }
    }
    // Fewer than k allowed among those looked at: the next allowed may lie further down.
    if kept.len() < k && look < row.len() {
        return false;
    }
    if kept.is_empty() {
        return false;
    }
    let values: Vec<f32> = kept.iter().map(|&t| row[t as usize]).collect();
    row.iter_mut().for_each(|l| *l = f32::NEG_INFINITY);
    for (&t, v) in kept.iter().zip(values) {
        row[t as usize] = v;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structured::{Grammar, TokenTrie};
    use std::sync::Arc;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn greedy_takes_the_first_largest_and_ignores_nan() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(s.sample(&[f32::NAN, -5.0, -4.0]), 2);
        assert!(matches!(s.next(&[]), Err(LlmError::NoToken { .. })));
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(Sampler::new(params(-1.0, 0, 1.0, 0)).is_err());
        assert!(Sampler::new(params(f32::NAN, 0, 1.0, 0)).is_err());
        assert!(Sampler::new(params(1.0, 0, 0.0, 0)).is_err());
        assert!(Sampler::new(params(1.0, 0, 1.5, 0)).is_err());
        let with = |f: &dyn Fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            f(&mut p);
            Sampler::new(p).err().map(|e| e.to_string())
        };
        assert!(with(&|p| p.min_p = 1.5).unwrap().contains("min_p"));
        assert!(with(&|p| p.penalties.repeat = 0.0)
            .unwrap()
            .contains("repeat_penalty"));
        assert!(with(&|p| p.penalties.presence = 2.5)
            .unwrap()
            .contains("presence_penalty"));
        assert!(with(&|p| p.penalties.frequency = f32::NAN)
            .unwrap()
            .contains("frequency_penalty"));
        assert!(with(&|p| p.logprobs = Some(21))
            .unwrap()
            .contains("top_logprobs"));
        let bias = LogitRules {
            bias: vec![(0, f32::INFINITY)],
            constraint: None,
        };
        assert!(Sampler::with_rules(SamplingParams::default(), bias).is_err());
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [0.5, 2.0, 1.9, -3.0, 1.0];
        for seed in 0..20 {
            let mut k1 = Sampler::new(params(2.0, 1, 1.0, seed)).unwrap();
            assert_eq!(k1.sample(&logits), 1);
            let mut p = Sampler::new(params(2.0, 0, 1e-6, seed)).unwrap();
            assert_eq!(p.sample(&logits), 1);
        }
    }

    #[test]
    fn sampling_follows_the_softmax_and_is_seeded() {
        // Two tokens with logits ln 3 and 0 at temperature 1: probabilities 3/4 and 1/4.
        let logits = [3f32.ln(), 0.0];
        let mut s = Sampler::new(params(1.0, 0, 1.0, 42)).unwrap();
        let n = 20_000;
        let zeros = (0..n).filter(|_| s.sample(&logits) == 0).count();
        let frac = zeros as f64 / f64::from(n);
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
        // Same seed, same tokens; top_k 2 of 3 never picks the least likely.
        let logits = [1.0, 0.0, 0.5];
        let draw = |seed| {
            let mut s = Sampler::new(params(1.0, 2, 1.0, seed)).unwrap();
            (0..200).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert!(draw(7).iter().all(|&t| t != 1));
        // top_p 0.5 over probabilities ~(0.51, 0.19, 0.31) keeps only the first.
        let mut s = Sampler::new(params(1.0, 0, 0.5, 3)).unwrap();
        assert!((0..200).all(|_| s.sample(&logits) == 0));
    }

    #[test]
    fn min_p_keeps_the_tokens_near_the_most_likely() {
        // Probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.5 keeps those >= 0.25 (the first two),
        // in the ratio 5:3.
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let mut s = Sampler::new(SamplingParams {
            min_p: 0.5,
            ..params(1.0, 0, 1.0, 11)
        })
        .unwrap();
        let n = 16_000;
        let mut seen = [0u32; 4];
        for _ in 0..n {
            seen[s.sample(&logits) as usize] += 1;
        }
        assert_eq!(&seen[2..], [0, 0]);
        let frac = f64::from(seen[0]) / f64::from(n);
        assert!((frac - 0.625).abs() < 0.02, "{seen:?}");
    }

    #[test]
    fn penalties_follow_llama_cpp() {
        // Token 1 was seen twice, token 2 once, in a window of 3 (the oldest token, 0, fell
        // out of it).
        let p = SamplingParams {
            penalties: Penalties {
                last_n: 3,
                repeat: 2.0,
                presence: 0.5,
                frequency: 0.25,
            },
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(p).unwrap();
        s.observe(&[0, 1, 2, 1]);
        let mut row = vec![4.0, 4.0, -1.0, 0.0];
        s.process(&mut row);
        // 0: not in the window; 1: 4 / 2 - (2 * 0.25 + 0.5) = 1; 2: -1 * 2 - 0.75 = -2.75.
        assert_eq!(row, [4.0, 1.0, -2.75, 0.0]);
        // Greedy picks token 0; now the window is (2, 1, 0).
        assert_eq!(s.next(&[4.0, 4.0, -1.0, 0.0]).unwrap().token, 0);
        assert_eq!(s.window, [2, 1, 0]);
        let mut row = vec![4.0, 4.0, -1.0, 0.0];
        s.process(&mut row);
        assert_eq!(row, [1.25, 1.25, -2.75, 0.0]);
        // A high presence penalty steers greedy away from a repeated token.
        let mut s = Sampler::new(SamplingParams {
            penalties: Penalties {
                presence: 2.0,
                ..Penalties::default()
            },
            ..SamplingParams::default()
        })
        .unwrap();
        let row = [1.0, 0.0];
        assert_eq!(s.next(&row).unwrap().token, 0);
        assert_eq!(s.next(&row).unwrap().token, 1);
        // Both seen once now: 1 - 2 against 0 - 2.
        assert_eq!(s.next(&row).unwrap().token, 0);
    }

    #[test]
    fn bias_bans_and_forces_tokens() {
        let rules = LogitRules {
            bias: vec![(0, -100.0), (3, 100.0), (99, 5.0)],
            constraint: None,
        };
        let mut s = Sampler::with_rules(params(1.0, 0, 1.0, 5), rules).unwrap();
        assert!(s.needs_logits());
        for _ in 0..50 {
            assert_eq!(s.sample(&[10.0, 0.0, 0.0, 0.0]), 3);
        }
    }

    #[test]
    fn logprobs_are_the_models_log_softmax() {
        let p = SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::default()
        };
        assert!(p.needs_logits());
        let rules = LogitRules {
            bias: vec![(2, 10.0)],
            constraint: None,
        };
        let mut s = Sampler::with_rules(p, rules).unwrap();
        let row = [2f32.ln(), 1f32.ln(), 1f32.ln()];
        let out = s.next(&row).unwrap();
        // The bias chose token 2; its log-probability is the model's, ln(1/4).
        assert_eq!(out.token, 2);
        let lp = out.logprobs.unwrap();
        assert!((lp.logprob - 0.25f32.ln()).abs() < 1e-6);
        assert_eq!(lp.top.len(), 2);
        assert_eq!(lp.top[0].0, 0);
        assert!((lp.top[0].1 - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(lp.top[1].0, 1);
    }

    /// A vocabulary of `{`, `}`, `a`, `"`, `1` and a stop token (5).
    fn trie() -> Arc<TokenTrie> {
        const T: [&str; 5] = ["{", "}", "a", "\"", "1"];
        Arc::new(TokenTrie::from_tokens(
            6,
            |id| T.get(id as usize).map(|t| t.as_bytes()),
            &[5],
        ))
    }

    #[test]
    fn a_constraint_masks_the_row_in_every_mode() {
        let g = Arc::new(
            Grammar::json_schema(&serde_json::from_str("{\"enum\":[1]}").unwrap()).unwrap(),
        );
        let row = [5.0, 4.0, 3.0, 2.0, 0.0, 1.0];
        for (temperature, top_k) in [(0.0, 0), (1.0, 0), (1.0, 2), (0.7, 1)] {
            for seed in 0..10 {
                let rules = LogitRules {
                    bias: Vec::new(),
                    constraint: Some(Constraint::new(g.clone(), trie())),
                };
                let mut s =
                    Sampler::with_rules(params(temperature, top_k, 1.0, seed), rules).unwrap();
                assert_eq!(s.next(&row).unwrap().token, 4, "{temperature} {top_k}");
                // Then only the stop token.
                assert_eq!(s.next(&row).unwrap().token, 5);
            }
        }
        // A constraint that allows no token of the row is an error, not a token.
        let rules = LogitRules {
            bias: vec![(4, f32::MIN)],
            constraint: Some(Constraint::new(g, trie())),
        };
        let mut s = Sampler::with_rules(SamplingParams::default(), rules).unwrap();
        let mut row = row;
        row[4] = f32::NEG_INFINITY;
        assert!(matches!(s.next(&row), Err(LlmError::NoToken { .. })));
    }
}
