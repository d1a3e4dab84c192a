//! BERT's WordPiece tokenizer, read from a Hugging Face `tokenizer.json` (the tokenizer of
//! sentence-transformers models such as all-MiniLM-L6-v2).
//!
//! The pipeline is the `tokenizers` package's for `BertNormalizer` → `BertPreTokenizer` →
//! `WordPiece` → a `[CLS] A [SEP]` post-processor:
//!
//! 1. **Normalize**: clean the text (drop NUL, U+FFFD and control characters — categories
//!    Cc, Cf, Co, Cs — except tab, newline and carriage return, which like every other white
//!    space become a space); put spaces around CJK ideographs; strip accents (NFD, then drop
//!    the non-spacing marks, Mn) when asked, which by default follows lower-casing; lower-case.
//! 2. **Pre-tokenize**: split on white space (dropped) and on punctuation (ASCII punctuation
//!    and the P* categories), each punctuation character a word of its own.
//! 3. **WordPiece**: each word greedily, longest vocabulary entry first, continuation pieces
//!    prefixed `##`; a word with a piece not in the vocabulary, or longer than
//!    `max_input_chars_per_word` characters, is one `[UNK]`.
//! 4. **Post-process**: the template's tokens around the sequence (`[CLS]` … `[SEP]`), the
//!    sequence truncated first so that the whole fits [`WordPiece::max_length`].
//!
//! User text is never a control token: `[SEP]` typed in a sentence is the characters `[`,
//! `sep`, `]` (the `tokenizers` package's `encode_special_tokens` mode, which the tests
//! compare against). The character tables are Unicode 16's (`unicode-general-category`,
//! `unicode-normalization`); the tests check the ids against the `tokenizers` package on
//! over a thousand strings. That package's tables are older: a non-spacing mark of a script
//! added after Unicode 8 (Sogdian, Marchen) is an accent dynrt strips and a letter it keeps
//! (two of the test's 1,662 strings).

use super::TokenizerError;
use std::collections::HashMap;
use unicode_general_category::{get_general_category, GeneralCategory as Gc};
use unicode_normalization::UnicodeNormalization;

/// The largest vocabulary accepted (BERT's has 30,522 entries, multilingual ones 250,000).
pub const MAX_VOCAB: usize = 1 << 22;

/// The longest vocabulary entry accepted, in bytes.
const MAX_TOKEN_BYTES: usize = 1024;

/// The normalizer's switches (`BertNormalizer` in `tokenizer.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BertNormalizer {
    /// Drop control characters and map white space to spaces.
    pub clean_text: bool,
    /// Put spaces around CJK ideographs.
    pub handle_chinese_chars: bool,
    /// Decompose (NFD) and drop non-spacing marks.
    pub strip_accents: bool,
    /// Lower-case.
    pub lowercase: bool,
}

/// A WordPiece tokenizer with BERT's normalizer, pre-tokenizer and post-processor.
#[derive(Debug, Clone)]
pub struct WordPiece {
    vocab: HashMap<String, u32>,
    vocab_size: usize,
    prefix: String,
    max_word_chars: usize,
    unk_id: u32,
    pad_id: u32,
    normalizer: BertNormalizer,
    /// Ids before and after the sequence (`[CLS]`, `[SEP]`).
    before: Vec<u32>,
    after: Vec<u32>,
    max_length: Option<usize>,
}

fn bad(reason: impl Into<String>) -> TokenizerError {
    TokenizerError::Json {
        reason: reason.into(),
    }
}

fn field<'a>(
    v: &'a serde_json::Value,
    key: &str,
    what: &str,
) -> Result<&'a serde_json::Value, TokenizerError> {
    v.get(key)
        .ok_or_else(|| bad(format!("{what} has no `{key}`")))
}

fn flag(v: &serde_json::Value, key: &str, default: bool) -> Result<bool, TokenizerError> {
    match v.get(key) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(serde_json::Value::Bool(b)) => Ok(*b),
        Some(other) => Err(bad(format!("normalizer `{key}` is {other}, not a boolean"))),
    }
}

