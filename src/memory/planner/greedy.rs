//! Greedy placement with best fit: buffers in a fixed order, each into the tightest address
//! gap left free by the already placed buffers that overlap it in time (docs/design.md).
//!
//! Finding what the already placed buffers occupy during a new buffer's lifetime is the cost.
//! Enumerating the time-overlapping buffers one by one costs the number of overlapping pairs
//! (about 1.8e8 on fixtures/planner's 62k-buffer `Y_1`), so the [`Index`] keeps, per
//! segment-tree node over time, the *union* of the address ranges placed there, merged into
//! runs; a query merges a few dozen short sorted run lists instead.

use super::{align_up, height_of, Problem};
use web_time::Instant;

/// The union of address ranges inserted so far: sorted, disjoint runs `[start, end)`, with
/// touching runs merged (insert only; the greedy never frees).
#[derive(Debug, Default, Clone)]
struct Runs(Vec<(u64, u64)>);

impl Runs {
    fn insert(&mut self, start: u64, end: u64) {
        let v = &mut self.0;
        // Runs ending before `start` stay; runs starting after `end` stay; those between
        // (touching included) merge with the new range.
        let a = v.partition_point(|r| r.1 < start);
        let b = v.partition_point(|r| r.0 <= end);
        if a == b {
            v.insert(a, (start, end));
        } else {
            v[a] = (v[a].0.min(start), v[b - 1].1.max(end));
            v.drain(a + 1..b);
        }
    }
}

/// Time-compressed view of a problem and an index of the address space occupied by placed
/// buffers over any time range.
///
/// A segment tree over compressed time: every placed buffer's `[offset, offset + size)` joins
/// `cover` of its canonical nodes (the node's whole time range lies inside the buffer's
/// lifetime) and `inside` of its canonical nodes and their ancestors (the buffer lives during
/// part of the node's range). The address space used during `[lo, hi)` is then exactly the
/// union of `inside` of the query's canonical nodes and `cover` of their ancestors, which all
/// lie on the paths from the leaves `lo` and `hi - 1` to the root: a placed buffer meeting the
/// query meets one canonical node C; one of its own canonical nodes D shares a point with C, so
/// D is C or below it (the buffer is in `inside[C]`) or an ancestor of C that it covers (the
/// buffer is in `cover[D]`). Conversely every buffer read there lives during the query.
pub(crate) struct Index {
    /// Compressed `[lo, hi)` of each buffer.
    pub lo: Vec<u32>,
    pub hi: Vec<u32>,
    leaves: usize,
    cover: Vec<Runs>,
    inside: Vec<Runs>,
    /// Nodes with runs, so `clear` costs what was inserted.
    touched: Vec<u32>,
    /// Node lists reused by `insert`.
    scratch: (Vec<usize>, Vec<usize>),
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
            cover: vec![Runs::default(); 2 * leaves],
            inside: vec![Runs::default(); 2 * leaves],
            touched: Vec::new(),
            scratch: Default::default(),
        }
    }

    pub fn clear(&mut self) {
        for &k in &self.touched {
            self.cover[k as usize].0.clear();
            self.inside[k as usize].0.clear();
        }
        self.touched.clear();
    }

    /// Calls `f(node, true)` on every canonical node of buffer `i`'s range, then
    /// `f(node, false)` on every strict ancestor of them: the nodes on the paths from its
    /// first and last leaf to the root whose range is not inside the buffer's (each once).
    fn walk(&self, i: usize, mut f: impl FnMut(usize, bool)) {
        let (lo, hi) = (self.lo[i] as usize, self.hi[i] as usize);
        let (mut l, mut r) = (lo + self.leaves, hi + self.leaves);
        while l < r {
            if l & 1 == 1 {
                f(l, true);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                f(r, true);
            }
            l /= 2;
            r /= 2;
        }
        // A node at a level of `width` leaves starts at (node - first node of the level) * width.
        let (mut a, mut b) = (lo + self.leaves, hi - 1 + self.leaves);
        let mut width = 1;
        let outside = |node: usize, width: usize| {
            let start = (node - self.leaves / width) * width;
            start < lo || start + width > hi
        };
        while a >= 1 {
            if outside(a, width) {
                f(a, false);
            }
            if b != a && outside(b, width) {
                f(b, false);
            }
            a /= 2;
            b /= 2;
            width *= 2;
        }
    }

    /// Records buffer `i` at `[offset, offset + size)`; zero-size buffers occupy nothing.
    pub fn insert(&mut self, i: usize, offset: u64, size: u64) {
        if size == 0 {
            return;
        }
        let end = offset + size;
        let (mut canonical, mut path) = std::mem::take(&mut self.scratch);
        canonical.clear();
        path.clear();
        self.walk(i, |k, c| if c { canonical.push(k) } else { path.push(k) });
        for &k in canonical.iter().chain(path.iter()) {
            if self.inside[k].0.is_empty() {
                self.touched.push(k as u32);
            }
            self.inside[k].insert(offset, end);
        }
        for &k in &canonical {
            self.cover[k].insert(offset, end);
        }
        self.scratch = (canonical, path);
    }

    /// Calls `f(start, end)` for every free address gap `[start, end)` below the top of the
    /// space used by the inserted buffers that overlap buffer `i` in time, lowest first, and
    /// returns that top (0 when none overlaps).
    pub fn for_each_gap(
        &self,
        i: usize,
        scratch: &mut GapScratch,
        mut f: impl FnMut(u64, u64),
    ) -> u64 {
        let GapScratch { runs, next, bounds } = scratch;
        runs.clear();
        bounds.clear();
        bounds.push(0);
        self.walk(i, |k, canonical| {
            let node = if canonical {
                &self.inside[k]
            } else {
                &self.cover[k]
            };
            if !node.0.is_empty() {
                runs.extend_from_slice(&node.0);
                bounds.push(runs.len());
            }
        });
        // Each node's list is sorted: merge them pairwise, uniting touching runs as they meet
        // (measured on fixtures/planner's Y_1: faster than one sort of the concatenation,
        // which is itself faster than a heap of the lists' heads).
        while bounds.len() > 2 {
            next.clear();
            let mut merged_bounds = 0;
            let mut k = 0;
            while k + 1 < bounds.len() {
                let a = &runs[bounds[k]..bounds[k + 1]];
                let b = if k + 2 < bounds.len() {
                    &runs[bounds[k + 1]..bounds[k + 2]]
                } else {
                    &[]
                };
                union_into(a, b, next);
                bounds[merged_bounds + 1] = next.len();
                merged_bounds += 1;
                k += 2;
            }
            bounds.truncate(merged_bounds + 1);
            std::mem::swap(runs, next);
        }
        let mut top = 0u64;
        for &(start, end) in runs.iter() {
            if start > top {
                f(top, start);
            }
            top = top.max(end);
        }
        top
    }
}

