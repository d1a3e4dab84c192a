//! Static memory planner: give every buffer with a known lifetime an offset in one arena,
//! keeping the arena's height low (docs/design.md, "Memory pool and static planner").
//!
//! A [`PlanBuffer`] lives in the half-open time interval `[lower, upper)`; two buffers whose
//! lifetimes overlap must not overlap in address space. [`build`] returns a [`Plan`] whose
//! `height` is `max(offset + size)`; [`lower_bound`] is the largest sum of sizes live at one
//! instant, so `height / lower_bound` measures the plan's quality.
//!
//! Strategies ([`Strategy`]):
//! - [`Strategy::GmemFitFirst`], [`Strategy::GmemOpSize`]: the global-memory planner that
//!   allocates by lifetime (weights first, then reuse of end-of-life
//!   blocks in processing order);
//! - [`Strategy::GreedySize`]: greedy by size with best fit, over several orders;
//! - [`Strategy::Search`]: depth-first search over canonical placements with section-based
//!   pruning and dominance (the approach of MiniMalloc), under a time limit;
//! - [`Strategy::Best`]: all of the above, keeping the lowest height.
//!
//! `Best`, `GreedySize` and `Search` are *anytime*: the greedy baseline (decreasing size, best
//! fit; an interval index makes it about 0.4 s for 62k buffers) always runs to completion, and
//! later phases only replace it with a lower valid plan found before the time limit, so no
//! time limit or machine load makes them return worse than that baseline.
//!
//! Offsets honour each buffer's alignment and [`PlanOptions::min_align_bytes`] (the wgpu arena
//! needs `min_storage_buffer_offset_alignment`, 256 on most adapters, for binding offsets).

// Buffers are parallel arrays (lower, upper, size, align) indexed by buffer: index loops read
// clearer than zipped iterators here.
#![allow(clippy::needless_range_loop)]

mod csv;
mod gmem;
mod greedy;
mod search;
mod svg;

pub use csv::{parse_csv, write_csv};
pub use svg::{to_svg, SvgOptions};

use std::fmt;
use std::time::Duration;
use web_time::Instant;

/// One buffer to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanBuffer {
    /// Name used in errors and output files.
    pub id: String,
    /// First time step the buffer is live.
    pub lower: u64,
    /// First time step after the buffer's life (half-open: `upper > lower`).
    pub upper: u64,
    /// Bytes.
    pub size_bytes: u64,
    /// Required alignment of the offset in bytes (1 = none).
    pub align_bytes: u64,
}

/// Which algorithm [`build`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// The greedy baseline, then every strategy below within the time limit; the lowest
    /// height wins.
    Best,
    /// Reference gmem planner, first end-of-life block that fits.
    GmemFitFirst,
    /// Reference gmem planner, smallest end-of-life block that fits (outputs of a step
    /// allocated largest first).
    GmemOpSize,
    /// Greedy best fit: by decreasing size (the baseline, always run to completion), then
    /// other orders within the time limit, keeping the lowest.
    GreedySize,
    /// The greedy baseline and orders, then depth-first search over canonical placements
    /// within the time limit (the greedy's plan stands when the search finds nothing lower).
    Search,
}

impl Strategy {
    /// All strategies, in the order reports list them.
    pub const ALL: [Strategy; 5] = [
        Strategy::Best,
        Strategy::GmemFitFirst,
        Strategy::GmemOpSize,
        Strategy::GreedySize,
        Strategy::Search,
    ];

    /// The command-line name (`best`, `gmem-fit-first`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Best => "best",
            Strategy::GmemFitFirst => "gmem-fit-first",
            Strategy::GmemOpSize => "gmem-op-size",
            Strategy::GreedySize => "greedy-size",
            Strategy::Search => "search",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown strategy `{s}`: expected best, gmem-fit-first, gmem-op-size, greedy-size or search"))
    }
}

