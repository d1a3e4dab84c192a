//! The adaptive policy: the OpenVINO rule, with a look-ahead that grows with the buffer.
//!
//! Why: under linear growth (a KV cache gaining one token per decode step) the OpenVINO rule
//! reserves a fixed 10 steps, so it reallocates every 10 steps forever — 200 reallocations
//! for 2048 tokens (docs/design.md, "Shape predictor"). Reserving a fixed *fraction* of the
//! current size instead makes the number of reallocations logarithmic in the final length,
//! while the over-reservation never exceeds that fraction of what is in use: at any moment the buffer
//! was sized at most `ratio` times a need that has only grown since.
//!
//! The rule, for the last three shapes of an id:
//! - Two equal, non-zero, monotonic steps (a linear-growth streak): reserve `k` steps ahead,
//!   `k = max(k_openvino, k_fraction, 1)`, where `k_openvino` is the OpenVINO rule's
//!   `iterations` when its per-dimension and per-iteration limits hold (0 otherwise), and
//!   `k_fraction` is the largest `k` whose shape takes at most `ratio` times the current
//!   bytes. Steps above the per-dimension limit (prefill chunks) still get one step ahead,
//!   which halves their reallocations for at most one step of over-reservation.
//! - Otherwise the OpenVINO rule's percentage mode (`ratio`).
//! - Separately, [`super::ShapePredictor::should_reclaim`]: a buffer whose last
//!   [`RECLAIM_ROWS`] needs all stayed under `1 / RECLAIM_FACTOR` of it is mostly empty;
//!   [`super::Ledger`] shrinks such a buffer when the request as a whole over-reserves.
//!
//! `"0 0 0 1.0"` disables this policy too: `iterations = 0` removes the one-step minimum and
//! `ratio = 1.0` leaves no fraction to grow into.

use super::openvino::iterations_mode_applies;
use super::{add_steps, percentage, steps, PredictorError, PredictorOptions};
use crate::shape::Shape;
use std::collections::VecDeque;

/// A buffer is reclaimed when `needed * RECLAIM_FACTOR < allocated` (the OpenVINO plugin's
/// "reclaim when required * 10 < allocated").
pub const RECLAIM_FACTOR: u64 = 10;

/// ... for this many consecutive recorded needs of its id (the current one included), so a
/// buffer that is small for a few iterations between large ones keeps its room (measured: 2
/// or 4 reclaim image-batch buffers that the next batch needs again; 8 and 16 do not).
pub const RECLAIM_ROWS: usize = 8;

/// Largest look-ahead considered, in steps; bounds the search below.
const MAX_LOOKAHEAD_STEPS: u64 = 1 << 32;

/// The adaptive prediction from the last three shapes of an id (oldest first, equal ranks);
/// `None` means "allocate exactly".
pub(super) fn predict(
    id: &str,
    shapes: [&Shape; 3],
    dtype_bits: u32,
    options: &PredictorOptions,
) -> Result<Option<Shape>, PredictorError> {
    let current = shapes[2];
    if let Some((older, newer)) = steps(shapes) {
        if older == newer && newer.iter().any(|&s| s > 0) {
            let k_openvino =
                if iterations_mode_applies(current, &older, &newer, dtype_bits, options)? {
                    u64::from(options.iterations)
                } else {
                    0
                };
            let k_fraction = fraction_steps(current, &newer, dtype_bits, options.ratio)?;
            let k_min = u64::from(options.iterations > 0);
            let k = k_openvino.max(k_fraction).max(k_min);
            if k > 0 {
                return add_steps(id, current, &newer, k).map(Some);
            }
        }
    }
    if options.ratio > 1.0 {
        return percentage(current, options.ratio);
    }
    Ok(None)
}

