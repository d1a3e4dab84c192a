//! Fuzzing on the stable toolchain: mutation loops over the GGUF parser, the tokenizer and
//! the `.npy` reader that fail on any panic and save the input that caused it.
//!
//! Each test runs for `DYNRT_FUZZ_SECS` seconds (default 2, so the suite stays quick); a
//! long campaign is
//!
//! ```text
//! DYNRT_FUZZ_SECS=600 cargo test --release --test host fuzz:: -- --nocapture --test-threads 1
//! ```
//!
//! which prints the executions and what the inputs exercised. `DYNRT_FUZZ_SEED` picks the
//! random stream (default: from the clock, printed). A panic writes the input under the
//! test's scratch directory (`target/tmp/fuzz_*`) and fails the test.
//!
//! The GGUF loop starts from valid files (tiny llama models, a file with every metadata type,
//! the real model's metadata when it has been fetched) and mutates them structure-blind:
//! bit flips, overwritten bytes, lengths and counts replaced by boundary values,
//! truncations, insertions, deletions, duplications and splices. Every parsed file then
//! goes through the accessors, dequantization, `ModelConfig` and `Tokenizer::from_gguf`.
//! The tokenizer loop encodes random text (random scalar values, special-token fragments,
//! whitespace runs, long words) and checks properties: decode inverts encode, the
//! streaming decoder's pieces add up to the lossy decode, unknown ids are errors.
//! The `.npy` loop starts from files of every readable dtype and layout and from the hostile
//! headers of issue 23 (nested braces, huge header lengths, overflowing shapes, shapes beyond
//! the data), mutates them structure-blind and by splicing header tokens into the header
//! (keeping its length field right, so the parser sees them), and checks that every file is
//! read or refused with a message that quotes little, and that what is read writes and reads
//! back the same.

use crate::common;

use dynrt::gguf::{GgmlType, Gguf, GgufBuilder, MetaArray, MetaValue, TinyLlama};
use dynrt::graph::ops::{rope_table, rope_table_rows};
use dynrt::llm::context_on_device;
use dynrt::llm::ModelConfig;
use dynrt::npy::{read_npy, write_npy};
use dynrt::onnx::{HostTensor, TensorDType};
use dynrt::rng::SplitMix64;
use dynrt::tokenizer::{ChatMessage, Special, Tokenizer, TokenizerError, TokenizerModel};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

fn budget() -> Duration {
    let secs = std::env::var("DYNRT_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

fn seed(test: &str) -> u64 {
    let s = std::env::var("DYNRT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{test}: DYNRT_FUZZ_SEED={s}");
    s
}

fn pick<'a, T>(rng: &mut SplitMix64, v: &'a [T]) -> &'a T {
    &v[rng.range(0, v.len() as u64) as usize]
}

/// Valid files to start from.
fn gguf_seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![
        TinyLlama::default().build(1).unwrap(),
        TinyLlama {
            num_layers: 1,
            untied_output: true,
            projection_type: GgmlType::F16,
            embedding_type: GgmlType::F32,
            ..TinyLlama::default()
        }
        .build(2)
        .unwrap(),
        GgufBuilder::new()
            .version(2)
            .alignment(64)
            .metadata("u8", MetaValue::U8(1))
            .metadata("i16", MetaValue::I16(-3))
            .metadata("f64", MetaValue::F64(0.5))
            .metadata("b", MetaValue::Bool(true))
            .metadata("s", MetaValue::Str("x".into()))
            .metadata(
                "nested",
                MetaValue::Array(MetaArray::Array(vec![
                    MetaArray::U64(vec![1, 2]),
                    MetaArray::Str(vec!["a".into()]),
                    MetaArray::Array(vec![MetaArray::Bool(vec![false])]),
                ])),
            )
            .tensor("q8", GgmlType::Q8_0, &[32, 2], vec![3; 68])
            .tensor("f16", GgmlType::F16, &[4], vec![0x3c; 8])
            .tensor("k", GgmlType::Q4_K, &[256], vec![0; 144])
            .build()
            .unwrap(),
        // qwen2 (biases, another key prefix) and a K-quant mix (Q5_K projections, Q6_K
        // embedding, Q4_K head): the config's architecture table and every block format.
        TinyLlama {
            architecture: "qwen2",
            num_layers: 1,
            projection_type: GgmlType::Q5_0,
            embedding_type: GgmlType::Q8_0,
            ..TinyLlama::default()
        }
        .build(5)
        .unwrap(),
        TinyLlama {
            num_layers: 1,
            embedding_len: 256,
            head_dim: 64,
            ffn_len: 256,
            projection_type: GgmlType::Q5_K,
            embedding_type: GgmlType::Q6_K,
            ..TinyLlama::default()
        }
        .build(6)
        .unwrap(),
        // Issue 23's hostile metadata: a context of 2^32 - 1 tokens (the RoPE table and
        // everything else sized by it must stay small), and a block count below the blocks
        // the file holds.
        TinyLlama {
            context_len: u32::MAX,
            ..TinyLlama::default()
        }
        .build(3)
        .unwrap(),
        {
            let mut b = TinyLlama::default().build(4).unwrap();
            let key = b"llama.block_count";
            let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
            b[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
            b
        },
    ];
    seeds.push(crate::gemma_tokenizer::spm_gguf());
    // The real model's metadata and tensor index (its first 1.8 MB), when fetched: parsing
    // it walks 49152 token strings and 272 tensor infos.
    if let Ok(path) = dynrt::fetch::resolve_model(None) {
        if let Ok(bytes) = std::fs::read(&path) {
            seeds.push(bytes[..1_800_000.min(bytes.len())].to_vec());
        }
    }
    seeds
}