/// Options of [`build`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// The algorithm.
    pub strategy: Strategy,
    /// Arena size the plan must fit in; `None` = as low as possible.
    pub capacity: Option<u64>,
    /// Wall-clock budget. The gmem planners always complete (they are fast), and so does the
    /// greedy baseline of [`Strategy::Best`], [`Strategy::GreedySize`] and
    /// [`Strategy::Search`] (about 0.4 s for 62k buffers), which the rest can only improve on;
    /// everything else stops at the deadline.
    pub time_limit: Duration,
    /// Every offset is a multiple of this (and of the buffer's own alignment); 1 = none.
    pub min_align_bytes: u64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            strategy: Strategy::Best,
            capacity: None,
            time_limit: Duration::from_secs(5),
            min_align_bytes: 1,
        }
    }
}

/// A solution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `offsets[i]` is the byte offset of `buffers[i]`.
    pub offsets: Vec<u64>,
    /// `max(offset + size)`: the arena size the plan needs.
    pub height: u64,
    /// [`lower_bound`] of the buffers.
    pub lower_bound: u64,
    /// The strategy that produced these offsets (for `Best`, the winner).
    pub strategy_used: Strategy,
    /// Whether the height is proven optimal (it equals the lower bound, or the search proved
    /// no lower height fits).
    pub optimal: bool,
}

impl Plan {
    /// `height / lower_bound` (1.0 is optimal; 1.0 too when both are 0).
    pub fn ratio(&self) -> f64 {
        if self.lower_bound == 0 {
            return if self.height == 0 { 1.0 } else { f64::INFINITY };
        }
        self.height as f64 / self.lower_bound as f64
    }

    /// Whether the plan fits in `capacity` bytes.
    pub fn fits(&self, capacity: u64) -> bool {
        self.height <= capacity
    }
}

/// Errors of the planner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A buffer's lifetime is empty or reversed.
    #[error("buffer `{id}`: upper {upper} must be greater than lower {lower}")]
    EmptyLifetime {
        /// The buffer.
        id: String,
        /// Its lower.
        lower: u64,
        /// Its upper.
        upper: u64,
    },
    /// A buffer's alignment is zero.
    #[error("buffer `{id}`: alignment must be at least 1")]
    ZeroAlignment {
        /// The buffer.
        id: String,
    },
    /// `min_align_bytes` is zero.
    #[error("minimum alignment must be at least 1")]
    ZeroMinAlignment,
    /// Offsets plus sizes do not fit in 64 bits.
    #[error("buffer `{id}`: offset plus size overflows 64 bits")]
    Overflow {
        /// The buffer.
        id: String,
    },
    /// The offsets list has the wrong length.
    #[error("{offsets} offsets for {buffers} buffers")]
    LengthMismatch {
        /// Offsets given.
        offsets: usize,
        /// Buffers given.
        buffers: usize,
    },
    /// Two buffers live at the same time share addresses.
    #[error("buffers `{a}` and `{b}` overlap in time and in address")]
    Overlap {
        /// One buffer.
        a: String,
        /// The other.
        b: String,
    },
    /// An offset is not a multiple of the alignment.
    #[error(
        "buffer `{id}`: offset {offset_bytes} is not a multiple of its alignment {align_bytes}"
    )]
    Misaligned {
        /// The buffer.
        id: String,
        /// Its offset.
        offset_bytes: u64,
        /// The alignment required.
        align_bytes: u64,
    },
    /// The CSV header lacks a column or is empty.
    #[error("csv header: {reason} (expected `id,lower,upper,size[,alignment]`)")]
    BadHeader {
        /// What is wrong.
        reason: String,
    },
    /// A CSV row is malformed.
    #[error("csv line {line}: {reason}")]
    BadRow {
        /// 1-based line number in the file.
        line: usize,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// No plan within the capacity was found in time.
    #[error("no plan fits in {capacity_bytes} bytes (lower bound {lower_bound}, best height found {best_height}); raise the capacity or the time limit")]
    DoesNotFit {
        /// The capacity asked for.
        capacity_bytes: u64,
        /// The lower bound.
        lower_bound: u64,
        /// The lowest height found.
        best_height: u64,
    },
}

/// Buffers after checking, with the effective alignment folded in.
pub(crate) struct Problem {
    pub lower: Vec<u64>,
    pub upper: Vec<u64>,
    pub size: Vec<u64>,
    pub align: Vec<u64>,
}

