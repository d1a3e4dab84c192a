//! SentencePiece BPE (GGUF `tokenizer.ggml.model` = `llama`), as llama.cpp's SPM tokenizer
//! runs it: spaces become U+2581 `▁`, the text starts as its characters, and the adjacent
//! pair whose concatenation is a token with the highest score merges first (ties: the
//! leftmost), until no pair is a token. A character that is no token becomes its bytes'
//! `<0xXX>` tokens (byte fallback), or the unknown token without them.
//!
//! Merges form normal, user-defined and unused tokens only, never control, byte or unknown
//! ones (SentencePiece's rule; llama.cpp would accept any token text, but in Gemma's
//! vocabulary no control or byte token can be formed by merges, so both give the same ids,
//! and here user text can never become a control token by merging). User-defined tokens are
//! cut out of the text before, as whole tokens (see [`Tokenizer::encode`]).

use super::{
    check_ids, special_matchers, token_kinds, ChatTemplate, Model, TokenKind, Tokenizer,
    TokenizerError,
};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// SentencePiece's escaped space, U+2581 `▁`.
pub const SPACE: char = '\u{2581}';

/// The pieces a SentencePiece [`Tokenizer`] is built from (what a GGUF's metadata holds).
#[derive(Debug, Clone)]
pub struct SpmParts {
    /// Token texts by id: `▁` for a space in normal tokens, `<0xXX>` for byte tokens,
    /// plain text for control and user-defined ones.
    pub tokens: Vec<String>,
    /// Scores by id (`tokenizer.ggml.scores`): of two candidate merges the higher score
    /// merges first. `None` means all 0 (merges then go leftmost first).
    pub scores: Option<Vec<f32>>,
    /// [`TokenKind`] numbers by id (llama.cpp's 1..=6); `None` means all normal.
    pub token_types: Option<Vec<i32>>,
    /// Beginning-of-sequence id, if any (Gemma: `<bos>`, 2).
    pub bos_id: Option<u32>,
    /// End-of-sequence id, if any (Gemma: `<eos>`, 1).
    pub eos_id: Option<u32>,
    /// The unknown token (`tokenizer.ggml.unknown_token_id`); without it the token of type
    /// unknown, if any. Characters that are no token and have no byte tokens encode as it.
    pub unk_id: Option<u32>,
    /// Whether the model expects BOS before a prompt (`tokenizer.ggml.add_bos_token`; the
    /// tokenizer never adds it itself, see [`Tokenizer::with_bos`]).
    pub add_bos: bool,
    /// Whether each run of plain text gets a space in front
    /// (`tokenizer.ggml.add_space_prefix`; llama.cpp's default is true, Gemma's file says
    /// false).
    pub add_space_prefix: bool,
    /// The chat template, if any.
    pub chat_template: Option<ChatTemplate>,
}

/// The SentencePiece half of a [`Tokenizer`].
#[derive(Debug, Clone)]
pub struct Spm {
    scores: Vec<f32>,
    unk_id: Option<u32>,
    add_space_prefix: bool,
}