/// The largest `k` such that `current + step * k` takes at most `ratio` times the bytes of
/// `current` (0 when `ratio <= 1`). Bytes grow monotonically with `k`, so a binary search.
fn fraction_steps(
    current: &Shape,
    step: &[u64],
    dtype_bits: u32,
    ratio: f32,
) -> Result<u64, PredictorError> {
    if ratio <= 1.0 {
        return Ok(0);
    }
    let current_bytes = current.size_bytes_for_bits(dtype_bits)?;
    // f64 holds every byte count that matters here well enough: the cap is a heuristic bound,
    // not a reference value that must match bit for bit.
    let limit_bytes = current_bytes as f64 * f64::from(ratio);
    let fits = |k: u64| -> bool {
        let dims: Option<Vec<u64>> = current
            .dims()
            .iter()
            .zip(step)
            .map(|(&c, &s)| s.checked_mul(k).and_then(|g| c.checked_add(g)))
            .collect();
        match dims.and_then(|d| Shape(d).size_bytes_for_bits(dtype_bits).ok()) {
            Some(bytes) => (bytes as f64) <= limit_bytes,
            None => false,
        }
    };
    let (mut lo, mut hi) = (0u64, MAX_LOOKAHEAD_STEPS);
    if fits(hi) {
        return Ok(hi);
    }
    // Invariant: fits(lo), !fits(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// The reclaim rule over the recorded needs of one id (see
/// [`super::ShapePredictor::should_reclaim`]).
pub(super) fn should_reclaim(
    recent_bytes: &VecDeque<u64>,
    needed_bytes: u64,
    allocated_bytes: u64,
) -> bool {
    let small = |b: u64| u128::from(b) * u128::from(RECLAIM_FACTOR) < u128::from(allocated_bytes);
    small(needed_bytes)
        && recent_bytes.len() >= RECLAIM_ROWS
        && recent_bytes.iter().all(|&b| small(b))
}

#[cfg(test)]
mod tests {
    use super::RECLAIM_ROWS;
    use crate::memory::predictor::{Policy, PredictorOptions, ShapePredictor};
    use crate::shape::Shape;

    use crate::memory::predictor::test_support::{defaults, last_with, s};

    /// Feeds `shapes` to a fresh adaptive predictor and returns the last answer.
    fn last(options: PredictorOptions, shapes: &[&[u64]], bits: u32) -> (bool, Shape) {
        last_with(Policy::Adaptive, options, shapes, bits)
    }

    #[test]
    fn small_buffers_keep_the_openvino_look_ahead() {
        // t = 7: 10% of 7 steps is 0, so the OpenVINO rule's 10 iterations win.
        assert_eq!(
            last(
                defaults(),
                &[&[1, 12, 5, 64], &[1, 12, 6, 64], &[1, 12, 7, 64]],
                32
            ),
            (true, s(&[1, 12, 17, 64]))
        );
    }

    #[test]
    fn large_buffers_look_ahead_a_tenth_of_their_size() {
        // t = 1000: 10% is 100 steps, more than the OpenVINO rule's 10.
        let (predicted, shape) = last(
            defaults(),
            &[&[1, 12, 998, 64], &[1, 12, 999, 64], &[1, 12, 1000, 64]],
            16,
        );
        assert!(predicted);
        assert_eq!(shape, s(&[1, 12, 1100, 64]));
        let cur = s(&[1, 12, 1000, 64]).size_bytes_for_bits(16).unwrap() as f64;
        assert!(shape.size_bytes_for_bits(16).unwrap() as f64 <= cur * 1.1f32 as f64);
    }

    #[test]
    fn large_steps_get_one_step_ahead() {
        // Prefill chunks of 128: above the per-dimension limit, the OpenVINO rule would give
        // 1.1 * 384 = 422 (too small for the next chunk); adaptive reserves the next chunk.
        assert_eq!(
            last(
                defaults(),
                &[&[1, 128, 64], &[1, 256, 64], &[1, 384, 64]],
                32
            ),
            (true, s(&[1, 512, 64]))
        );
    }

    #[test]
    fn irregular_growth_uses_percentage_like_openvino() {
        let shapes: &[&[u64]] = &[&[1, 10], &[1, 11], &[1, 13]];
        let mut r = ShapePredictor::new(Policy::OpenVino, defaults());
        let mut expected = (false, Shape::default());
        for d in shapes {
            expected = r
                .predict_preallocation_shape("n", &s(d), 32, false)
                .unwrap();
        }
        assert_eq!(last(defaults(), shapes, 32), expected);
        assert!(expected.0);
    }

    #[test]
    fn disabled_options_never_predict() {
        for shapes in [
            &[&[1u64, 1][..], &[1, 2], &[1, 3]][..],
            &[&[1, 1000], &[1, 1001], &[1, 1002]],
            &[&[5, 5], &[5, 5], &[5, 5]],
            &[&[1], &[100], &[300]],
        ] {
            assert_eq!(
                last(PredictorOptions::disabled(), shapes, 32),
                (false, s(&[]))
            );
        }
    }

    #[test]
    fn reclaim_needs_a_streak_of_small_needs() {
        let mut p = ShapePredictor::new(Policy::Adaptive, defaults());
        let allocated = 1000;
        // 8 needs under a tenth, one of exactly a tenth (100 * 10 is not below 1000), 8 more.
        let mut needs = vec![99u64; RECLAIM_ROWS];
        needs.push(100);
        needs.extend(vec![50u64; RECLAIM_ROWS]);
        let mut yes = Vec::new();
        for (i, &needed) in needs.iter().enumerate() {
            p.predict_preallocation_shape("n", &s(&[needed]), 8, true)
                .unwrap();
            if p.should_reclaim("n", needed, allocated) {
                yes.push(i);
            }
        }
        assert_eq!(yes, vec![RECLAIM_ROWS - 1, 2 * RECLAIM_ROWS]);
        assert!(!p.should_reclaim("unknown", 1, allocated));
        let r = ShapePredictor::new(Policy::OpenVino, defaults());
        assert!(!r.should_reclaim("n", 1, allocated));
    }
}
