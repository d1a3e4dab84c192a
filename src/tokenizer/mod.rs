//! The tokenizer of a GGUF model, read from the file's metadata: GPT-2 style byte-level BPE
//! (`tokenizer.ggml.model` = `gpt2`) or SentencePiece BPE (`llama`, see [`SpmParts`]), with
//! special tokens, streaming decode and the chat template.
//!
//! [`Tokenizer::from_gguf`] reads `tokenizer.ggml.tokens`, `token_type`, `merges`, `pre`
//! (SentencePiece: `scores`, `add_space_prefix`, the unknown id), the BOS/EOS ids and
//! `tokenizer.chat_template`. Encoding:
//!
//! 1. With [`Special::Allow`], control tokens (`<|im_start|>`, type 3) are matched in the
//!    text as whole tokens, leftmost-longest; user-defined tokens (type 4) always are. With
//!    [`Special::Plain`] a control token's text is encoded like any other text. A chat is
//!    rendered with [`Tokenizer::render_chat`] and encoded with [`Tokenizer::encode_chat`]:
//!    control tokens only where the template wrote them, message text always plain, so a
//!    user who types `<|im_end|>` cannot open a turn.
//! 2. Byte-level BPE: the [`PreTokenizer`] cuts the rest into words (SmolLM2: digits alone,
//!    then GPT-2's split); each word's UTF-8 bytes become one-byte tokens that BPE merges,
//!    lowest rank first.
//! 3. SentencePiece: spaces become `▁` and the characters merge by token score across the
//!    whole run, with byte fallback (`<0xXX>` tokens) for characters that are no token.
//!
//! No BOS is added by [`Tokenizer::encode`]; the start of a sequence goes through
//! [`Tokenizer::with_bos`], which adds it where `tokenizer.ggml.add_bos_token` asks (Gemma:
//! yes; SmolLM2: no). Decoding maps byte-level characters (or `▁` and byte tokens) back to
//! bytes and shows invalid UTF-8 as U+FFFD; [`StreamDecoder`] does the same one token at a
//! time.
//!
//! Byte-level BPE equals the Python `tokenizers` package's for the same vocabulary, merges
//! and pre-tokenizer, SentencePiece the `sentencepiece` package's for the same pieces
//! (tests compare them on over a thousand strings each).
//!
//! ```
//! use dynrt::tokenizer::{PreTokenizer, Special, Tokenizer, TokenizerParts};
//! // A toy vocabulary: the 256 byte tokens, then "ab" and one control token.
//! let bytes = dynrt::tokenizer::byte_level_tokens();
//! let mut tokens = bytes.clone();
//! tokens.push("ab".into());
//! tokens.push("<|end|>".into());
//! let mut token_types = vec![1; 257];
//! token_types.push(3);
//! let tok = Tokenizer::from_parts(TokenizerParts {
//!     tokens,
//!     token_types: Some(token_types),
//!     merges: vec!["a b".into()],
//!     pre: PreTokenizer::Gpt2,
//!     bos_id: None,
//!     eos_id: Some(257),
//!     add_bos: false,
//!     chat_template: None,
//! })?;
//! let ids = tok.encode("abc<|end|>", Special::Allow);
//! assert_eq!(ids, vec![256, u32::from(b'c'), 257]);
//! assert_eq!(tok.decode(&ids)?, "abc<|end|>");
//! # Ok::<(), dynrt::tokenizer::TokenizerError>(())
//! ```

mod bpe;
mod chat;
mod error;
mod pretokenize;
mod spm;
mod stream;
pub mod wordpiece;

pub use chat::{ChatMessage, ChatTemplate, ChatToolCall, RenderedChat, TEMPLATE_FUEL};
pub use error::TokenizerError;
pub use pretokenize::PreTokenizer;
pub use spm::SpmParts;
pub use stream::StreamDecoder;
pub use wordpiece::WordPiece;

use crate::gguf::Gguf;
use aho_corasick::{AhoCorasick, MatchKind};
use bpe::Merge;
use std::collections::HashMap;

/// Whether control tokens written in the text are matched as the tokens they name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// `<|im_start|>` in the text is token 1: for rendered chat templates.
    Allow,
    /// `<|im_start|>` in the text is encoded as the characters it is: for user text that
    /// must not inject control tokens.
    Plain,
}