impl WordPiece {
    /// Reads `tokenizer.json` text. Supported: model `WordPiece`, normalizer `BertNormalizer`,
    /// pre-tokenizer `BertPreTokenizer`, post-processor `TemplateProcessing` or
    /// `BertProcessing`; added tokens must be special ones (they are never matched in text).
    ///
    /// # Errors
    /// [`TokenizerError::Json`] naming the field that is malformed or unsupported.
    pub fn from_json(text: &str) -> Result<WordPiece, TokenizerError> {
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let model = field(&json, "model", "the file")?;
        let kind = model.get("type").and_then(|t| t.as_str()).unwrap_or("");
        if kind != "WordPiece" {
            return Err(bad(format!(
                "model type `{kind}`: only WordPiece is supported"
            )));
        }
        let entries = field(model, "vocab", "the model")?
            .as_object()
            .ok_or_else(|| bad("model vocab is not an object"))?;
        let vocab_size = entries.len();
        if vocab_size == 0 || vocab_size > MAX_VOCAB {
            return Err(TokenizerError::BadVocabularySize { count: vocab_size });
        }
        let mut vocab = HashMap::with_capacity(vocab_size);
        let mut seen = vec![false; vocab_size];
        for (token, id) in entries {
            let id = id
                .as_u64()
                .filter(|&i| (i as usize) < vocab_size)
                .ok_or_else(|| {
                    bad(format!(
                        "vocab `{token}` has id {id}: ids must number the {vocab_size} entries from 0"
                    ))
                })? as usize;
            if token.len() > MAX_TOKEN_BYTES {
                return Err(bad(format!(
                    "vocab entry {id} is over {MAX_TOKEN_BYTES} bytes"
                )));
            }
            if std::mem::replace(&mut seen[id], true) {
                return Err(bad(format!("two vocab entries have id {id}")));
            }
            vocab.insert(token.clone(), id as u32);
        }
        let id_of = |token: &str, what: &str| {
            vocab
                .get(token)
                .copied()
                .ok_or_else(|| bad(format!("{what} `{token}` is not in the vocabulary")))
        };
        let unk = field(model, "unk_token", "the model")?
            .as_str()
            .ok_or_else(|| bad("model unk_token is not a string"))?;
        let unk_id = id_of(unk, "unk_token")?;
        let prefix = model
            .get("continuing_subword_prefix")
            .and_then(|p| p.as_str())
            .unwrap_or("##")
            .to_string();
        let max_word_chars = model
            .get("max_input_chars_per_word")
            .and_then(|m| m.as_u64())
            .unwrap_or(100)
            .min(1 << 20) as usize;

        let norm = field(&json, "normalizer", "the file")?;
        if norm.get("type").and_then(|t| t.as_str()) != Some("BertNormalizer") {
            return Err(bad(format!(
                "normalizer {}: only BertNormalizer is supported",
                norm.get("type").unwrap_or(&serde_json::Value::Null)
            )));
        }
        let lowercase = flag(norm, "lowercase", true)?;
        let normalizer = BertNormalizer {
            clean_text: flag(norm, "clean_text", true)?,
            handle_chinese_chars: flag(norm, "handle_chinese_chars", true)?,
            strip_accents: flag(norm, "strip_accents", lowercase)?,
            lowercase,
        };
        let pre = field(&json, "pre_tokenizer", "the file")?;
        if pre.get("type").and_then(|t| t.as_str()) != Some("BertPreTokenizer") {
            return Err(bad(
                "pre_tokenizer: only BertPreTokenizer is supported".to_string()
            ));
        }
        if let Some(added) = json.get("added_tokens").and_then(|a| a.as_array()) {
            for t in added {
                if t.get("special").and_then(|s| s.as_bool()) != Some(true) {
                    return Err(bad(format!(
                        "added token {} is not special: matching added tokens in text is not supported",
                        t.get("content").unwrap_or(&serde_json::Value::Null)
                    )));
                }
            }
        }
        let (before, after) = post_processor(
            field(&json, "post_processor", "the file")?,
            &id_of,
            vocab_size,
        )?;
        let pad_id = json
            .get("padding")
            .and_then(|p| p.get("pad_id"))
            .and_then(|p| p.as_u64())
            .map_or(Ok(0), |p| {
                u32::try_from(p)
                    .ok()
                    .filter(|&p| (p as usize) < vocab_size)
                    .ok_or_else(|| bad(format!("padding pad_id {p} is outside the vocabulary")))
            })?;
        let max_length = json
            .get("truncation")
            .and_then(|t| t.get("max_length"))
            .and_then(|m| m.as_u64())
            .map(|m| m as usize);
        let mut wp = WordPiece {
            vocab,
            vocab_size,
            prefix,
            max_word_chars,
            unk_id,
            pad_id,
            normalizer,
            before,
            after,
            max_length: None,
        };
        if let Some(m) = max_length {
            wp.set_max_length(Some(m))?;
        }
        Ok(wp)
    }

