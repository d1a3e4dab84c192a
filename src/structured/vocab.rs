//! From bytes to tokens: a trie of the vocabulary's token bytes, walked together with the
//! automaton so that a whole subtree of tokens is dropped at the first byte the grammar
//! refuses, and a [`Constraint`]: one generation's automaton state, the tokens it allows
//! next, and the token it took.

use super::automaton::State;
use super::Grammar;
use crate::tokenizer::{TokenKind, Tokenizer};
use std::collections::HashMap;
use std::sync::Arc;

/// Masks one constraint keeps for states it has seen (a string's inside, an object's
/// commas): each is `vocab / 8` bytes, so the memo stays small.
const MASK_MEMO: usize = 32;

/// The token bytes of a vocabulary as a trie, built once per model and shared (`Arc`) by
/// every constraint. Holds the text tokens: normal, user-defined and byte tokens; control,
/// unknown and unused tokens never come from a grammar. The stop tokens are allowed exactly
/// where the grammar's value is complete.
#[derive(Debug)]
pub struct TokenTrie {
    vocab_size: usize,
    /// Node `n`'s edges are `edges[first_edge[n]..first_edge[n + 1]]`, sorted by byte.
    first_edge: Vec<u32>,
    edges: Vec<(u8, u32)>,
    /// The tokens whose bytes end at node `n`: `tokens[first_token[n]..first_token[n + 1]]`.
    first_token: Vec<u32>,
    tokens: Vec<u32>,
    /// Each token's bytes (`offsets[t]..offsets[t + 1]` of `bytes`; empty for tokens a
    /// grammar never takes).
    offsets: Vec<u32>,
    bytes: Vec<u8>,
    stop_ids: Vec<u32>,
}

impl TokenTrie {
    /// The trie of `tokenizer`'s text tokens, with `stop_ids` as the tokens that end a
    /// generation.
    pub fn new(tokenizer: &Tokenizer, stop_ids: &[u32]) -> TokenTrie {
        let vocab = tokenizer.vocab_size();
        let text = |id: u32| -> Option<&[u8]> {
            match tokenizer.kind(id)? {
                TokenKind::Normal | TokenKind::UserDefined | TokenKind::Byte => {
                    tokenizer.token_bytes(id).ok().filter(|b| !b.is_empty())
                }
                _ => None,
            }
        };
        Self::from_tokens(vocab, text, stop_ids)
    }

