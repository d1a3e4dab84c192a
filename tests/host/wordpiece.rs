//! BERT's WordPiece tokenizer (`src/tokenizer/wordpiece.rs`) against the `tokenizers`
//! package (`scripts/bert_ref.py tokenize`) on all-MiniLM-L6-v2's `tokenizer.json`: the
//! tokenizer corpus of the BPE tests (over a thousand strings: unicode from every plane,
//! accents, CJK, emoji, punctuation, control characters) and BERT's own cases (combining
//! marks, long words that become `[UNK]`, control tokens typed as text, texts truncated at
//! the maximum length).

use crate::common;

/// Characters whose category the `tokenizers` package takes from older Unicode tables than
/// dynrt's (Unicode 16): non-spacing marks of scripts added after Unicode 8 (Sogdian, Marchen),
/// which it keeps as unknown letters where dynrt strips them as accents. The corpus's random
/// code points hit these; a difference on any other string fails the test.
const NEWER_UNICODE: &[char] = &['\u{10f4b}', '\u{11ca0}'];
use crate::smollm2::{random_mixes, reference_tokenize, tokenizer_corpus};
use dynrt::fetch;
use dynrt::rng::SplitMix64;
use dynrt::tokenizer::WordPiece;

/// Strings that exercise BERT's normalizer and WordPiece beyond the shared corpus.
fn bert_corpus() -> Vec<String> {
    let mut v: Vec<String> = [
        "Héllo Wörld ÀÉÎÕÜ àéîõü",
        "Ångström naïve coöperate façade",
        "g\u{308}\u{301} a\u{30a} e\u{301}\u{302}\u{303}",
        "İstanbul ǅemal ﬁne Ⅻ ß ẞ",
        "[CLS] [SEP] [PAD] [MASK] [UNK] [cls]",
        "hello[SEP]world",
        "unaffable supercalifragilisticexpialidocious antidisestablishmentarianism",
        "ThisIsAVeryLongWordWithoutAnySpacesThatGoesOnAndOnAndOnForMoreThanOneHundredCharactersSoItBecomesUnknownToken",
        "中文字符测试，包括标点。日本語テキスト 한국어",
        "\u{3400}\u{20000}\u{2a700}\u{f900}\u{2f800} CJK extensions",
        "emoji 😀😃😄 🥰 🫠 👍🏽 🇺🇸 ❤️ 👨‍👩‍👧",
        "tabs\tnew\nlines\r\nform\u{c}feed vtab\u{b}",
        "zero\u{200b}width\u{200d}joiner\u{2060}word\u{feff}",
        "soft\u{ad}hyphen and\u{a0}nbsp and\u{2028}line sep",
        "private \u{e000}\u{f8ff} use and \u{10fffd}",
        "unassigned \u{378} \u{31350} \u{e0001}",
        "\u{0}\u{1}\u{7f}\u{80}\u{9f}\u{fffd}",
        "¿Qué? ¡Sí! «quotes» „low“ 'single' ‹angle›",
        "em—dash en–dash … ‰ § ¶ † ‡ • ⁂",
        "$100.00 €50 £20 ¥1000 ₹500 3.14159 1,000,000 50%",
        "user@example.com https://example.com/a_b?c=d&e=f#g",
        "C++ C# F# .NET node.js x86_64 a/b\\c",
        "don't won't it's y'all rock'n'roll",
        "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ ！？",
        "Ελληνικά Русский עברית العربية हिन्दी ไทย",
        "",
        "   ",
        "a",
        "A.",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let pieces = [
        "the", " ", "Café", "naïve", "中", "😀", "[SEP]", "##", "un", "able", ",", ".", "!", "'",
        "\u{301}", "\u{3000}", "\t", "\n", "ß", "İ", "1", "2024", "-", "_", "(", ")", "…", "«",
        "ü", "ñ", "ç", "ø", "a", "Z",
    ];
    let mut rng = SplitMix64::new(34);
    v.extend(random_mixes(&mut rng, &pieces, 300, 24));
    // Long texts, to be truncated.
    for n in [200, 300, 600] {
        v.push(
            (0..n)
                .map(|i| ["word", "other", "thing", "é", "x"][i % 5])
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    v
}

#[test]
fn wordpiece_equals_the_tokenizers_package() {
    let test = "wordpiece_equals_the_tokenizers_package";
    let Some(folder) = fetch::embedding_or_skip(&fetch::ALL_MINILM_L6_V2, test) else {
        return;
    };
    let Some(py) = common::python_or_skip(test) else {
        return;
    };
    let path = folder.join("tokenizer.json");
    let mut tok = WordPiece::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // sentence-transformers' length for this model (sentence_bert_config.json).
    tok.set_max_length(Some(256)).unwrap();
    let mut texts = tokenizer_corpus();
    texts.extend(bert_corpus());
    assert!(texts.len() >= 1300, "{}", texts.len());
    let path = path.display().to_string();
    let r = reference_tokenize(
        test,
        &py,
        "bert_ref.py",
        &["tokenize", "--tokenizer", &path, "--max-length", "256"],
        &texts,
    );
    let mut mismatches = Vec::new();
    let (mut unknowns, mut truncated, mut newer) = (0, 0, 0);
    let unk = tok.token_id("[UNK]").unwrap();
    for (i, text) in texts.iter().enumerate() {
        let ours = tok.encode(text);
        let theirs = common::json_ids(&r["ids"][i]);
        if ours != theirs && !text.chars().any(|c| NEWER_UNICODE.contains(&c)) {
            mismatches.push(format!(
                "{text:?}: normalized ours {:?} theirs {}\n  ours {ours:?}\n  theirs {theirs:?}",
                tok.normalize(text),
                r["normalized"][i]
            ));
        }
        if ours != theirs {
            newer += 1;
        }
        unknowns += usize::from(ours.contains(&unk));
        truncated += usize::from(ours.len() == 256);
    }
    assert!(
        mismatches.is_empty(),
        "{test}: {} of {} differ:\n{}",
        mismatches.len(),
        texts.len(),
        mismatches.join("\n")
    );
    assert!(
        unknowns >= 50 && truncated >= 2,
        "{unknowns} unknowns, {truncated} truncated"
    );
    assert!(
        newer <= NEWER_UNICODE.len(),
        "{newer} strings differ by newer Unicode"
    );
    eprintln!(
        "{test}: {} of {} strings equal the tokenizers package's ids ({unknowns} with [UNK], \
         {truncated} truncated; {newer} differ by marks newer than its Unicode tables)",
        texts.len() - newer,
        texts.len()
    );
}