impl Problem {
    pub fn len(&self) -> usize {
        self.size.len()
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Rounds `x` up to a multiple of `align` (`align >= 1`), saturating.
pub(crate) fn align_up(x: u64, align: u64) -> u64 {
    let r = x % align;
    if r == 0 {
        x
    } else {
        x.saturating_add(align - r)
    }
}

fn check(buffers: &[PlanBuffer], min_align_bytes: u64) -> Result<Problem, PlanError> {
    if min_align_bytes == 0 {
        return Err(PlanError::ZeroMinAlignment);
    }
    let n = buffers.len();
    let mut p = Problem {
        lower: Vec::with_capacity(n),
        upper: Vec::with_capacity(n),
        size: Vec::with_capacity(n),
        align: Vec::with_capacity(n),
    };
    for b in buffers {
        if b.upper <= b.lower {
            return Err(PlanError::EmptyLifetime {
                id: b.id.clone(),
                lower: b.lower,
                upper: b.upper,
            });
        }
        if b.align_bytes == 0 {
            return Err(PlanError::ZeroAlignment { id: b.id.clone() });
        }
        let g = gcd(b.align_bytes, min_align_bytes);
        let align = (b.align_bytes / g)
            .checked_mul(min_align_bytes)
            .ok_or_else(|| PlanError::Overflow { id: b.id.clone() })?;
        p.lower.push(b.lower);
        p.upper.push(b.upper);
        p.size.push(b.size_bytes);
        p.align.push(align);
    }
    // Every height the planner can produce is at most the sum of aligned sizes.
    let mut total: u64 = 0;
    for (i, b) in buffers.iter().enumerate() {
        total = total
            .checked_add(p.size[i])
            .and_then(|t| t.checked_add(p.align[i]))
            .ok_or_else(|| PlanError::Overflow { id: b.id.clone() })?;
    }
    Ok(p)
}

/// The largest sum of sizes of buffers live at one instant: no plan is lower.
pub fn lower_bound(buffers: &[PlanBuffer]) -> u64 {
    let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(buffers.len() * 2);
    for b in buffers {
        if b.upper > b.lower {
            events.push((b.lower, true, b.size_bytes));
            events.push((b.upper, false, b.size_bytes));
        }
    }
    // Ends sort before starts at the same time: lifetimes are half-open.
    events.sort_unstable_by_key(|&(t, start, _)| (t, start));
    let (mut live, mut best) = (0u64, 0u64);
    for (_, start, size) in events {
        if start {
            live = live.saturating_add(size);
            best = best.max(live);
        } else {
            live = live.saturating_sub(size);
        }
    }
    best
}

/// Checks a solution: one offset per buffer, every offset a multiple of the buffer's alignment
/// and of `min_align_bytes`, and no two buffers overlapping in both time and address.
/// Zero-size buffers occupy no addresses.
///
/// # Errors
/// The first violation found ([`PlanError::Overlap`], [`PlanError::Misaligned`], ...).
pub fn validate(
    buffers: &[PlanBuffer],
    offsets: &[u64],
    min_align_bytes: u64,
) -> Result<(), PlanError> {
    if offsets.len() != buffers.len() {
        return Err(PlanError::LengthMismatch {
            offsets: offsets.len(),
            buffers: buffers.len(),
        });
    }
    let p = check(buffers, min_align_bytes)?;
    for i in 0..p.len() {
        if offsets[i] % p.align[i] != 0 {
            return Err(PlanError::Misaligned {
                id: buffers[i].id.clone(),
                offset_bytes: offsets[i],
                align_bytes: p.align[i],
            });
        }
        if offsets[i].checked_add(p.size[i]).is_none() {
            return Err(PlanError::Overflow {
                id: buffers[i].id.clone(),
            });
        }
    }
    // Sweep over time; live buffers are kept in an address-ordered map so each new buffer
    // only checks its address neighbours: O(n log n).
    let mut order: Vec<usize> = (0..p.len()).filter(|&i| p.size[i] > 0).collect();
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(order.len() * 2);
    for &i in &order {
        events.push((p.lower[i], true, i));
        events.push((p.upper[i], false, i));
    }
    order.clear();
    events.sort_unstable_by_key(|&(t, start, i)| (t, start, i));
    let mut live: std::collections::BTreeMap<(u64, usize), u64> = std::collections::BTreeMap::new();
    for (_, start, i) in events {
        let key = (offsets[i], i);
        if !start {
            live.remove(&key);
            continue;
        }
        let end = offsets[i] + p.size[i];
        if let Some((&(_, j), &jend)) = live.range(..key).next_back() {
            if jend > offsets[i] {
                return Err(PlanError::Overlap {
                    a: buffers[j].id.clone(),
                    b: buffers[i].id.clone(),
                });
            }
        }
        if let Some((&(joff, j), _)) = live.range(key..).next() {
            if joff < end {
                return Err(PlanError::Overlap {
                    a: buffers[i].id.clone(),
                    b: buffers[j].id.clone(),
                });
            }
        }
        live.insert(key, end);
    }
    Ok(())
}

pub(crate) fn height_of(p: &Problem, offsets: &[u64]) -> u64 {
    (0..p.len())
        .map(|i| offsets[i] + p.size[i])
        .max()
        .unwrap_or(0)
}

/// The best plan found so far by [`build`].
struct Incumbent<'a> {
    p: &'a Problem,
    lb: u64,
    start: Instant,
    /// (offsets, height, strategy, proven optimal).
    best: Option<(Vec<u64>, u64, Strategy, bool)>,
}

impl Incumbent<'_> {
    /// Keeps `offsets` when they are lower than the incumbent (or as low and proven optimal).
    fn consider(&mut self, offsets: Vec<u64>, strategy: Strategy, optimal: bool) {
        let h = height_of(self.p, &offsets);
        log::debug!(
            "planner: {strategy} height {h} at {} ms",
            self.start.elapsed().as_millis()
        );
        if self
            .best
            .as_ref()
            .is_none_or(|b| h < b.1 || (h == b.1 && optimal && !b.3))
        {
            self.best = Some((offsets, h, strategy, optimal || h == self.lb));
        }
    }