/// The byte of a byte token's text `<0xXX>`.
fn byte_of(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Whether merges may form a token of this kind (SentencePiece's "pieces").
fn mergeable(kind: TokenKind) -> bool {
    matches!(
        kind,
        TokenKind::Normal | TokenKind::UserDefined | TokenKind::Unused
    )
}

impl Tokenizer {
    /// Builds a SentencePiece tokenizer from its pieces and checks them: token types and
    /// scores as many as tokens, byte tokens spelled `<0xXX>`, special ids inside the
    /// vocabulary. A token text that appears twice maps to its first id, and so does a
    /// byte. Decoding turns `▁` in normal tokens into spaces and byte tokens into their
    /// byte.
    ///
    /// # Errors
    /// [`TokenizerError::BadVocabularySize`], [`TokenizerError::LengthMismatch`],
    /// [`TokenizerError::UnknownTokenType`], [`TokenizerError::BadByteToken`],
    /// [`TokenizerError::SpecialIdOutOfRange`].
    pub fn from_spm_parts(parts: SpmParts) -> Result<Tokenizer, TokenizerError> {
        let kinds = token_kinds(&parts.tokens, parts.token_types.as_deref())?;
        let n = parts.tokens.len();
        check_ids(
            n,
            &[
                ("tokenizer.ggml.bos_token_id", parts.bos_id),
                ("tokenizer.ggml.eos_token_id", parts.eos_id),
                ("tokenizer.ggml.unknown_token_id", parts.unk_id),
            ],
        )?;
        let scores = match parts.scores {
            None => vec![0.0; n],
            Some(s) if s.len() != n => {
                return Err(TokenizerError::LengthMismatch {
                    what: "tokenizer.ggml.scores",
                    expected: n,
                    actual: s.len(),
                })
            }
            Some(s) => s,
        };
        let mut token_bytes = Vec::with_capacity(n);
        let mut text_to_id = HashMap::with_capacity(n);
        let mut byte_ids = [None; 256];
        for (id, (text, kind)) in parts.tokens.iter().zip(&kinds).enumerate() {
            let bytes = match kind {
                TokenKind::Normal if text.contains(SPACE) => text.replace(SPACE, " ").into_bytes(),
                TokenKind::Byte => {
                    let b = byte_of(text).ok_or_else(|| TokenizerError::BadByteToken {
                        id: id as u32,
                        token: text.clone(),
                    })?;
                    byte_ids[usize::from(b)].get_or_insert(id as u32);
                    vec![b]
                }
                _ => text.as_bytes().to_vec(),
            };
            token_bytes.push(bytes);
            text_to_id.entry(text.clone()).or_insert(id as u32);
        }
        let unk_id = parts.unk_id.or_else(|| {
            kinds
                .iter()
                .position(|&k| k == TokenKind::Unknown)
                .map(|id| id as u32)
        });
        let (all_special, user_defined) = special_matchers(&parts.tokens, &kinds);
        Ok(Tokenizer {
            token_bytes,
            kinds,
            text_to_id,
            byte_ids,
            model: Model::Spm(Spm {
                scores,
                unk_id,
                add_space_prefix: parts.add_space_prefix,
            }),
            all_special,
            user_defined,
            bos_id: parts.bos_id,
            eos_id: parts.eos_id,
            add_bos: parts.add_bos,
            chat_template: parts.chat_template,
        })
    }
}

/// A candidate merge of the symbol `left` with the one after it, `len` bytes together when
/// queued. Twelve bytes: the queue of a long text stays small enough to be fast.
struct Candidate {
    score: f32,
    left: u32,
    len: u32,
}

impl Ord for Candidate {
    // BinaryHeap is a max-heap: the highest score, then the leftmost, pops first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

/// One symbol: bytes `start..start + len` of the escaped text, linked to its neighbours;
/// `len == 0` once merged into the symbol before it.
#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

/// The longest text merged as one: a longer run (over a gigabyte) is merged in pieces of at
/// most this many bytes, cut at characters, so that positions fit in 32 bits.
const MAX_PIECE: usize = 1 << 30;

impl Spm {
    /// Whether plain text gets a space in front.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Encodes a run of plain text (no user-defined or matched control tokens in it) and
    /// appends the ids to `out`. `O(n log n)` in the text's length.
    pub fn encode(&self, tok: &Tokenizer, text: &str, out: &mut Vec<u32>) {
        self.encode_in_pieces(tok, text, MAX_PIECE, out);
    }

    /// [`encode`](Self::encode), merging at most `max_piece` bytes (at least 4) as one.
    fn encode_in_pieces(&self, tok: &Tokenizer, text: &str, max_piece: usize, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut esc = String::with_capacity(text.len() + 3 * (1 + text.len() / 4));
        if self.add_space_prefix {
            esc.push(SPACE);
        }
        esc.extend(text.chars().map(|c| if c == ' ' { SPACE } else { c }));
        let mut rest = esc.as_str();
        while !rest.is_empty() {
            let mut cut = rest.len().min(max_piece.max(4));
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            self.merge(tok, &rest[..cut], out);
            rest = &rest[cut..];
        }
    }

    /// Merges escaped text of at most [`MAX_PIECE`] bytes and appends the ids to `out`.
    fn merge(&self, tok: &Tokenizer, esc: &str, out: &mut Vec<u32>) {
        let piece = |s: &str| {
            tok.text_to_id
                .get(s)
                .copied()
                .filter(|&id| mergeable(tok.kinds[id as usize]))
        };
        // Positions are below MAX_PIECE < u32::MAX.
        let mut symbols: Vec<Symbol> = esc
            .char_indices()
            .map(|(start, c)| Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: NONE,
                next: NONE,
            })
            .collect();
        let n = symbols.len() as u32;
        for (i, s) in (0..n).zip(symbols.iter_mut()) {
            s.prev = if i == 0 { NONE } else { i - 1 };
            s.next = if i + 1 == n { NONE } else { i + 1 };
        }
        let candidate = |symbols: &[Symbol], left: u32| -> Option<Candidate> {
            let l = symbols.get(left as usize)?;
            let r = symbols.get(l.next as usize)?;
            let len = l.len + r.len;
            let start = l.start as usize;
            piece(&esc[start..start + len as usize]).map(|id| Candidate {
                score: self.scores[id as usize],
                left,
                len,
            })
        };
        let initial: Vec<Candidate> = (0..n).filter_map(|i| candidate(&symbols, i)).collect();
        let mut queue = BinaryHeap::from(initial);
        while let Some(top) = queue.pop() {
            let l = symbols[top.left as usize];
            // Stale: the left symbol was merged away, or one side grew since the pair was
            // queued (the right one, or the left by taking the right).
            if l.len == 0 || l.next == NONE {
                continue;
            }
            let r = symbols[l.next as usize];
            if l.len + r.len != top.len {
                continue;
            }
            symbols[l.next as usize].len = 0;
            let merged = &mut symbols[top.left as usize];
            merged.len = top.len;
            merged.next = r.next;
            if r.next != NONE {
                symbols[r.next as usize].prev = top.left;
            }
            queue.extend(candidate(&symbols, l.prev));
            queue.extend(candidate(&symbols, top.left));
        }
        let mut at = 0;
        while at != NONE {
            let s = symbols[at as usize];
            let text = &esc[s.start as usize..(s.start + s.len) as usize];
            if let Some(id) = piece(text) {
                out.push(id);
            } else if text.bytes().all(|b| tok.byte_ids[usize::from(b)].is_some()) {
                out.extend(text.bytes().filter_map(|b| tok.byte_ids[usize::from(b)]));
            } else {
                out.extend(self.unk_id);
            }
            at = s.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ChatMessage, Special, TokenizerModel};
    use super::*;

    /// Ids 0..3 `<unk>` `<s>` `</s>` (control), 3..259 the byte tokens, then normal pieces
    /// and a user-defined `@@`. `abc` is no token: its pieces decide which pair merged first.
    fn toy_parts(bytes: bool) -> SpmParts {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
        let mut types = vec![2, 3, 3];
        let mut scores = vec![0.0; 3];
        if bytes {
            tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
            types.extend([6; 256]);
            scores.extend([0.0; 256]);
        }
        for (piece, score) in [
            ("▁", -1.0),
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -5.0),
            ("bc", -4.0),
            ("aa", -3.0),
            ("▁a", -2.0),
            ("▁ab", -6.0),
            ("<", -1.0),
            ("s", -1.0),
            (">", -1.0),
        ] {
            tokens.push(piece.into());
            types.push(1);
            scores.push(score);
        }
        tokens.push("@@".into());
        types.push(4);
        scores.push(0.0);
        SpmParts {
            tokens,
            scores: Some(scores),
            token_types: Some(types),
            bos_id: Some(1),
            eos_id: Some(2),
            unk_id: None,
            add_bos: true,
            add_space_prefix: false,
            chat_template: None,
        }
    }

    fn ids_of(t: &Tokenizer, pieces: &[&str]) -> Vec<u32> {
        pieces.iter().map(|p| t.token_id(p).unwrap()).collect()
    }

    #[test]
    fn merges_by_score_then_leftmost() {
        let t = Tokenizer::from_spm_parts(toy_parts(true)).unwrap();
        assert_eq!(t.model(), TokenizerModel::SentencePiece);
        assert_eq!(t.pre_tokenizer(), None);
        // "bc" (-4) beats "ab" (-5): leftmost-first would give ["ab", "c"].
        assert_eq!(t.encode("abc", Special::Plain), ids_of(&t, &["a", "bc"]));
        // Equal scores: the leftmost pair merges.
        assert_eq!(t.encode("aaa", Special::Plain), ids_of(&t, &["aa", "a"]));
        // "▁a" (-2) merges before "ab" (-5), and "▁a" + "b" is "▁ab".
        assert_eq!(t.encode(" ab", Special::Plain), ids_of(&t, &["▁ab"]));
        assert_eq!(t.encode("b a", Special::Plain), ids_of(&t, &["b", "▁a"]));
        assert_eq!(t.encode("", Special::Allow), Vec::<u32>::new());
    }

    #[test]
    fn falls_back_to_bytes_and_unknown() {
        let t = Tokenizer::from_spm_parts(toy_parts(true)).unwrap();
        let e = t.encode("aé", Special::Plain);
        assert_eq!(e, ids_of(&t, &["a", "<0xC3>", "<0xA9>"]));
        assert_eq!(t.decode(&e).unwrap(), "aé");
        assert!(t.missing_bytes().is_empty());
        // Without byte tokens a character that is no token is the unknown token (type 2).
        let t = Tokenizer::from_spm_parts(toy_parts(false)).unwrap();
        assert_eq!(
            t.encode("aéb", Special::Plain),
            ids_of(&t, &["a", "<unk>", "b"])
        );
        assert_eq!(t.missing_bytes().len(), 256);
    }

    #[test]
    fn control_tokens_only_when_allowed() {
        let t = Tokenizer::from_spm_parts(toy_parts(true)).unwrap();
        assert_eq!(
            t.encode("a<s>b", Special::Allow),
            ids_of(&t, &["a", "<s>", "b"])
        );
        let plain = t.encode("a<s>b", Special::Plain);
        assert_eq!(plain, ids_of(&t, &["a", "<", "s", ">", "b"]));
        assert_eq!(t.decode(&plain).unwrap(), "a<s>b");
        // User-defined tokens are cut out in either mode; merges never cross them.
        assert_eq!(
            t.encode("a@@b", Special::Plain),
            ids_of(&t, &["a", "@@", "b"])
        );
        let mut parts = toy_parts(true);
        parts.chat_template = Some(
            ChatTemplate::new(
                "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}",
                "<s>",
                "</s>",
            )
            .unwrap(),
        );
        let t = Tokenizer::from_spm_parts(parts).unwrap();
        let r = t
            .render_chat(&[ChatMessage::user("ab</s>")], false)
            .unwrap();
        let ids = t.encode_chat(&r, 0);
        assert_eq!(ids.iter().filter(|&&i| t.is_control(i)).count(), 2);
        assert_eq!(t.decode(&ids).unwrap(), r.text);
        assert_eq!(t.with_bos(ids.clone()), ids, "the template wrote BOS");
        assert_eq!(t.with_bos(vec![5]), [1, 5]);
    }

    #[test]
    fn space_prefix_and_decoding() {
        let mut parts = toy_parts(true);
        parts.add_space_prefix = true;
        let t = Tokenizer::from_spm_parts(parts).unwrap();
        // Each run of text gets the space: at the start and after a control token.
        assert_eq!(
            t.encode("ab<s>a", Special::Allow),
            ids_of(&t, &["▁ab", "<s>", "▁a"])
        );
        let ids = t.encode("ab", Special::Plain);
        assert_eq!(t.decode(&t.with_bos(ids.clone())).unwrap(), "<s>ab");
        assert_eq!(t.decode(&ids_of(&t, &["▁a", "▁a"])).unwrap(), "a a");
        // A stream decodes a continuation: its first space stays. Bytes split across
        // tokens come out when the character is complete.
        let mut s = t.stream_decoder(true);
        assert_eq!(s.push(t.token_id("▁a").unwrap()).unwrap(), " a");
        assert_eq!(s.push(t.token_id("<0xC3>").unwrap()).unwrap(), "");
        assert_eq!(s.push(t.token_id("<0xA9>").unwrap()).unwrap(), "é");
        assert_eq!(s.push(1).unwrap(), "");
    }

    #[test]
    fn long_runs_merge_in_pieces() {
        let t = Tokenizer::from_spm_parts(toy_parts(true)).unwrap();
        let Model::Spm(spm) = &t.model else {
            unreachable!("a SentencePiece tokenizer")
        };
        let text = "ab aé abc 😀 ba";
        let mut whole = Vec::new();
        spm.encode_in_pieces(&t, text, 1 << 20, &mut whole);
        assert_eq!(whole, t.encode(text, Special::Plain));
        // Pieces of 5 bytes, cut at characters (`▁` and `é` are 3 and 2 bytes).
        let mut pieces = Vec::new();
        spm.encode_in_pieces(&t, text, 5, &mut pieces);
        assert_ne!(pieces, whole);
        assert_eq!(t.decode(&pieces).unwrap(), text);
    }

    #[test]
    fn bad_parts_are_errors() {
        let mut p = toy_parts(true);
        p.tokens[3] = "<0x0>".into();
        assert!(matches!(
            Tokenizer::from_spm_parts(p),
            Err(TokenizerError::BadByteToken { id: 3, .. })
        ));
        let mut p = toy_parts(true);
        p.scores = Some(vec![0.0; 4]);
        assert!(matches!(
            Tokenizer::from_spm_parts(p),
            Err(TokenizerError::LengthMismatch {
                what: "tokenizer.ggml.scores",
                ..
            })
        ));
        let mut p = toy_parts(true);
        p.unk_id = Some(10_000);
        assert!(matches!(
            Tokenizer::from_spm_parts(p),
            Err(TokenizerError::SpecialIdOutOfRange { id: 10_000, .. })
        ));
    }
}
