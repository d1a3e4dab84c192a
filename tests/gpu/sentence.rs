//! Sentence embeddings on the GPU (`src/sentence/`) against the independent references of
//! `scripts/bert_ref.py`: all-MiniLM-L6-v2 from its sentence-transformers folder against the
//! numpy BERT on the same folder (cosine >= 0.99999 per sentence), the int8 ONNX export
//! against that f32 reference (>= 0.99) and against ONNX Runtime on the same file
//! (>= 0.99999), paraphrase-MiniLM-L3-v2's ONNX export against ONNX Runtime (>= 0.99999); a
//! tiny random BERT written here for every pooling and both activations; and reuse by the
//! predictor and the pool never changing a vector.

use crate::common;
use dynrt::fetch;
use dynrt::gpu::{testing, Engine};
use dynrt::memory::predictor::Policy;
use dynrt::rng::SplitMix64;
use dynrt::runtime::RunOptions;
use dynrt::sentence::{EmbedOptions, Embeddings, SentenceModel};
use std::path::Path;

/// `n` sentences of mixed lengths: mostly short, some long, a few past 256 tokens (cut by
/// the tokenizer), with accents, CJK and punctuation.
pub(crate) fn mixed_sentences(n: usize, seed: u64) -> Vec<String> {
    mixed_sentences_up_to(n, seed, 330)
}

