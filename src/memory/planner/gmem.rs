//! The global-memory (gmem) planner that allocates by lifetime (docs/design.md, "Memory pool
//! and static planner"), on buffers with lifetimes.
//!
//! Mapping of the reference onto `[lower, upper)` buffers:
//! - *weight tensors* are the buffers live over the whole horizon; they are allocated first,
//!   sequentially, each at a 4 KiB-aligned address ("address space keeps accumulating");
//! - *global neuron tensors* are the others, visited in processing order (by `lower`). A tensor
//!   whose `upper` is at or before the current step is end-of-life: its block (the `rec_tbl`
//!   entry) becomes reusable. A new tensor reuses a whole end-of-life block at least as large
//!   and suitably aligned (the reference's conditions: not held, address not in use, EOL, big
//!   enough; the input/output address rule holds because an input is live at the step, so its
//!   block is in use), else a new block is opened on top.
//!
//! The two rules differ in which reusable block is taken: [`Rule::FitFirst`] the first in table
//! order (the reference's scan of `rec_tbl`), [`Rule::OpSize`] the smallest that fits, with the
//! outputs of one step allocated largest first.

use super::{align_up, Problem};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

/// Which reusable block a tensor takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    FitFirst,
    OpSize,
}

/// The reference aligns weights to 4 KiB.
const WEIGHT_ALIGN_BYTES: u64 = 4096;

/// Max-size segment tree over block indices, for "first block (in table order) with free size
/// at least s" in O(log n).
struct FirstFit {
    n: usize,
    tree: Vec<u64>,
}

impl FirstFit {
    fn new(n: usize) -> FirstFit {
        let n = n.next_power_of_two().max(1);
        FirstFit {
            n,
            tree: vec![0; 2 * n],
        }
    }

    fn set(&mut self, i: usize, v: u64) {
        let mut k = i + self.n;
        self.tree[k] = v;
        while k > 1 {
            k /= 2;
            self.tree[k] = self.tree[2 * k].max(self.tree[2 * k + 1]);
        }
    }

    /// First index whose value is at least `s` and for which `ok` holds, scanning left to right.
    fn first_at_least(&self, s: u64, ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        self.descend(1, s, ok)
    }

    fn descend(&self, k: usize, s: u64, ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        if self.tree[k] < s || self.tree[k] == 0 && s > 0 {
            return None;
        }
        if k >= self.n {
            let i = k - self.n;
            return if ok(i) { Some(i) } else { None };
        }
        self.descend(2 * k, s, ok)
            .or_else(|| self.descend(2 * k + 1, s, ok))
    }
}

/// Plans with the reference gmem rules; returns offsets indexed by buffer.
pub(crate) fn plan(p: &Problem, rule: Rule) -> Vec<u64> {
    let n = p.len();
    let mut offsets = vec![0u64; n];
    let t_min = p.lower.iter().copied().min().unwrap_or(0);
    let t_max = p.upper.iter().copied().max().unwrap_or(0);
    let mut top = 0u64;
    let mut neurons = Vec::new();
    for i in 0..n {
        if p.lower[i] == t_min && p.upper[i] == t_max {
            // 4 KiB when the buffer's own alignment is compatible (the usual powers of two);
            // an exotic alignment is kept as is rather than multiplied up.
            let a = p.align[i];
            let align = if a % WEIGHT_ALIGN_BYTES == 0 || WEIGHT_ALIGN_BYTES % a == 0 {
                a.max(WEIGHT_ALIGN_BYTES)
            } else {
                a
            };
            offsets[i] = align_up(top, align);
            top = offsets[i] + p.size[i];
        } else {
            neurons.push(i);
        }
    }
    match rule {
        Rule::FitFirst => neurons.sort_by_key(|&i| (p.lower[i], i)),
        Rule::OpSize => neurons.sort_by_key(|&i| (p.lower[i], Reverse(p.size[i]), i)),
    }
    // Blocks: (offset, size). A block is reusable once its occupant's upper has passed.
    let mut blocks: Vec<(u64, u64)> = Vec::new();
    let mut occupied: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new(); // (upper, block)
    let mut first_fit = FirstFit::new(neurons.len());
    let mut by_size: BTreeSet<(u64, usize)> = BTreeSet::new();
    for &i in &neurons {
        while let Some(&Reverse((upper, blk))) = occupied.peek() {
            if upper > p.lower[i] {
                break;
            }
            occupied.pop();
            first_fit.set(blk, blocks[blk].1.max(1));
            by_size.insert((blocks[blk].1, blk));
        }
        let (size, align) = (p.size[i], p.align[i]);
        let aligned = |blk: usize| blocks[blk].0 % align == 0;
        let found = match rule {
            Rule::FitFirst => {
                first_fit.first_at_least(size.max(1), &|b| aligned(b) && blocks[b].1 >= size)
            }
            Rule::OpSize => by_size
                .range((size, 0)..)
                .find(|&&(_, b)| aligned(b))
                .map(|&(_, b)| b),
        };
        let blk = match found {
            Some(b) => {
                first_fit.set(b, 0);
                by_size.remove(&(blocks[b].1, b));
                b
            }
            None => {
                let off = align_up(top, align);
                top = off + size;
                blocks.push((off, size));
                blocks.len() - 1
            }
        };
        offsets[i] = blocks[blk].0;
        occupied.push(Reverse((p.upper[i], blk)));
    }
    offsets
}