const INTERESTING_U64: [u64; 14] = [
    0,
    1,
    2,
    3,
    7,
    31,
    32,
    255,
    0xFFFF_FFFF,
    0x1_0000_0000,
    0x7FFF_FFFF_FFFF_FFFF,
    0x8000_0000_0000_0000,
    u64::MAX,
    u64::MAX - 31,
];

fn mutate(rng: &mut SplitMix64, input: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    let rounds = rng.range(1, 5);
    for _ in 0..rounds {
        let len = input.len() as u64;
        let at = |rng: &mut SplitMix64| {
            if len == 0 {
                0
            } else {
                rng.range(0, len) as usize
            }
        };
        match rng.range(0, 9) {
            0 => {
                let i = at(rng);
                if let Some(b) = input.get_mut(i) {
                    *b ^= 1 << rng.range(0, 8);
                }
            }
            1 => {
                let i = at(rng);
                if let Some(b) = input.get_mut(i) {
                    *b = rng.next_u64() as u8;
                }
            }
            2 | 3 => {
                // A length, count, type or offset field replaced by a boundary value.
                let i = at(rng);
                let v = match rng.range(0, 3) {
                    0 => *pick(rng, &INTERESTING_U64),
                    1 => len.wrapping_add(rng.range(0, 64)).wrapping_sub(32),
                    _ => rng.range(0, 64),
                };
                let width = if rng.range(0, 2) == 0 { 4 } else { 8 };
                for (k, &byte) in v.to_le_bytes()[..width].iter().enumerate() {
                    if let Some(b) = input.get_mut(i + k) {
                        *b = byte;
                    }
                }
            }
            4 => {
                let cut = at(rng);
                input.truncate(cut);
            }
            5 => {
                let i = at(rng);
                let n = rng.range(1, 16) as usize;
                let extra: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                input.splice(i..i, extra);
            }
            6 => {
                let i = at(rng);
                let n = (rng.range(1, 64) as usize).min(input.len() - i.min(input.len()));
                input.drain(i..i + n);
            }
            7 => {
                let i = at(rng);
                let n = (rng.range(1, 64) as usize).min(input.len() - i.min(input.len()));
                let copy = input[i..i + n].to_vec();
                let j = at(rng);
                input.splice(j..j, copy);
            }
            _ => {
                // Splice: the head of this input, the tail of another seed.
                let other = pick(rng, seeds);
                let i = at(rng);
                let j = rng.range(0, other.len() as u64 + 1) as usize;
                input.truncate(i);
                input.extend_from_slice(&other[j..]);
            }
        }
    }
}