/// Appends to `out` the union of two sorted lists of disjoint runs, as sorted disjoint runs
/// with touching ones joined.
fn union_into(a: &[(u64, u64)], b: &[(u64, u64)], out: &mut Vec<(u64, u64)>) {
    let (mut x, mut y) = (0, 0);
    let mut next = || {
        if x < a.len() && (y >= b.len() || a[x].0 <= b[y].0) {
            x += 1;
            Some(a[x - 1])
        } else if y < b.len() {
            y += 1;
            Some(b[y - 1])
        } else {
            None
        }
    };
    let Some((mut start, mut end)) = next() else {
        return;
    };
    while let Some((s, e)) = next() {
        if s <= end {
            end = end.max(e);
        } else {
            out.push((start, end));
            (start, end) = (s, e);
        }
    }
    out.push((start, end));
}

/// Buffers reused by [`Index::for_each_gap`].
#[derive(Default)]
pub(crate) struct GapScratch {
    runs: Vec<(u64, u64)>,
    next: Vec<(u64, u64)>,
    /// Where each sorted list in `runs` starts (and, last, where the last one ends).
    bounds: Vec<usize>,
}

/// Places buffers in `order`, each into the smallest gap that holds it (lowest on ties; with
/// `first_fit` the lowest gap), or on top when no gap does. Returns offsets indexed by buffer,
/// `None` when `deadline` passed first (`None`: run to completion).
pub(crate) fn best_fit(
    p: &Problem,
    index: &mut Index,
    order: &[usize],
    first_fit: bool,
    deadline: Option<Instant>,
) -> Option<Vec<u64>> {
    index.clear();
    let mut offsets = vec![0u64; p.len()];
    let mut scratch = GapScratch::default();
    for (k, &i) in order.iter().enumerate() {
        // The clock is read every 256 placements, a small slice of CPU even on
        // fixtures/planner's largest instance: a cut phase overruns by little.
        if k % 256 == 255 && deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        let (size, align) = (p.size[i], p.align[i]);
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        let top = index.for_each_gap(i, &mut scratch, |lo, hi| {
            let start = align_up(lo, align);
            if start.saturating_add(size) <= hi {
                // First fit ranks every gap equal, so the lowest wins.
                let gap = if first_fit { 0 } else { hi - lo };
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, start));
                }
            }
        });
        offsets[i] = match best {
            Some((_, off)) => off,
            None => align_up(top, align),
        };
        index.insert(i, offsets[i], p.size[i]);
    }
    Some(offsets)
}