/// What a token is, from `tokenizer.ggml.token_type` (llama.cpp's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenKind {
    /// 1: ordinary byte-level text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<|im_start|>`), matched only with [`Special::Allow`].
    Control,
    /// 4: an added token always matched in text.
    UserDefined,
    /// 5: an unused slot.
    Unused,
    /// 6: a raw byte (SentencePiece vocabularies).
    Byte,
}

impl TokenKind {
    fn from_gguf(value: i32) -> Option<TokenKind> {
        Some(match value {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => return None,
        })
    }
}

/// The pieces a [`Tokenizer`] is built from (what a GGUF's metadata holds).
#[derive(Debug, Clone)]
pub struct TokenizerParts {
    /// Token texts by id: byte-level characters for normal tokens, plain text for control
    /// and user-defined ones.
    pub tokens: Vec<String>,
    /// [`TokenKind`] numbers by id (llama.cpp's 1..=6); `None` means all normal.
    pub token_types: Option<Vec<i32>>,
    /// Merge rules `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// How text is cut into words.
    pub pre: PreTokenizer,
    /// Beginning-of-sequence id, if any.
    pub bos_id: Option<u32>,
    /// End-of-sequence id, if any (SmolLM2: `<|im_end|>`).
    pub eos_id: Option<u32>,
    /// Whether the model expects BOS before a prompt (the tokenizer never adds it itself).
    pub add_bos: bool,
    /// The chat template, if any.
    pub chat_template: Option<ChatTemplate>,
}

/// How plain text (between special tokens) becomes ids.
#[derive(Debug, Clone)]
enum Model {
    /// GGUF `gpt2`: words of the pre-tokenizer, merged by rank from their bytes.
    Bpe {
        merges: HashMap<(u32, u32), Merge>,
        pre: PreTokenizer,
    },
    /// GGUF `llama`: SentencePiece BPE by score from characters.
    Spm(spm::Spm),
}

/// The kind of tokenizer a GGUF's `tokenizer.ggml.model` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenizerModel {
    /// `gpt2`: byte-level BPE with merge rules and a pre-tokenizer (SmolLM2, Qwen2.5, Llama 3).
    BytePairs,
    /// `llama`: SentencePiece BPE by token score with byte fallback (Gemma, Llama 2).
    SentencePiece,
}

/// A tokenizer: byte-level BPE or SentencePiece. Immutable once built; share it by
/// reference.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    /// The bytes each id decodes to.
    token_bytes: Vec<Vec<u8>>,
    kinds: Vec<TokenKind>,
    text_to_id: HashMap<String, u32>,
    /// The token of each byte (byte-level BPE: its one-byte token; SentencePiece: its
    /// `<0xXX>` token); `None` for bytes the vocabulary lacks.
    byte_ids: [Option<u32>; 256],
    model: Model,
    /// Control and user-defined tokens, for [`Special::Allow`].
    all_special: Option<(AhoCorasick, Vec<u32>)>,
    /// User-defined tokens only, for [`Special::Plain`].
    user_defined: Option<(AhoCorasick, Vec<u32>)>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    add_bos: bool,
    chat_template: Option<ChatTemplate>,
}

/// The 256 one-byte token texts in byte order (`"Ā"` for byte 0, `"!"` for `!`, `"Ġ"` for
/// space): the start of every byte-level vocabulary, handy for building test tokenizers.
pub fn byte_level_tokens() -> Vec<String> {
    bpe::byte_to_char_table()
        .iter()
        .map(|c| c.to_string())
        .collect()
}

fn matcher(texts: Vec<(&str, u32)>) -> Option<(AhoCorasick, Vec<u32>)> {
    let (patterns, ids): (Vec<&str>, Vec<u32>) =
        texts.into_iter().filter(|(t, _)| !t.is_empty()).unzip();
    if patterns.is_empty() {
        return None;
    }
    // Building fails only past aho-corasick's size limits, far beyond any vocabulary's
    // special tokens; without a matcher the texts are then encoded as plain text.
    AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(&patterns)
        .ok()
        .map(|ac| (ac, ids))
}