    /// The trie of the tokens `0..vocab_size` whose bytes `bytes_of` gives (`None`: a token
    /// no grammar takes).
    pub fn from_tokens<'a>(
        vocab_size: usize,
        bytes_of: impl Fn(u32) -> Option<&'a [u8]>,
        stop_ids: &[u32],
    ) -> TokenTrie {
        let mut offsets = Vec::with_capacity(vocab_size + 1);
        let mut bytes = Vec::new();
        // Build with a child list per node, then flatten.
        let mut children: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
        let mut ending: Vec<Vec<u32>> = vec![Vec::new()];
        for id in 0..vocab_size as u32 {
            offsets.push(bytes.len() as u32);
            let Some(b) = bytes_of(id) else { continue };
            if stop_ids.contains(&id) {
                continue;
            }
            bytes.extend_from_slice(b);
            let mut node = 0usize;
            for &c in b {
                node = match children[node].binary_search_by_key(&c, |e| e.0) {
                    Ok(k) => children[node][k].1 as usize,
                    Err(k) => {
                        let child = children.len();
                        children[node].insert(k, (c, child as u32));
                        children.push(Vec::new());
                        ending.push(Vec::new());
                        child
                    }
                };
            }
            ending[node].push(id);
        }
        offsets.push(bytes.len() as u32);
        let mut first_edge = Vec::with_capacity(children.len() + 1);
        let mut edges = Vec::new();
        let mut first_token = Vec::with_capacity(children.len() + 1);
        let mut tokens = Vec::new();
        for (c, e) in children.into_iter().zip(ending) {
            first_edge.push(edges.len() as u32);
            edges.extend(c);
            first_token.push(tokens.len() as u32);
            tokens.extend(e);
        }
        first_edge.push(edges.len() as u32);
        first_token.push(tokens.len() as u32);
        TokenTrie {
            vocab_size,
            first_edge,
            edges,
            first_token,
            tokens,
            offsets,
            bytes,
            stop_ids: stop_ids.to_vec(),
        }
    }

    /// Tokens of the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Bytes the trie holds on the host (its arrays).
    pub fn size_bytes(&self) -> usize {
        self.first_edge.len() * 4
            + self.edges.len() * 8
            + self.first_token.len() * 4
            + self.tokens.len() * 4
            + self.offsets.len() * 4
            + self.bytes.len()
    }

    /// The bytes of token `id` a grammar reads (`None`: a token no grammar takes).
    fn token(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (a, b) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        (b > a).then(|| &self.bytes[a as usize..b as usize])
    }

    /// Sets the bits of the tokens under trie node `node` that `grammar` reads from `state`.
    fn fill(&self, grammar: &Grammar, node: usize, state: &State, mask: &mut [u64]) {
        let (t0, t1) = (self.first_token[node], self.first_token[node + 1]);
        for &t in &self.tokens[t0 as usize..t1 as usize] {
            mask[t as usize / 64] |= 1 << (t % 64);
        }
        let (e0, e1) = (self.first_edge[node], self.first_edge[node + 1]);
        for &(b, child) in &self.edges[e0 as usize..e1 as usize] {
            if grammar.passes_unchanged(state, b) {
                self.fill(grammar, child as usize, state, mask);
            } else if let Some(next) = grammar.step(state, b) {
                self.fill(grammar, child as usize, &next, mask);
            }
        }
    }
}

/// A token the constraint could not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token {token} does not continue the structured output (the grammar refuses it)")]
pub struct Refused {
    /// The token.
    pub token: u32,
}

/// One generation held to a [`Grammar`]: where the automaton is, which tokens may come next
/// ([`Constraint::mask`], [`Constraint::allows`]) and the token taken
/// ([`Constraint::accept`]).
#[derive(Debug, Clone)]
pub struct Constraint {
    grammar: Arc<Grammar>,
    trie: Arc<TokenTrie>,
    state: State,
    memo: HashMap<State, Arc<Vec<u64>>>,
}

impl Constraint {
    /// A constraint at the start of `grammar`'s value, over `trie`'s vocabulary.
    pub fn new(grammar: Arc<Grammar>, trie: Arc<TokenTrie>) -> Constraint {
        let state = grammar.start();
        Constraint {
            grammar,
            trie,
            state,
            memo: HashMap::new(),
        }
    }

    /// Whether the text so far is a whole value (a stop token may come).
    pub fn is_complete(&self) -> bool {
        self.grammar.is_complete(&self.state)
    }

    /// Whether token `id` may come next.
    pub fn allows(&self, id: u32) -> bool {
        if self.trie.stop_ids.contains(&id) {
            return self.is_complete();
        }
        self.trie
            .token(id)
            .is_some_and(|b| self.grammar.walk(&self.state, b).is_some())
    }

    /// The tokens that may come next, one bit per token of the vocabulary (bit `t % 64` of
    /// word `t / 64`).
    pub fn mask(&mut self) -> Arc<Vec<u64>> {
        if let Some(m) = self.memo.get(&self.state) {
            return m.clone();
        }
        let mut mask = vec![0u64; self.trie.vocab_size.div_ceil(64)];
        if self.grammar.can_continue(&self.state) {
            self.trie.fill(&self.grammar, 0, &self.state, &mut mask);
        }
        if self.is_complete() {
            for &t in &self.trie.stop_ids {
                if let Some(w) = mask.get_mut(t as usize / 64) {
                    *w |= 1 << (t % 64);
                }
            }
        }
        let mask = Arc::new(mask);
        if self.memo.len() >= MASK_MEMO {
            self.memo.clear();
        }
        self.memo.insert(self.state.clone(), mask.clone());
        mask
    }

