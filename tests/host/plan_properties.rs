//! Property tests of the static planner: every strategy's plan passes the validator, the
//! validator rejects overlaps and misalignment, and heights respect the lower bound.

use crate::common;
use dynrt::memory::planner::{
    build, lower_bound, validate, PlanBuffer, PlanError, PlanOptions, Strategy as PlanStrategy,
};
use proptest::prelude::*;
use std::time::Duration;

/// Buffers `b0, b1, ...` from (lower, lifetime length, size, alignment).
fn to_buffers(v: Vec<(u64, u64, u64, u64)>) -> Vec<PlanBuffer> {
    v.into_iter()
        .enumerate()
        .map(|(i, (lower, len, size_bytes, align_bytes))| PlanBuffer {
            id: format!("b{i}"),
            lower,
            upper: lower + len,
            size_bytes,
            align_bytes,
        })
        .collect()
}

fn buffers() -> impl Strategy<Value = Vec<PlanBuffer>> {
    prop::collection::vec(
        (
            0u64..40,
            1u64..15,
            0u64..200,
            prop::sample::select(vec![1u64, 1, 2, 8, 64]),
        ),
        1..40,
    )
    .prop_map(to_buffers)
}

/// Many buffers (far more than the 256 the greedy places between two looks at the clock), so a
/// tiny time limit really cuts phases short.
fn many_buffers() -> impl Strategy<Value = Vec<PlanBuffer>> {
    prop::collection::vec(
        (
            0u64..400,
            prop_oneof![4 => 1u64..6, 1 => 1u64..400],
            1u64..5000,
            prop::sample::select(vec![1u64, 1, 8, 256]),
        ),
        1100..2500,
    )
    .prop_map(to_buffers)
}

/// The greedy baseline written out plainly: by decreasing size (ties: earlier start, then
/// input order), each buffer into the smallest gap left by the placed buffers it meets in time
/// (lowest on ties), else on top. Returns the height.
fn greedy_baseline_height(bufs: &[PlanBuffer]) -> u64 {
    let up = |x: u64, a: u64| x.div_ceil(a) * a;
    let mut order: Vec<usize> = (0..bufs.len()).collect();
    order.sort_by(|&a, &b| {
        (bufs[b].size_bytes, bufs[a].lower, a).cmp(&(bufs[a].size_bytes, bufs[b].lower, b))
    });
    let mut offsets = vec![0u64; bufs.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut height = 0;
    for i in order {
        let b = &bufs[i];
        let mut spans: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| {
                let o = &bufs[j];
                o.size_bytes > 0 && o.lower < b.upper && b.lower < o.upper
            })
            .map(|&j| (offsets[j], offsets[j] + bufs[j].size_bytes))
            .collect();
        spans.sort_unstable();
        let (mut best, mut top): (Option<(u64, u64)>, u64) = (None, 0);
        for (start, end) in spans {
            if start > top && up(top, b.align_bytes) + b.size_bytes <= start {
                let gap = start - top;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, up(top, b.align_bytes)));
                }
            }
            top = top.max(end);
        }
        offsets[i] = best.map_or(up(top, b.align_bytes), |(_, o)| o);
        height = height.max(offsets[i] + b.size_bytes);
        placed.push(i);
    }
    height
}

