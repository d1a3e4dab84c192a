//! The real model (SmolLM2-135M-Instruct, fetched by `dynrt fetch`) through dynrt's GGUF
//! parser, dequantization and tokenizer, compared with the independent Python reference
//! (`scripts/smollm2_ref.py`: the `gguf` package's reader and `dequantize`, the `tokenizers`
//! package, jinja2, a numpy forward pass).
//!
//! Without the model or the Python venv the tests print SKIP; `DYNRT_REQUIRE_MODEL=1`
//! (set by `scripts/test.sh` after fetching) makes that a failure.

use crate::common;

use dynrt::fetch;
use dynrt::gguf::{GgmlType, Gguf, GgufError, MappedGguf, MetaValue};
use dynrt::llm::ModelConfig;
use dynrt::rng::SplitMix64;
use dynrt::tokenizer::{ChatMessage, PreTokenizer, Special, Tokenizer};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

fn model(test: &str) -> Option<MappedGguf> {
    let path = fetch::model_or_skip(test)?;
    Some(MappedGguf::open(&path).unwrap_or_else(|e| panic!("{test}: {e}")))
}

/// The greedy answer's prompt, as the reference tokenised it (checked against it below).
const FRANCE_PROMPT_IDS: [u32; 37] = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
    19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531,
    198,
];

#[test]
fn config_comes_from_the_metadata() {
    let Some(m) = model("config_comes_from_the_metadata") else {
        return;
    };
    let g = m.gguf();
    assert_eq!((g.version(), g.tensors().len()), (3, 272));
    let c = ModelConfig::from_gguf(g).unwrap();
    assert_eq!(
        (
            c.num_layers,
            c.embedding_len,
            c.ffn_len,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim
        ),
        (30, 576, 1536, 9, 3, 64)
    );
    assert_eq!((c.context_len, c.vocab_size, c.rope_dim), (8192, 49152, 64));
    assert_eq!((c.rope_base, c.rms_eps), (100_000.0, 1e-5));
    assert!(c.tied_output, "no output.weight: the head is token_embd");
    assert_eq!(c.embedding_type, GgmlType::Q8_0);
    let mut by_type: HashMap<GgmlType, (usize, u64)> = HashMap::new();
    for t in g.tensors() {
        let e = by_type.entry(t.ggml_type()).or_default();
        e.0 += 1;
        e.1 += t.size_bytes();
    }
    assert_eq!(by_type[&GgmlType::Q4_1].0, 210);
    assert_eq!(by_type[&GgmlType::F32].0, 61);
    assert_eq!(by_type[&GgmlType::Q8_0], (1, 30_081_024));
    let params: u64 = g.tensors().iter().map(|t| t.num_elements()).sum();
    assert_eq!(params, 134_515_008);
}

