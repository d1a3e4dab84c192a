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
//!
//! Files: this one (the search, its sections and partitions, [`fit`] and [`minimise`]),
//! `skyline` ([`dive`] and its segment tree).

mod skyline;

use super::{align_up, height_of, Problem};
use skyline::dive;
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

/// The first preorder's dive (the one `minimise` skips), for `build` to run early.
pub(crate) fn first_dive(p: &Problem, deadline: Instant) -> Option<Vec<u64>> {
    dive(p, HEURISTICS[0], deadline)
}
