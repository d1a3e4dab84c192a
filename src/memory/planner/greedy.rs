//! Greedy placement with best fit: buffers in a fixed order, each into the tightest address
//! gap left free by the already placed buffers that overlap it in time (DESIGN.md §6 baseline).
//!
//! Finding the overlapping placed buffers is the cost: a time-bucket index keeps it near the
//! number of real overlaps, so 60k-buffer instances take about a second per order.

use super::{align_up, height_of, Problem};
use web_time::Instant;

/// Time-compressed view of a problem and a bucket index over placed buffers.
pub(crate) struct Index {
    /// Compressed `[lo, hi)` of each buffer.
    pub lo: Vec<u32>,
    pub hi: Vec<u32>,
    width: u32,
    buckets: Vec<Vec<u32>>,
    stamp: Vec<u32>,
    epoch: u32,
}

impl Index {
    pub fn new(p: &Problem) -> Index {
        let mut times: Vec<u64> = p.lower.iter().chain(p.upper.iter()).copied().collect();
        times.sort_unstable();
        times.dedup();
        let pos = |t: u64| times.partition_point(|&x| x < t) as u32;
        let lo: Vec<u32> = p.lower.iter().map(|&t| pos(t)).collect();
        let hi: Vec<u32> = p.upper.iter().map(|&t| pos(t)).collect();
        let span = times.len().max(1) as u32;
        // About 1024 buckets: long-lived buffers are entered in every bucket they span, so more
        // buckets cost memory; fewer make each query scan more non-overlapping buffers.
        let width = span.div_ceil(1024).max(1);
        let nb = span.div_ceil(width) as usize;
        Index {
            lo,
            hi,
            width,
            buckets: vec![Vec::new(); nb.max(1)],
            stamp: vec![0; p.len()],
            epoch: 0,
        }
    }

    pub fn clear(&mut self) {
        for b in &mut self.buckets {
            b.clear();
        }
    }

    pub fn insert(&mut self, i: usize) {
        let (a, b) = (self.lo[i] / self.width, (self.hi[i] - 1) / self.width);
        for k in a..=b {
            self.buckets[k as usize].push(i as u32);
        }
    }

    /// Calls `f` once for every inserted buffer overlapping buffer `i` in time.
    pub fn for_each_overlap(&mut self, i: usize, mut f: impl FnMut(usize)) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.stamp.iter_mut().for_each(|s| *s = 0);
            self.epoch = 1;
        }
        let (lo, hi) = (self.lo[i], self.hi[i]);
        let (a, b) = (lo / self.width, (hi - 1) / self.width);
        for k in a..=b {
            for &j in &self.buckets[k as usize] {
                let j = j as usize;
                if self.stamp[j] == self.epoch {
                    continue;
                }
                self.stamp[j] = self.epoch;
                if self.lo[j] < hi && lo < self.hi[j] {
                    f(j);
                }
            }
        }
    }
}

/// Places buffers in `order`, each into the smallest gap that holds it (lowest on ties),
/// or on top when no gap does. Returns offsets indexed by buffer.
pub(crate) fn best_fit(p: &Problem, index: &mut Index, order: &[usize]) -> Vec<u64> {
    index.clear();
    let mut offsets = vec![0u64; p.len()];
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for &i in order {
        spans.clear();
        index.for_each_overlap(i, |j| {
            if p.size[j] > 0 {
                spans.push((offsets[j], offsets[j] + p.size[j]));
            }
        });
        spans.sort_unstable();
        let (size, align) = (p.size[i], p.align[i]);
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        let mut cur = 0u64;
        for &(o, e) in &spans {
            if o > cur {
                let start = align_up(cur, align);
                if start.saturating_add(size) <= o {
                    let gap = o - cur;
                    if best.is_none_or(|(g, _)| gap < g) {
                        best = Some((gap, start));
                    }
                }
            }
            cur = cur.max(e);
        }
        offsets[i] = match best {
            Some((_, off)) => off,
            None => align_up(cur, align),
        };
        index.insert(i);
    }
    offsets
}

/// The orders tried: the literature's greedy-by-size plus orders that help on real models.
fn orders(p: &Problem, index: &Index) -> Vec<Vec<usize>> {
    let n = p.len();
    let dur = |i: usize| (index.hi[i] - index.lo[i]) as u64;
    let mut out = Vec::new();
    let mut by_size: Vec<usize> = (0..n).collect();
    by_size.sort_by(|&a, &b| {
        p.size[b]
            .cmp(&p.size[a])
            .then(dur(b).cmp(&dur(a)))
            .then(p.lower[a].cmp(&p.lower[b]))
            .then(a.cmp(&b))
    });
    out.push(by_size);
    let mut by_area: Vec<usize> = (0..n).collect();
    by_area.sort_by(|&a, &b| {
        (p.size[b] as u128 * dur(b) as u128)
            .cmp(&(p.size[a] as u128 * dur(a) as u128))
            .then(p.size[b].cmp(&p.size[a]))
            .then(a.cmp(&b))
    });
    out.push(by_area);
    let mut by_dur: Vec<usize> = (0..n).collect();
    by_dur.sort_by(|&a, &b| {
        dur(b)
            .cmp(&dur(a))
            .then(p.size[b].cmp(&p.size[a]))
            .then(a.cmp(&b))
    });
    out.push(by_dur);
    let mut by_lower: Vec<usize> = (0..n).collect();
    by_lower.sort_by(|&a, &b| {
        p.lower[a]
            .cmp(&p.lower[b])
            .then(p.size[b].cmp(&p.size[a]))
            .then(a.cmp(&b))
    });
    out.push(by_lower);
    out
}

/// Best fit over several orders; stops trying new orders once `deadline` passed (the first
/// always runs). Returns the lowest offsets and how many orders ran.
pub(crate) fn best_of_orders(p: &Problem, deadline: Instant) -> (Vec<u64>, usize) {
    let mut index = Index::new(p);
    let mut best: Option<(u64, Vec<u64>)> = None;
    let mut ran = 0;
    for order in orders(p, &index) {
        if ran > 0 && Instant::now() >= deadline {
            break;
        }
        let offsets = best_fit(p, &mut index, &order);
        ran += 1;
        let h = height_of(p, &offsets);
        if best.as_ref().is_none_or(|(bh, _)| h < *bh) {
            best = Some((h, offsets));
        }
    }
    (best.map(|b| b.1).unwrap_or_default(), ran)
}