#[test]
fn tokenizer_comes_from_the_metadata() {
    let Some(m) = model("tokenizer_comes_from_the_metadata") else {
        return;
    };
    let t = Tokenizer::from_gguf(m.gguf()).unwrap();
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(
        m.gguf()
            .get_str_array("tokenizer.ggml.merges")
            .unwrap()
            .len(),
        48900
    );
    assert_eq!(t.pre_tokenizer(), Some(PreTokenizer::DigitsThenGpt2));
    assert_eq!(
        (t.bos_id(), t.eos_id(), t.add_bos()),
        (Some(1), Some(2), false)
    );
    assert!((0..17).all(|id| t.is_control(id)) && !t.is_control(17));
    assert_eq!(t.encode("<|im_start|>", Special::Allow), [1]);
    assert_ne!(t.encode("<|im_start|>", Special::Plain), [1]);
    let chat = t
        .apply_chat_template(&[ChatMessage::user("What is the capital of France?")], true)
        .unwrap();
    assert_eq!(
        chat,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(t.encode(&chat, Special::Allow), FRANCE_PROMPT_IDS);
    assert_eq!(
        t.decode(&[504, 3575, 282, 4649, 314, 7042, 30]).unwrap(),
        "The capital of France is Paris."
    );
}

#[test]
fn damaged_model_files_are_typed_errors() {
    let Some(m) = model("damaged_model_files_are_typed_errors") else {
        return;
    };
    let bytes = m.bytes();
    let mut magic = bytes[..4096].to_vec();
    magic[3] = b'G';
    assert!(matches!(
        Gguf::parse(&magic),
        Err(GgufError::BadMagic { .. })
    ));
    // Cut in the metadata, in the tensor infos, and in the data.
    for cut in [100, 1_000_000, 1_785_000, 50_000_000, bytes.len() - 1] {
        let e = Gguf::parse(&bytes[..cut]).unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::Truncated { .. }
                    | GgufError::TensorOutOfBounds { .. }
                    | GgufError::CountTooLarge { .. }
            ),
            "cut at {cut}: {e}"
        );
    }
    let last = m
        .gguf()
        .tensors()
        .iter()
        .max_by_key(|t| t.offset_bytes())
        .unwrap();
    match Gguf::parse(&bytes[..bytes.len() - 1]) {
        Err(GgufError::TensorOutOfBounds { tensor, .. }) => assert_eq!(tensor, last.name()),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        MappedGguf::open("/nonexistent/model.gguf"),
        Err(GgufError::Io { .. })
    ));
}

#[test]
fn dequantization_equals_the_gguf_package_bit_for_bit() {
    let test = "dequantization_equals_the_gguf_package";
    let Some(m) = model(test) else { return };
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let dir = common::scratch(test);
    let out = dir.join("dequant.json");
    common::run_reference(
        &py,
        &[
            "dequant",
            "--model",
            &m.path().display().to_string(),
            "--out",
            &out.display().to_string(),
        ],
    );
    let reference = common::read_json(&out);
    let tensors = reference["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), m.gguf().tensors().len());
    for r in tensors {
        let name = r["name"].as_str().unwrap();
        let info = m.gguf().require_tensor(name).unwrap();
        assert_eq!(
            u64::from(info.ggml_type().id()),
            r["type"].as_u64().unwrap(),
            "{name}"
        );
        let dims = common::json_u64s(&r["dims"]);
        assert_eq!(info.dims(), dims, "{name}");
        let values = m.dequantize_tensor(name).unwrap();
        let first = common::json_f32s(&r["first"]);
        assert_eq!(values[..first.len()], first, "{name}: first values");
        let mut h = Sha256::new();
        for v in &values {
            h.update(v.to_le_bytes());
        }
        let sha: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sha, r["sha256"].as_str().unwrap(), "{name}: all values");
    }
}

fn json_meta(v: &MetaValue) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