    /// Sets the most tokens an encoding may have, special tokens included (`None`: no
    /// truncation).
    ///
    /// # Errors
    /// [`TokenizerError::Json`] when `max` cannot hold the special tokens and one more.
    pub fn set_max_length(&mut self, max: Option<usize>) -> Result<(), TokenizerError> {
        if let Some(m) = max {
            if m <= self.before.len() + self.after.len() {
                return Err(bad(format!(
                    "max length {m} leaves no room beside {} special tokens",
                    self.before.len() + self.after.len()
                )));
            }
        }
        self.max_length = max;
        Ok(())
    }

    /// The most tokens an encoding has, special tokens included.
    pub fn max_length(&self) -> Option<usize> {
        self.max_length
    }

    /// Entries in the vocabulary (ids are below it).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The padding id.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// The normalizer's switches.
    pub fn normalizer(&self) -> BertNormalizer {
        self.normalizer
    }

    /// The id of vocabulary entry `token`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.vocab.get(token).copied()
    }

    /// `text` normalized (step 1).
    pub fn normalize(&self, text: &str) -> String {
        let n = self.normalizer;
        let mut s = String::with_capacity(text.len());
        for c in text.chars() {
            if n.clean_text {
                if c == '\0' || c == '\u{fffd}' || is_control(c) {
                    continue;
                }
                if is_whitespace(c) {
                    s.push(' ');
                    continue;
                }
            }
            if n.handle_chinese_chars && is_chinese_char(c) {
                s.push(' ');
                s.push(c);
                s.push(' ');
            } else {
                s.push(c);
            }
        }
        if n.strip_accents {
            s = s
                .nfd()
                .filter(|&c| get_general_category(c) != Gc::NonspacingMark)
                .collect();
        }
        if n.lowercase {
            s = s.chars().flat_map(char::to_lowercase).collect();
        }
        s
    }

    /// The ids of `text`: the template's tokens around its WordPiece ids, truncated to
    /// [`WordPiece::max_length`]. Tokenizing stops once the sequence is full, so a long text
    /// costs its normalization and the tokens kept.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let normalized = self.normalize(text);
        let room = self
            .max_length
            .map(|m| m - self.before.len() - self.after.len());
        let mut ids = self.before.clone();
        let mut sequence = 0usize;
        'words: for word in pre_tokenize(&normalized) {
            let start = ids.len();
            self.word_ids(word, &mut ids);
            for _ in start..ids.len() {
                if room.is_some_and(|r| sequence == r) {
                    ids.truncate(self.before.len() + sequence);
                    break 'words;
                }
                sequence += 1;
            }
        }
        ids.extend_from_slice(&self.after);
        ids
    }

    /// Appends the WordPiece ids of one word.
    fn word_ids(&self, word: &str, out: &mut Vec<u32>) {
        if word.chars().count() > self.max_word_chars {
            out.push(self.unk_id);
            return;
        }
        let first = out.len();
        let mut start = 0;
        let mut piece = String::new();
        while start < word.len() {
            let mut end = word.len();
            let mut found = None;
            while start < end {
                piece.clear();
                if start > 0 {
                    piece.push_str(&self.prefix);
                }
                piece.push_str(&word[start..end]);
                if let Some(&id) = self.vocab.get(piece.as_str()) {
                    found = Some(id);
                    break;
                }
                // The previous character boundary.
                end = word[..end].char_indices().next_back().map_or(0, |(i, _)| i);
            }
            match found {
                Some(id) => {
                    out.push(id);
                    start = end;
                }
                None => {
                    out.truncate(first);
                    out.push(self.unk_id);
                    return;
                }
            }
        }
    }
}

