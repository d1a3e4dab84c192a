//! KV page bookkeeping: the pools' pages ([`Pages`]: who holds each page, the prefix index
//! and the prompt cache), and each sequence's page tables in them: reserving pages for its
//! rows, spare pages given back, sliding-window pages let go once out of the window.

use super::{BatchEngine, Seq};
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

/// The entry of a full page in the prefix index: what it holds, and where it sits in the
/// chain of pages from a sequence's start.
struct Indexed {
    /// Chained hash: of the partition for the first page, else of the previous page's hash;
    /// and of this page's tokens.
    hash: u64,
    /// The previous page's chained hash (the partition's for the first page).
    parent: u64,
    /// The partition ([`Request::cache_salt`](crate::llm::Request::cache_salt)).
    salt: u64,
    /// The page's tokens (`page_size` of them): a hash match is checked against them, so a
    /// collision never shares a page.
    tokens: Box<[u32]>,
}

/// Pages of the pools: who holds each page, and the **prefix index** of full pages, keyed by
/// chained per-page hashes (a page's key covers the whole prefix up to it through its
/// parent's hash, so the index holds each page's tokens once: host memory linear in the
/// tokens indexed). With `keep` (the prompt cache), a page whose last holder lets it go stays
/// in the index, *idle*, and is given to the next sequence whose prefix it continues; idle
/// pages are taken back, least recently used first, whenever a free page is needed.
pub(super) struct Pages {
    page_size: usize,
    free: Vec<u32>,
    pub(super) holders: Vec<u32>,
    /// Each page's entry in the index.
    index: Vec<Option<Indexed>>,
    /// Indexed pages by chained hash.
    by_hash: HashMap<u64, u32>,
    /// Idle pages by the time they became idle (oldest first), and each idle page's time.
    idle: BTreeMap<u64, u32>,
    idle_at: HashMap<u32, u64>,
    clock: u64,
    keep: bool,
    /// A random key per engine: hashes an attacker cannot precompute collisions for.
    hasher: RandomState,
}

impl Pages {
    pub(super) fn new(total: u32, page_size: usize, keep: bool) -> Pages {
        Pages {
            page_size,
            free: (0..total).rev().collect(),
            holders: vec![0; total as usize],
            index: (0..total).map(|_| None).collect(),
            by_hash: HashMap::new(),
            idle: BTreeMap::new(),
            idle_at: HashMap::new(),
            clock: 0,
            keep,
            hasher: RandomState::new(),
        }
    }

    /// The chained hash of a page holding `tokens` after a page whose hash is `parent`.
    fn chain(&self, parent: u64, tokens: &[u32]) -> u64 {
        self.hasher.hash_one((parent, tokens))
    }

    /// The chain's start for partition `salt`.
    fn root(&self, salt: u64) -> u64 {
        self.hasher.hash_one(("dynrt prefix", salt))
    }