    /// Logs a phase the deadline cut short (its partial result is dropped).
    fn cut(&self, phase: &str) {
        log::debug!(
            "planner: {phase} cut by the time limit at {} ms",
            self.start.elapsed().as_millis()
        );
    }

    fn at_lower_bound(&self) -> bool {
        self.best.as_ref().is_some_and(|b| b.1 == self.lb)
    }

    fn height(&self) -> u64 {
        self.best.as_ref().map_or(u64::MAX, |b| b.1)
    }
}

/// Plans offsets for `buffers`.
///
/// With a capacity, the plan's height is at most the capacity; without, the planner lowers
/// the height as far as the strategy and the time limit allow.
///
/// [`Strategy::Best`], [`Strategy::GreedySize`] and [`Strategy::Search`] are anytime: they
/// first run the greedy baseline (best fit by decreasing size) to completion, whatever the
/// time limit, then improve on it until the limit and keep the lowest valid plan found, so
/// they never return a plan higher than the baseline's. Only that baseline may outlast the
/// limit (0.4 s of CPU for 62k buffers); later phases look at the clock every millisecond or
/// so of work, and one cut short is dropped.
///
/// # Errors
/// Invalid buffers ([`PlanError::EmptyLifetime`], [`PlanError::ZeroAlignment`], overflow), or
/// [`PlanError::DoesNotFit`] when no plan within the capacity was found in time.
pub fn build(buffers: &[PlanBuffer], opts: &PlanOptions) -> Result<Plan, PlanError> {
    let start = Instant::now();
    let p = check(buffers, opts.min_align_bytes)?;
    let lb = lower_bound(buffers);
    let mut best = Incumbent {
        p: &p,
        lb,
        start,
        best: None,
    };
    if p.len() > 0 {
        match opts.strategy {
            Strategy::GmemFitFirst => best.consider(
                gmem::plan(&p, gmem::Rule::FitFirst),
                Strategy::GmemFitFirst,
                false,
            ),
            Strategy::GmemOpSize => best.consider(
                gmem::plan(&p, gmem::Rule::OpSize),
                Strategy::GmemOpSize,
                false,
            ),
            Strategy::Best | Strategy::GreedySize | Strategy::Search => {
                anytime(&p, opts, &mut best)
            }
        }
    }
    let Some((offsets, height, strategy_used, optimal)) = best.best else {
        return Ok(Plan {
            offsets: Vec::new(),
            height: 0,
            lower_bound: lb,
            strategy_used: opts.strategy,
            optimal: true,
        });
    };
    if let Some(cap) = opts.capacity {
        if height > cap {
            return Err(PlanError::DoesNotFit {
                capacity_bytes: cap,
                lower_bound: lb,
                best_height: height,
            });
        }
    }
    Ok(Plan {
        offsets,
        height,
        lower_bound: lb,
        strategy_used,
        optimal,
    })
}