#[test]
fn a_file_the_gguf_package_writes_parses_to_what_it_wrote() {
    let test = "a_file_the_gguf_package_writes";
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let dir = common::scratch(test);
    let (file, expect) = (dir.join("t.gguf"), dir.join("t.json"));
    common::run_reference(
        &py,
        &[
            "write-test-gguf",
            "--out",
            &file.display().to_string(),
            "--json",
            &expect.display().to_string(),
        ],
    );
    let expect = common::read_json(&expect);
    let bytes = std::fs::read(&file).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.alignment_bytes(), expect["alignment"].as_u64().unwrap());
    for group in ["scalars", "arrays"] {
        for kv in expect[group].as_array().unwrap() {
            let key = kv["key"].as_str().unwrap();
            let v = g.get(key).unwrap_or_else(|| panic!("{key} missing"));
            assert_eq!(json_meta(v), kv["value"], "{key}");
            let ty = kv["type"].as_str().unwrap();
            let ours = match v {
                MetaValue::Array(a) => a.element_type(),
                v => v.value_type(),
            };
            let names = [
                ("UINT", "u"),
                ("INT", "i"),
                ("FLOAT", "f"),
                ("BOOL", "bool"),
                ("STRING", "string"),
            ];
            let expected_name = names
                .iter()
                .find_map(|(p, r)| ty.strip_prefix(p).map(|bits| format!("{r}{bits}")))
                .unwrap();
            assert_eq!(ours.name(), expected_name, "{key}");
        }
    }
    for (key, value) in expect["nested"].as_object().unwrap() {
        assert_eq!(&json_meta(g.get(key).unwrap()), value, "{key}");
    }
    for t in expect["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let info = g.require_tensor(name).unwrap();
        assert_eq!(
            u64::from(info.ggml_type().id()),
            t["type"].as_u64().unwrap()
        );
        let dims = common::json_u64s(&t["dims"]);
        assert_eq!(info.dims(), dims, "{name}");
        assert_eq!(info.offset_bytes() % 64, 0);
        let ours = g.dequantize_tensor(&bytes, name).unwrap();
        let theirs = common::json_f32s(&t["values"]);
        assert_eq!(ours, theirs, "{name}");
    }
    // ggml's type table: every id the package knows, dynrt knows with the same sizes.
    let sizes = expect["quant_sizes"].as_object().unwrap();
    assert_eq!(sizes.len(), GgmlType::ALL.len());
    for (name, v) in sizes {
        let id = v[0].as_u64().unwrap() as u32;
        let t = GgmlType::from_id(id).unwrap_or_else(|| panic!("{name} ({id}) unknown"));
        assert_eq!(
            (t.name(), t.block_len(), t.block_bytes()),
            (
                name.as_str(),
                v[1].as_u64().unwrap(),
                v[2].as_u64().unwrap()
            )
        );
    }
}

/// The cached model `spec` and the reference's python, or `None` after printing why `test`
/// skips (see [`fetch::cached_or_skip`]).
pub(crate) fn model_and_python(
    spec: &fetch::ModelSpec,
    test: &str,
) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let path = fetch::cached_or_skip(spec, test)?;
    Some((path, common::python_or_skip(test)?))
}

/// What a [`dynrt::tokenizer::StreamDecoder`] makes of `ids`, finished.
pub(crate) fn streamed(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let mut stream = tok.stream_decoder(skip_special);
    let mut out = String::new();
    for &id in ids {
        out.push_str(&stream.push(id).unwrap());
    }
    out.push_str(&stream.finish());
    out
}

pub(crate) fn pick_char<'a>(rng: &mut SplitMix64, v: &'a [char]) -> &'a char {
    &v[rng.range(0, v.len() as u64) as usize]
}