/// The kinds of `tokens` from their GGUF type numbers (all normal without them).
fn token_kinds(tokens: &[String], types: Option<&[i32]>) -> Result<Vec<TokenKind>, TokenizerError> {
    let n = tokens.len();
    if n == 0 || n > u32::MAX as usize {
        return Err(TokenizerError::BadVocabularySize { count: n });
    }
    let Some(types) = types else {
        return Ok(vec![TokenKind::Normal; n]);
    };
    if types.len() != n {
        return Err(TokenizerError::LengthMismatch {
            what: "tokenizer.ggml.token_type",
            expected: n,
            actual: types.len(),
        });
    }
    types
        .iter()
        .enumerate()
        .map(|(id, &value)| {
            TokenKind::from_gguf(value).ok_or(TokenizerError::UnknownTokenType {
                id: id as u32,
                value,
            })
        })
        .collect()
}

/// Checks that each special id (metadata key, id) is inside a vocabulary of `n` tokens.
fn check_ids(n: usize, ids: &[(&'static str, Option<u32>)]) -> Result<(), TokenizerError> {
    for &(key, id) in ids {
        if let Some(id) = id.filter(|&id| id as usize >= n) {
            return Err(TokenizerError::SpecialIdOutOfRange {
                key,
                id: id.into(),
                vocab_size: n,
            });
        }
    }
    Ok(())
}

/// The matchers of control and user-defined tokens (for [`Special::Allow`]) and of
/// user-defined tokens alone (for [`Special::Plain`]).
type Matchers = (
    Option<(AhoCorasick, Vec<u32>)>,
    Option<(AhoCorasick, Vec<u32>)>,
);

fn special_matchers(tokens: &[String], kinds: &[TokenKind]) -> Matchers {
    let specials = |include_control: bool| {
        let texts = tokens
            .iter()
            .zip(kinds)
            .enumerate()
            .filter(|(_, (_, k))| {
                **k == TokenKind::UserDefined || (include_control && **k == TokenKind::Control)
            })
            .map(|(id, (t, _))| (t.as_str(), id as u32))
            .collect();
        matcher(texts)
    };
    (specials(true), specials(false))
}

impl Tokenizer {
    /// Reads the tokenizer of a GGUF model: byte-level BPE (`tokenizer.ggml.model` =
    /// `gpt2`, see [`Tokenizer::from_parts`]) or SentencePiece (`llama`, see
    /// [`Tokenizer::from_spm_parts`]).
    ///
    /// # Errors
    /// [`TokenizerError::Gguf`] for missing or mistyped keys, and the errors of
    /// [`Tokenizer::from_parts`] and [`Tokenizer::from_spm_parts`];
    /// [`TokenizerError::UnsupportedModel`] and [`TokenizerError::UnsupportedPreTokenizer`]
    /// for other tokenizer kinds.
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" && model != "llama" {
            return Err(TokenizerError::UnsupportedModel {
                model: model.to_owned(),
            });
        }
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?.to_vec();
        let token_types = match gguf.get("tokenizer.ggml.token_type") {
            Some(_) => Some(gguf.get_i32_array("tokenizer.ggml.token_type")?.to_vec()),
            None => None,
        };
        let id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            match gguf.opt_u32(key)? {
                Some(id) if id as usize >= tokens.len() => {
                    Err(TokenizerError::SpecialIdOutOfRange {
                        key,
                        id: id.into(),
                        vocab_size: tokens.len(),
                    })
                }
                other => Ok(other),
            }
        };
        let bos_id = id("tokenizer.ggml.bos_token_id")?;
        let eos_id = id("tokenizer.ggml.eos_token_id")?;
        // llama.cpp's defaults: SentencePiece vocabularies add BOS unless told otherwise.
        let add_bos = gguf
            .opt_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(model == "llama");
        let text_of = |id: Option<u32>| id.map(|i| tokens[i as usize].clone()).unwrap_or_default();
        let chat_template = match gguf.opt_str("tokenizer.chat_template")? {
            Some(src) => Some(ChatTemplate::new(src, text_of(bos_id), text_of(eos_id))?),
            None => None,
        };
        if model == "llama" {
            let scores = match gguf.get("tokenizer.ggml.scores") {
                Some(_) => Some(gguf.get_f32_array("tokenizer.ggml.scores")?.to_vec()),
                None => None,
            };
            return Tokenizer::from_spm_parts(SpmParts {
                unk_id: id("tokenizer.ggml.unknown_token_id")?,
                tokens,
                scores,
                token_types,
                bos_id,
                eos_id,
                add_bos,
                add_space_prefix: gguf
                    .opt_bool("tokenizer.ggml.add_space_prefix")?
                    .unwrap_or(true),
                chat_template,
            });
        }
        let pre_name = gguf.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
        let pre = PreTokenizer::from_gguf_name(pre_name).ok_or_else(|| {
            TokenizerError::UnsupportedPreTokenizer {
                name: pre_name.to_owned(),
            }
        })?;
        let merges = gguf.get_str_array("tokenizer.ggml.merges")?.to_vec();
        Tokenizer::from_parts(TokenizerParts {
            tokens,
            token_types,
            merges,
            pre,
            bos_id,
            eos_id,
            add_bos,
            chat_template,
        })
    }

    /// Builds a byte-level BPE tokenizer from its pieces and checks them: token types
    /// known, normal tokens byte-level text, merges of two known tokens into a known token,
    /// BOS/EOS inside the vocabulary. A token text that appears twice maps to its first id; a
    /// merge rule that appears twice keeps its first rank (as llama.cpp). Bytes without a
    /// one-byte token are dropped when encoding ([`missing_bytes`](Self::missing_bytes)).
    ///
    /// # Errors
    /// [`TokenizerError::BadVocabularySize`], [`TokenizerError::LengthMismatch`],
    /// [`TokenizerError::UnknownTokenType`], [`TokenizerError::NotByteLevel`],
    /// [`TokenizerError::BadMerge`],
    /// [`TokenizerError::SpecialIdOutOfRange`].
    pub fn from_parts(parts: TokenizerParts) -> Result<Tokenizer, TokenizerError> {
        let kinds = token_kinds(&parts.tokens, parts.token_types.as_deref())?;
        check_ids(
            parts.tokens.len(),
            &[
                ("tokenizer.ggml.bos_token_id", parts.bos_id),
                ("tokenizer.ggml.eos_token_id", parts.eos_id),
            ],
        )?;
        let n = parts.tokens.len();

        let char_to_byte = bpe::char_to_byte_map();
        let mut token_bytes = Vec::with_capacity(n);
        let mut text_to_id = HashMap::with_capacity(n);
        for (id, (text, kind)) in parts.tokens.iter().zip(&kinds).enumerate() {
            let bytes = if *kind == TokenKind::Normal {
                text.chars()
                    .map(|ch| {
                        char_to_byte
                            .get(&ch)
                            .copied()
                            .ok_or_else(|| TokenizerError::NotByteLevel {
                                id: id as u32,
                                token: text.clone(),
                                ch,
                            })
                    })
                    .collect::<Result<Vec<u8>, _>>()?
            } else {
                text.as_bytes().to_vec()
            };
            token_bytes.push(bytes);
            text_to_id.entry(text.clone()).or_insert(id as u32);
        }

        let table = bpe::byte_to_char_table();
        let mut byte_ids = [None; 256];
        for (slot, symbol) in byte_ids.iter_mut().zip(table) {
            *slot = text_to_id
                .get(symbol.encode_utf8(&mut [0; 4]) as &str)
                .copied()
                .filter(|&id| kinds[id as usize] == TokenKind::Normal);
        }

        let mut merges = HashMap::with_capacity(parts.merges.len());
        for (index, rule) in parts.merges.iter().enumerate() {
            let bad = |reason| TokenizerError::BadMerge {
                index,
                merge: rule.clone(),
                reason,
            };
            let mut halves = rule.split(' ');
            let (Some(left), Some(right), None) = (halves.next(), halves.next(), halves.next())
            else {
                return Err(bad("expected two tokens separated by one space"));
            };
            let known = |t: &str| text_to_id.get(t).copied();
            let (Some(l), Some(r)) = (known(left), known(right)) else {
                return Err(bad("a half is not in the vocabulary"));
            };
            let Some(id) = known(&format!("{left}{right}")) else {
                return Err(bad("the merged token is not in the vocabulary"));
            };
            let rank = u32::try_from(index).map_err(|_| bad("more than 2^32 merges"))?;
            merges.entry((l, r)).or_insert(Merge { rank, id });
        }

        let (all_special, user_defined) = special_matchers(&parts.tokens, &kinds);
        Ok(Tokenizer {
            token_bytes,
            kinds,
            text_to_id,
            byte_ids,
            model: Model::Bpe {
                merges,
                pre: parts.pre,
            },
            all_special,
            user_defined,
            bos_id: parts.bos_id,
            eos_id: parts.eos_id,
            add_bos: parts.add_bos,
            chat_template: parts.chat_template,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The end-of-sequence id (generation stops there), if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Whether the model expects a BOS token before a prompt
    /// (`tokenizer.ggml.add_bos_token`). [`encode`](Self::encode) never adds it; the start
    /// of a sequence goes through [`with_bos`](Self::with_bos).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// `ids` as the start of a sequence: with [`bos_id`](Self::bos_id) in front when the
    /// model expects it ([`add_bos`](Self::add_bos)) and `ids` do not begin with it already
    /// (a chat template that writes `<bos>` itself).
    pub fn with_bos(&self, mut ids: Vec<u32>) -> Vec<u32> {
        if let Some(bos) = self.bos_id.filter(|_| self.add_bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        ids
    }

    /// The pre-tokenizer of a byte-level BPE tokenizer; `None` for SentencePiece, which
    /// merges across the whole text.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        match &self.model {
            Model::Bpe { pre, .. } => Some(*pre),
            Model::Spm(_) => None,
        }
    }

    /// Which kind of tokenizer this is.
    pub fn model(&self) -> TokenizerModel {
        match &self.model {
            Model::Bpe { .. } => TokenizerModel::BytePairs,
            Model::Spm(_) => TokenizerModel::SentencePiece,
        }
    }

    /// The kind of token `id`, or `None` outside the vocabulary.
    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// True for a control token (`<|im_start|>`, `<|endoftext|>`).
    pub fn is_control(&self, id: u32) -> bool {
        self.kind(id) == Some(TokenKind::Control)
    }

    /// The id of the token whose stored text is `text` (byte-level characters for normal
    /// tokens: `"Ġthe"`), if any.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.text_to_id.get(text).copied()
    }

    /// The bytes token `id` decodes to.
    ///
    /// # Errors
    /// [`TokenizerError::UnknownId`].
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        self.token_bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            })
    }

    /// The bytes that have no byte token. Byte-level BPE drops them when encoding (the
    /// Python `tokenizers` package and llama.cpp drop them too); SentencePiece encodes a
    /// character that is no token and has such a byte as the unknown token. SmolLM2 lacks 21:
    /// six control characters (`0x04 0x06 0x13 0x14 0x16 0x1d`), the UTF-8 lead bytes
    /// `0xf1 0xf2` (characters U+40000 to U+BFFFF) and bytes that never occur in UTF-8.
    pub fn missing_bytes(&self) -> Vec<u8> {
        (0..=255u8)
            .filter(|&b| self.byte_ids[b as usize].is_none())
            .collect()
    }

    /// The chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Renders `messages` with the model's chat template (see [`ChatTemplate::render`]):
    /// the text alone. To encode a chat use [`Tokenizer::render_chat`] and
    /// [`Tokenizer::encode_chat`]: encoding this text with [`Special::Allow`] would let a
    /// message that spells `<|im_end|>` open a turn of its own.
    ///
    /// # Errors
    /// [`TokenizerError::NoChatTemplate`], [`TokenizerError::Template`].
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.chat_template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?
            .render(messages, add_generation_prompt)
    }

    /// Renders `messages` with the model's chat template and says where each message's
    /// text landed (see [`ChatTemplate::render_spans`]).
    ///
    /// # Errors
    /// [`TokenizerError::NoChatTemplate`], [`TokenizerError::Template`].
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<RenderedChat, TokenizerError> {
        self.chat_template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?
            .render_spans(messages, add_generation_prompt)
    }

    /// [`Tokenizer::render_chat`] with `tools` (OpenAI's tool definitions) for templates
    /// that offer tools ([`ChatTemplate::render_spans_with_tools`]). Tool definitions and
    /// the messages' tool calls are rendered as the template's own text, so one that spells
    /// a control token of the model is refused (message contents stay plain text as always).
    ///
    /// # Errors
    /// As [`Tokenizer::render_chat`]; [`TokenizerError::Template`] naming the control token
    /// a tool definition or call spells.
    pub fn render_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[crate::structured::Json],
        add_generation_prompt: bool,
    ) -> Result<RenderedChat, TokenizerError> {
        let template = self
            .chat_template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        let mut texts = Vec::new();
        for t in tools {
            t.strings(&mut texts);
        }
        texts.extend(messages.iter().flat_map(ChatMessage::other_texts));
        if let Some((ac, ids)) = &self.all_special {
            for text in texts {
                let control = ac
                    .find_iter(text)
                    .map(|m| ids[m.pattern().as_usize()])
                    .find(|&id| self.is_control(id));
                if let Some(id) = control {
                    let name = String::from_utf8_lossy(self.token_bytes(id)?).into_owned();
                    return Err(TokenizerError::Template {
                        reason: format!(
                            "a tool definition or tool call spells the control token `{name}`, \
                             which only the template may write"
                        ),
                    });
                }
            }
        }
        template.render_spans_with_tools(messages, tools, add_generation_prompt)
    }

    /// Encodes `chat.text[from..]`: control tokens are matched only in the template's own
    /// text, never in a message's (there a control token's text is plain text, as with
    /// [`Special::Plain`]); the plain text between control tokens is encoded as one run,
    /// whichever side wrote it, so a chat whose messages spell no control token encodes
    /// exactly as `encode(&chat.text[from..], Special::Allow)` does. `from` must be a
    /// character boundary of the text (the end of what an earlier turn encoded).
    pub fn encode_chat(&self, chat: &RenderedChat, from: usize) -> Vec<u32> {
        let text = &chat.text;
        let from = from.min(text.len());
        // Regions from `from` on: (start, end, is message text).
        let mut regions = Vec::new();
        let mut at = from;
        for span in &chat.content {
            let (s, e) = (span.start.max(from), span.end.max(from));
            if s > at {
                regions.push((at, s, false));
            }
            if e > s {
                regions.push((s, e, true));
            }
            at = at.max(e);
        }
        if text.len() > at {
            regions.push((at, text.len(), false));
        }
        let mut out = Vec::with_capacity((text.len() - from) / 3 + 1);
        let mut words = Vec::new();
        let mut start = from;
        for (s, e, message) in regions {
            let matcher = if message {
                &self.user_defined
            } else {
                &self.all_special
            };
            let Some((ac, ids)) = matcher else {
                continue;
            };
            for m in ac.find_iter(&text[s..e]) {
                self.encode_plain(&text[start..s + m.start()], &mut words, &mut out);
                out.push(ids[m.pattern().as_usize()]);
                start = s + m.end();
            }
        }
        self.encode_plain(&text[start..], &mut words, &mut out);
        out
    }

    /// Encodes `text` into token ids. Never fails; bytes in
    /// [`missing_bytes`](Self::missing_bytes) are dropped.
    pub fn encode(&self, text: &str, special: Special) -> Vec<u32> {
        let matcher = match special {
            Special::Allow => &self.all_special,
            Special::Plain => &self.user_defined,
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut words = Vec::new();
        let mut start = 0;
        if let Some((ac, ids)) = matcher {
            for m in ac.find_iter(text) {
                self.encode_plain(&text[start..m.start()], &mut words, &mut out);
                out.push(ids[m.pattern().as_usize()]);
                start = m.end();
            }
        }
        self.encode_plain(&text[start..], &mut words, &mut out);
        out
    }

    fn encode_plain<'t>(&self, text: &'t str, words: &mut Vec<&'t str>, out: &mut Vec<u32>) {
        match &self.model {
            Model::Bpe { merges, pre } => {
                words.clear();
                pre.split(text, words);
                for word in words.iter() {
                    bpe::merge_word(word.as_bytes(), &self.byte_ids, merges, out);
                }
            }
            Model::Spm(spm) => spm.encode(self, text, out),
        }
    }

    /// The bytes `ids` decode to, special tokens as their text. A SentencePiece tokenizer
    /// that adds a space before text ([`SpmParts::add_space_prefix`]) drops one leading space
    /// of the first token that is not a control token, as llama.cpp's detokenizer does (a
    /// [`StreamDecoder`] keeps it: it decodes continuations).
    ///
    /// # Errors
    /// [`TokenizerError::UnknownId`] for an id outside the vocabulary.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::new();
        let mut strip = matches!(&self.model, Model::Spm(s) if s.add_space_prefix());
        for &id in ids {
            let mut bytes = self.token_bytes(id)?;
            if strip && !self.is_control(id) {
                strip = false;
                bytes = bytes.strip_prefix(b" ").unwrap_or(bytes);
            }
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }

    /// The text `ids` decode to, special tokens as their text, invalid UTF-8 as U+FFFD.
    ///
    /// # Errors
    /// [`TokenizerError::UnknownId`] for an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }

    /// A decoder that turns ids into text one at a time (see [`StreamDecoder`]).
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }
}

#[cfg(test)]
mod tests;