/// Everything a loader would do with a file.
fn exercise_gguf(bytes: &[u8], outcomes: &mut BTreeMap<String, u64>) {
    let kind = |e: &dyn std::fmt::Debug| {
        let s = format!("{e:?}");
        s.split([' ', '(', '{']).next().unwrap_or("").to_owned()
    };
    let g = match Gguf::parse(bytes) {
        Ok(g) => g,
        Err(e) => {
            *outcomes.entry(format!("parse: {}", kind(&e))).or_default() += 1;
            return;
        }
    };
    *outcomes.entry("parse: Ok".into()).or_default() += 1;
    for (k, _) in g.metadata() {
        let _ = (
            g.get_u32(k),
            g.get_f32(k),
            g.get_str(k),
            g.get_str_array(k),
            g.get_bool(k),
        );
    }
    for t in g.tensors() {
        let _ = g.tensor_bytes(bytes, t.name());
        if t.num_elements() <= 1 << 20 {
            let _ = g.dequantize_tensor(bytes, t.name());
            let rows = t.num_rows();
            let _ = g.dequantize_rows(bytes, t.name(), rows / 2..rows);
        }
    }
    match ModelConfig::from_gguf(&g) {
        Ok(c) => {
            *outcomes.entry("config: Ok".into()).or_default() += 1;
            // What a load sizes from the metadata before the device: the context the
            // browser's default binding allows and the RoPE table for it.
            let context = context_on_device(&c, 128 << 20);
            let table = rope_table(f64::from(c.rope_base), c.rope_dim, context);
            assert_eq!(
                table.len() as u64,
                u64::from(rope_table_rows(context)) * u64::from(c.rope_dim)
            );
            assert!(
                table.len() < 1 << 24,
                "a RoPE table of {} values",
                table.len()
            );
        }
        Err(e) => *outcomes.entry(format!("config: {}", kind(&e))).or_default() += 1,
    }
    match Tokenizer::from_gguf(&g) {
        Ok(t) => {
            *outcomes.entry("tokenizer: Ok".into()).or_default() += 1;
            let ids = t.encode("Hello <|im_start|> 2024 😀", Special::Allow);
            let _ = t.decode(&ids);
            if let Ok(chat) = t.render_chat(&[ChatMessage::user("<|im_end|>hi")], true) {
                let _ = t.encode_chat(&chat, 0);
            }
        }
        Err(e) => {
            *outcomes
                .entry(format!("tokenizer: {}", kind(&e)))
                .or_default() += 1
        }
    }
}

fn save_crash(test: &str, n: u64, input: &[u8]) -> String {
    let dir = common::scratch(&format!("{test}_crash_{n}"));
    let path = dir.join("input.bin");
    std::fs::write(&path, input).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path.display().to_string()
}

#[test]
fn fuzz_gguf_parser() {
    let test = "fuzz_gguf_parser";
    let seeds = gguf_seeds();
    let mut rng = SplitMix64::new(seed(test));
    let mut outcomes = BTreeMap::new();
    let (start, limit) = (Instant::now(), budget());
    let mut execs = 0u64;
    // The unmutated seeds must load: otherwise the loop only fuzzes the first error path.
    for s in &seeds[..2] {
        let g = Gguf::parse(s).unwrap();
        ModelConfig::from_gguf(&g).unwrap();
        Tokenizer::from_gguf(&g).unwrap();
    }
    while start.elapsed() < limit {
        let mut input = pick(&mut rng, &seeds).clone();
        mutate(&mut rng, &mut input, &seeds);
        let result = catch_unwind(AssertUnwindSafe(|| exercise_gguf(&input, &mut outcomes)));
        execs += 1;
        if result.is_err() {
            let path = save_crash(test, execs, &input);
            panic!("{test}: panic on input saved at {path}");
        }
    }
    eprintln!(
        "{test}: {execs} executions in {:.1} s, no panic; outcomes:",
        start.elapsed().as_secs_f64()
    );
    for (k, n) in &outcomes {
        eprintln!("  {n:>9}  {k}");
    }
    assert!(execs > 0);
    assert!(
        outcomes.get("parse: Ok").copied().unwrap_or(0) > 0,
        "no mutant parsed: the loop is too destructive"
    );
}

/// The tokenizer the loop fuzzes: the real model's when fetched, else the tiny model's.
fn fuzz_tokenizer_target() -> Tokenizer {
    if let Ok(path) = dynrt::fetch::resolve_model(None) {
        if let Ok(m) = dynrt::gguf::MappedGguf::open(&path) {
            if let Ok(t) = Tokenizer::from_gguf(m.gguf()) {
                eprintln!("fuzz_tokenizer: the real model's tokenizer");
                return t;
            }
        }
    }
    eprintln!("fuzz_tokenizer: the tiny model's tokenizer (run `dynrt fetch` for the real one)");
    let bytes = TinyLlama::default().build(1).unwrap();
    Tokenizer::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap()
}