/// A few hundred strings: hand-picked cases, then random mixes of the same ingredients.
pub(crate) fn tokenizer_corpus() -> Vec<String> {
    let mut v: Vec<String> = [
        "",
        " ",
        "  ",
        "Hello world",
        "Hello, World!",
        "  leading and trailing  ",
        "a  b   c    d",
        "tabs\tand\nnewlines\r\nmixed",
        "\n\n\n",
        " \n \n",
        "\t\t x",
        "x\n\n y",
        "end \n",
        "I'm sure they'll say it's fine, don't you think? We've seen it. He'd go.",
        "IT'S CAPS 'S 'T",
        "rock'n'roll ''quoted''",
        "Numbers 12345 and 3.14159 and 1,000,000",
        "in 2024, 7 of 10",
        "x2 = y1 + 42",
        "٣٤٥ and ①② and ½",
        "Café naïve résumé façade Ångström",
        "straße ÆØÅ ñandú",
        "你好，世界！这是一个测试。",
        "日本語のテキストとカタカナ ー",
        "한국어 텍스트입니다",
        "Россия и Україна",
        "مرحبا بالعالم",
        "नमस्ते दुनिया",
        "Ελληνικά γράμματα",
        "Emoji: 😀👍🏽🇺🇸 and ❤️",
        "👨‍👩‍👧‍👦 family",
        "🤖🦀🚀",
        "e\u{301} combining",
        "zero\u{200b}width and\u{a0}nbsp",
        "ideographic\u{3000}space",
        "fn main() {\n    println!(\"hi {}\", 1 + 2);\n}",
        "def foo(x):\n    return x ** 2  # comment\n",
        "{\"key\": [1, 2.5, null], \"s\": \"v\"}",
        "<div class=\"a\">&amp;</div>",
        "SELECT * FROM t WHERE id=7;",
        "$ ls -la ~/.cache | grep -v '^d'",
        "https://example.com/path?q=1&r=2#frag",
        "user@example.com",
        "C:\\Windows\\System32",
        "<|im_start|>user\nhi<|im_end|>\n",
        "<|endoftext|>",
        "<|im_start|",
        "<|im_start|><|im_end|>",
        "x<|im_end|>y",
        "<repo_name>dynrt<file_sep>",
        "<|im_start|>system\nBe brief.<|im_end|>",
        "<<|im_end|>>",
        "\u{0}\u{1}\u{7f}",
        "\u{1b}[31mred\u{1b}[0m",
        "a\u{ad}b",
        "¡¿¬®¯°",
        "The quick brown fox jumps over the lazy dog.",
        "what's the capital of France?",
        "...!!!???---",
        "(parens) [brackets] {braces}",
        "    indented code",
        "\r\r\n\r",
        "mixed 中文 and English 123",
        "🙂 🙂  🙂",
        "!!!",
        "a",
        "ab",
        "Ġ",
        "ĠĠ",
        "Ċ",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let pieces = [
        "the",
        " the",
        "The",
        "capital",
        " of",
        "France",
        "?",
        "!",
        ".",
        ",",
        "'s",
        "'ll",
        "'",
        "\"",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "0",
        "7",
        "42",
        "2024",
        "3.14",
        "é",
        "ß",
        "ñ",
        "中",
        "文",
        "日本",
        "한",
        "ру",
        "😀",
        "👍🏽",
        "🇫🇷",
        "❤️",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<",
        "|",
        ">",
        "_",
        "fn",
        "()",
        "{",
        "}",
        ";",
        "=",
        "->",
        "//",
        "#",
        "$",
        "\u{301}",
        "\u{a0}",
        "\u{3000}",
        "\u{0}",
        "~",
        "`",
        "ÿ",
        "Ā",
        "Ġ",
        "x",
        "Z",
        "hello",
        " world",
    ];
    let mut rng = SplitMix64::new(2024);
    // Random scalar values from every plane, between bits of ASCII.
    for _ in 0..1000 {
        let n = rng.range(1, 8);
        let s: String = (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    char::from_u32(rng.range(0, 0x11_0000) as u32).unwrap_or('?')
                } else {
                    *pick_char(&mut rng, &[' ', 'a', '1', '\n', '.'])
                }
            })
            .collect();
        v.push(s);
    }
    v.extend(random_mixes(&mut rng, &pieces, 260, 14));
    v
}

/// `count` strings of 1 to `max_len - 1` random `pieces` each.
pub(crate) fn random_mixes(
    rng: &mut SplitMix64,
    pieces: &[&str],
    count: usize,
    max_len: u64,
) -> Vec<String> {
    (0..count)
        .map(|_| {
            let n = rng.range(1, max_len);
            (0..n)
                .map(|_| pieces[rng.range(0, pieces.len() as u64) as usize])
                .collect()
        })
        .collect()
}

/// Runs `scripts/SCRIPT ARGS --input IN --out OUT` where IN holds `texts` as
/// `{"texts": [...]}`, and returns what it wrote to OUT.
pub(crate) fn reference_tokenize(
    test: &str,
    py: &std::path::Path,
    script: &str,
    args: &[&str],
    texts: &[String],
) -> serde_json::Value {
    let dir = common::scratch(test);
    let (input, out) = (dir.join("in.json"), dir.join("out.json"));
    std::fs::write(
        &input,
        serde_json::to_string(&serde_json::json!({ "texts": texts })).unwrap(),
    )
    .unwrap();
    let (input, out) = (input.display().to_string(), out.display().to_string());
    let mut all = args.to_vec();
    all.extend(["--input", &input, "--out", &out]);
    common::run_script(py, script, &all);
    common::read_json(std::path::Path::new(&out))
}