    /// Pages that can be had now: free, or idle in the cache.
    pub(super) fn available(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// Idle pages (in the cache, held by no sequence).
    pub(super) fn cached(&self) -> usize {
        self.idle.len()
    }

    /// Bytes of host memory the index holds: its slots, the tokens its entries hold, the hash
    /// map and the idle lists.
    pub(super) fn index_bytes(&self) -> usize {
        let tokens: usize = (self.index.iter().flatten())
            .map(|e| std::mem::size_of_val(&*e.tokens))
            .sum();
        self.index.len() * std::mem::size_of::<Option<Indexed>>()
            + tokens
            + self.by_hash.capacity() * 16
            + (self.idle.len() + self.idle_at.capacity()) * 24
    }

    /// A free page, held once; an idle page leaves the cache for it when none is free.
    fn take(&mut self) -> Option<u32> {
        let p = match self.free.pop() {
            Some(p) => p,
            None => {
                let (_, p) = self.idle.pop_first()?;
                self.idle_at.remove(&p);
                self.unindex(p);
                p
            }
        };
        self.holders[p as usize] = 1;
        Some(p)
    }

    fn unindex(&mut self, p: u32) {
        if let Some(e) = self.index[p as usize].take() {
            if self.by_hash.get(&e.hash) == Some(&p) {
                self.by_hash.remove(&e.hash);
            }
        }
    }

    /// Lets one holder of page `p` go: with no holder left it becomes idle (indexed, with the
    /// cache) or free.
    fn release(&mut self, p: u32) {
        let h = &mut self.holders[p as usize];
        *h = h.saturating_sub(1);
        if *h > 0 {
            return;
        }
        if self.keep && self.index[p as usize].is_some() {
            self.clock += 1;
            self.idle.insert(self.clock, p);
            self.idle_at.insert(p, self.clock);
        } else {
            self.unindex(p);
            self.free.push(p);
        }
    }

    /// The indexed pages that hold the start of `tokens` in partition `salt`, each held once
    /// more, leaving at least the last token to compute (its logits are needed); with their
    /// chained hashes and how many of them were idle.
    pub(super) fn share(&mut self, tokens: &[u32], salt: u64) -> (Vec<u32>, Vec<u64>, usize) {
        let ps = self.page_size;
        let (mut pages, mut hashes, mut idle) = (Vec::new(), Vec::new(), 0);
        let mut parent = self.root(salt);
        while (pages.len() + 1) * ps < tokens.len() {
            let page = &tokens[pages.len() * ps..(pages.len() + 1) * ps];
            let hash = self.chain(parent, page);
            let Some(&p) = self.by_hash.get(&hash) else {
                break;
            };
            let same = self.index[p as usize]
                .as_ref()
                .is_some_and(|e| e.parent == parent && e.salt == salt && *e.tokens == *page);
            if !same {
                break;
            }
            if self.holders[p as usize] == 0 {
                if let Some(at) = self.idle_at.remove(&p) {
                    self.idle.remove(&at);
                }
                idle += 1;
            }
            self.holders[p as usize] += 1;
            pages.push(p);
            hashes.push(hash);
            parent = hash;
        }
        (pages, hashes, idle)
    }

    /// Indexes the pages of `tokens[..done]` that are full (in partition `salt`); `hashes`
    /// holds the chained hashes of the sequence's pages so far and grows with them.
    pub(super) fn publish(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        done: usize,
        salt: u64,
        hashes: &mut Vec<u64>,
    ) {
        let ps = self.page_size;
        let full = (done / ps).min(pages.len());
        while hashes.len() < full {
            let i = hashes.len();
            let parent = match i {
                0 => self.root(salt),
                _ => hashes[i - 1],
            };
            hashes.push(self.chain(parent, &tokens[i * ps..(i + 1) * ps]));
        }
        for (i, &p) in pages.iter().enumerate().take(full) {
            let hash = hashes[i];
            if self.index[p as usize].is_some() || self.by_hash.contains_key(&hash) {
                continue;
            }
            let parent = match i {
                0 => self.root(salt),
                _ => hashes[i - 1],
            };
            self.by_hash.insert(hash, p);
            self.index[p as usize] = Some(Indexed {
                hash,
                parent,
                salt,
                tokens: tokens[i * ps..(i + 1) * ps].into(),
            });
        }
    }
}

impl BatchEngine {
    /// Pages sequence `q` holds past those its tokens and the next one fill.
    pub(super) fn spare(&self, q: &Seq) -> usize {
        let ps = self.options.page_size as usize;
        let need = (q.tokens.len() + 1).max(q.done + 1).div_ceil(ps);
        q.pages.len().saturating_sub(need)
    }

    /// Sequence `i` gives every page it holds back.
    pub(super) fn give_back_pages(&mut self, i: usize) {
        let q = &mut self.seqs[i];
        let (pages, swa_pages) = (
            std::mem::take(&mut q.pages),
            std::mem::take(&mut q.swa_pages),
        );
        self.free_pages(pages, swa_pages);
    }

    /// Gives pages back: `pages` to the pools, `swa_pages` to the sliding-window pools.
    pub(super) fn free_pages(&mut self, pages: Vec<u32>, swa_pages: Vec<Option<u32>>) {
        // Last page first: in the cache a page's successors then count as older than it and
        // are taken back before it (a page is reached only through its predecessors).
        for p in pages.into_iter().rev() {
            self.pages.release(p);
        }
        if let Some((swa, _)) = &mut self.swa {
            for p in swa_pages.into_iter().flatten() {
                swa.release(p);
            }
        }
    }