const PIECES: [&str; 33] = [
    "<|im_start|>",
    "<start_of_turn>",
    "<bos>",
    "\u{2581}",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_",
    "start|>",
    "<",
    "|>",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\u{a0}",
    "\u{3000}",
    "'s",
    "'",
    "0",
    "12",
    "٣",
    "the",
    " the",
    "😀",
    "👍🏽",
    "\u{301}",
    "é",
    "中",
    "Ġ",
    "Ċ",
    "\u{0}",
    "\u{200d}",
];

fn random_text(rng: &mut SplitMix64) -> String {
    let mut s = String::new();
    let n = rng.range(0, 24);
    for _ in 0..n {
        match rng.range(0, 6) {
            0 => s.push_str(pick::<&str>(rng, &PIECES)),
            1 => {
                // Any scalar value (surrogates skipped by from_u32).
                let c = char::from_u32(rng.range(0, 0x11_0000) as u32).unwrap_or('?');
                s.push(c);
            }
            2 => s.push(char::from(rng.range(0x20, 0x7f) as u8)),
            3 => {
                let c = char::from_u32(rng.range(0x80, 0x3000) as u32).unwrap_or('?');
                s.push(c);
            }
            4 => {
                let c = *pick(rng, &[" ", "\n", "\t", "a", "1"]);
                let k = rng.range(1, 40) as usize;
                s.push_str(&c.repeat(k));
            }
            _ => {
                if rng.range(0, 200) == 0 {
                    // A long word: BPE must stay O(n log n).
                    s.push_str(&"ab".repeat(20_000));
                }
            }
        }
    }
    s
}

#[test]
fn fuzz_tokenizer() {
    fuzz_tokenizer_loop("fuzz_tokenizer", &fuzz_tokenizer_target());
}

/// [`fuzz_tokenizer`] for SentencePiece: Gemma 3's tokenizer when fetched, else the seed's.
#[test]
fn fuzz_spm_tokenizer() {
    let gemma = dynrt::fetch::resolve_model(Some(std::path::Path::new("gemma3-270m")))
        .ok()
        .and_then(|path| dynrt::gguf::MappedGguf::open(&path).ok())
        .and_then(|m| Tokenizer::from_gguf(m.gguf()).ok());
    let tok = gemma.unwrap_or_else(|| {
        eprintln!("fuzz_spm_tokenizer: the seed's tokenizer (fetch gemma3-270m for Gemma's)");
        Tokenizer::from_gguf(&Gguf::parse(&crate::gemma_tokenizer::spm_gguf()).unwrap()).unwrap()
    });
    assert_eq!(tok.model(), TokenizerModel::SentencePiece);
    fuzz_tokenizer_loop("fuzz_spm_tokenizer", &tok);
}