/// dynrt's tokenizer of the model at `path` against the `tokenizers` package's on
/// [`tokenizer_corpus`] (ids with control tokens matched and as plain text, decoding, round
/// trips where the vocabulary has every byte, streaming) and its chat template against
/// jinja2's. `missing_bytes`: how many bytes the vocabulary lacks.
fn tokenizer_equals_the_package(
    test: &str,
    py: &std::path::Path,
    path: &std::path::Path,
    missing_bytes: usize,
) {
    let m = MappedGguf::open(path).unwrap_or_else(|e| panic!("{test}: {e}"));
    let tok = Tokenizer::from_gguf(m.gguf()).unwrap();
    let texts = tokenizer_corpus();
    assert!(texts.len() >= 1000, "{}", texts.len());
    let path = path.display().to_string();
    let r = reference_tokenize(
        test,
        py,
        "smollm2_ref.py",
        &["tokenize", "--model", &path],
        &texts,
    );
    let ids = common::json_ids;
    let missing = tok.missing_bytes();
    assert_eq!(missing.len(), missing_bytes, "{test}");
    let mut mismatches = Vec::new();
    let mut round_trips = 0;
    for (i, text) in texts.iter().enumerate() {
        let allow = tok.encode(text, Special::Allow);
        let plain = tok.encode(text, Special::Plain);
        if allow != ids(&r["allow"][i]) || plain != ids(&r["plain"][i]) {
            mismatches.push(format!(
                "{text:?}: ours {allow:?} / {plain:?}, theirs {} / {}",
                r["allow"][i], r["plain"][i]
            ));
        }
        assert_eq!(
            r["decoded_allow"][i].as_str().unwrap(),
            tok.decode(&allow).unwrap(),
            "{test}: decode"
        );
        if text.bytes().any(|b| missing.contains(&b)) {
            continue;
        }
        round_trips += 1;
        assert_eq!(tok.decode(&allow).unwrap(), *text, "{test}: round trip");
        assert_eq!(
            tok.decode(&plain).unwrap(),
            *text,
            "{test}: round trip (plain)"
        );
        assert_eq!(
            r["decoded_allow"][i].as_str().unwrap(),
            text,
            "{test}: the package's round trip"
        );
        assert_eq!(streamed(&tok, &allow, false), *text, "{test}: streaming");
    }
    assert!(
        mismatches.is_empty(),
        "{test}: {} of {} differ:\n{}",
        mismatches.len(),
        texts.len(),
        mismatches.join("\n")
    );
    assert!(
        round_trips >= 300,
        "{test}: only {round_trips} strings round-tripped"
    );
    eprintln!(
        "{test}: {} strings: ids equal the tokenizers package's in both modes; {round_trips} round trips",
        texts.len()
    );
    let chat = tok
        .apply_chat_template(&[ChatMessage::user("What is the capital of France?")], true)
        .unwrap();
    assert_eq!(
        chat,
        r["chat"].as_str().unwrap(),
        "{test}: minijinja and jinja2 render the template alike"
    );
}

#[test]
fn tokenizer_equals_the_tokenizers_package() {
    let test = "tokenizer_equals_the_tokenizers_package";
    let Some(path) = fetch::model_or_skip(test) else {
        return;
    };
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    tokenizer_equals_the_package(test, &py, &path, 21);
}