/// [`mixed_sentences`] whose longest have at most `longest` words.
pub(crate) fn mixed_sentences_up_to(n: usize, seed: u64, longest: u64) -> Vec<String> {
    let words = [
        "the",
        "a",
        "cat",
        "sat",
        "on",
        "mat",
        "dynamic",
        "shapes",
        "memory",
        "GPU",
        "runtime",
        "sentence",
        "embedding",
        "search",
        "query",
        "browser",
        "WebGPU",
        "model",
        "café",
        "naïve",
        "Zürich",
        "东京",
        "北京",
        "データ",
        "🙂",
        "fast",
        "slow",
        "river",
        "bank",
        "money",
        "finance",
        "music",
        "guitar",
        "piano",
        "weather",
        "rain",
        "sunny",
        "is",
        "was",
        "very",
        "not",
        "quickly",
        "jumps",
        "over",
        "lazy",
        "dog",
        "fox",
        "brown",
        "2024",
        "3.14",
        "e-mail",
        "don't",
        "(see",
        "below)",
        "…",
        "!",
        "?",
        ",",
        ".",
        "unbelievably",
    ];
    // The longest sentences: 200 words up (past 256 tokens), or the upper half below `longest`.
    let low = if longest > 200 { 200 } else { longest / 2 };
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            let len = match i % 20 {
                0 => rng.range(low, longest),
                1..=3 => rng.range(40, 120),
                4..=11 => rng.range(9, 40),
                _ => rng.range(1, 9),
            };
            (0..len)
                .map(|_| words[rng.range(0, words.len() as u64) as usize])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * y).sum();
    let na: f64 = a
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    let nb: f64 = b.iter().map(|&y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Runs `bert_ref.py ARGS --input IN --out OUT` on `texts` and returns the embeddings.
pub(crate) fn reference(test: &str, py: &Path, args: &[&str], texts: &[String]) -> Vec<Vec<f64>> {
    let dir = common::scratch(test);
    let (input, out) = (dir.join("in.json"), dir.join("out.json"));
    std::fs::write(&input, serde_json::json!({ "texts": texts }).to_string()).unwrap();
    let (i, o) = (input.display().to_string(), out.display().to_string());
    let mut all = args.to_vec();
    all.extend(["--input", &i, "--out", &o]);
    common::run_script(py, "bert_ref.py", &all);
    common::read_json(&out)["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// Every vector of `ours` within `bound` of `theirs` in cosine; returns the smallest cosine.
fn check(test: &str, ours: &Embeddings, theirs: &[Vec<f64>], bound: f64) -> f64 {
    assert_eq!(ours.len(), theirs.len(), "{test}");
    let mut worst = 1.0f64;
    for (i, t) in theirs.iter().enumerate() {
        assert_eq!(t.len(), ours.dim, "{test}: width");
        let c = cosine(ours.vector(i), t);
        assert!(c >= bound, "{test}: sentence {i}: cosine {c} < {bound}");
        worst = worst.min(c);
    }
    eprintln!(
        "{test}: {} sentences, smallest cosine {worst:.9} (bound {bound})",
        theirs.len()
    );
    worst
}

fn engine(test: &str) -> Option<Engine> {
    testing::gpu_or_skip(test).map(Engine::new)
}

#[test]
fn all_minilm_equals_the_reference_on_200_sentences() {
    let test = "all_minilm_equals_the_reference_on_200_sentences";
    let Some(folder) = fetch::embedding_or_skip(&fetch::ALL_MINILM_L6_V2, test) else {
        return;
    };
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let Some(engine) = engine(test) else {
        return;
    };
    let texts = mixed_sentences(200, 34);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut model = SentenceModel::open_folder(&engine, &folder, EmbedOptions::default()).unwrap();
    assert_eq!(model.dim(), 384);
    let ours = model.embed_blocking(&refs).unwrap();
    assert!(ours.batches >= 7, "{} batches", ours.batches);
    eprintln!(
        "{test}: {} batches, {} padding tokens for {} tokens",
        ours.batches,
        ours.padding_tokens,
        ours.tokens.iter().sum::<usize>()
    );
    assert!(
        ours.tokens.contains(&256),
        "no sentence reached the length limit"
    );
    for i in 0..ours.len() {
        let n: f32 = ours.vector(i).iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-5, "{test}: vector {i} has length {n}");
    }
    let folder_arg = folder.display().to_string();
    let theirs = reference(test, &py, &["embed", "--model", &folder_arg], &texts);
    check(test, &ours, &theirs, 0.99999);
    // Padding is small: batches of similar lengths.
    let real: usize = ours.tokens.iter().sum();
    assert!(
        ours.padding_tokens * 5 < real,
        "{test}: {} padding tokens for {real}",
        ours.padding_tokens
    );
}

#[test]
fn the_onnx_exports_pass_their_bounds() {
    let test = "the_onnx_exports_pass_their_bounds";
    let (Some(f32_folder), Some(int8), Some(l3)) = (
        fetch::embedding_or_skip(&fetch::ALL_MINILM_L6_V2, test),
        fetch::embedding_or_skip(&fetch::ALL_MINILM_L6_V2_INT8, test),
        fetch::embedding_or_skip(&fetch::PARAPHRASE_MINILM_L3_V2, test),
    ) else {
        return;
    };
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let Some(engine) = engine(test) else {
        return;
    };
    let cache = fetch::models_dir().unwrap();
    // Up to 120 words: the int8 export computes its attention with more ops than dynrt's own
    // graph, and 256-token batches of it take minutes on a software adapter.
    let texts = mixed_sentences_up_to(200, 35, 120);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let tokenizer = f32_folder.join("tokenizer.json").display().to_string();
    for (spec, folder) in [
        (&fetch::ALL_MINILM_L6_V2_INT8, &int8),
        (&fetch::PARAPHRASE_MINILM_L3_V2, &l3),
    ] {
        // Large batches: the int8 export dequantizes its weights in the graph at every call.
        let options = EmbedOptions {
            max_batch: 64,
            max_batch_tokens: 16384,
            ..EmbedOptions::default()
        };
        let mut model = SentenceModel::open_spec(&engine, spec, folder, &cache, options).unwrap();
        let ours = model.embed_blocking(&refs).unwrap();
        let onnx = folder.join("model.onnx").display().to_string();
        let max = spec.max_seq_length.to_string();
        let mut args = vec![
            "onnx",
            "--model",
            &onnx,
            "--tokenizer",
            &tokenizer,
            "--pooling",
            spec.pooling,
            "--max-length",
            &max,
        ];
        if spec.normalize {
            args.push("--normalize");
        }
        let ort = reference(&format!("{test}_{}", spec.name), &py, &args, &texts);
        check(
            &format!("{test}: {} vs ONNX Runtime", spec.name),
            &ours,
            &ort,
            0.99999,
        );
        if spec.name == fetch::ALL_MINILM_L6_V2_INT8.name {
            let folder_arg = f32_folder.display().to_string();
            let f32_ref = reference(
                &format!("{test}_f32"),
                &py,
                &["embed", "--model", &folder_arg],
                &texts,
            );
            let worst = check(
                &format!("{test}: int8 vs the f32 model"),
                &ours,
                &f32_ref,
                0.99,
            );
            // The int8 weights do change the vectors: this is not the f32 model by mistake.
            assert!(worst < 0.99999, "{test}: int8 equals f32 ({worst})");
        }
    }
}

/// A tiny BERT folder with seeded weights: its vocabulary is the first `vocab` entries of
/// all-MiniLM-L6-v2's tokenizer.json (the real normalizer and post-processor).
fn tiny_bert(
    dir: &Path,
    tokenizer_json: &str,
    pooling: &str,
    normalize: bool,
    gelu: &str,
    prefix: &str,
) {
    let (h, inter, layers, heads, vocab, positions) =
        (32usize, 64usize, 2usize, 4usize, 30522usize, 64usize);
    let mut rng = SplitMix64::new(7);
    let mut tensors: Vec<(String, Vec<u64>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, dims: Vec<u64>, scale: f32, offset: f32| {
        let n: u64 = dims.iter().product();
        let bytes: Vec<u8> = (0..n)
            .flat_map(|_| (offset + scale * (rng.next_f32() * 2.0 - 1.0)).to_le_bytes())
            .collect();
        tensors.push((format!("{prefix}{name}"), dims, bytes));
    };
    let (hh, ii) = (h as u64, inter as u64);
    add(
        "embeddings.word_embeddings.weight".into(),
        vec![vocab as u64, hh],
        0.5,
        0.0,
    );
    add(
        "embeddings.position_embeddings.weight".into(),
        vec![positions as u64, hh],
        0.5,
        0.0,
    );
    add(
        "embeddings.token_type_embeddings.weight".into(),
        vec![2, hh],
        0.5,
        0.0,
    );
    add("embeddings.LayerNorm.weight".into(), vec![hh], 0.2, 1.0);
    add("embeddings.LayerNorm.bias".into(), vec![hh], 0.2, 0.0);
    for l in 0..layers {
        let p = format!("encoder.layer.{l}.");
        for (name, out, inp) in [
            ("attention.self.query", hh, hh),
            ("attention.self.key", hh, hh),
            ("attention.self.value", hh, hh),
            ("attention.output.dense", hh, hh),
            ("intermediate.dense", ii, hh),
            ("output.dense", hh, ii),
        ] {
            add(format!("{p}{name}.weight"), vec![out, inp], 0.3, 0.0);
            add(format!("{p}{name}.bias"), vec![out], 0.1, 0.0);
        }
        for name in ["attention.output.LayerNorm", "output.LayerNorm"] {
            add(format!("{p}{name}.weight"), vec![hh], 0.2, 1.0);
            add(format!("{p}{name}.bias"), vec![hh], 0.2, 0.0);
        }
    }
    let list: Vec<(&str, &str, &[u64], &[u8])> = tensors
        .iter()
        .map(|(n, d, b)| (n.as_str(), "F32", d.as_slice(), b.as_slice()))
        .collect();
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    std::fs::write(
        dir.join("model.safetensors"),
        dynrt::safetensors::write(&list),
    )
    .unwrap();
    let config = serde_json::json!({
        "model_type": "bert", "hidden_size": h, "num_attention_heads": heads,
        "num_hidden_layers": layers, "intermediate_size": inter,
        "max_position_embeddings": positions, "type_vocab_size": 2, "vocab_size": vocab,
        "hidden_act": gelu, "layer_norm_eps": 1e-12,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut modules = vec![
        serde_json::json!({"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}),
        serde_json::json!({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}),
    ];
    if normalize {
        modules.push(serde_json::json!({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}));
    }
    std::fs::write(
        dir.join("modules.json"),
        serde_json::Value::Array(modules).to_string(),
    )
    .unwrap();
    let pool = serde_json::json!({
        "word_embedding_dimension": h,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": pooling == "max",
    });
    std::fs::write(dir.join("1_Pooling/config.json"), pool.to_string()).unwrap();
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        serde_json::json!({"max_seq_length": 48}).to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json).unwrap();
}

#[test]
fn a_tiny_bert_equals_the_reference_for_every_pooling() {
    let test = "a_tiny_bert_equals_the_reference_for_every_pooling";
    let Some(folder) = fetch::embedding_or_skip(&fetch::ALL_MINILM_L6_V2, test) else {
        return;
    };
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let Some(engine) = engine(test) else {
        return;
    };
    let tokenizer = std::fs::read_to_string(folder.join("tokenizer.json")).unwrap();
    let texts = mixed_sentences(40, 36);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for (pooling, normalize, gelu, prefix) in [
        ("mean", true, "gelu", ""),
        ("cls", false, "gelu", "bert."),
        ("max", true, "gelu_new", ""),
        ("max", false, "gelu", "bert."),
    ] {
        let name = format!("{test}_{pooling}_{normalize}_{gelu}");
        let dir = common::scratch(&format!("{name}_folder"));
        tiny_bert(&dir, &tokenizer, pooling, normalize, gelu, prefix);
        let options = EmbedOptions {
            max_batch: 8,
            ..EmbedOptions::default()
        };
        let mut model = SentenceModel::open_folder(&engine, &dir, options).unwrap();
        let ours = model.embed_blocking(&refs).unwrap();
        assert!(ours.tokens.contains(&48), "{name}: nothing truncated");
        let d = dir.display().to_string();
        let theirs = reference(&name, &py, &["embed", "--model", &d], &texts);
        check(&name, &ours, &theirs, 0.99999);
    }
}

#[test]
fn reuse_by_the_predictor_and_the_pool_never_changes_a_vector() {
    let test = "reuse_by_the_predictor_and_the_pool_never_changes_a_vector";
    let Some(folder) = fetch::embedding_or_skip(&fetch::ALL_MINILM_L6_V2, test) else {
        return;
    };
    let Some(engine) = engine(test) else {
        return;
    };
    let tokenizer = std::fs::read_to_string(folder.join("tokenizer.json")).unwrap();
    let dir = common::scratch(&format!("{test}_folder"));
    tiny_bert(&dir, &tokenizer, "mean", true, "gelu", "");
    let texts = mixed_sentences(40, 37);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut first: Option<Vec<f32>> = None;
    for policy in [Policy::None, Policy::OpenVino, Policy::Adaptive] {
        for pool in [false, true] {
            let mut run = RunOptions::new(policy);
            run.pool = pool;
            run.poison = true;
            let options = EmbedOptions {
                max_batch: 6,
                run,
                ..EmbedOptions::default()
            };
            let mut model = SentenceModel::open_folder(&engine, &dir, options).unwrap();
            // Twice, with a call of other shapes between: the second runs on the buffers the
            // earlier calls sized.
            let a = model.embed_blocking(&refs).unwrap();
            model.embed_blocking(&refs[..5]).unwrap();
            let b = model.embed_blocking(&refs).unwrap();
            assert_eq!(a.values, b.values, "{test}: {policy:?} pool {pool}");
            assert!(
                model.stats().iterations >= 15,
                "{test}: {:?}",
                model.stats()
            );
            match &first {
                None => first = Some(a.values),
                Some(f) => assert_eq!(f, &a.values, "{test}: {policy:?} pool {pool}"),
            }
        }
    }
}
