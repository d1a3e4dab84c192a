//! Byte-level BPE: GPT-2's byte-to-character table and the merge loop.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's table from bytes to the printable characters that stand for them in token text:
/// the printable Latin-1 bytes stand for themselves, the other 68 (controls, space, DEL,
/// NBSP, soft hyphen) for `U+0100` onwards in byte order (space is `Ġ`, newline `Ċ`).
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every code is below 0x100 + 68, a valid scalar value.
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// The inverse of [`byte_to_char_table`], as a map.
pub fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// A merge rule's rank (lower merges first) and the token it produces.
#[derive(Debug, Clone, Copy)]
pub struct Merge {
    pub rank: u32,
    pub id: u32,
}

/// A candidate merge of the symbol at `pos` with the one after it.
#[derive(PartialEq, Eq)]
struct Candidate {
    rank: u32,
    pos: usize,
    id: u32,
}

impl Ord for Candidate {
    // BinaryHeap is a max-heap: the lowest rank, then the leftmost position, pops first
    // (the order of the Python `tokenizers` package and of llama.cpp).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.pos.cmp(&self.pos))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One symbol of a word being merged, linked to its neighbours; `len == 0` once merged away.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: usize,
    next: usize,
    len: usize,
}

const NONE: usize = usize::MAX;

/// Applies `merges` to the one-byte tokens of `word` (`byte_ids[b]` is the token of byte
/// `b`; a byte without one is dropped, and its neighbours become adjacent, as in the Python
/// `tokenizers` package and llama.cpp) and appends the resulting ids to `out`.
/// `O(n log n)` in the word's length, so a megabyte without a space costs no more than it
/// should.
pub fn merge_word(
    word: &[u8],
    byte_ids: &[Option<u32>; 256],
    merges: &HashMap<(u32, u32), Merge>,
    out: &mut Vec<u32>,
) {
    let ids: Vec<u32> = word.iter().filter_map(|&b| byte_ids[b as usize]).collect();
    let n = ids.len();
    let mut symbols: Vec<Symbol> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| Symbol {
            id,
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
            len: 1,
        })
        .collect();
    let mut queue = BinaryHeap::with_capacity(n);
    let candidate = |symbols: &[Symbol], pos: usize| -> Option<Candidate> {
        let next = symbols[pos].next;
        if next == NONE {
            return None;
        }
        merges
            .get(&(symbols[pos].id, symbols[next].id))
            .map(|m| Candidate {
                rank: m.rank,
                pos,
                id: m.id,
            })
    };
    for pos in 0..n.saturating_sub(1) {
        queue.extend(candidate(&symbols, pos));
    }
    while let Some(top) = queue.pop() {
        let pos = top.pos;
        // A candidate is stale when its left symbol was merged into another, or its pair
        // changed since it was queued.
        if symbols[pos].len == 0 {
            continue;
        }
        match candidate(&symbols, pos) {
            Some(c) if c.id == top.id && c.rank == top.rank => {}
            _ => continue,
        }
        let next = symbols[pos].next;
        let after = symbols[next].next;
        symbols[pos].id = top.id;
        symbols[pos].len += symbols[next].len;
        symbols[pos].next = after;
        symbols[next].len = 0;
        if after != NONE {
            symbols[after].prev = pos;
        }
        let prev = symbols[pos].prev;
        if prev != NONE {
            queue.extend(candidate(&symbols, prev));
        }
        queue.extend(candidate(&symbols, pos));
    }
    out.extend(symbols.iter().filter(|s| s.len > 0).map(|s| s.id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2s() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], 'Ń');
        assert_eq!(char_to_byte_map().len(), 256, "the table is a bijection");
    }

    #[test]
    fn merges_lowest_rank_first_then_leftmost() {
        // Tokens: bytes are their own ids; 300 = "aa", 301 = "ab", 302 = "aab".
        let mut byte_ids = [None; 256];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = Some(b as u32);
        }
        byte_ids[usize::from(b'-')] = None;
        let a = u32::from(b'a');
        let b = u32::from(b'b');
        let mut merges = HashMap::new();
        merges.insert((a, a), Merge { rank: 0, id: 300 });
        merges.insert((a, b), Merge { rank: 1, id: 301 });
        merges.insert((300, b), Merge { rank: 2, id: 302 });
        let run = |w: &str| {
            let mut out = Vec::new();
            merge_word(w.as_bytes(), &byte_ids, &merges, &mut out);
            out
        };
        assert_eq!(run("aab"), vec![302]);
        // "aaa": the leftmost "aa" merges, the third `a` stays.
        assert_eq!(run("aaa"), vec![300, a]);
        // "aaab": "aa" (rank 0) beats "ab" (rank 1), then "aa" + "ab" has no rule.
        assert_eq!(run("aaab"), vec![300, 301]);
        assert_eq!(run(""), Vec::<u32>::new());
        // A byte without a token is dropped and its neighbours merge across it.
        assert_eq!(run("a-a-b"), vec![302]);
    }
}
