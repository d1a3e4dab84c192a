//! The search's first path alone, [`dive`]: every buffer at the lowest offset its placed
//! time-neighbours allow, with no backtracking, in O(n log n) from a range-max segment tree
//! over compressed time ([`Skyline`]) and a lazy heap.

use crate::memory::planner::{align_up, Problem};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use web_time::Instant;

/// Range-max segment tree over compressed time where updates only raise values ("chmax"),
/// bottom-up without push-down: `tag[k]` applies to k's whole subtree, `max[k]` is the max of
/// k's subtree including tags. A query takes the canonical nodes' maxima plus the tags of the
/// ancestors of its two boundary leaves (every such ancestor covers part of the range).
struct Skyline {
    n: usize,
    max: Vec<u64>,
    tag: Vec<u64>,
}

impl Skyline {
    fn new(n: usize) -> Skyline {
        let n = n.max(1).next_power_of_two();
        Skyline {
            n,
            max: vec![0; 2 * n],
            tag: vec![0; 2 * n],
        }
    }

    /// Max over `[lo, hi)`, `lo < hi`.
    fn query(&self, lo: usize, hi: usize) -> u64 {
        let mut best = 0;
        let (mut l, mut r) = (lo + self.n, hi + self.n);
        while l < r {
            if l & 1 == 1 {
                best = best.max(self.max[l]);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                best = best.max(self.max[r]);
            }
            l /= 2;
            r /= 2;
        }
        let (mut a, mut b) = ((lo + self.n) / 2, (hi - 1 + self.n) / 2);
        while a >= 1 {
            best = best.max(self.tag[a]).max(self.tag[b]);
            a /= 2;
            b /= 2;
        }
        best
    }

    /// Raises every point of `[lo, hi)` to at least `v`.
    fn raise(&mut self, lo: usize, hi: usize, v: u64) {
        let (mut l, mut r) = (lo + self.n, hi + self.n);
        let (l0, r0) = (l, r - 1);
        while l < r {
            if l & 1 == 1 {
                self.max[l] = self.max[l].max(v);
                self.tag[l] = self.tag[l].max(v);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.max[r] = self.max[r].max(v);
                self.tag[r] = self.tag[r].max(v);
            }
            l /= 2;
            r /= 2;
        }
        let (mut a, mut b) = (l0 / 2, r0 / 2);
        while a >= 1 {
            self.max[a] = self.max[a].max(v);
            self.max[b] = self.max[b].max(v);
            a /= 2;
            b /= 2;
        }
    }
}