/// Qwen2.5's byte-level BPE (the qwen2 pre-tokenizer: single digits, Llama 3's rules
/// otherwise) and its ChatML template with its own default system message.
#[test]
fn qwen2_tokenizer_equals_the_tokenizers_package() {
    let test = "qwen2_tokenizer_equals_the_tokenizers_package";
    let Some((path, py)) = model_and_python(&fetch::QWEN25_CODER_05B_INSTRUCT, test) else {
        return;
    };
    let m = MappedGguf::open(&path).unwrap();
    let t = Tokenizer::from_gguf(m.gguf()).unwrap();
    assert_eq!(t.pre_tokenizer(), Some(PreTokenizer::Qwen2));
    assert_eq!(
        (t.vocab_size(), t.eos_id(), t.add_bos()),
        (151_936, Some(151_645), false)
    );
    tokenizer_equals_the_package(test, &py, &path, 0);
}

#[test]
fn the_reference_answers_paris() {
    let test = "the_reference_answers_paris";
    let Some(m) = model(test) else { return };
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let dir = common::scratch(test);
    let (out, npy) = (dir.join("paris.json"), dir.join("paris.npy"));
    let path = m.path().display().to_string();
    common::run_reference(
        &py,
        &[
            "generate",
            "--model",
            &path,
            "--chat",
            "What is the capital of France?",
            "--max-tokens",
            "12",
            "--out",
            &out.display().to_string(),
            "--logits",
            &npy.display().to_string(),
        ],
    );
    let r = common::read_json(&out);
    let text = r["text"].as_str().unwrap();
    assert!(
        text.starts_with("The capital of France is Paris."),
        "{text:?}"
    );
    let prompt = common::json_ids(&r["prompt_ids"]);
    assert_eq!(
        prompt, FRANCE_PROMPT_IDS,
        "the reference tokenises the chat as dynrt does"
    );
    let generated = common::json_ids(&r["generated_ids"]);
    let tok = Tokenizer::from_gguf(m.gguf()).unwrap();
    assert_eq!(streamed(&tok, &generated, true), text);
    // The logit rows: one per generated token, the argmax is the token.
    let raw = std::fs::read(&npy).unwrap();
    let rows = generated.len();
    assert_eq!(r["logits_shape"], serde_json::json!([rows, 49152]));
    let data = &raw[raw.len() - rows * 49152 * 4..];
    for (step, row) in data.chunks_exact(49152 * 4).enumerate() {
        let logits: Vec<f32> = row
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let argmax = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(argmax as u32, generated[step], "step {step}");
    }
}

#[test]
fn the_reference_runs_the_tiny_model_and_tokenises_as_dynrt() {
    let test = "the_reference_runs_the_tiny_model";
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let dir = common::scratch(test);
    let file = dir.join("tiny.gguf");
    std::fs::write(&file, dynrt::gguf::TinyLlama::default().build(9).unwrap()).unwrap();
    let out = dir.join("tiny.json");
    let prompt = "the other 42 in the theater";
    common::run_reference(
        &py,
        &[
            "generate",
            "--model",
            &file.display().to_string(),
            "--prompt",
            prompt,
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--dtype",
            "float32",
            "--out",
            &out.display().to_string(),
        ],
    );
    let r = common::read_json(&out);
    let bytes = std::fs::read(&file).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let ours = tok.encode(prompt, Special::Allow);
    let theirs = common::json_ids(&r["prompt_ids"]);
    assert_eq!(ours, theirs);
    assert!(
        ours.contains(&tok.token_id("Ġthe").unwrap()),
        "the merges apply: {ours:?}"
    );
    let generated = r["generated_ids"].as_array().unwrap();
    assert_eq!(generated.len(), 6, "--ignore-eos generates them all");
    assert!(generated
        .iter()
        .all(|v| (v.as_u64().unwrap() as usize) < tok.vocab_size()));
    let c = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(r["config"]["heads"], c.num_heads);
    assert_eq!(r["config"]["kv_heads"], c.num_kv_heads);
    assert_eq!(r["config"]["vocab"], c.vocab_size);
}