/// Number of orders [`order`] knows.
pub(crate) const ORDERS: usize = 6;

/// The `k`-th order tried (and whether it places first fit instead of best fit), most useful
/// first (measured on the real-model instances): by size (ties: earlier start first; the
/// baseline), by lifetime length, by size (ties: longer first), by area, by size with first
/// fit (the literature's greedy baseline), by start time.
fn order(p: &Problem, index: &Index, k: usize) -> (Vec<usize>, bool) {
    let dur = |i: usize| (index.hi[i] - index.lo[i]) as u64;
    let mut order: Vec<usize> = (0..p.len()).collect();
    match k {
        0 => order.sort_by(|&a, &b| {
            p.size[b]
                .cmp(&p.size[a])
                .then(p.lower[a].cmp(&p.lower[b]))
                .then(a.cmp(&b))
        }),
        1 => order.sort_by(|&a, &b| {
            dur(b)
                .cmp(&dur(a))
                .then(p.size[b].cmp(&p.size[a]))
                .then(a.cmp(&b))
        }),
        2 | 4 => order.sort_by(|&a, &b| {
            p.size[b]
                .cmp(&p.size[a])
                .then(dur(b).cmp(&dur(a)))
                .then(p.lower[a].cmp(&p.lower[b]))
                .then(a.cmp(&b))
        }),
        3 => order.sort_by(|&a, &b| {
            (p.size[b] as u128 * dur(b) as u128)
                .cmp(&(p.size[a] as u128 * dur(a) as u128))
                .then(p.size[b].cmp(&p.size[a]))
                .then(a.cmp(&b))
        }),
        _ => order.sort_by(|&a, &b| {
            p.lower[a]
                .cmp(&p.lower[b])
                .then(p.size[b].cmp(&p.size[a]))
                .then(a.cmp(&b))
        }),
    }
    (order, k == 4)
}

/// Greedy best fit over the orders of [`order`], one order per call, sharing one index.
pub(crate) struct Greedy<'a> {
    p: &'a Problem,
    index: Index,
}