    /// Gives back sequence `i`'s sliding-window pages that no query from position `done` on
    /// sees (all their positions are older than the window).
    pub(super) fn release_out_of_window(&mut self, i: usize) {
        let Some((swa, window)) = &mut self.swa else {
            return;
        };
        let ps = self.options.page_size as usize;
        let q = &mut self.seqs[i];
        let lowest = (q.done + 1).saturating_sub(*window);
        for (k, slot) in q.swa_pages.iter_mut().enumerate() {
            if (k + 1) * ps > lowest {
                break;
            }
            if let Some(p) = slot.take() {
                swa.release(p);
            }
        }
    }

    /// Gives sequence `i` the pages for positions `0..upto` (its sliding-window layers only
    /// those a query from position `done` on sees); `false` (nothing taken) when the pool
    /// has too few free pages.
    fn reserve(&mut self, i: usize, upto: usize) -> bool {
        self.reserve_in(i, upto, true)
    }

    /// [`BatchEngine::reserve`], in the pools of the layers without a window only unless
    /// `with_window`.
    pub(super) fn reserve_in(&mut self, i: usize, upto: usize, with_window: bool) -> bool {
        let ps = self.options.page_size as usize;
        let q = &mut self.seqs[i];
        let need = upto.div_ceil(ps).saturating_sub(q.pages.len());
        let swa_from = q.swa_pages.len();
        let upto_swa = if with_window { upto } else { 0 };
        let lowest = self
            .swa
            .as_ref()
            .map_or(0, |(_, window)| (q.done + 1).saturating_sub(*window));
        let in_window = |k: usize| (k + 1) * ps > lowest;
        let need_swa = (swa_from..upto_swa.div_ceil(ps))
            .filter(|&k| in_window(k))
            .count();
        let swa_short = self
            .swa
            .as_ref()
            .is_some_and(|(swa, _)| need_swa > swa.free.len());
        if need > self.pages.available() || swa_short {
            return false;
        }
        for _ in 0..need {
            if let Some(p) = self.pages.take() {
                q.pages.push(p);
            }
        }
        if let Some((swa, _)) = &mut self.swa {
            for k in swa_from..upto_swa.div_ceil(ps) {
                q.swa_pages
                    .push(if in_window(k) { swa.take() } else { None });
            }
        }
        true
    }

    /// Like [`BatchEngine::reserve`]; when the pools are short, the spare pages of the
    /// sequences not in `plan` are given back first and the reservation tried again.
    pub(super) fn reserve_or_trim(
        &mut self,
        i: usize,
        upto: usize,
        plan: &[(usize, usize, usize)],
    ) -> bool {
        if self.reserve(i, upto) {
            return true;
        }
        let mut trimmed = false;
        for j in 0..self.seqs.len() {
            if j != i && !plan.iter().any(|&(k, _, _)| k == j) && self.spare(&self.seqs[j]) > 0 {
                let keep = self.seqs[j].pages.len() - self.spare(&self.seqs[j]);
                let q = &mut self.seqs[j];
                let swa_keep = keep.min(q.swa_pages.len());
                let (pages, swa) = (q.pages.split_off(keep), q.swa_pages.split_off(swa_keep));
                self.stats.spare_pages_reclaimed += pages.len() as u64;
                self.free_pages(pages, swa);
                trimmed = true;
            }
        }
        trimmed && self.reserve(i, upto)
    }
}

#[cfg(test)]
mod tests {
    use super::Pages;

    fn take(pages: &mut Pages, n: usize) -> Vec<u32> {
        (0..n).map(|_| pages.take().unwrap()).collect()
    }

    #[test]
    fn full_pages_are_shared_and_freed_with_their_last_holder() {
        let mut pages = Pages::new(8, 4, false);
        let a: Vec<u32> = (0..10).collect();
        let pa = take(&mut pages, 3);
        // Only the two full pages of the 10 computed tokens are shareable.
        let mut hashes = Vec::new();
        pages.publish(&a, &pa, 10, 0, &mut hashes);
        assert_eq!(pages.by_hash.len(), 2);
        assert_eq!(hashes.len(), 2);
        let mut b = a[..9].to_vec();
        b.push(99);
        let (shared, shared_hashes, idle) = pages.share(&b, 0);
        assert_eq!(shared, pa[..2]);
        assert_eq!(shared_hashes, hashes);
        assert_eq!(idle, 0);
        // A prompt of exactly two pages shares one: its last token is computed.
        assert_eq!(pages.share(&a[..8], 0).0, pa[..1]);
        // Another partition shares nothing.
        assert!(pages.share(&b, 1).0.is_empty());
        for p in pa.iter().chain(&shared).chain(&pa[..1]) {
            pages.release(*p);
        }
        // Without the cache, a page leaves the index with its last holder.
        assert_eq!(pages.free.len(), 8);
        assert!(pages.by_hash.is_empty());
        // A different first token shares nothing.
        let c: Vec<u32> = (1..11).collect();
        assert!(pages.share(&c, 0).0.is_empty());
    }

