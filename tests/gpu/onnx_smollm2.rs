//! The real exported decoder through dynrt's ONNX path, against onnxruntime on the same file.
//!
//! `scripts/export_smollm2_onnx.py` writes the SmolLM2 decoder (opset 17, f32 weights as
//! external data, `past_key_values.*` → Concat → `present.*`) from the fetched GGUF, and
//! `scripts/onnx_ref.py` decodes it greedily with onnxruntime's CPU provider. Both are run
//! once and cached under the target directory (`target/tmp/onnx-smollm2/`, keyed by the
//! scripts' and the model's bytes), so a second run costs only dynrt's side.
//!
//! dynrt runs the same 3 prompts x 32 greedy tokens through [`OnnxSession`] with the caches
//! carried on the device: the tokens must be onnxruntime's, the last position's logits of
//! every run within [`LOGITS_ATOL`] of onnxruntime's, and a decode step must neither allocate
//! nor copy more than the new cache rows (no per-step reallocation, no full copy).
//!
//! The second test does the same on that export quantized by ONNX Runtime's own quantizer
//! (`scripts/nbits_ref.py quantize`: every projection a 4-bit `com.microsoft` `MatMulNBits`,
//! blocks of 32; cached beside it under `target/tmp/onnx-smollm2-q4/`): dynrt's importer keeps
//! those weights in `q4_nb` blocks, and its tokens must be onnxruntime's on the same file, its
//! logits within [`LOGITS_ATOL`] (the largest difference is 9e-5 on lavapipe).
//!
//! Without the model, the Python venv or an adapter the tests print SKIP;
//! `DYNRT_REQUIRE_MODEL=1` / `DYNRT_REQUIRE_GPU=1` make that a failure.

use crate::common;

use dynrt::fetch;
use dynrt::gguf::MappedGguf;
use dynrt::gpu::{testing, Engine};
use dynrt::memory::predictor::Policy;
use dynrt::npy::read_npy_file;
use dynrt::onnx::{HostTensor, OnnxSession, SessionOptions, TensorData};
use dynrt::runtime::RunOptions;
use dynrt::tokenizer::{Special, Tokenizer};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Largest difference allowed between dynrt's and onnxruntime's logits (the last position of
/// every run; the logits are of order 10). Both compute in f32 with different summation
/// orders over 30 layers; the test prints the largest difference (1.3e-4 on lavapipe and
/// llvmpipe GL, 1.5e-4 on SwiftShader: docs/onnx.md), and the bound leaves room for adapters
/// that fuse or reorder differently.
const LOGITS_ATOL: f32 = 2e-3;

/// Greedy tokens per prompt.
const STEPS: usize = 32;

/// The chat-template prompt for "What is the capital of France?" (as `tests/host/smollm2.rs`
/// checks the tokenizer gives it).
const FRANCE_PROMPT_IDS: [u32; 37] = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
    19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531,
    198,
];

/// Layers, KV heads and head size of SmolLM2-135M.
const LAYERS: u64 = 30;
const KV_HEADS: u64 = 3;
const HEAD_DIM: u64 = 64;

fn sha256_of(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    format!("{:x}", h.finalize())
}