/// The special ids before and after the sequence, from the post-processor.
fn post_processor(
    post: &serde_json::Value,
    id_of: &dyn Fn(&str, &str) -> Result<u32, TokenizerError>,
    vocab_size: usize,
) -> Result<(Vec<u32>, Vec<u32>), TokenizerError> {
    match post.get("type").and_then(|t| t.as_str()) {
        Some("BertProcessing") => {
            let id = |key: &str| -> Result<u32, TokenizerError> {
                let pair = post
                    .get(key)
                    .and_then(|p| p.as_array())
                    .filter(|p| p.len() == 2)
                    .ok_or_else(|| {
                        bad(format!("post_processor `{key}` is not a [token, id] pair"))
                    })?;
                let token = pair[0].as_str().unwrap_or("");
                let id = id_of(token, "post_processor token")?;
                if pair[1].as_u64() != Some(u64::from(id)) {
                    return Err(bad(format!(
                        "post_processor `{key}` id differs from the vocabulary's"
                    )));
                }
                Ok(id)
            };
            Ok((vec![id("cls")?], vec![id("sep")?]))
        }
        Some("TemplateProcessing") => {
            let single = post
                .get("single")
                .and_then(|s| s.as_array())
                .ok_or_else(|| bad("post_processor has no `single` template"))?;
            let specials = post.get("special_tokens");
            let (mut before, mut after, mut seen_sequence) = (Vec::new(), Vec::new(), false);
            for piece in single {
                if piece.get("Sequence").is_some() {
                    if seen_sequence {
                        return Err(bad("the single template has two sequences"));
                    }
                    seen_sequence = true;
                    continue;
                }
                let name = piece
                    .get("SpecialToken")
                    .and_then(|s| s.get("id"))
                    .and_then(|s| s.as_str())
                    .ok_or_else(|| {
                        bad(format!(
                            "template piece {piece} is neither a sequence nor a special token"
                        ))
                    })?;
                let ids = specials
                    .and_then(|s| s.get(name))
                    .and_then(|s| s.get("ids"))
                    .and_then(|s| s.as_array())
                    .ok_or_else(|| {
                        bad(format!("template token `{name}` is not in special_tokens"))
                    })?;
                for id in ids {
                    let id = id
                        .as_u64()
                        .and_then(|i| u32::try_from(i).ok())
                        .ok_or_else(|| bad(format!("special token `{name}` has a bad id")))?;
                    if id as usize >= vocab_size {
                        return Err(bad(format!(
                            "special token `{name}` has id {id}, outside the vocabulary"
                        )));
                    }
                    if seen_sequence {
                        after.push(id);
                    } else {
                        before.push(id);
                    }
                }
            }
            if !seen_sequence {
                return Err(bad("the single template has no sequence"));
            }
            Ok((before, after))
        }
        other => Err(bad(format!(
            "post_processor {}: TemplateProcessing or BertProcessing are supported",
            other.unwrap_or("(none)")
        ))),
    }
}

/// White space as the normalizer sees it: tab, newline, carriage return and Unicode white
/// space.
fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

/// Control characters the normalizer drops: Cc, Cf, Co and Cs, but tab, newline and carriage
/// return count as white space. Unassigned code points (Cn) stay: the `tokenizers` package
/// keeps them too.
fn is_control(c: char) -> bool {
    if matches!(c, '\t' | '\n' | '\r') {
        return false;
    }
    matches!(
        get_general_category(c),
        Gc::Control | Gc::Format | Gc::PrivateUse | Gc::Surrogate
    )
}