impl<'a> Greedy<'a> {
    pub fn new(p: &'a Problem) -> Greedy<'a> {
        Greedy {
            p,
            index: Index::new(p),
        }
    }

    /// Places every buffer in order `k` (`k < ORDERS`; 0 is the baseline); `None` when
    /// `deadline` passed first (`None`: run to completion).
    pub fn run(&mut self, k: usize, deadline: Option<Instant>) -> Option<Vec<u64>> {
        let (order, first_fit) = order(self.p, &self.index, k);
        let offsets = best_fit(self.p, &mut self.index, &order, first_fit, deadline)?;
        log::debug!(
            "greedy order {}: height {}",
            k + 1,
            height_of(self.p, &offsets)
        );
        Some(offsets)
    }
}

/// Compaction: re-places every buffer, in ascending order of its current offset, at the
/// lowest address free of the already re-placed ones. No offset rises (a buffer's old place
/// stays free: everything re-placed before it was below it and only moved down), so the
/// height never grows; gaps under buffers close. `None` when `deadline` passed first.
pub(crate) fn compact(p: &Problem, offsets: &[u64], deadline: Instant) -> Option<Vec<u64>> {
    let mut index = Index::new(p);
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by_key(|&i| (offsets[i], i));
    best_fit(p, &mut index, &order, true, Some(deadline))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// Best fit with the placed overlapping buffers found by scanning all of them: the
    /// definition the index must reproduce exactly.
    fn best_fit_by_scan(p: &Problem, order: &[usize], first_fit: bool) -> Vec<u64> {
        let mut offsets = vec![0u64; p.len()];
        let mut placed: Vec<usize> = Vec::new();
        for &i in order {
            let mut spans: Vec<(u64, u64)> = placed
                .iter()
                .filter(|&&j| p.size[j] > 0 && p.lower[j] < p.upper[i] && p.lower[i] < p.upper[j])
                .map(|&j| (offsets[j], offsets[j] + p.size[j]))
                .collect();
            spans.sort_unstable();
            let (size, align) = (p.size[i], p.align[i]);
            let mut best: Option<(u64, u64)> = None;
            let mut cur = 0u64;
            for &(o, e) in &spans {
                if o > cur {
                    let start = align_up(cur, align);
                    if start + size <= o {
                        let gap = if first_fit { 0 } else { o - cur };
                        if best.is_none_or(|(g, _)| gap < g) {
                            best = Some((gap, start));
                        }
                    }
                }
                cur = cur.max(e);
            }
            offsets[i] = best.map_or(align_up(cur, align), |b| b.1);
            placed.push(i);
        }
        offsets
    }

    fn random_problem(rng: &mut SplitMix64, n: usize, horizon: u64) -> Problem {
        let mut p = Problem {
            lower: Vec::new(),
            upper: Vec::new(),
            size: Vec::new(),
            align: Vec::new(),
        };
        for _ in 0..n {
            let lower = rng.range(0, horizon);
            // Mostly short lifetimes, some spanning most of the horizon (like real traces).
            let len = if rng.range(0, 8) == 0 {
                rng.range(1, horizon + 1)
            } else {
                rng.range(1, 6)
            };
            p.lower.push(lower);
            p.upper.push(lower + len);
            // A few sizes repeat (touching runs merge), some zero.
            p.size
                .push([0, 8, 16, 24, 100, 256][rng.range(0, 6) as usize] * rng.range(1, 4));
            p.align.push([1, 1, 4, 64][rng.range(0, 4) as usize]);
        }
        p
    }

    #[test]
    fn index_gives_the_offsets_of_a_full_scan() {
        let mut rng = SplitMix64::new(11);
        let mut checked = 0;
        for case in 0..60 {
            let n = 1 + (case * 7) % 300;
            let p = random_problem(&mut rng, n, 1 + (case as u64 * 13) % 120);
            let mut greedy = Greedy::new(&p);
            for k in 0..ORDERS {
                let (order, first_fit) = order(&p, &greedy.index, k);
                let want = best_fit_by_scan(&p, &order, first_fit);
                let got = greedy.run(k, None).expect("no deadline");
                assert_eq!(got, want, "case {case}, order {k}");
                checked += 1;
            }
        }
        assert_eq!(checked, 60 * ORDERS);
    }

    #[test]
    fn runs_unite_touching_and_overlapping_ranges() {
        let mut r = Runs::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(0, 5);
        assert_eq!(r.0, [(0, 5), (10, 20), (30, 40)]);
        r.insert(20, 25); // touches the run before it
        assert_eq!(r.0, [(0, 5), (10, 25), (30, 40)]);
        r.insert(4, 31); // swallows two runs and meets the last
        assert_eq!(r.0, [(0, 40)]);
        r.insert(50, 60);
        r.insert(45, 46);
        assert_eq!(r.0, [(0, 40), (45, 46), (50, 60)]);
    }

    #[test]
    fn union_of_sorted_lists() {
        let mut out = Vec::new();
        union_into(
            &[(0, 2), (5, 7), (9, 10)],
            &[(1, 3), (3, 4), (7, 8)],
            &mut out,
        );
        assert_eq!(out, [(0, 4), (5, 8), (9, 10)]);
        out.clear();
        union_into(&[], &[(1, 2)], &mut out);
        assert_eq!(out, [(1, 2)]);
    }
}
