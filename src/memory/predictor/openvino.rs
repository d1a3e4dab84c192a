//! The openvino policy: the OpenVINO GPU plugin's preallocation rule, bit for bit
//! (docs/design.md, "Shape predictor").

use super::{add_steps, percentage, steps, PredictorError, PredictorOptions};
use crate::shape::Shape;

/// The OpenVINO prediction from the last three shapes of an id (oldest first, equal ranks,
/// the current shape last); `None` means "allocate exactly".
///
/// Iterations-ahead mode when the two latest steps are equal, not all zero, every component
/// at most `max_per_dim_diff`, and the unit slice (the current shape with every growing
/// dimension set to 1) takes at most `max_per_iter_bytes`: `current + step * iterations`.
/// Otherwise percentage mode when `ratio > 1.0` (also for zero steps and for shrinking
/// shapes).
pub(super) fn predict(
    id: &str,
    shapes: [&Shape; 3],
    dtype_bits: u32,
    options: &PredictorOptions,
) -> Result<Option<Shape>, PredictorError> {
    let current = shapes[2];
    if let Some((older, newer)) = steps(shapes) {
        if iterations_mode_applies(current, &older, &newer, dtype_bits, options)? {
            return add_steps(id, current, &newer, u64::from(options.iterations)).map(Some);
        }
    }
    if options.ratio > 1.0 {
        return percentage(current, options.ratio);
    }
    Ok(None)
}

/// The OpenVINO conditions of iterations-ahead mode for monotonic steps `older`, `newer`.
pub(super) fn iterations_mode_applies(
    current: &Shape,
    older: &[u64],
    newer: &[u64],
    dtype_bits: u32,
    options: &PredictorOptions,
) -> Result<bool, PredictorError> {
    if older != newer || newer.iter().all(|&s| s == 0) {
        return Ok(false);
    }
    if newer.iter().any(|&s| s > options.max_per_dim_diff) {
        return Ok(false);
    }
    Ok(unit_slice_bytes(current, newer, dtype_bits)? <= options.max_per_iter_bytes)
}

/// Bytes of one step's slice: the current shape with every growing dimension set to 1,
/// `ceil(elements * bits / 8)`.
pub(super) fn unit_slice_bytes(
    current: &Shape,
    step: &[u64],
    dtype_bits: u32,
) -> Result<u64, PredictorError> {
    let slice: Vec<u64> = current
        .dims()
        .iter()
        .zip(step)
        .map(|(&c, &s)| if s == 0 { c } else { 1 })
        .collect();
    Ok(Shape(slice).size_bytes_for_bits(dtype_bits)?)
}

#[cfg(test)]
mod tests {
    use crate::memory::predictor::{Policy, PredictorError, PredictorOptions, ShapePredictor};
    use crate::shape::Shape;

    use crate::memory::predictor::test_support::{defaults, last_with, s};

    /// Feeds `shapes` to a fresh openvino predictor and returns the last answer.
    fn last(options: PredictorOptions, shapes: &[&[u64]], bits: u32) -> (bool, Shape) {
        last_with(Policy::OpenVino, options, shapes, bits)
    }

    #[test]
    fn fewer_than_three_shapes_predict_nothing() {
        assert_eq!(last(defaults(), &[&[1, 4]], 32), (false, s(&[])));
        assert_eq!(last(defaults(), &[&[1, 4], &[1, 5]], 32), (false, s(&[])));
    }

    #[test]
    fn linear_growth_predicts_ten_iterations_ahead() {
        assert_eq!(
            last(
                defaults(),
                &[&[1, 12, 5, 64], &[1, 12, 6, 64], &[1, 12, 7, 64]],
                32
            ),
            (true, s(&[1, 12, 17, 64]))
        );
        // Step 2 in two dimensions at once: both grow by 20.
        assert_eq!(
            last(defaults(), &[&[2, 2], &[4, 4], &[6, 6]], 8),
            (true, s(&[26, 26]))
        );
    }

