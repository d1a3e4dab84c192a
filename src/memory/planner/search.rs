//! Depth-first search over canonical placements, in the spirit of MiniMalloc
//! (Moffitt, "MiniMalloc: A Lightweight Memory Allocator for Hardware-Accelerated Machine
//! Learning", ASPLOS 2023). Written from the paper's ideas:
//!
//! - *canonical solutions*: every buffer sits at the lowest offset its already placed
//!   time-neighbours allow (the max of their ends), and buffers are placed in non-decreasing
//!   offset order (ties by a static preorder), so each solution is enumerated once;
//! - *dynamic ordering*: the candidates at a node are the unplaced buffers sorted by their
//!   minimum offset; *dominance*: a buffer whose offset is at or above the lowest top of
//!   another candidate would leave a gap that candidate could fill first, so it is skipped;
//! - *sections* (maximal cliques of the interval graph): for each, the floor (the lowest offset
//!   still usable there) plus the unplaced sizes live in it must fit the capacity, which prunes
//!   most dead ends early;
//! - *decomposition*: when no unplaced buffer crosses a section boundary, the two sides are
//!   independent and are solved one after the other.
//!
//! The search answers "does a plan fit in capacity C"; [`minimise`] drives it over capacities
//! between the lower bound and the best heuristic height. A round robin over a few preorders
//! with a doubling node limit keeps one unlucky order from eating the time budget.
//!
//! For instances too large for per-node sorting, [`dive`] runs the first path of the search
//! only (the "skyline" placement), with a segment tree and a lazy heap: O(n log n).

use super::{align_up, height_of, Problem};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use web_time::Instant;

/// Above this many buffers the full search is not attempted: the per-node work is linear in
/// the buffers, and the recursion goes one level (about 300-600 bytes of stack) per placed
/// buffer, so 2000 buffers stay near 1 MiB, well inside a 2 MiB test thread's stack.
pub(crate) const MAX_SEARCH_BUFFERS: usize = 2000;

const NONE: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Found,
    NotFound,
    Aborted,
    Timeout,
}

/// Result of a feasibility question.
pub(crate) enum Fit {
    Found(Vec<u64>),
    Infeasible,
    Unknown,
}

struct Sections {
    /// Buffers live in each section.
    members: Vec<Vec<u32>>,
    /// Section range `[sec_lo, sec_hi)` of each buffer.
    sec_lo: Vec<u32>,
    sec_hi: Vec<u32>,
}

/// Cross sections: one per distinct end time, holding the buffers live just before it (as
/// MiniMalloc's sweep does). Besides the maximal cliques this keeps their sub-cliques, whose
/// floors can be higher and so prune more. Zero-size buffers are left out (they occupy no
/// addresses).
fn sections(p: &Problem, active: &[bool]) -> Sections {
    let n = p.len();
    let mut events: Vec<(u64, bool, u32)> = Vec::with_capacity(2 * n);
    for i in 0..n {
        if active[i] {
            events.push((p.lower[i], true, i as u32));
            events.push((p.upper[i], false, i as u32));
        }
    }
    events.sort_unstable_by_key(|&(t, start, i)| (t, start, i));
    let mut members = Vec::new();
    let mut sec_lo = vec![0u32; n];
    let mut sec_hi = vec![0u32; n];
    let mut live: Vec<u32> = Vec::new();
    let mut pos: Vec<usize> = vec![usize::MAX; n];
    let mut last_time: Option<u64> = None;
    for (t, start, i) in events {
        if start {
            pos[i as usize] = live.len();
            live.push(i);
            sec_lo[i as usize] = members.len() as u32;
        } else {
            if last_time != Some(t) {
                last_time = Some(t);
                members.push(live.clone());
            }
            sec_hi[i as usize] = members.len() as u32;
            let k = pos[i as usize];
            live.swap_remove(k);
            if k < live.len() {
                pos[live[k] as usize] = k;
            }
        }
    }
    Sections {
        members,
        sec_lo,
        sec_hi,
    }
}

struct Partition {
    buffers: Vec<u32>,
    sec_lo: u32,
    sec_hi: u32,
}

