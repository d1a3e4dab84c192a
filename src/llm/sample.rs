//! Choosing the next token from a row of logits: greedy by default, or sampling with a
//! temperature, top-k and top-p (nucleus), seeded so a run can be repeated. Device-free.

use super::LlmError;
use crate::graph::ops::SampleRow;
use crate::rng::SplitMix64;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 (the default): greedy, the largest logit (the first of equals). Above 0: sample
    /// from `softmax(logits / temperature)` restricted by `top_k` and `top_p`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities add up to at least `top_p`
    /// (1: all).
    pub top_p: f32,
    /// Seed of the random stream (the same seed and logits give the same tokens).
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Greedy.
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks the ranges.
    ///
    /// # Errors
    /// [`LlmError::BadParameter`] for a negative or non-finite temperature, or a `top_p`
    /// outside `(0, 1]`.
    pub fn validate(&self) -> Result<(), LlmError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(LlmError::BadParameter {
                name: "temperature",
                value: self.temperature.to_string(),
                reason: "must be a finite number >= 0 (0 is greedy)",
            });
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(LlmError::BadParameter {
                name: "top_p",
                value: self.top_p.to_string(),
                reason: "must be in (0, 1] (1 keeps every token)",
            });
        }
        Ok(())
    }

    /// Whether tokens are chosen greedily.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The row of the device's `sample` op ([`crate::graph::ops::sample`]) that draws the
    /// token at position `step` as these parameters ask, or `None` where the op does not
    /// (top-k 0 with top-p below 1, top-k above 64): then only this CPU sampler can, and
    /// it needs the logits. Greedy rows give the same tokens on both; sampled ones the same
    /// distribution from other random numbers (the device's depend on the seed and the
    /// position only). A parameter that only the CPU sampler applies must make this `None`.
    pub fn device_row(&self, step: u32) -> Option<SampleRow> {
        let row = SampleRow {
            temperature: self.temperature,
            top_k: u32::try_from(self.top_k).unwrap_or(u32::MAX),
            top_p: self.top_p,
            min_p: 0.0,
            seed: self.seed,
            step,
        };
        row.covered().then_some(row)
    }

    /// Whether choosing a token needs the logits on the host ([`SamplingParams::device_row`]
    /// is `None`).
    pub fn needs_logits(&self) -> bool {
        self.device_row(0).is_none()
    }
}

/// A sampler: [`SamplingParams`] and its random stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
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

impl Sampler {
    /// A sampler with `params`.
    ///
    /// # Errors
    /// As [`SamplingParams::validate`].
    pub fn new(params: SamplingParams) -> Result<Sampler, LlmError> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: SplitMix64::new(params.seed),
        })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token from `logits` (one row, vocabulary-long).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() || logits.len() < 2 {
            return argmax(logits);
        }
        // Candidates by decreasing logit (NaN last, never chosen).
        let mut order: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| !logits[i as usize].is_nan())
            .collect();
        if order.is_empty() {
            return 0;
        }
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
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
        let max = f64::from(logits[order[0] as usize]);
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| ((f64::from(logits[i as usize]) - max) * inv_t).exp())
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
        let mass: f64 = probs[..keep].iter().sum();
        // A uniform draw in [0, mass) from 53 random bits.
        let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * mass;
        let mut acc = 0.0;
        for (n, p) in probs[..keep].iter().enumerate() {
            acc += p;
            if u < acc {
                return order[n];
            }
        }
        order[keep - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        }
    }

    #[test]
    fn greedy_takes_the_first_largest_and_ignores_nan() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(s.sample(&[f32::NAN, -5.0, -4.0]), 2);
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(Sampler::new(params(-1.0, 0, 1.0, 0)).is_err());
        assert!(Sampler::new(params(f32::NAN, 0, 1.0, 0)).is_err());
        assert!(Sampler::new(params(1.0, 0, 0.0, 0)).is_err());
        assert!(Sampler::new(params(1.0, 0, 1.5, 0)).is_err());
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
}