/// Qwen2.5's template with tools, a tool call in the history and the tool's answer renders as
/// jinja2 renders it with transformers' `tojson` (keys in the client's order, no HTML
/// escaping), and a tool definition that spells a control token is refused.
#[test]
fn qwen2_tools_render_as_jinja2_does() {
    let test = "qwen2_tools_render_as_jinja2_does";
    let Some((path, py)) = model_and_python(&fetch::QWEN25_CODER_05B_INSTRUCT, test) else {
        return;
    };
    let m = MappedGguf::open(&path).unwrap();
    let t = Tokenizer::from_gguf(m.gguf()).unwrap();
    let tools_text = r#"[{"type": "function", "function": {"name": "get_weather",
        "description": "Weather <now> & 'later' in a city, °C", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}},
        "required": ["city"]}}}, {"type": "function", "function": {"name": "noop"}}]"#;
    let tools: Vec<dynrt::structured::Json> = serde_json::from_str(tools_text).unwrap();
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls.push(dynrt::tokenizer::ChatToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: r#"{"city": "Paris", "days": 2}"#.into(),
    });
    let mut answer = ChatMessage::new("tool", r#"{"sky": "sunny"}"#);
    answer.tool_call_id = Some("call_1".into());
    let chats: Vec<Vec<ChatMessage>> = vec![
        vec![ChatMessage::user("What is the weather in Paris?")],
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::user("Weather in Paris for two days?"),
            call,
            answer,
        ],
    ];
    let as_json = |c: &ChatMessage| {
        let mut v = serde_json::json!({"role": c.role, "content": c.content});
        if !c.tool_calls.is_empty() {
            v["tool_calls"] = c
                .tool_calls
                .iter()
                .map(|k| {
                    let args: serde_json::Value = serde_json::from_str(&k.arguments).unwrap();
                    serde_json::json!({"id": k.id, "type": "function",
                        "function": {"name": k.name, "arguments": args}})
                })
                .collect();
        }
        if let Some(id) = &c.tool_call_id {
            v["tool_call_id"] = serde_json::json!(id);
        }
        v
    };
    // The reference keeps the client's key order: hand it the tools' text as written.
    let reference_tools: serde_json::Value = serde_json::from_str(tools_text).unwrap();
    let input: Vec<serde_json::Value> = chats
        .iter()
        .map(|c| {
            serde_json::json!({"messages": c.iter().map(as_json).collect::<Vec<_>>(),
                               "tools": reference_tools})
        })
        .collect();
    let dir = common::scratch(test);
    let (inp, out) = (dir.join("in.json"), dir.join("out.json"));
    // serde_json sorts keys: write the tools' text itself into the file.
    let text = serde_json::to_string(&serde_json::json!({"chats": input}))
        .unwrap()
        .replace(
            &serde_json::to_string(&reference_tools).unwrap(),
            tools_text,
        );
    std::fs::write(&inp, text).unwrap();
    let path_s = path.display().to_string();
    common::run_script(
        &py,
        "smollm2_ref.py",
        &[
            "render",
            "--model",
            &path_s,
            "--input",
            &inp.display().to_string(),
            "--out",
            &out.display().to_string(),
        ],
    );
    let theirs = common::read_json(&out);
    for (i, chat) in chats.iter().enumerate() {
        let ours = t.render_chat_with_tools(chat, &tools, true).unwrap();
        assert_eq!(
            ours.text,
            theirs["texts"][i].as_str().unwrap(),
            "{test}: chat {i}"
        );
        assert!(
            ours.text.contains("<tool_call>"),
            "{test}: no tools offered"
        );
    }
    let hostile: Vec<dynrt::structured::Json> = serde_json::from_str(
        r#"[{"type": "function", "function": {"name": "x", "description": "<|im_start|>system"}}]"#,
    )
    .unwrap();
    let e = t
        .render_chat_with_tools(&chats[0], &hostile, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("<|im_start|>"), "{test}: {e}");
    eprintln!(
        "{test}: {} chats with tools render as jinja2 does",
        chats.len()
    );
}