fn run_python(python: &Path, script: &str, args: &[&str]) {
    let out = Command::new(python)
        .arg(common::repo().join("scripts").join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "{script} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `dir/model.onnx`, written first by `scripts/SCRIPT ARGS` into an emptied `dir` unless the
/// stamp file `dir/STAMP` holds `key` (the cache of the export and of its quantization).
/// Both tests want the export: [`common::cache_lock`] makes the second wait for the first's
/// instead of emptying `dir` under it.
fn cached_model(
    python: &Path,
    dir: &Path,
    stamp: &str,
    key: &str,
    script: &str,
    args: &[&str],
) -> PathBuf {
    let _cache = common::cache_lock();
    let stamp = dir.join(stamp);
    let model = dir.join("model.onnx");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(key) && model.exists() {
        return model;
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let t = std::time::Instant::now();
    run_python(python, script, args);
    eprintln!(
        "{script} wrote {} in {:.1} s",
        model.display(),
        t.elapsed().as_secs_f64()
    );
    std::fs::write(&stamp, key).unwrap();
    model
}

/// onnxruntime's greedy tokens and last-position logits (`[runs, vocab]`) for `prompt`,
/// cached in `dir` under `name`.
fn reference(
    python: &Path,
    model: &Path,
    dir: &Path,
    name: &str,
    prompt: &[u32],
) -> (Vec<u32>, Vec<f32>, usize) {
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let ids = ids.join(",");
    let json = dir.join(format!("{name}.json"));
    let npy = dir.join(format!("{name}.npy"));
    let stamp = dir.join(format!("{name}.stamp"));
    let key = format!("{ids} {STEPS}");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(key.as_str()) || !npy.exists() {
        run_python(
            python,
            "onnx_ref.py",
            &[
                model.to_str().unwrap(),
                "--tokens",
                &ids,
                "--steps",
                &STEPS.to_string(),
                "--out",
                json.to_str().unwrap(),
                "--logits",
                npy.to_str().unwrap(),
            ],
        );
        std::fs::write(&stamp, &key).unwrap();
    }
    let v = common::read_json(&json);
    let tokens = common::json_ids(&v["tokens"]);
    let logits = read_npy_file(&npy).unwrap();
    let vocab = *logits.dims().last().unwrap() as usize;
    (tokens, f32s(&logits), vocab)
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    match t.data() {
        TensorData::Bytes(b) => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        TensorData::Strings(_) => panic!("logits are not f32"),
    }
}

fn ids_tensor(ids: &[i64]) -> HostTensor {
    HostTensor::from_i64(vec![1, ids.len() as u64], ids).unwrap()
}

/// The index of the largest value (the first on ties), as onnxruntime's numpy argmax.
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// What both tests start from: the python of the venv, an adapter, the f32 export (cached)
/// with its cache key, and the 3 prompts; `None` (after printing SKIP) without the model, the
/// venv or an adapter.
struct Setup {
    python: PathBuf,
    gpu: dynrt::gpu::Gpu,
    dir: PathBuf,
    model: PathBuf,
    key: String,
    prompts: Vec<(&'static str, Vec<u32>)>,
}

fn setup(test: &str) -> Option<Setup> {
    let gguf = fetch::model_or_skip(test)?;
    let python = common::python_or_skip(test)?;
    let gpu = testing::gpu_or_skip(test)?;
    let repo = common::repo();
    let script = std::fs::read(repo.join("scripts/export_smollm2_onnx.py")).unwrap();
    let ref_script = std::fs::read(repo.join("scripts/onnx_ref.py")).unwrap();
    let size = std::fs::metadata(&gguf).unwrap().len();
    let dir = crate::common::tmpdir().join("onnx-smollm2");
    let key = sha256_of(&[&script, &ref_script, &size.to_le_bytes()]);
    let model = cached_model(
        &python,
        &dir,
        "export.stamp",
        &key,
        "export_smollm2_onnx.py",
        &[gguf.to_str().unwrap(), dir.to_str().unwrap()],
    );

    let tok = Tokenizer::from_gguf(MappedGguf::open(&gguf).unwrap().gguf()).unwrap();
    let prompts = vec![
        ("france", FRANCE_PROMPT_IDS.to_vec()),
        (
            "story",
            tok.encode("Once upon a time, in a small village", Special::Plain),
        ),
        ("code", tok.encode("def fibonacci(n):\n", Special::Plain)),
    ];
    Some(Setup {
        python,
        gpu,
        dir,
        model,
        key,
        prompts,
    })
}

/// The options of both tests' sessions.
fn decode_options() -> SessionOptions {
    SessionOptions {
        run: RunOptions::new(Policy::Adaptive),
        ..SessionOptions::default()
    }
}

/// The largest |a - b|.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn the_exported_decoder_gives_onnxruntimes_tokens_and_logits() {
    let Some(Setup {
        python,
        gpu,
        dir,
        model,
        prompts,
        ..
    }) = setup("onnx_smollm2")
    else {
        return;
    };
    let engine = Engine::new(gpu);
    let options = decode_options();
    let t = std::time::Instant::now();
    let mut session = OnnxSession::load(&engine, &model, &options).unwrap();
    eprintln!("loaded in {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(
        session.states().len() as u64,
        2 * LAYERS,
        "every past -> Concat -> present pair is carried"
    );
    let new_rows_bytes = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4;

    let mut worst = 0f32;
    // (context rows before the step, bytes copied, copies) of every in-place decode step.
    let mut in_place: Vec<(u64, u64, u64)> = Vec::new();
    let mut max_writes = 0u64;
    // Decode steps, and those that created any buffer (a reallocation sized by the predictor).
    let (mut decode_steps, mut allocating_steps) = (0u64, 0u64);
    for (name, prompt) in &prompts {
        let (ref_tokens, ref_logits, vocab) = reference(&python, &model, &dir, name, prompt);
        assert_eq!(ref_tokens.len(), STEPS, "{name}");
        session.reset();
        let t = std::time::Instant::now();
        let mut fed: Vec<i64> = prompt.iter().map(|&i| i64::from(i)).collect();
        let mut position = 0i64;
        let mut tokens = Vec::new();
        for step in 0..STEPS {
            let positions: Vec<i64> = (position..position + fed.len() as i64).collect();
            let before = session.stats();
            let engine_before = session.engine().stats();
            session
                .run_blocking(&[
                    ("input_ids", &ids_tensor(&fed)),
                    ("position_ids", &ids_tensor(&positions)),
                ])
                .unwrap_or_else(|e| panic!("{name} step {step}: {e}"));
            let after = session.stats();
            let logits = session.read_blocking("logits").unwrap();
            let engine_after = session.engine().stats();
            assert_eq!(
                logits.dims(),
                [1, fed.len() as u64, vocab as u64],
                "{name} step {step}"
            );
            let all = f32s(&logits);
            let last = &all[all.len() - vocab..];
            let want = &ref_logits[step * vocab..(step + 1) * vocab];
            let diff = max_diff(last, want);
            worst = worst.max(diff);
            assert!(
                diff <= LOGITS_ATOL,
                "{name} step {step}: logits differ by {diff} (> {LOGITS_ATOL})"
            );
            let token = argmax(last);
            tokens.push(token);
            assert_eq!(
                token, ref_tokens[step],
                "{name} step {step}: dynrt {tokens:?} vs onnxruntime {ref_tokens:?}"
            );
            if step > 0 {
                // One queue write per decode step (each is a staging buffer wgpu creates):
                // the changed uniform slots of ~1500 dispatches and the fed token and position
                // are packed into one upload and copied to their places (25 writes of 16 KiB
                // chunks per step before the chunks grew geometrically, 6 before packing).
                let writes = engine_after.queue_writes - engine_before.queue_writes;
                assert!(
                    writes <= 1,
                    "{name} step {step}: {writes} queue writes (staging buffers) in a decode step"
                );
                max_writes = max_writes.max(writes);
                // Every buffer a decode step creates is one the request sized (no readback or
                // staging buffer through the engine per step).
                let created: u64 = (0..4)
                    .map(|i| {
                        engine_after.per_kind[i].allocations - engine_before.per_kind[i].allocations
                    })
                    .sum();
                assert_eq!(
                    created,
                    after.allocations - before.allocations,
                    "{name} step {step}: buffers created outside the request's sizing"
                );
                allocating_steps += u64::from(created > 0);
                decode_steps += 1;
            }
            if (1..=2).contains(&step) {
                // The first decode steps have too little history for a prediction; the caches
                // were given room when the prompt filled them, so neither copies every cache
                // into a larger buffer (they both did: 60 cache-sized buffers per step).
                assert_eq!(
                    after.state_growths, before.state_growths,
                    "{name} step {step}: the first decode steps grew the caches"
                );
            }
            if step > 0 && after.state_growths == before.state_growths {
                // A decode step in place: what it allocates (an output sized by the context
                // outgrowing its prediction) is far less than the caches, and the cache copies
                // are the new rows only (whatever else copies, it does not grow with the
                // context).
                let bytes = after.bytes_allocated_total - before.bytes_allocated_total;
                let caches = new_rows_bytes * position as u64;
                assert!(
                    bytes < caches / 2,
                    "{name} step {step}: {bytes} bytes allocated, the caches hold {caches}"
                );
                let copied = after.copy_bytes - before.copy_bytes;
                assert!(
                    copied >= new_rows_bytes,
                    "{name} step {step}: {copied} bytes copied, the new rows are {new_rows_bytes}"
                );
            }
            if step > 0 && after.state_growths == before.state_growths {
                let copied = after.copy_bytes - before.copy_bytes;
                in_place.push((position as u64, copied, after.copies - before.copies));
            }
            position += fed.len() as i64;
            fed = vec![i64::from(token)];
        }
        eprintln!(
            "{name}: {} prompt tokens + {STEPS} generated in {:.1} s, tokens equal onnxruntime's",
            prompt.len(),
            t.elapsed().as_secs_f64()
        );
    }
    let stats = session.stats();
    in_place.sort_unstable();
    let (first, last) = (in_place[0], in_place[in_place.len() - 1]);
    let per_row = (last.1 as f64 - first.1 as f64) / (last.0 - first.0).max(1) as f64;
    eprintln!(
        "max |logits - onnxruntime| = {worst:e} (tolerance {LOGITS_ATOL}); {} in-place decode \
         steps: {} bytes in {} copies at context {}, {} bytes in {} copies at context {} ({per_row:.1} \
         bytes more per context row; the new cache rows are {new_rows_bytes} bytes, a full copy \
         of the caches would add {new_rows_bytes} bytes per context row); state growths {}, \
         allocations {}, reallocations {}; at most {max_writes} queue writes per decode step; {allocating_steps} of \
         {decode_steps} decode steps created buffers",
        in_place.len(),
        first.1,
        first.2,
        first.0,
        last.1,
        last.2,
        last.0,
        stats.state_growths,
        stats.allocations,
        stats.reallocations
    );
    // Reallocations are the predictor's, logarithmic in the context: most steps create nothing.
    assert!(
        allocating_steps * 4 <= decode_steps,
        "{allocating_steps} of {decode_steps} decode steps created buffers"
    );
    // The caches are appended in place: what a step copies does not grow with the context
    // the way a copy of the caches would (the causal mask's row of the context does grow).
    assert!(
        per_row < 64.0,
        "a decode step copies {per_row} more bytes per context row: the caches are copied"
    );
    assert!(
        in_place.len() >= prompts.len() * (STEPS - 1) * 3 / 4,
        "only {} decode steps ran in place (the others grew the caches)",
        in_place.len()
    );
}

/// ONNX Runtime's 4-bit export of the same decoder: dynrt imports every `MatMulNBits` onto
/// the `linear` kernels with the weights kept in blocks (`q4_nb`), and its greedy tokens for
/// the same 3 prompts are onnxruntime's (CPU provider, same file), the last position's logits
/// within [`LOGITS_ATOL`].
#[test]
fn the_4_bit_export_gives_onnxruntimes_tokens_and_logits() {
    let Some(setup) = setup("onnx_smollm2_q4") else {
        return;
    };
    let q_script = std::fs::read(common::repo().join("scripts/nbits_ref.py")).unwrap();
    let dir = setup.dir.with_file_name("onnx-smollm2-q4");
    let key = sha256_of(&[setup.key.as_bytes(), &q_script]);
    // The export quantized by ONNX Runtime's own quantizer (every projection a 4-bit
    // `MatMulNBits`, blocks of 32, uint8 zero points).
    let model = cached_model(
        &setup.python,
        &dir,
        "quantize.stamp",
        &key,
        "nbits_ref.py",
        &[
            "quantize",
            setup.model.to_str().unwrap(),
            dir.to_str().unwrap(),
        ],
    );
    let (python, prompts) = (setup.python, setup.prompts);
    let engine = Engine::new(setup.gpu);
    let options = decode_options();
    let mut session = OnnxSession::load(&engine, &model, &options).unwrap();
    let mut worst = 0f32;
    for (name, prompt) in &prompts {
        let (ref_tokens, ref_logits, vocab) = reference(&python, &model, &dir, name, prompt);
        session.reset();
        let t = std::time::Instant::now();
        let mut fed: Vec<i64> = prompt.iter().map(|&i| i64::from(i)).collect();
        let mut position = 0i64;
        let mut tokens = Vec::new();
        for step in 0..STEPS {
            let positions: Vec<i64> = (position..position + fed.len() as i64).collect();
            session
                .run_blocking(&[
                    ("input_ids", &ids_tensor(&fed)),
                    ("position_ids", &ids_tensor(&positions)),
                ])
                .unwrap_or_else(|e| panic!("{name} step {step}: {e}"));
            let all = f32s(&session.read_blocking("logits").unwrap());
            let last = &all[all.len() - vocab..];
            let want = &ref_logits[step * vocab..(step + 1) * vocab];
            let diff = max_diff(last, want);
            worst = worst.max(diff);
            assert!(
                diff <= LOGITS_ATOL,
                "{name} step {step}: logits differ by {diff} (> {LOGITS_ATOL})"
            );
            tokens.push(argmax(last));
            position += fed.len() as i64;
            fed = vec![i64::from(tokens[step])];
        }
        assert_eq!(tokens, ref_tokens, "{name}: dynrt vs onnxruntime");
        eprintln!(
            "{name}: {} prompt tokens + {STEPS} generated in {:.1} s, tokens equal onnxruntime's",
            prompt.len(),
            t.elapsed().as_secs_f64()
        );
    }
    eprintln!("max |logits - onnxruntime| = {worst:e} (tolerance {LOGITS_ATOL})");
}