/// CJK ideographs (BERT's ranges: the Unified Ideographs and their extensions A-E, the
/// compatibility ideographs and their supplement).
fn is_chinese_char(c: char) -> bool {
    matches!(u32::from(c),
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// BERT's punctuation: ASCII punctuation and the Unicode punctuation categories.
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(
            get_general_category(c),
            Gc::ConnectorPunctuation
                | Gc::DashPunctuation
                | Gc::OpenPunctuation
                | Gc::ClosePunctuation
                | Gc::InitialPunctuation
                | Gc::FinalPunctuation
                | Gc::OtherPunctuation
        )
}

/// Words of normalized text (step 2): split on white space (dropped) and punctuation
/// (each character alone).
pub fn pre_tokenize(text: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() || is_punctuation(c) {
            if let Some(s) = start.take() {
                words.push(&text[s..i]);
            }
            if !c.is_whitespace() {
                words.push(&text[i..i + c.len_utf8()]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        words.push(&text[s..]);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> WordPiece {
        let vocab: Vec<&str> = vec![
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "hello", "world", ",",
            "!", "a", "##b", "cafe", "中", "[", "]", "sep",
        ];
        let entries: serde_json::Map<String, serde_json::Value> = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), serde_json::json!(i)))
            .collect();
        let json = serde_json::json!({
            "added_tokens": [{"id": 0, "content": "[PAD]", "special": true}],
            "normalizer": {"type": "BertNormalizer", "clean_text": true,
                "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                                   "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
            "model": {"type": "WordPiece", "unk_token": "[UNK]",
                "continuing_subword_prefix": "##", "max_input_chars_per_word": 10,
                "vocab": entries},
        });
        WordPiece::from_json(&json.to_string()).unwrap()
    }

    #[test]
    fn words_split_into_pieces_with_unknowns() {
        let wp = toy();
        assert_eq!(wp.encode("unaffable"), vec![2, 4, 5, 6, 3]);
        assert_eq!(wp.encode("Hello, WORLD!"), vec![2, 7, 9, 8, 10, 3]);
        // A piece missing: the whole word is [UNK]; too long a word too.
        assert_eq!(wp.encode("unx hello"), vec![2, 1, 7, 3]);
        // At most 10 characters a word (the toy's max_input_chars_per_word).
        assert_eq!(wp.encode(&format!("a{}", "b".repeat(10))), vec![2, 1, 3]);
        let mut ten = vec![2, 11];
        ten.extend([12; 9]);
        ten.push(3);
        assert_eq!(wp.encode(&format!("a{}", "b".repeat(9))), ten);
        // Accents stripped, CJK split off, controls dropped.
        assert_eq!(wp.encode("Café中a\u{0}b"), vec![2, 13, 14, 11, 12, 3]);
        // A control token typed as text is text.
        assert_eq!(wp.encode("[SEP]"), vec![2, 15, 17, 16, 3]);
        assert_eq!(wp.encode(""), vec![2, 3]);
    }

    #[test]
    fn truncation_keeps_the_special_tokens() {
        let mut wp = toy();
        wp.set_max_length(Some(4)).unwrap();
        assert_eq!(wp.encode("hello world hello"), vec![2, 7, 8, 3]);
        assert_eq!(wp.encode("unaffable"), vec![2, 4, 5, 3]);
        assert!(wp.set_max_length(Some(2)).is_err());
    }

    #[test]
    fn unsupported_files_are_named() {
        for (json, what) in [
            ("{}", "model"),
            (r#"{"model":{"type":"BPE"}}"#, "WordPiece"),
            (r#"{"model":{"type":"WordPiece","vocab":{"a":5}}}"#, "id 5"),
            ("[", "EOF"),
        ] {
            let e = WordPiece::from_json(json).unwrap_err().to_string();
            assert!(e.contains(what), "{json}: {e}");
        }
    }
}
