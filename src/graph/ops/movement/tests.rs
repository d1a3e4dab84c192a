//! Shape rules of the movement ops: reshape targets, permutations, concat and gather shapes,
//! split parts, `shape_of` bounds and slice ranges.

use super::*;
use crate::graph::ops::OpDef;
use crate::shape::DType;

fn s(d: &[u64]) -> Shape {
    Shape(d.to_vec())
}

#[test]
fn reshape_rules() {
    let r = |x: &[u64], t: &[i64]| infer_reshape(&s(x), t, false);
    assert_eq!(r(&[2, 3, 4], &[0, -1]).unwrap(), s(&[2, 12]));
    assert_eq!(r(&[2, 3, 4], &[4, 6]).unwrap(), s(&[4, 6]));
    assert!(r(&[2, 3], &[-1, -1]).is_err());
    assert!(r(&[2, 3], &[4, 2]).is_err());
    assert!(r(&[2, 3], &[-2, 3]).is_err());
    assert!(r(&[2, 3], &[0, 0, 0]).is_err());
    assert_eq!(r(&[0, 3], &[3, -1]).unwrap(), s(&[3, 0]));
    // allowzero: 0 is a zero extent, so a -1 beside it cannot be inferred.
    assert_eq!(
        infer_reshape(&s(&[0, 3, 4]), &[3, 4, 0], true).unwrap(),
        s(&[3, 4, 0])
    );
    assert!(infer_reshape(&s(&[0, 3]), &[0, -1], true).is_err());
    assert!(infer_reshape(&s(&[2, 3]), &[0, 6], true).is_err());
}

#[test]
fn transpose_concat_gather_split() {
    assert_eq!(
        infer_transpose(&s(&[2, 3, 4]), &[2, 0, 1]).unwrap(),
        s(&[4, 2, 3])
    );
    assert!(infer_transpose(&s(&[2, 3]), &[0, 0]).is_err());
    assert!(infer_transpose(&s(&[2, 3]), &[0]).is_err());
    let rev = Transpose { perm: vec![] };
    assert_eq!(rev.infer(&[&s(&[2, 3, 4])], &[]).unwrap(), s(&[4, 3, 2]));
    assert_eq!(
        infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 3, 4])], 1).unwrap(),
        s(&[1, 5, 4])
    );
    assert_eq!(
        infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 2, 5])], -1).unwrap(),
        s(&[1, 2, 9])
    );
    let e = infer_concat(&[&s(&[1, 2, 4]), &s(&[1, 3, 5])], 1).unwrap_err();
    assert!(e.to_string().contains("1x2x4 vs 1x3x5"), "{e}");
    assert!(infer_concat(&[&s(&[2])], 1).is_err());
    assert!(infer_concat(&[&s(&[2])], -2).is_err());
    assert_eq!(
        infer_gather(&s(&[50, 8]), &s(&[2, 3]), 0).unwrap(),
        s(&[2, 3, 8])
    );
    assert_eq!(
        infer_gather(&s(&[5, 6, 7]), &s(&[2]), -2).unwrap(),
        s(&[5, 2, 7])
    );
    assert_eq!(infer_gather(&s(&[5, 6]), &s(&[]), 1).unwrap(), s(&[5]));
    assert!(infer_gather(&s(&[]), &s(&[2]), 0).is_err());
    assert!(infer_gather(&s(&[4]), &s(&[2]), 1).is_err());
    let part = |sizes: Option<Vec<i64>>, parts, index| SplitPart {
        axis: -1,
        sizes,
        parts,
        index,
    };
    let x = s(&[2, 7]);
    let shapes: Vec<u64> = (0..4)
        .map(|i| part(None, 4, i).infer(&[&x], &[]).unwrap().0[1])
        .collect();
    assert_eq!(shapes, vec![2, 2, 2, 1], "ceil chunks, smaller last");
    assert_eq!(
        part(Some(vec![3, 0, 4]), 3, 2).range(&x).unwrap(),
        (1, 3, 4)
    );
    assert!(
        part(Some(vec![3, 3]), 2, 0).range(&x).is_err(),
        "sum 6 != 7"
    );
    assert!(part(Some(vec![8, -1]), 2, 0).range(&x).is_err());
    assert!(part(None, 2, 2).range(&x).is_err());
    let sh = |start, end| ShapeOf {
        start,
        end,
        dtype: DType::I64,
    };
    assert_eq!(sh(0, None).bounds(3), (0, 3));
    assert_eq!(sh(-1, None).bounds(3), (2, 3));
    assert_eq!(sh(1, Some(-1)).bounds(3), (1, 2));
    assert_eq!(sh(-10, Some(10)).bounds(3), (0, 3));
    assert_eq!(sh(2, Some(1)).bounds(3), (2, 2), "start past end is empty");
}

#[test]
fn slice_rules() {
    let r = slice_ranges(&s(&[10, 4]), &[0], &[-3], &[i64::MAX], &[1]).unwrap();
    assert_eq!(
        r[0],
        AxisRange {
            start: 7,
            step: 1,
            len: 3
        }
    );
    assert_eq!(r[1].len, 4);
    let r = slice_ranges(&s(&[10]), &[0], &[1], &[8], &[3]).unwrap();
    assert_eq!(
        r[0],
        AxisRange {
            start: 1,
            step: 3,
            len: 3
        }
    );
    assert_eq!(
        slice_ranges(&s(&[10]), &[0], &[5], &[2], &[1]).unwrap()[0].len,
        0
    );
    // Negative steps: 9, 7, 5, 3, 1 (start clamps to dim - 1, end to -1).
    let r = slice_ranges(&s(&[10]), &[-1], &[i64::MAX], &[i64::MIN], &[-2]).unwrap();
    assert_eq!(
        r[0],
        AxisRange {
            start: 9,
            step: -2,
            len: 5
        }
    );
    let r = slice_ranges(&s(&[10]), &[0], &[-2], &[2], &[-3]).unwrap();
    assert_eq!((r[0].start, r[0].len), (8, 2), "8, 5");
    assert_eq!(
        slice_ranges(&s(&[0]), &[0], &[0], &[-1], &[-1]).unwrap()[0].len,
        0
    );
    assert!(slice_ranges(&s(&[10]), &[0], &[0], &[2], &[0]).is_err());
    assert!(slice_ranges(&s(&[10]), &[1], &[0], &[2], &[1]).is_err());
    assert!(slice_ranges(&s(&[10, 2]), &[0, -2], &[0, 0], &[2, 2], &[1, 1]).is_err());
}