    #[test]
    fn step_above_per_dim_limit_falls_back_to_percentage() {
        // Steps equal (3) but above the limit 2: percentage mode, 7*4 = 28 elements * 1.1.
        assert_eq!(
            last(defaults(), &[&[1, 4], &[4, 4], &[7, 4]], 32),
            (true, s(&[(28.0f32 * 1.1f32) as u64, 1]))
        );
        assert_eq!((28.0f32 * 1.1f32) as u64, 30);
        // Step 2 passes.
        assert_eq!(
            last(defaults(), &[&[1, 4], &[3, 4], &[5, 4]], 32),
            (true, s(&[25, 4]))
        );
    }

    #[test]
    fn unit_slice_of_16384_bytes_passes_and_16385_does_not() {
        // Unit slice [1, 4096] f32 = 16384 bytes: iterations mode.
        assert_eq!(
            last(defaults(), &[&[1, 4096], &[2, 4096], &[3, 4096]], 32),
            (true, s(&[13, 4096]))
        );
        // Unit slice [1, 16385] u8 = 16385 bytes: percentage mode.
        let (predicted, shape) = last(defaults(), &[&[1, 16385], &[2, 16385], &[3, 16385]], 8);
        assert!(predicted);
        assert_eq!(shape, s(&[(49155.0f32 * 1.1f32) as u64, 1]));
        // Rounding up to whole bytes: 32769 4-bit elements are 16385 bytes, 32768 are 16384.
        assert_eq!(
            last(defaults(), &[&[1, 32768], &[2, 32768], &[3, 32768]], 4),
            (true, s(&[13, 32768]))
        );
        assert_eq!(
            last(defaults(), &[&[1, 32769], &[2, 32769], &[3, 32769]], 4).1,
            s(&[(98307.0f32 * 1.1f32) as u64, 1])
        );
    }

    #[test]
    fn zero_steps_use_percentage_only_above_ratio_one() {
        let same: &[&[u64]] = &[&[2, 5], &[2, 5], &[2, 5]];
        assert_eq!(last(defaults().with_ratio(1.0), same, 32), (false, s(&[])));
        assert_eq!(last(defaults(), same, 32), (true, s(&[11, 1])));
        assert_eq!((10.0f32 * 1.1f32) as u64, 11);
    }

    #[test]
    fn unequal_steps_use_percentage() {
        assert_eq!(
            last(defaults(), &[&[1, 10], &[1, 11], &[1, 13]], 32),
            (true, s(&[(13.0f32 * 1.1f32) as u64, 1]))
        );
        assert_eq!(
            last(
                defaults().with_ratio(1.0),
                &[&[1, 10], &[1, 11], &[1, 13]],
                32
            ),
            (false, s(&[]))
        );
    }

    #[test]
    fn percentage_multiplies_in_f32_and_truncates() {
        // 2^25 - 1 is not representable in f32: it becomes 2^25 before the multiply, and the
        // product rounds to a multiple of 4 (exact: 36909874.1).
        let n: u64 = 33_554_431;
        let expect = 36_909_876;
        assert_eq!((n as f32 * 1.1f32) as u64, expect);
        assert_eq!(
            last(defaults(), &[&[n], &[n], &[n]], 8),
            (true, s(&[expect]))
        );
    }

    #[test]
    fn only_the_last_three_shapes_count() {
        // Irregular start, then three shapes with equal steps: iterations mode.
        assert_eq!(
            last(
                defaults(),
                &[&[1, 1], &[1, 9], &[1, 2], &[1, 3], &[1, 4]],
                32
            ),
            (true, s(&[1, 14]))
        );
        // Linear start, then the last three irregular: percentage mode.
        assert_eq!(
            last(
                defaults(),
                &[&[1, 1], &[1, 2], &[1, 3], &[1, 4], &[1, 6]],
                32
            ),
            (true, s(&[(6.0f32 * 1.1f32) as u64, 1]))
        );
    }