struct Solver<'a> {
    p: &'a Problem,
    capacity: u64,
    sec: Sections,
    overlaps: Vec<Vec<u32>>,
    floor: Vec<u64>,
    total: Vec<u64>,
    cuts: Vec<u32>,
    min_off: Vec<u64>,
    assigned: Vec<u64>,
    solution: Vec<u64>,
    nodes_left: u64,
    nodes: u64,
    deadline: Instant,
    heuristic: &'static [u8],
    affected_mark: Vec<u32>,
    affected_epoch: u32,
    affected: Vec<u32>,
    /// Undo logs: (buffer, previous minimum offset) and (section, previous floor).
    offset_log: Vec<(u32, u64)>,
    section_log: Vec<(u32, u64)>,
}

/// Preorders tried in round robin (MiniMalloc's defaults: T = largest section total the buffer
/// is in, A = area, W = width of the lifetime, Z = size; each descending).
const HEURISTICS: [&[u8]; 3] = [b"WAT", b"TAW", b"TWA"];

impl<'a> Solver<'a> {
    fn new(p: &'a Problem, capacity: u64, deadline: Instant) -> Solver<'a> {
        let n = p.len();
        let active: Vec<bool> = (0..n).map(|i| p.size[i] > 0).collect();
        let sec = sections(p, &active);
        let ns = sec.members.len();
        let mut total = vec![0u64; ns];
        for (s, m) in sec.members.iter().enumerate() {
            total[s] = m.iter().map(|&b| p.size[b as usize]).sum();
        }
        let mut cuts = vec![0u32; ns.saturating_sub(1)];
        for i in 0..n {
            if active[i] {
                for c in
                    &mut cuts[sec.sec_lo[i] as usize..(sec.sec_hi[i] as usize).saturating_sub(1)]
                {
                    *c += 1;
                }
            }
        }
        // Overlap lists via the sections: two buffers overlap iff they share a clique.
        let mut overlaps: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut by_lower: Vec<u32> = (0..n as u32).filter(|&i| active[i as usize]).collect();
        by_lower.sort_unstable_by_key(|&i| (p.lower[i as usize], i));
        for (k, &a) in by_lower.iter().enumerate() {
            for &b in &by_lower[k + 1..] {
                if p.lower[b as usize] >= p.upper[a as usize] {
                    break;
                }
                overlaps[a as usize].push(b);
                overlaps[b as usize].push(a);
            }
        }
        let mut assigned = vec![NONE; n];
        let mut solution = vec![NONE; n];
        for i in 0..n {
            if !active[i] {
                assigned[i] = 0;
                solution[i] = 0;
            }
        }
        Solver {
            p,
            capacity,
            sec,
            overlaps,
            floor: vec![0; ns],
            total,
            cuts,
            min_off: vec![0; n],
            assigned,
            solution,
            nodes_left: u64::MAX,
            nodes: 0,
            deadline,
            heuristic: HEURISTICS[0],
            affected_mark: vec![0; ns],
            affected_epoch: 0,
            affected: Vec::new(),
            offset_log: Vec::new(),
            section_log: Vec::new(),
        }
    }

    fn whole(&self) -> Partition {
        let buffers = (0..self.p.len() as u32)
            .filter(|&i| self.assigned[i as usize] == NONE)
            .collect();
        Partition {
            buffers,
            sec_lo: 0,
            sec_hi: self.sec.members.len() as u32,
        }
    }

    /// Static partitions: cut wherever no buffer crosses a section boundary.
    fn initial_partitions(&self) -> Vec<Partition> {
        let whole = self.whole();
        let mut cutpoints = vec![0u32];
        for (s, &c) in self.cuts.iter().enumerate() {
            if c == 0 {
                cutpoints.push(s as u32 + 1);
            }
        }
        cutpoints.push(self.sec.members.len() as u32);
        self.split(&whole, &cutpoints)
    }

    fn split(&self, part: &Partition, cutpoints: &[u32]) -> Vec<Partition> {
        let mut out = Vec::new();
        for w in cutpoints.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            let buffers: Vec<u32> = part
                .buffers
                .iter()
                .copied()
                .filter(|&b| {
                    self.assigned[b as usize] == NONE
                        && self.sec.sec_lo[b as usize] < hi
                        && lo < self.sec.sec_hi[b as usize]
                })
                .collect();
            if !buffers.is_empty() {
                out.push(Partition {
                    buffers,
                    sec_lo: lo,
                    sec_hi: hi,
                });
            }
        }
        out
    }

    fn solve_all(&mut self) -> Status {
        let parts = self.initial_partitions();
        for part in &parts {
            let s = self.sub_solve(part);
            if s != Status::Found {
                return s;
            }
        }
        Status::Found
    }