    #[test]
    fn the_cache_keeps_idle_pages_for_the_next_request_and_gives_the_oldest_back_first() {
        let mut pages = Pages::new(6, 4, true);
        // A chat turn of 12 tokens fills three pages; it ends and lets them go.
        let turn: Vec<u32> = (100..112).collect();
        let held = take(&mut pages, 3);
        pages.publish(&turn, &held, turn.len(), 7, &mut Vec::new());
        for &p in held.iter().rev() {
            pages.release(p);
        }
        assert_eq!(
            (pages.free.len(), pages.cached(), pages.available()),
            (3, 3, 6)
        );
        // The next turn starts with the whole first turn: it gets its three pages back.
        let mut next = turn.clone();
        next.extend([1, 2, 3]);
        let (got, _, idle) = pages.share(&next, 7);
        assert_eq!((got.as_slice(), idle), (held.as_slice(), 3));
        assert_eq!(pages.cached(), 0);
        // Another partition with the same tokens gets nothing.
        assert!(pages.share(&next, 8).0.is_empty());
        for &p in got.iter().rev() {
            pages.release(p);
        }
        // Short of free pages, idle ones are taken, the last page of the chain first (the
        // chain's start stays reachable).
        let fresh = take(&mut pages, 4);
        assert_eq!(fresh[3], held[2]);
        assert_eq!(pages.cached(), 2);
        let (got, _, _) = pages.share(&next, 7);
        assert_eq!(got, held[..2]);
        for &p in got.iter().chain(&fresh) {
            pages.release(p);
        }
        let all = take(&mut pages, 6);
        assert_eq!(all.len(), 6);
        assert!(pages.take().is_none());
        assert!(pages.by_hash.is_empty(), "a page taken leaves the index");
    }

    #[test]
    fn a_hash_match_with_other_tokens_is_not_shared() {
        let mut pages = Pages::new(4, 2, true);
        let a = [1, 2, 3, 4, 5];
        let held = take(&mut pages, 2);
        let mut hashes = Vec::new();
        pages.publish(&a, &held, 4, 0, &mut hashes);
        // Forge an entry: the hash of `a`'s first page pointing at a page with other tokens.
        if let Some(e) = pages.index[held[0] as usize].as_mut() {
            e.tokens = vec![9, 9].into();
        }
        assert!(pages.share(&a, 0).0.is_empty());
    }

    #[test]
    fn the_prefix_index_holds_each_token_once() {
        // A 32k-token prompt in pages of 16: the index grows linearly with the prompt (each
        // page's 16 tokens and a fixed entry), not with the square of it.
        let bytes_for = |tokens: usize| {
            let ps = 16;
            let n = tokens / ps;
            let mut pages = Pages::new(n as u32, ps, true);
            let prompt: Vec<u32> = (0..tokens as u32)
                .map(|t| t.wrapping_mul(2654435761) % 49152)
                .collect();
            let held = take(&mut pages, n);
            let mut hashes = Vec::new();
            // As the engine publishes: after every chunk of 128 tokens.
            for done in (128..=tokens).step_by(128) {
                pages.publish(&prompt, &held, done, 0, &mut hashes);
            }
            assert_eq!(pages.by_hash.len(), n);
            let (shared, _, _) = pages.share(&prompt, 0);
            assert_eq!(shared.len(), n - 1);
            pages.index_bytes()
        };
        let (small, large) = (bytes_for(8192), bytes_for(32768));
        let per_token = large as f64 / 32768.0;
        assert!(per_token < 16.0, "{large} bytes for 32768 tokens");
        let ratio = large as f64 / small as f64;
        assert!(
            (3.5..4.6).contains(&ratio),
            "4x the tokens, {ratio}x the bytes"
        );
    }
}