fn fuzz_tokenizer_loop(test: &str, tok: &Tokenizer) {
    let missing = tok.missing_bytes();
    // SentencePiece decodes a `▁` written in the text as a space.
    let spm = tok.model() == TokenizerModel::SentencePiece;
    // Texts that decode back to themselves.
    let exact =
        |t: &str| !(t.bytes().any(|b| missing.contains(&b)) || (spm && t.contains('\u{2581}')));
    let vocab = tok.vocab_size() as u64;
    let mut rng = SplitMix64::new(seed(test));
    let (start, limit) = (Instant::now(), budget());
    let (mut execs, mut round_trips, mut stream_checks) = (0u64, 0u64, 0u64);
    while start.elapsed() < limit {
        let text = random_text(&mut rng);
        let ids_len = rng.range(0, 40);
        let ids: Vec<u32> = (0..ids_len)
            .map(|_| match rng.range(0, 20) {
                0 => vocab as u32 + rng.range(0, 5) as u32,
                _ => rng.range(0, vocab) as u32,
            })
            .collect();
        let result = catch_unwind(AssertUnwindSafe(|| {
            let mut checked = (0, 0);
            for special in [Special::Allow, Special::Plain] {
                let enc = tok.encode(&text, special);
                let dec = tok.decode(&enc).unwrap();
                if exact(&text) {
                    assert_eq!(dec, text, "decode(encode) with {special:?}");
                    checked.0 += 1;
                }
            }
            // Without a control token matched, both modes cut the text alike.
            if !tok
                .encode(&text, Special::Allow)
                .iter()
                .any(|&i| tok.is_control(i))
            {
                assert_eq!(
                    tok.encode(&text, Special::Allow),
                    tok.encode(&text, Special::Plain)
                );
            }
            // Random ids: decode is an error exactly when one is out of range, and the
            // streamed pieces add up to the lossy decode.
            let whole = tok.decode(&ids);
            let out_of_range = ids.iter().any(|&id| u64::from(id) >= vocab);
            assert_eq!(whole.is_err(), out_of_range);
            if let Ok(whole) = whole {
                let mut s = tok.stream_decoder(false);
                let mut streamed = String::new();
                for &id in &ids {
                    let piece = s.push(id).unwrap();
                    streamed.push_str(&piece);
                    assert!(s.pending_bytes() <= 3);
                }
                streamed.push_str(&s.finish());
                assert_eq!(streamed, whole, "stream vs whole for {ids:?}");
                checked.1 += 1;
            } else {
                let bad = ids
                    .iter()
                    .copied()
                    .find(|&id| u64::from(id) >= vocab)
                    .unwrap();
                let mut s = tok.stream_decoder(false);
                assert!(matches!(s.push(bad), Err(TokenizerError::UnknownId { .. })));
            }
            // A chat whose message is this text: control tokens only from the template,
            // however the text spells them, and the ids decode to the rendered text.
            if let Ok(chat) = tok.render_chat(&[ChatMessage::user(text.clone())], true) {
                let ids = tok.encode_chat(&chat, 0);
                let own = tok
                    .render_chat(&[ChatMessage::user("x")], true)
                    .map(|c| tok.encode_chat(&c, 0))
                    .unwrap();
                let controls = |ids: &[u32]| ids.iter().filter(|&&i| tok.is_control(i)).count();
                assert_eq!(
                    controls(&ids),
                    controls(&own),
                    "control tokens for {text:?}"
                );
                if exact(&text) {
                    assert_eq!(tok.decode(&ids).unwrap(), chat.text);
                }
            }
            checked
        }));
        execs += 1;
        match result {
            Ok((r, s)) => {
                round_trips += r;
                stream_checks += s;
            }
            Err(_) => {
                let path = save_crash(test, execs, text.as_bytes());
                panic!("{test}: failure on text saved at {path} (ids {ids:?})");
            }
        }
    }
    eprintln!(
        "{test}: {execs} executions in {:.1} s ({round_trips} round trips, {stream_checks} stream checks), no failure",
        start.elapsed().as_secs_f64()
    );
    assert!(round_trips > 0 && stream_checks > 0);
}

/// Valid files of every readable dtype and layout, then the hostile headers of issue 23.
fn npy_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    let shapes: [&[u64]; 4] = [&[], &[3], &[2, 3], &[1, 2, 0]];
    for (i, dtype) in dynrt::npy::DTYPES.into_iter().enumerate() {
        let dims = shapes[i % shapes.len()];
        let n: u64 = dims.iter().product();
        let width = dtype.bits().unwrap() as usize / 8;
        let bytes: Vec<u8> = (0..n as usize * width)
            .map(|k| {
                if dtype == TensorDType::Bool {
                    (k % 2) as u8
                } else {
                    (k * 7 % 61) as u8
                }
            })
            .collect();
        let t = HostTensor::from_bytes(dtype, dims.to_vec(), bytes.into()).unwrap();
        seeds.push(write_npy(&t).unwrap());
    }
    let six: Vec<u8> = (0..6u8).flat_map(|v| f32::from(v).to_le_bytes()).collect();
    let six_be: Vec<u8> = (0..6u8).flat_map(|v| f32::from(v).to_be_bytes()).collect();
    seeds.extend([
        common::npy_file(
            1,
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
            &six,
        ),
        common::npy_file(
            2,
            "{'descr': '>f4', 'fortran_order': False, 'shape': (3, 2)}",
            &six_be,
        ),
        common::npy_file(
            3,
            "{\"shape\": (6L,), \"descr\": \"<f4\", \"fortran_order\": False}",
            &six,
        ),
        // Hostile: nested braces (the 64-byte file that hung), in the shape and the value too.
        common::npy_file(1, &"{".repeat(16), &[]),
        common::npy_file(1, &"{".repeat(64), &[]),
        common::npy_file(
            1,
            &format!(
                "{{'descr': '<f4', 'fortran_order': False, 'shape': {}",
                "(".repeat(64)
            ),
            &[],
        ),
        common::npy_file(1, &format!("{{'descr': {}", "[".repeat(64)), &[]),
        // A header length far past the file.
        {
            let mut f = b"\x93NUMPY\x02\x00".to_vec();
            f.extend_from_slice(&u32::MAX.to_le_bytes());
            f.extend_from_slice(b"{'descr': '<f4', 'fortran_order': False, 'shape': (), }\n");
            f
        },
        // Shapes whose size overflows, and shapes beyond the data.
        common::npy_file(
            1,
            "{'descr': '<f8', 'fortran_order': True, 'shape': (4294967296, 4294967296, 2), }",
            &six,
        ),
        common::npy_file(
            1,
            "{'descr': '<u1', 'fortran_order': False, 'shape': (1099511627776, 1024), }",
            &six,
        ),
        common::npy_file(
            1,
            "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }",
            &six,
        ),
        // A long key and a long dtype, which errors must not quote whole.
        common::npy_file(1, &format!("{{'{}': 1}}", "k".repeat(2_000)), &[]),
        common::npy_file(
            1,
            &format!(
                "{{'descr': '{}', 'fortran_order': False, 'shape': ()}}",
                "x".repeat(2_000)
            ),
            &[],
        ),
    ]);
    seeds
}