    fn sub_solve(&mut self, part: &Partition) -> Status {
        let p = self.p;
        let mut keyed: Vec<([u128; 3], u32)> = part
            .buffers
            .iter()
            .map(|&b| {
                let bi = b as usize;
                let t = (self.sec.sec_lo[bi]..self.sec.sec_hi[bi])
                    .map(|s| self.total[s as usize])
                    .max()
                    .unwrap_or(0);
                let mut key = [0u128; 3];
                for (k, &c) in self.heuristic.iter().enumerate().take(3) {
                    key[k] = match c {
                        b'T' => t as u128,
                        b'Z' => p.size[bi] as u128,
                        b'A' => p.size[bi] as u128 * (p.upper[bi] - p.lower[bi]) as u128,
                        _ => (p.upper[bi] - p.lower[bi]) as u128,
                    };
                }
                (key, b)
            })
            .collect();
        keyed.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let preorder: Vec<u32> = keyed.into_iter().map(|(_, b)| b).collect();
        let ordering: Vec<(u64, u32)> = (0..preorder.len() as u32).map(|r| (0, r)).collect();
        self.search(part, &preorder, &ordering, 0, 0)
    }

    fn search(
        &mut self,
        part: &Partition,
        preorder: &[u32],
        orig: &[(u64, u32)],
        min_offset: u64,
        min_rank: u32,
    ) -> Status {
        if self.nodes_left == 0 {
            return Status::Aborted;
        }
        self.nodes_left -= 1;
        self.nodes += 1;
        if self.nodes % 256 == 0 && Instant::now() >= self.deadline {
            return Status::Timeout;
        }
        let mut ordering: Vec<(u64, u32)> = Vec::with_capacity(orig.len());
        for &(_, r) in orig {
            let b = preorder[r as usize] as usize;
            if self.assigned[b] == NONE {
                ordering.push((self.min_off[b], r));
            }
        }
        if ordering.is_empty() {
            for &b in &part.buffers {
                self.solution[b as usize] = self.assigned[b as usize];
            }
            return Status::Found;
        }
        ordering.sort_unstable();
        let min_height = ordering
            .iter()
            .map(|&(o, r)| o.saturating_add(self.p.size[preorder[r as usize] as usize]))
            .min()
            .unwrap_or(NONE);
        for k in 0..ordering.len() {
            let (offset, rank) = ordering[k];
            if offset < min_offset || (offset == min_offset && rank < min_rank) {
                continue;
            }
            if offset >= min_height {
                // Dominated: another buffer fits entirely below this offset; placing this one
                // first would leave a gap (and every later candidate is higher still).
                break;
            }
            let b = preorder[rank as usize] as usize;
            if offset.saturating_add(self.p.size[b]) > self.capacity {
                continue;
            }
            // Cheap tests first, before the costly updates (most candidates fail here).
            if !self.precheck(part, b, offset) {
                continue;
            }
            self.assigned[b] = offset;
            let (offset_mark, section_mark) = (self.offset_log.len(), self.section_log.len());
            self.update_min_offsets(b);
            let mut status = Status::NotFound;
            if self.update_sections(b) {
                status = self.decompose(part, preorder, &ordering, offset, rank, b);
            }
            self.restore_sections(section_mark, b);
            while self.offset_log.len() > offset_mark {
                if let Some((o, m)) = self.offset_log.pop() {
                    self.min_off[o as usize] = m;
                }
            }
            self.assigned[b] = NONE;
            if status != Status::NotFound {
                return status;
            }
        }
        Status::NotFound
    }

    /// Raises the minimum offsets of b's unplaced neighbours above b (logged in `offset_log`)
    /// and collects the sections whose floors may rise in `affected`.
    fn update_min_offsets(&mut self, b: usize) {
        let height = self.assigned[b] + self.p.size[b];
        self.affected.clear();
        self.affected_epoch = self.affected_epoch.wrapping_add(1);
        if self.affected_epoch == 0 {
            self.affected_mark.iter_mut().for_each(|m| *m = 0);
            self.affected_epoch = 1;
        }
        for k in 0..self.overlaps[b].len() {
            let o = self.overlaps[b][k] as usize;
            if self.assigned[o] != NONE || self.min_off[o] >= height {
                continue;
            }
            self.offset_log.push((o as u32, self.min_off[o]));
            self.min_off[o] = align_up(height, self.p.align[o]);
            for s in self.sec.sec_lo[o]..self.sec.sec_hi[o] {
                if self.affected_mark[s as usize] != self.affected_epoch {
                    self.affected_mark[s as usize] = self.affected_epoch;
                    self.affected.push(s);
                }
            }
        }
    }

