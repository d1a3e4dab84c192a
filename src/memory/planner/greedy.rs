//! Greedy placement with best fit: buffers in a fixed order, each into the tightest address
//! gap left free by the already placed buffers that overlap it in time (DESIGN.md §6 baseline).
//!
//! Finding the overlapping placed buffers is the cost: a time-bucket index keeps it near the
//! number of real overlaps, so 60k-buffer instances take about a second per order.

use super::{align_up, height_of, Problem};
use web_time::Instant;

/// Time-compressed view of a problem and an index over placed buffers that reports each
/// buffer overlapping a query exactly once: a placed interval overlaps `[lo, hi)` iff it
/// contains `lo` (a stabbing query on a segment tree, O(log T) nodes) or starts inside
/// `(lo, hi)` (a range of an ordered set of starts). The work is O(log n + overlaps).
pub(crate) struct Index {
    /// Compressed `[lo, hi)` of each buffer.
    pub lo: Vec<u32>,
    pub hi: Vec<u32>,
    leaves: usize,
    /// Segment tree over compressed time: each placed interval sits in its canonical nodes.
    nodes: Vec<Vec<u32>>,
    starts: std::collections::BTreeSet<(u32, u32)>,
}

impl Index {
    pub fn new(p: &Problem) -> Index {
        let mut times: Vec<u64> = p.lower.iter().chain(p.upper.iter()).copied().collect();
        times.sort_unstable();
        times.dedup();
        let pos = |t: u64| times.partition_point(|&x| x < t) as u32;
        let lo: Vec<u32> = p.lower.iter().map(|&t| pos(t)).collect();
        let hi: Vec<u32> = p.upper.iter().map(|&t| pos(t)).collect();
        let leaves = times.len().max(1).next_power_of_two();
        Index {
            lo,
            hi,
            leaves,
            nodes: vec![Vec::new(); 2 * leaves],
            starts: Default::default(),
        }
    }

    pub fn clear(&mut self) {
        for n in &mut self.nodes {
            n.clear();
        }
        self.starts.clear();
    }

    pub fn insert(&mut self, i: usize) {
        let (mut l, mut r) = (
            self.lo[i] as usize + self.leaves,
            self.hi[i] as usize + self.leaves,
        );
        while l < r {
            if l & 1 == 1 {
                self.nodes[l].push(i as u32);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.nodes[r].push(i as u32);
            }
            l /= 2;
            r /= 2;
        }
        self.starts.insert((self.lo[i], i as u32));
    }

    /// Calls `f` once for every inserted buffer overlapping buffer `i` in time.
    pub fn for_each_overlap(&self, i: usize, mut f: impl FnMut(usize)) {
        let (lo, hi) = (self.lo[i], self.hi[i]);
        let mut k = lo as usize + self.leaves;
        while k >= 1 {
            for &j in &self.nodes[k] {
                f(j as usize);
            }
            k /= 2;
        }
        for &(_, j) in self.starts.range((lo + 1, 0)..(hi, 0)) {
            f(j as usize);
        }
    }
}

/// Places buffers in `order`, each into the smallest gap that holds it (lowest on ties),
/// or on top when no gap does. Returns offsets indexed by buffer.
pub(crate) fn best_fit(
    p: &Problem,
    index: &mut Index,
    order: &[usize],
    first_fit: bool,
    deadline: Instant,
) -> Option<Vec<u64>> {
    index.clear();
    let mut offsets = vec![0u64; p.len()];
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        if k % 1024 == 1023 && Instant::now() >= deadline {
            return None;
        }
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
                    // First fit ranks every gap equal, so the lowest wins.
                    let gap = if first_fit { 0 } else { o - cur };
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
    Some(offsets)
}

/// The orders tried, most useful first (measured on the real-model instances): by size (ties:
/// earlier start first), by lifetime length, by size (ties: longer first), by area, by size
/// with first fit (the literature's greedy baseline), by start time.
fn orders(p: &Problem, index: &Index) -> Vec<(Vec<usize>, bool)> {
    let n = p.len();
    let dur = |i: usize| (index.hi[i] - index.lo[i]) as u64;
    let mut out = Vec::new();
    let mut by_size_lower: Vec<usize> = (0..n).collect();
    by_size_lower.sort_by(|&a, &b| {
        p.size[b]
            .cmp(&p.size[a])
            .then(p.lower[a].cmp(&p.lower[b]))
            .then(a.cmp(&b))
    });
    out.push((by_size_lower, false));
    let mut by_dur: Vec<usize> = (0..n).collect();
    by_dur.sort_by(|&a, &b| {
        dur(b)
            .cmp(&dur(a))
            .then(p.size[b].cmp(&p.size[a]))
            .then(a.cmp(&b))
    });
    out.push((by_dur, false));
    let mut by_size: Vec<usize> = (0..n).collect();
    by_size.sort_by(|&a, &b| {
        p.size[b]
            .cmp(&p.size[a])
            .then(dur(b).cmp(&dur(a)))
            .then(p.lower[a].cmp(&p.lower[b]))
            .then(a.cmp(&b))
    });
    out.push((by_size.clone(), false));
    let mut by_area: Vec<usize> = (0..n).collect();
    by_area.sort_by(|&a, &b| {
        (p.size[b] as u128 * dur(b) as u128)
            .cmp(&(p.size[a] as u128 * dur(a) as u128))
            .then(p.size[b].cmp(&p.size[a]))
            .then(a.cmp(&b))
    });
    out.push((by_area, false));
    out.push((by_size, true));
    let mut by_lower: Vec<usize> = (0..n).collect();
    by_lower.sort_by(|&a, &b| {
        p.lower[a]
            .cmp(&p.lower[b])
            .then(p.size[b].cmp(&p.size[a]))
            .then(a.cmp(&b))
    });
    out.push((by_lower, false));
    out
}

/// Best fit over several orders until `deadline` (an order cut short by it is dropped; with
/// `force_first` the first order always completes). Returns the lowest offsets and how many
/// orders ran, `None` when no order completed.
pub(crate) fn best_of_orders(
    p: &Problem,
    deadline: Instant,
    force_first: bool,
) -> Option<(Vec<u64>, usize)> {
    let mut index = Index::new(p);
    let mut best: Option<(u64, Vec<u64>)> = None;
    let mut ran = 0;
    for (order, first_fit) in orders(p, &index) {
        let limit = if ran == 0 && force_first {
            Instant::now() + std::time::Duration::from_secs(3600)
        } else {
            deadline
        };
        let Some(offsets) = best_fit(p, &mut index, &order, first_fit, limit) else {
            break;
        };
        ran += 1;
        let h = height_of(p, &offsets);
        log::debug!("greedy order {ran}: height {h}");
        if best.as_ref().is_none_or(|(bh, _)| h < *bh) {
            best = Some((h, offsets));
        }
    }
    best.map(|b| (b.1, ran))
}

/// Compaction: re-places every buffer, in ascending order of its current offset, at the
/// lowest address free of the already re-placed ones. No offset rises (a buffer's old place
/// stays free: everything re-placed before it was below it and only moved down), so the
/// height never grows; gaps under buffers close. `None` when `deadline` passed first.
pub(crate) fn compact(p: &Problem, offsets: &[u64], deadline: Instant) -> Option<Vec<u64>> {
    let mut index = Index::new(p);
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by_key(|&i| (offsets[i], i));
    best_fit(p, &mut index, &order, true, deadline)
}