    /// Sets the logits of the tokens that may not come next to minus infinity.
    pub fn apply(&mut self, logits: &mut [f32]) {
        let mask = self.mask();
        for (t, l) in logits.iter_mut().enumerate() {
            let allowed = mask.get(t / 64).is_some_and(|w| w >> (t % 64) & 1 == 1);
            if !allowed {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Takes token `id`: the automaton reads its bytes (a stop token ends the value).
    ///
    /// # Errors
    /// [`Refused`] when the grammar does not allow it; the state is unchanged then.
    pub fn accept(&mut self, id: u32) -> Result<(), Refused> {
        if self.trie.stop_ids.contains(&id) {
            return if self.is_complete() {
                Ok(())
            } else {
                Err(Refused { token: id })
            };
        }
        let bytes = self.trie.token(id).ok_or(Refused { token: id })?;
        self.state = self
            .grammar
            .walk(&self.state, bytes)
            .ok_or(Refused { token: id })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Json;
    use super::*;

    /// A toy vocabulary: the texts below, then a stop token.
    const TOKENS: [&str; 14] = [
        "{", "}", "\"", "a", "b", "\":", " ", "1", "0", "{\"", "true", "\"a\":", "ab\"", "é",
    ];

    fn trie() -> Arc<TokenTrie> {
        let stop = TOKENS.len() as u32;
        Arc::new(TokenTrie::from_tokens(
            TOKENS.len() + 1,
            |id| TOKENS.get(id as usize).map(|t| t.as_bytes()),
            &[stop],
        ))
    }

    fn allowed(c: &mut Constraint) -> Vec<String> {
        let mask = c.mask();
        (0..=TOKENS.len())
            .filter(|&t| mask[t / 64] >> (t % 64) & 1 == 1)
            .map(|t| TOKENS.get(t).map_or("<stop>".into(), |s| s.to_string()))
            .collect()
    }

    #[test]
    fn the_mask_follows_the_grammar_token_by_token() {
        let schema: Json = serde_json::from_str(
            r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}"#,
        )
        .unwrap();
        let mut c = Constraint::new(Arc::new(Grammar::json_schema(&schema).unwrap()), trie());
        assert_eq!(allowed(&mut c), ["{", "{\""]);
        c.accept(9).unwrap(); // {"
        assert_eq!(allowed(&mut c), ["a"]);
        assert!(c.accept(4).is_err()); // b
        c.accept(3).unwrap(); // a
        assert_eq!(allowed(&mut c), ["\"", "\":"]);
        c.accept(5).unwrap();
        assert_eq!(allowed(&mut c), [" ", "1", "0"]);
        c.accept(7).unwrap(); // 1
        assert!(!c.is_complete());
        assert_eq!(allowed(&mut c), ["}", " ", "1", "0"]);
        c.accept(1).unwrap(); // }
        assert!(c.is_complete());
        assert_eq!(allowed(&mut c), ["<stop>"]);
        assert!(c.allows(TOKENS.len() as u32));
        assert!(!c.allows(0));
        c.accept(TOKENS.len() as u32).unwrap();
    }

    #[test]
    fn inside_a_string_every_text_token_but_a_broken_one_is_allowed() {
        let mut c = Constraint::new(Arc::new(Grammar::json_object()), trie());
        c.accept(9).unwrap(); // {"
        let inside = allowed(&mut c);
        // Not `"a":` (a key closed at once must be followed by a colon), not the stop.
        assert_eq!(
            inside,
            ["{", "}", "\"", "a", "b", "\":", " ", "1", "0", "{\"", "true", "ab\"", "é"]
        );
        // The mask of the same state comes from the memo.
        assert!(Arc::ptr_eq(&c.mask(), &c.mask()));
    }
}