    /// Raises the floors of b's sections to b's top, takes b's size out of their totals, and
    /// raises affected floors to their lowest unplaced minimum offset (logged in
    /// `section_log`). Returns false as soon as a raised floor leaves no room for its section's
    /// unplaced buffers.
    fn update_sections(&mut self, b: usize) -> bool {
        let height = self.assigned[b] + self.p.size[b];
        for s in self.sec.sec_lo[b]..self.sec.sec_hi[b] {
            self.section_log.push((s, self.floor[s as usize]));
            self.floor[s as usize] = height;
            self.total[s as usize] -= self.p.size[b];
        }
        // No buffer of a section can go below the lowest minimum offset among its unplaced
        // buffers, so that is the section's floor too.
        for k in 0..self.affected.len() {
            let s = self.affected[k] as usize;
            let mut lowest = NONE;
            for &o in &self.sec.members[s] {
                if self.assigned[o as usize] == NONE {
                    lowest = lowest.min(self.min_off[o as usize]);
                }
            }
            if lowest != NONE && self.floor[s] < lowest {
                self.section_log.push((s as u32, self.floor[s]));
                self.floor[s] = lowest;
                if lowest.saturating_add(self.total[s]) > self.capacity {
                    return false;
                }
            }
        }
        true
    }

    fn restore_sections(&mut self, mark: usize, b: usize) {
        while self.section_log.len() > mark {
            if let Some((s, f)) = self.section_log.pop() {
                self.floor[s as usize] = f;
            }
        }
        for s in self.sec.sec_lo[b]..self.sec.sec_hi[b] {
            self.total[s as usize] += self.p.size[b];
        }
    }

    /// The section tests that do not need the updated floors. Invariant: at every node,
    /// `floor + total <= capacity` holds in every section of the partition, so after placing
    /// `b` only b's sections and the raised floors need the floor test (done here and in
    /// [`Solver::update_sections`]); the monotonic test (placement order is non-decreasing in
    /// offset, so nothing unplaced goes below `offset`) concerns every section.
    fn precheck(&self, part: &Partition, b: usize, offset: u64) -> bool {
        let (size, cap) = (self.p.size[b], self.capacity);
        let (lo, hi) = (self.sec.sec_lo[b], self.sec.sec_hi[b]);
        let rest = cap - (offset + size);
        if (lo..hi).any(|s| self.total[s as usize] - size > rest) {
            return false;
        }
        let room = cap - offset;
        for s in part.sec_lo..part.sec_hi {
            let mut t = self.total[s as usize];
            if lo <= s && s < hi {
                t -= size;
            }
            if t > room {
                return false;
            }
        }
        true
    }

    fn decompose(
        &mut self,
        part: &Partition,
        preorder: &[u32],
        ordering: &[(u64, u32)],
        offset: u64,
        rank: u32,
        b: usize,
    ) -> Status {
        self.solution[b] = self.assigned[b];
        let (lo, hi) = (self.sec.sec_lo[b] as usize, self.sec.sec_hi[b] as usize);
        let mut cutpoints = vec![part.sec_lo];
        for s in lo..hi.saturating_sub(1) {
            self.cuts[s] -= 1;
            if self.cuts[s] == 0 {
                cutpoints.push(s as u32 + 1);
            }
        }
        let status = if cutpoints.len() == 1 {
            self.search(part, preorder, ordering, offset, rank)
        } else {
            cutpoints.push(part.sec_hi);
            let subs = self.split(part, &cutpoints);
            let mut status = Status::Found;
            for sub in &subs {
                status = self.sub_solve(sub);
                if status != Status::Found {
                    break;
                }
            }
            status
        };
        for s in lo..hi.saturating_sub(1) {
            self.cuts[s] += 1;
        }
        status
    }
}