    #[test]
    fn decreasing_shapes_are_not_monotonic_growth() {
        assert_eq!(
            last(defaults(), &[&[1, 9], &[1, 8], &[1, 7]], 32),
            (true, s(&[(7.0f32 * 1.1f32) as u64, 1]))
        );
        // One dimension grows by 1 while another shrinks: still not monotonic.
        assert_eq!(
            last(defaults(), &[&[3, 7], &[4, 7], &[5, 6]], 32),
            (true, s(&[(30.0f32 * 1.1f32) as u64, 1]))
        );
        assert_eq!(
            last(defaults().with_ratio(1.0), &[&[1, 9], &[1, 8], &[1, 7]], 32),
            (false, s(&[]))
        );
    }

    #[test]
    fn can_reuse_buffer_records_and_answers_nothing() {
        let mut p = ShapePredictor::new(Policy::OpenVino, defaults());
        for t in 1..=3 {
            let r = p
                .predict_preallocation_shape("n", &s(&[1, t]), 32, true)
                .unwrap();
            assert_eq!(r, (false, s(&[])));
        }
        // The three reused shapes were recorded: the fourth call predicts from them.
        let r = p
            .predict_preallocation_shape("n", &s(&[1, 4]), 32, false)
            .unwrap();
        assert_eq!(r, (true, s(&[1, 14])));
    }

    #[test]
    fn ids_are_independent() {
        let mut p = ShapePredictor::new(Policy::OpenVino, defaults());
        for t in 1..=3 {
            p.predict_preallocation_shape("a", &s(&[t]), 32, false)
                .unwrap();
        }
        let r = p
            .predict_preallocation_shape("b", &s(&[4]), 32, false)
            .unwrap();
        assert_eq!(r, (false, s(&[])));
    }

    #[test]
    fn rank_change_is_an_error_and_records_nothing() {
        let mut p = ShapePredictor::new(Policy::OpenVino, defaults());
        p.predict_preallocation_shape("n", &s(&[1, 2]), 32, false)
            .unwrap();
        let err = p
            .predict_preallocation_shape("n", &s(&[1, 2, 3]), 32, false)
            .unwrap_err();
        assert_eq!(
            err,
            PredictorError::RankChanged {
                id: "n".into(),
                previous_rank: 2,
                current_rank: 3
            }
        );
        p.predict_preallocation_shape("n", &s(&[1, 3]), 32, false)
            .unwrap();
        let r = p
            .predict_preallocation_shape("n", &s(&[1, 4]), 32, false)
            .unwrap();
        assert_eq!(r, (true, s(&[1, 14])));
    }

    #[test]
    fn disabled_options_never_predict() {
        let o = PredictorOptions::disabled();
        for shapes in [
            &[&[1u64, 1][..], &[1, 2], &[1, 3]][..],
            &[&[5, 5], &[5, 5], &[5, 5]],
            &[&[9], &[3], &[1]],
            &[&[1], &[100], &[300]],
        ] {
            assert_eq!(last(o, shapes, 32), (false, s(&[])));
        }
    }

    #[test]
    fn iterations_count_comes_from_options() {
        assert_eq!(
            last(defaults().with_iterations(4), &[&[1], &[2], &[3]], 32),
            (true, s(&[7]))
        );
        // Zero iterations: OpenVINO answers the current shape, predicted.
        assert_eq!(
            last(defaults().with_iterations(0), &[&[1], &[2], &[3]], 32),
            (true, s(&[3]))
        );
    }

    #[test]
    fn overflowing_prediction_is_an_error() {
        let mut p = ShapePredictor::new(Policy::OpenVino, defaults());
        let base = u64::MAX - 5;
        for d in [base - 2, base - 1] {
            p.predict_preallocation_shape("n", &s(&[d]), 8, false)
                .unwrap();
        }
        let err = p
            .predict_preallocation_shape("n", &s(&[base]), 8, false)
            .unwrap_err();
        assert!(
            matches!(err, PredictorError::PredictionOverflow { .. }),
            "{err}"
        );
    }

    #[test]
    fn scalar_shapes_never_predict() {
        assert_eq!(last(defaults(), &[&[], &[], &[]], 32), (false, s(&[])));
    }
}
