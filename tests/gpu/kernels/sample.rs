//! The `sample` family (`shaders/sample.wgsl`): the next token from rows of logits on the
//! device. Greedy rows equal the CPU's `argmax` exactly (ties, NaN, -inf, vocabularies of one
//! chunk and of 64 chunks); sampled rows equal the op's CPU reference wherever the
//! reference's choice is clear, and follow the softmax (a chi-square test over rows).

use super::*;
use dynrt::graph::ops::sample::{sample_row, SampleRow, PARAM_WORDS};
use dynrt::llm::sample::argmax;
use dynrt::tensor::HostTensor as Typed;

fn params(rows: &[SampleRow]) -> Typed {
    let words: Vec<u8> = rows
        .iter()
        .flat_map(|r| r.to_words())
        .flat_map(u32::to_le_bytes)
        .collect();
    Typed {
        shape: s(&[rows.len() as u64, PARAM_WORDS as u64]),
        dtype: DType::U32,
        bytes: words,
    }
}

/// The device's tokens for `logits` (`rows x vocab`, row-major) with one parameter row each.
fn sample_on(
    gpu: &Gpu,
    k: &mut Kernels,
    logits: &[f32],
    rows: &[SampleRow],
    skew: u64,
) -> Vec<u32> {
    let b = rows.len() as u64;
    let vocab = logits.len() as u64 / b;
    let engine = Engine::new(gpu.clone());
    let x = Typed::f32(s(&[b, vocab]), logits);
    let out = run_op(
        &engine,
        k,
        &Op::Sample(ops::Sample),
        &[x, params(rows)],
        &s(&[b]),
        DType::I32,
        skew,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    out.bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

fn random_logits(rng: &mut SplitMix64, n: usize, spread: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-spread, spread)).collect()
}

#[test]
fn greedy_rows_are_the_cpu_argmax() {
    for gpu in gpus("greedy_rows_are_the_cpu_argmax") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(31);
        // One chunk, a chunk and a bit, SmolLM2's and Gemma 3's vocabularies.
        for (vocab, skew) in [(100usize, 0), (4097, 4), (49_152, 0), (262_144, 8)] {
            let b = 5;
            let mut logits = random_logits(&mut rng, b * vocab, 4.0);
            // Row 1: a tie between two chunks (the first wins); row 2: NaN where the maximum
            // would be; row 3: only -inf and NaN (token 0); row 4: quantized values, many ties.
            let last = vocab - 1;
            logits[vocab + 3] = 9.0;
            logits[vocab + last] = 9.0;
            logits[2 * vocab + 7] = f32::NAN;
            logits[2 * vocab + last] = 8.0;
            for (i, v) in logits[3 * vocab..4 * vocab].iter_mut().enumerate() {
                *v = if i % 3 == 0 {
                    f32::NAN
                } else {
                    f32::NEG_INFINITY
                };
            }
            for v in &mut logits[4 * vocab..] {
                *v = v.round();
            }
            let rows = vec![SampleRow::greedy(); b];
            let got = sample_on(&gpu, &mut k, &logits, &rows, skew);
            let want: Vec<u32> = logits.chunks(vocab).map(argmax).collect();
            assert_eq!(got, want, "vocab {vocab} on {:?}", gpu.backend());
            assert_eq!(want[1], 3);
            assert_eq!(want[3], 0);
        }
    }
}

#[test]
fn sampled_rows_match_the_reference_where_it_is_clear() {
    for gpu in gpus("sampled_rows_match_the_reference_where_it_is_clear") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(32);
        for vocab in [300usize, 9000, 152_064] {
            let mut rows = Vec::new();
            for step in 0..12u32 {
                let (top_k, top_p, min_p) = match step % 4 {
                    0 => (0, 1.0, 0.0),
                    1 => (0, 1.0, 0.05),
                    2 => (40, 0.9, 0.0),
                    _ => (64, 1.0, 0.02),
                };
                rows.push(SampleRow {
                    temperature: 0.5 + step as f32 / 8.0,
                    top_k,
                    top_p,
                    min_p,
                    seed: 1000 + u64::from(step),
                    step,
                });
            }
            let b = rows.len();
            let logits = random_logits(&mut rng, b * vocab, 6.0);
            let got = sample_on(&gpu, &mut k, &logits, &rows, 0);
            let mut compared = 0;
            for (r, row) in rows.iter().enumerate() {
                let want = sample_row(&logits[r * vocab..(r + 1) * vocab], row);
                if want.margin > 1e-3 {
                    assert_eq!(got[r], want.token, "vocab {vocab} row {r} {row:?}");
                    compared += 1;
                }
                assert!((got[r] as usize) < vocab);
            }
            assert!(compared >= b - 2, "only {compared} of {b} rows were clear");
        }
    }
}

/// Many rows of the same logits with different steps draw from the softmax: probabilities
/// 0.4, 0.3, 0.2, 0.1 at temperature 1 (and 0.4/0.7, 0.3/0.7 with top-k 2, 4/9, 3/9, 2/9 with
/// min_p 0.4), checked by a chi-square test whose 0.1% tail is 16.3 for 3 degrees of freedom.
#[test]
fn sampled_tokens_follow_the_softmax() {
    for gpu in gpus("sampled_tokens_follow_the_softmax") {
        let mut k = Kernels::new(&gpu);
        let probs = [0.4f64, 0.3, 0.2, 0.1];
        // The four tokens in a vocabulary of 5000 whose other logits are -inf.
        let vocab = 5000;
        let at = [17usize, 4096, 2, 4999];
        let mut row_logits = vec![f32::NEG_INFINITY; vocab];
        for (&i, &p) in at.iter().zip(&probs) {
            row_logits[i] = p.ln() as f32;
        }
        for (top_k, min_p, expect) in [
            (0u32, 0.0f32, vec![0.4, 0.3, 0.2, 0.1]),
            (2, 0.0, vec![4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0]),
            (0, 0.4, vec![4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0, 0.0]),
        ] {
            let n = 3000;
            let rows: Vec<SampleRow> = (0..n)
                .map(|step| SampleRow {
                    temperature: 1.0,
                    top_k,
                    top_p: 1.0,
                    min_p,
                    seed: 99,
                    step,
                })
                .collect();
            let logits: Vec<f32> = (0..n).flat_map(|_| row_logits.iter().copied()).collect();
            let got = sample_on(&gpu, &mut k, &logits, &rows, 0);
            let mut counts = [0f64; 4];
            for t in &got {
                let j = at.iter().position(|&i| i == *t as usize);
                let j = j.unwrap_or_else(|| panic!("token {t} has probability 0"));
                counts[j] += 1.0;
            }
            let mut chi2 = 0.0;
            for (c, &p) in counts.iter().zip(&expect) {
                if p == 0.0 {
                    assert_eq!(*c, 0.0, "top_k {top_k} min_p {min_p}: {counts:?}");
                } else {
                    chi2 += (c - p * f64::from(n)).powi(2) / (p * f64::from(n));
                }
            }
            assert!(
                chi2 < 16.3,
                "top_k {top_k} min_p {min_p} on {:?}: {counts:?} (chi2 {chi2})",
                gpu.backend()
            );
        }
    }
}