/// Pieces of header syntax, spliced into headers.
const NPY_TOKENS: [&str; 28] = [
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "'",
    "\"",
    ",",
    ":",
    " ",
    "\n",
    "\\",
    "L",
    "-",
    "0",
    "1",
    "18446744073709551616",
    "True",
    "False",
    "None",
    "'descr'",
    "'shape'",
    "'fortran_order'",
    "'<f4'",
    "'|b1'",
    "'>i8'",
    "'<c8'",
];

/// Splices a header token into the header and keeps the length field right, so the header
/// parser (not the length check) sees it.
fn splice_npy_token(rng: &mut SplitMix64, input: &mut Vec<u8>) {
    let (length_at, width) = match input.get(6) {
        Some(1) => (8, 2),
        Some(2 | 3) => (8, 4),
        _ => return,
    };
    let Some(field) = input.get(length_at..length_at + width) else {
        return;
    };
    let mut le = [0u8; 8];
    le[..width].copy_from_slice(field);
    let length = u64::from_le_bytes(le);
    let start = length_at + width;
    let end = (start as u64 + length).min(input.len() as u64) as usize;
    let token = pick(rng, &NPY_TOKENS).repeat(if rng.range(0, 8) == 0 { 200 } else { 1 });
    let at = rng.range(start as u64, end as u64 + 1) as usize;
    let new_length = length + token.len() as u64;
    if width == 2 && new_length > u64::from(u16::MAX) {
        return;
    }
    input.splice(at..at, token.bytes());
    input[length_at..length_at + width].copy_from_slice(&new_length.to_le_bytes()[..width]);
}

#[test]
fn fuzz_npy_reader() {
    let test = "fuzz_npy_reader";
    let seeds = npy_seeds();
    let mut rng = SplitMix64::new(seed(test));
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let (start, limit) = (Instant::now(), budget());
    let mut execs = 0u64;
    // The valid seeds must read: otherwise the loop only fuzzes the first error path.
    for s in &seeds[..15] {
        read_npy(s).unwrap();
    }
    while start.elapsed() < limit {
        let mut input = pick(&mut rng, &seeds).clone();
        if rng.range(0, 2) == 0 {
            mutate(&mut rng, &mut input, &seeds);
        } else {
            for _ in 0..rng.range(1, 4) {
                splice_npy_token(&mut rng, &mut input);
            }
        }
        let result = catch_unwind(AssertUnwindSafe(|| match read_npy(&input) {
            Ok(t) => {
                let back = read_npy(&write_npy(&t).unwrap()).unwrap();
                assert_eq!(back, t, "write then read changed the tensor");
                "Ok".to_string()
            }
            Err(e) => {
                let message = e.to_string();
                assert!(
                    message.chars().count() < 400,
                    "the message quotes too much: {message}"
                );
                format!("{e:?}")
                    .split([' ', '(', '{'])
                    .next()
                    .unwrap_or("")
                    .to_owned()
            }
        }));
        execs += 1;
        match result {
            Ok(kind) => *outcomes.entry(kind).or_default() += 1,
            Err(_) => {
                let path = save_crash(test, execs, &input);
                panic!("{test}: failure on input saved at {path}");
            }
        }
    }
    eprintln!(
        "{test}: {execs} executions in {:.1} s, no failure; outcomes:",
        start.elapsed().as_secs_f64()
    );
    for (k, n) in &outcomes {
        eprintln!("  {n:>9}  {k}");
    }
    assert!(execs > 0);
    assert!(
        outcomes.get("Ok").copied().unwrap_or(0) > 0,
        "no mutant was read: the loop is too destructive"
    );
}