/// Does a plan of height at most `capacity` exist? Round robin over preorders with a doubling
/// node limit, until `deadline`.
pub(crate) fn fit(p: &Problem, capacity: u64, deadline: Instant) -> Fit {
    let mut solver = Solver::new(p, capacity, deadline);
    // Cheap infeasibility proof: a section whose sizes alone exceed the capacity.
    if solver.total.iter().any(|&t| t > capacity) {
        return Fit::Infeasible;
    }
    let mut node_limit = (p.len() as u64).max(64);
    loop {
        node_limit = node_limit.saturating_mul(2);
        for h in HEURISTICS {
            solver.heuristic = h;
            solver.nodes_left = node_limit;
            match solver.solve_all() {
                Status::Found => {
                    if std::env::var("DYNRT_PLAN_DEBUG").is_ok() {
                        eprintln!("nodes {} limit {}", solver.nodes, node_limit);
                    }
                    let offsets = solver.solution.clone();
                    if offsets.contains(&NONE) {
                        return Fit::Unknown;
                    }
                    return Fit::Found(offsets);
                }
                // The search is complete over canonical solutions: exhausting it proves that
                // nothing fits.
                Status::NotFound => return Fit::Infeasible,
                Status::Timeout => return Fit::Unknown,
                Status::Aborted => {}
            }
        }
    }
}

/// What [`minimise`] found.
pub(crate) struct Outcome {
    /// The lowest offsets found below the incumbent (None: nothing better than it).
    pub offsets: Option<Vec<u64>>,
    /// Whether the best height (found here, or the incumbent when `offsets` is None) is proven
    /// optimal.
    pub proven_optimal: bool,
}

/// Looks for a plan lower than `incumbent` (or within `capacity` when given), between the
/// lower bound `lb` and the incumbent, until `deadline`.
pub(crate) fn minimise(
    p: &Problem,
    lb: u64,
    incumbent: u64,
    capacity: Option<u64>,
    deadline: Instant,
) -> Outcome {
    let mut out = Outcome {
        offsets: None,
        proven_optimal: false,
    };
    let mut best_h = incumbent;
    if let Some(o) = best_dive(p, 1, deadline) {
        let h = height_of(p, &o);
        if h < best_h {
            best_h = h;
            out.offsets = Some(o);
        }
    }
    if p.len() > MAX_SEARCH_BUFFERS || best_h <= capacity.unwrap_or(lb) {
        out.proven_optimal = best_h == lb;
        return out;
    }
    if let Some(cap) = capacity {
        if let Fit::Found(o) = fit(p, cap, deadline) {
            out.proven_optimal = height_of(p, &o) == lb;
            out.offsets = Some(o);
        }
        return out;
    }
    // Minimise: try the lower bound first (often tight), then bisect between the highest
    // capacity known not to fit and the best height.
    let mut lo = lb;
    let mut lo_proven = true;
    let mut first = true;
    while lo < best_h {
        let now = Instant::now();
        if now >= deadline {
            lo_proven = false;
            break;
        }
        let target = if first {
            lo
        } else {
            lo + (best_h - 1 - lo) / 2
        };
        first = false;
        // Each question gets half the remaining time, so one hard capacity does not starve
        // the rest of the bisection.
        match fit(p, target, now + (deadline - now) / 2) {
            Fit::Found(o) => {
                best_h = height_of(p, &o);
                out.offsets = Some(o);
            }
            Fit::Infeasible => lo = target + 1,
            Fit::Unknown => {
                lo = target + 1;
                lo_proven = false;
            }
        }
    }
    out.proven_optimal = best_h == lb || (lo_proven && lo >= best_h);
    out
}

/// Runs [`dive`] over the preorders after the first `skip` until the deadline.
fn best_dive(p: &Problem, skip: usize, deadline: Instant) -> Option<Vec<u64>> {
    let mut best: Option<(u64, Vec<u64>)> = None;
    for h in HEURISTICS.iter().skip(skip) {
        let Some(o) = dive(p, h, deadline) else {
            break;
        };
        let height = height_of(p, &o);
        log::debug!("dive {}: height {height}", String::from_utf8_lossy(h));
        if best.as_ref().is_none_or(|(bh, _)| height < *bh) {
            best = Some((height, o));
        }
    }
    best.map(|b| b.1)
}

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
pub(crate) fn dive(p: &Problem, heuristic: &[u8], deadline: Instant) -> Option<Vec<u64>> {
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

/// The first preorder's dive (the one `minimise` skips), for `build` to run early.
pub(crate) fn first_dive(p: &Problem, deadline: Instant) -> Option<Vec<u64>> {
    dive(p, HEURISTICS[0], deadline)
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