/// The first path of the search without backtracking: repeatedly place the unplaced buffer
/// with the lowest minimum offset (ties by the preorder `heuristic`) at that offset.
pub(super) fn dive(p: &Problem, heuristic: &[u8], deadline: Instant) -> Option<Vec<u64>> {
    let n = p.len();
    let mut times: Vec<u64> = p.lower.iter().chain(p.upper.iter()).copied().collect();
    times.sort_unstable();
    times.dedup();
    let pos = |t: u64| times.partition_point(|&x| x < t);
    let lo: Vec<usize> = p.lower.iter().map(|&t| pos(t)).collect();
    let hi: Vec<usize> = p.upper.iter().map(|&t| pos(t)).collect();
    // Section totals for the 'T' key: sizes live at each compressed time.
    let mut diff = vec![0i128; times.len() + 1];
    for i in 0..n {
        diff[lo[i]] += p.size[i] as i128;
        diff[hi[i]] -= p.size[i] as i128;
    }
    let mut live = vec![0u64; times.len()];
    let mut acc = 0i128;
    for t in 0..times.len() {
        acc += diff[t];
        live[t] = acc.max(0) as u64;
    }
    // Range max over `live` per buffer with a sparse table would be faster; a per-buffer scan
    // is linear in its length, fine for the sizes this runs on.
    let mut keyed: Vec<([u128; 3], usize)> = (0..n)
        .map(|i| {
            let mut key = [0u128; 3];
            for (k, &c) in heuristic.iter().enumerate().take(3) {
                key[k] = match c {
                    b'T' => 0,
                    b'Z' => p.size[i] as u128,
                    b'A' => p.size[i] as u128 * (p.upper[i] - p.lower[i]) as u128,
                    _ => (p.upper[i] - p.lower[i]) as u128,
                };
            }
            (key, i)
        })
        .collect();
    if heuristic.contains(&b'T') {
        let table = SparseMax::new(&live);
        for (key, i) in keyed.iter_mut() {
            let t = table.query(lo[*i], hi[*i]) as u128;
            for (k, &c) in heuristic.iter().enumerate().take(3) {
                if c == b'T' {
                    key[k] = t;
                }
            }
        }
    }
    keyed.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut rank = vec![0u32; n];
    for (r, &(_, i)) in keyed.iter().enumerate() {
        rank[i] = r as u32;
    }
    let mut sky = Skyline::new(times.len());
    // Buffers with the same range and alignment always have the same minimum offset, so
    // only the lowest-ranked unplaced one of each such group can be next: the heap holds one
    // entry per group. Without this, k tiny buffers sharing one time step re-key each other
    // k^2/2 times (Y_1 has a step with about 6000: 36M heap operations).
    let mut members: Vec<usize> = (0..n).collect();
    members.sort_unstable_by_key(|&i| (lo[i], hi[i], p.align[i], rank[i]));
    let mut group_end: Vec<usize> = Vec::new();
    let mut group_start: Vec<usize> = Vec::new();
    for k in 0..n {
        let (i, prev) = (members[k], if k > 0 { Some(members[k - 1]) } else { None });
        if prev.is_none_or(|j| (lo[j], hi[j], p.align[j]) != (lo[i], hi[i], p.align[i])) {
            group_start.push(k);
            group_end.push(k);
        }
        if let Some(e) = group_end.last_mut() {
            *e = k + 1;
        }
    }
    let mut cursor = group_start.clone();
    // Keys packed as (offset, rank, group) in one u128: cheaper to compare than a tuple.
    let pack = |off: u64, r: u32, g: usize| (off as u128) << 64 | (r as u128) << 32 | g as u128;
    let mut heap: BinaryHeap<Reverse<u128>> = (0..group_start.len())
        .map(|g| Reverse(pack(0, rank[members[group_start[g]]], g)))
        .collect();
    let mut offsets = vec![0u64; n];
    let mut pops: u64 = 0;
    while let Some(mut top) = heap.peek_mut() {
        pops += 1;
        if pops % 4096 == 0 && Instant::now() >= deadline {
            return None;
        }
        let Reverse(packed) = *top;
        let (mut key, g) = ((packed >> 64) as u64, packed as u32 as usize);
        let i = members[cursor[g]];
        if p.size[i] > 0 {
            let off = align_up(sky.query(lo[i], hi[i]), p.align[i]);
            if off > key {
                // Stale key: the skyline rose under this group since it was pushed. Updating
                // the top in place sifts it down once instead of a pop and a push.
                *top = Reverse(pack(off, rank[i], g));
                continue;
            }
            offsets[i] = off;
            key = off + p.size[i];
            sky.raise(lo[i], hi[i], key);
        }
        cursor[g] += 1;
        if cursor[g] < group_end[g] {
            *top = Reverse(pack(key, rank[members[cursor[g]]], g));
        } else {
            std::collections::binary_heap::PeekMut::pop(top);
        }
    }
    log::debug!("dive: {pops} pops for {n} buffers");
    Some(offsets)
}

/// Sparse table for range maximum queries in O(1).
struct SparseMax {
    levels: Vec<Vec<u64>>,
}

impl SparseMax {
    fn new(v: &[u64]) -> SparseMax {
        let mut levels = vec![v.to_vec()];
        let mut w = 1;
        while 2 * w <= v.len() {
            let prev = &levels[levels.len() - 1];
            let next: Vec<u64> = (0..=v.len() - 2 * w)
                .map(|i| prev[i].max(prev[i + w]))
                .collect();
            levels.push(next);
            w *= 2;
        }
        SparseMax { levels }
    }

    /// Max over `[lo, hi)`, `lo < hi`.
    fn query(&self, lo: usize, hi: usize) -> u64 {
        let len = hi - lo;
        let k = (usize::BITS - 1 - len.leading_zeros()) as usize;
        self.levels[k][lo].max(self.levels[k][hi - (1 << k)])
    }
}