/// The greedy baseline, then improvements within the time limit, cheapest and most often
/// useful first; a phase the deadline cuts short is dropped, never half used.
fn anytime(p: &Problem, opts: &PlanOptions, best: &mut Incumbent<'_>) {
    let start = best.start;
    let deadline = start + opts.time_limit;
    // The last tenth of the budget is kept for compacting the winner.
    let improve_deadline = start + opts.time_limit.mul_f64(0.9);
    let searching = matches!(opts.strategy, Strategy::Best | Strategy::Search);
    let mut greedy = greedy::Greedy::new(p);
    // The baseline always completes: every later phase can only lower the height.
    if let Some(offsets) = greedy.run(0, None) {
        best.consider(offsets, Strategy::GreedySize, false);
    }
    if opts.strategy == Strategy::Best {
        // Both are O(n log n), tens of milliseconds on fixtures/planner's largest instance
        // (docs/benchmarks/2026-11-22-planner.md): not worth a deadline.
        best.consider(
            gmem::plan(p, gmem::Rule::FitFirst),
            Strategy::GmemFitFirst,
            false,
        );
        best.consider(
            gmem::plan(p, gmem::Rule::OpSize),
            Strategy::GmemOpSize,
            false,
        );
    }
    // The second greedy order (by lifetime) is the one that most often beats the first (S_1:
    // 1.0025 against 1.0158), at the cost of one more greedy pass; the first dive reaches the
    // lower bound on Y_1 but costs several passes (1.5 s there on an idle core), and a dive cut
    // short gives nothing, so it comes after that pass and before the other orders.
    // A phase starts only when it has time left and something to improve.
    let worth =
        |best: &Incumbent<'_>, until: Instant| !best.at_lower_bound() && Instant::now() < until;
    let run_order = |greedy: &mut greedy::Greedy<'_>, k: usize, best: &mut Incumbent<'_>| {
        if worth(best, improve_deadline) {
            match greedy.run(k, Some(improve_deadline)) {
                Some(offsets) => best.consider(offsets, Strategy::GreedySize, false),
                None => best.cut(&format!("greedy order {}", k + 1)),
            }
        }
    };
    run_order(&mut greedy, 1, best);
    if searching && worth(best, improve_deadline) {
        match search::first_dive(p, improve_deadline) {
            Some(offsets) => best.consider(offsets, Strategy::Search, false),
            None => best.cut("first dive"),
        }
    }
    for k in 2..greedy::ORDERS {
        run_order(&mut greedy, k, best);
    }
    if searching && worth(best, improve_deadline) && best.height() > opts.capacity.unwrap_or(0) {
        let out = search::minimise(p, best.lb, best.height(), opts.capacity, improve_deadline);
        if let Some(offsets) = out.offsets {
            best.consider(offsets, Strategy::Search, out.proven_optimal);
        } else if out.proven_optimal {
            if let Some(b) = best.best.as_mut() {
                // The search proved nothing lower than the incumbent fits.
                b.3 = true;
            }
        }
    }
    if opts.strategy == Strategy::Best && worth(best, deadline) {
        // A last cheap pass over the winner: compaction never raises the height.
        if let Some((offsets, strategy)) = best.best.as_ref().map(|b| (&b.0, b.2)) {
            match greedy::compact(p, offsets, deadline) {
                Some(offsets) => best.consider(offsets, strategy, false),
                None => best.cut("compaction"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn buf(id: &str, lower: u64, upper: u64, size: u64) -> PlanBuffer {
        PlanBuffer {
            id: id.into(),
            lower,
            upper,
            size_bytes: size,
            align_bytes: 1,
        }
    }

    fn example() -> Vec<PlanBuffer> {
        vec![
            buf("b1", 0, 3, 4),
            buf("b2", 3, 9, 4),
            buf("b3", 0, 9, 4),
            buf("b4", 9, 21, 4),
            buf("b5", 0, 21, 4),
        ]
    }

    #[test]
    fn lower_bound_treats_lifetimes_as_half_open() {
        assert_eq!(lower_bound(&example()), 12);
        assert_eq!(lower_bound(&[buf("a", 0, 2, 5), buf("b", 2, 4, 7)]), 7);
    }

    #[test]
    fn validator_rejects_overlap_and_misalignment() {
        let b = example();
        assert!(validate(&b, &[0, 0, 4, 0, 8], 1).is_ok());
        assert!(matches!(
            validate(&b, &[0, 0, 3, 0, 8], 1),
            Err(PlanError::Overlap { .. })
        ));
        assert!(matches!(validate(&b, &[0, 0, 4, 0, 8], 4), Ok(())));
        assert!(matches!(
            validate(&b, &[0, 0, 4, 0, 8], 8),
            Err(PlanError::Misaligned { .. })
        ));
        assert!(matches!(
            validate(&b, &[0, 0], 1),
            Err(PlanError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn every_strategy_plans_the_example_validly() {
        let b = example();
        for strategy in Strategy::ALL {
            let plan = build(
                &b,
                &PlanOptions {
                    strategy,
                    ..PlanOptions::default()
                },
            )
            .unwrap();
            validate(&b, &plan.offsets, 1).unwrap();
            assert!(plan.height >= 12, "{strategy}");
        }
        let plan = build(
            &b,
            &PlanOptions {
                strategy: Strategy::Best,
                capacity: Some(12),
                ..PlanOptions::default()
            },
        )
        .unwrap();
        assert_eq!(plan.height, 12);
        assert!(plan.optimal);
    }

    #[test]
    fn search_with_no_time_still_answers() {
        // Enough buffers that the greedy and the dive both look at the clock (and give up).
        let b: Vec<PlanBuffer> = (0..5000u64)
            .map(|i| {
                buf(
                    &format!("x{i}"),
                    i % 17,
                    i % 17 + 1 + i % 5,
                    1 + i * 7 % 100,
                )
            })
            .collect();
        for strategy in Strategy::ALL {
            let plan = build(
                &b,
                &PlanOptions {
                    strategy,
                    time_limit: Duration::ZERO,
                    ..PlanOptions::default()
                },
            )
            .unwrap();
            assert_eq!(plan.offsets.len(), b.len(), "{strategy}");
            validate(&b, &plan.offsets, 1).unwrap();
        }
    }

    #[test]
    fn impossible_capacity_is_a_typed_error() {
        let e = build(
            &example(),
            &PlanOptions {
                capacity: Some(11),
                ..PlanOptions::default()
            },
        )
        .unwrap_err();
        assert!(matches!(
            e,
            PlanError::DoesNotFit {
                capacity_bytes: 11,
                lower_bound: 12,
                ..
            }
        ));
    }

    #[test]
    fn min_alignment_is_honoured() {
        let b = vec![buf("a", 0, 2, 100), buf("b", 1, 3, 100), buf("c", 0, 3, 1)];
        for strategy in Strategy::ALL {
            let plan = build(
                &b,
                &PlanOptions {
                    strategy,
                    min_align_bytes: 256,
                    ..PlanOptions::default()
                },
            )
            .unwrap();
            validate(&b, &plan.offsets, 256).unwrap();
        }
    }
}