proptest! {
    #![proptest_config(common::proptest_config(8))]

    /// The anytime promise: whatever the time limit, the planner returns a valid plan no higher
    /// than the greedy baseline.
    #[test]
    fn a_tiny_time_limit_still_beats_or_ties_the_greedy(bufs in many_buffers()) {
        let baseline = greedy_baseline_height(&bufs);
        for strategy in [PlanStrategy::Best, PlanStrategy::GreedySize, PlanStrategy::Search] {
            for time_limit in [Duration::ZERO, Duration::from_millis(1)] {
                let opts = PlanOptions { strategy, capacity: None, time_limit, min_align_bytes: 1 };
                let plan = build(&bufs, &opts).unwrap();
                validate(&bufs, &plan.offsets, 1).unwrap();
                if strategy == PlanStrategy::GreedySize && time_limit.is_zero() {
                    // No time for anything but the baseline: it is this greedy exactly.
                    prop_assert_eq!(plan.height, baseline);
                }
                prop_assert!(
                    plan.height <= baseline,
                    "{} at {:?}: height {} above the greedy baseline {}",
                    strategy, time_limit, plan.height, baseline
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(common::proptest_config(64))]

    #[test]
    fn every_strategy_gives_a_valid_plan(bufs in buffers(), min_align in prop::sample::select(vec![1u64, 4, 256])) {
        let lb = lower_bound(&bufs);
        for strategy in PlanStrategy::ALL {
            let opts = PlanOptions { strategy, capacity: None, time_limit: Duration::from_millis(50), min_align_bytes: min_align };
            let plan = build(&bufs, &opts).unwrap();
            prop_assert_eq!(plan.offsets.len(), bufs.len());
            validate(&bufs, &plan.offsets, min_align).unwrap();
            prop_assert!(plan.height >= lb, "{} height {} below lower bound {}", strategy, plan.height, lb);
            prop_assert_eq!(plan.lower_bound, lb);
        }
    }

    #[test]
    fn a_capacity_is_met_or_refused(bufs in buffers()) {
        let lb = lower_bound(&bufs);
        let opts = PlanOptions { capacity: Some(lb), time_limit: Duration::from_millis(50), ..PlanOptions::default() };
        match build(&bufs, &opts) {
            Ok(plan) => {
                prop_assert!(plan.height <= lb);
                validate(&bufs, &plan.offsets, 1).unwrap();
            }
            Err(PlanError::DoesNotFit { best_height, .. }) => prop_assert!(best_height > lb),
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        }
    }

    #[test]
    fn validator_rejects_overlap_and_misalignment(bufs in buffers()) {
        let plan = build(&bufs, &PlanOptions { strategy: PlanStrategy::GreedySize, ..PlanOptions::default() }).unwrap();
        validate(&bufs, &plan.offsets, 1).unwrap();
        // Move one buffer onto a time-overlapping neighbour's address: must be an overlap.
        let n = bufs.len();
        let pair = (0..n).flat_map(|a| (0..n).map(move |b| (a, b))).find(|&(a, b)| {
            a != b && bufs[a].size_bytes > 0 && bufs[b].size_bytes > 0
                && bufs[a].lower < bufs[b].upper && bufs[b].lower < bufs[a].upper
                && plan.offsets[a] % bufs[b].align_bytes == 0
        });
        if let Some((a, b)) = pair {
            let mut bad = plan.offsets.clone();
            bad[b] = plan.offsets[a];
            let r = validate(&bufs, &bad, 1);
            prop_assert!(matches!(r, Err(PlanError::Overlap { .. })), "{:?}", r);
        }
        // Misalign a buffer that needs alignment.
        if let Some(i) = (0..n).find(|&i| bufs[i].align_bytes > 1) {
            let mut bad = plan.offsets.clone();
            bad[i] += 1;
            let r = validate(&bufs, &bad, 1);
            prop_assert!(matches!(r, Err(PlanError::Misaligned { .. })), "{:?}", r);
        }
    }
}

#[test]
fn validator_rejects_a_known_overlap_and_misalignment() {
    let b = |id: &str, lower, upper, size_bytes, align_bytes| PlanBuffer {
        id: id.into(),
        lower,
        upper,
        size_bytes,
        align_bytes,
    };
    let bufs = vec![
        b("x", 0, 4, 10, 1),
        b("y", 3, 6, 10, 8),
        b("z", 4, 8, 10, 1),
    ];
    assert!(
        validate(&bufs, &[0, 16, 0], 1).is_ok(),
        "x and z do not meet in time"
    );
    let e = validate(&bufs, &[0, 8, 0], 1).unwrap_err();
    assert_eq!(
        e,
        PlanError::Overlap {
            a: "x".into(),
            b: "y".into()
        }
    );
    let e = validate(&bufs, &[0, 12, 0], 1).unwrap_err();
    assert!(
        matches!(e, PlanError::Misaligned { ref id, offset_bytes: 12, align_bytes: 8 } if id == "y"),
        "{e}"
    );
    assert!(matches!(
        validate(&bufs, &[0, 16, 0], 32),
        Err(PlanError::Misaligned { .. })
    ));
}
