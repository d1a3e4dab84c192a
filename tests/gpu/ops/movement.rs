//! The movement and generate families against the CPU reference on every test backend
//! (Vulkan/lavapipe and GL/llvmpipe unless WGPU_BACKEND picks): gather on any axis with
//! i32 / u32 / i64 indices (negative ones from the end), slices with negative steps, split
//! parts, expand, transpose and concat of 64-bit elements, the views on 8- and 16-bit types,
//! shape with start/end as i64, constant_of_shape of every plain type, range, trilu, and the
//! parameters held in tensors (slice_to's starts/ends/steps/axes, split sizes, squeeze and
//! unsqueeze axes), size_of.
//! Everything here is exact (data movement and integers); random cases are seeded. A few
//! known answers pin the reference to ONNX's definitions.

use super::*;
use dynrt::gpu::kernels::Kernels;
use dynrt::graph::ops::{
    self, ConstantOfShape, Expand, Flatten, Gather, Range, ReshapeTo, ShapeOf, SizeOf, Slice,
    SliceTo, SplitPart, Squeeze, Transpose, Trilu, Unsqueeze,
};
use dynrt::graph::reference::{RefTensor, Values};
use dynrt::graph::Op;
use dynrt::rng::SplitMix64;
use dynrt::shape::DType;

/// A random tensor of `dtype` (f32 in [-1, 1), integers in [-1000, 1000)).
fn rand_of(rng: &mut SplitMix64, dtype: DType, dims: &[u64]) -> RefTensor {
    if dtype == DType::F32 {
        f32s(rng, dims)
    } else {
        rand_ints(rng, dtype, dims, -1000, 1000)
    }
}

#[test]
fn gather_on_any_axis_with_negative_and_64_bit_indices() {
    for gpu in gpus("gather_on_any_axis_with_negative_and_64_bit_indices") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(21);
        let mut cases = 0;
        for i in 0..40 {
            let dims = rand_dims(&mut rng, 1, 4, 6, false);
            let axis = rng.range(0, dims.len() as u64) as i64
                - if i % 2 == 0 { 0 } else { dims.len() as i64 };
            let extent = dims[(axis.rem_euclid(dims.len() as i64)) as usize] as i64;
            let data_type = [DType::F32, DType::I64, DType::I32][i % 3];
            let ids_type = [DType::I64, DType::I32, DType::U32, DType::I64][i % 4];
            let data = rand_of(&mut rng, data_type, &dims);
            let id_dims = rand_dims(&mut rng, 0, 2, 4, true);
            // Anywhere in range, negative ones from the end (out of range is an error the
            // runtime reports: tests/hostile/onnx.rs).
            let lo = if ids_type == DType::U32 { 0 } else { -extent };
            let ids = rand_ints(&mut rng, ids_type, &id_dims, lo, extent);
            let op = Op::Gather(Gather { axis });
            check(
                &gpu,
                &mut k,
                &op,
                &[&data, &ids],
                EXACT,
                &format!("gather #{i} {dims:?} axis {axis} ids {id_dims:?} {ids_type}"),
            );
            cases += 1;
        }
        assert_eq!(cases, 40);
        // Known answers (ONNX Gather, axis 1): -1 is the last column, -3 the first.
        let data = ints(DType::I64, &[2, 3], &[1, 2, 3, 4, 5, 6]);
        let ids = ints(DType::I64, &[3], &[-1, 0, -3]);
        let got = check(
            &gpu,
            &mut k,
            &Op::Gather(Gather { axis: 1 }),
            &[&data, &ids],
            EXACT,
            "gather known",
        );
        assert_eq!(got.values, Values::Int(vec![3, 1, 1, 6, 4, 4]));
    }
}

#[test]
fn slices_with_negative_steps_split_parts_and_64_bit_elements() {
    for gpu in gpus("slices_with_negative_steps_split_parts_and_64_bit_elements") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(22);
        for i in 0..40 {
            let dims = rand_dims(&mut rng, 1, 4, 7, true);
            let dtype = [DType::F32, DType::I64][i % 2];
            let x = rand_of(&mut rng, dtype, &dims);
            let n = rng.range(1, dims.len() as u64 + 1) as usize;
            let axes = rand_axes(&mut rng, dims.len(), n);
            let mut starts = Vec::new();
            let mut ends = Vec::new();
            let mut steps = Vec::new();
            for &a in &axes {
                let d = dims[a.rem_euclid(dims.len() as i64) as usize] as i64;
                let step = [1, 2, 3, -1, -2, -3][rng.range(0, 6) as usize];
                let pick = |rng: &mut SplitMix64| match rng.range(0, 5) {
                    0 => i64::MAX,
                    1 => i64::MIN,
                    _ => rng.range(0, 2 * d as u64 + 5) as i64 - d - 2,
                };
                starts.push(pick(&mut rng));
                ends.push(pick(&mut rng));
                steps.push(step);
            }
            let op = Op::Slice(Slice {
                axes: axes.clone(),
                starts: starts.clone(),
                ends: ends.clone(),
                steps: steps.clone(),
            });
            check(
                &gpu,
                &mut k,
                &op,
                &[&x],
                EXACT,
                &format!("slice #{i} {dims:?} {axes:?} {starts:?}:{ends:?}:{steps:?} {dtype}"),
            );
            // Split along a random axis, by sizes or into equal parts.
            let axis = rng.range(0, dims.len() as u64) as usize;
            let d = dims[axis];
            let parts = rng.range(1, 4) as usize;
            let sizes = if i % 3 == 0 {
                None
            } else {
                let mut left = d as i64;
                let mut v = Vec::new();
                for p in 0..parts {
                    let take = if p + 1 == parts {
                        left
                    } else {
                        rng.range(0, left as u64 + 1) as i64
                    };
                    v.push(take);
                    left -= take;
                }
                Some(v)
            };
            for index in 0..parts {
                let op = Op::SplitPart(SplitPart {
                    axis: axis as i64,
                    sizes: sizes.clone(),
                    parts,
                    index,
                });
                check(
                    &gpu,
                    &mut k,
                    &op,
                    &[&x],
                    EXACT,
                    &format!("split #{i} {dims:?} axis {axis} {sizes:?}/{parts} part {index}"),
                );
            }
        }
        // Known answer: [0..10) from the end, every second: 9, 7, 5, 3, 1.
        let x = ints(DType::I64, &[10], &(0..10).collect::<Vec<_>>());
        let op = Op::Slice(Slice {
            axes: vec![0],
            starts: vec![-1],
            ends: vec![i64::MIN],
            steps: vec![-2],
        });
        let got = check(&gpu, &mut k, &op, &[&x], EXACT, "slice backwards");
        assert_eq!(got.values, Values::Int(vec![9, 7, 5, 3, 1]));
    }
}

#[test]
fn transpose_concat_and_expand_move_64_bit_elements() {
    for gpu in gpus("transpose_concat_and_expand_move_64_bit_elements") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(23);
        for i in 0..30 {
            let dtype = [DType::I64, DType::F32, DType::I32][i % 3];
            let dims = rand_dims(&mut rng, 1, 5, 5, true);
            let x = rand_of(&mut rng, dtype, &dims);
            // Transpose: a random permutation, or the reversal (empty perm).
            let mut perm: Vec<usize> = (0..dims.len()).collect();
            for j in 0..perm.len() {
                let o = rng.range(0, perm.len() as u64) as usize;
                perm.swap(j, o);
            }
            if i % 4 == 0 {
                perm.clear();
            }
            check(
                &gpu,
                &mut k,
                &Op::Transpose(Transpose { perm: perm.clone() }),
                &[&x],
                EXACT,
                &format!("transpose #{i} {dims:?} {perm:?} {dtype}"),
            );
            // Concat along a negative axis.
            let axis = rng.range(0, dims.len() as u64) as usize;
            let parts: Vec<RefTensor> = (0..3)
                .map(|_| {
                    let mut p = dims.clone();
                    p[axis] = rng.range(0, 4);
                    rand_of(&mut rng, dtype, &p)
                })
                .collect();
            let refs: Vec<&RefTensor> = parts.iter().collect();
            let op = Op::Concat(ops::Concat {
                axis: axis as i64 - dims.len() as i64,
            });
            check(
                &gpu,
                &mut k,
                &op,
                &refs,
                EXACT,
                &format!("concat #{i} {dims:?} axis {axis} {dtype}"),
            );
            // Expand: some dims of x are 1 and grow; the target may add leading dims.
            let small: Vec<u64> = dims
                .iter()
                .map(|&d| if rng.range(0, 2) == 0 { 1 } else { d })
                .collect();
            let x = rand_of(&mut rng, dtype, &small);
            let mut target: Vec<i64> = (0..rng.range(0, 2))
                .map(|_| rng.range(1, 3) as i64)
                .collect();
            target.extend(dims.iter().zip(&small).map(|(&d, &sd)| {
                if sd == d && rng.range(0, 3) == 0 {
                    1
                } else {
                    d as i64
                }
            }));
            let shape = ints(DType::I64, &[target.len() as u64], &target);
            check(
                &gpu,
                &mut k,
                &Op::Expand(Expand),
                &[&x, &shape],
                EXACT,
                &format!("expand #{i} {small:?} to {target:?} {dtype}"),
            );
        }
    }
}

#[test]
fn views_move_whole_words_of_any_plain_type() {
    for gpu in gpus("views_move_whole_words_of_any_plain_type") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(24);
        for (i, dtype) in [
            DType::Bool,
            DType::U8,
            DType::I8,
            DType::F16,
            DType::I64,
            DType::F32,
        ]
        .into_iter()
        .enumerate()
        {
            for dims in [vec![3u64, 5, 1], vec![1, 7, 1], vec![2, 1, 3, 1]] {
                let n = dims.iter().product::<u64>() as usize;
                let x = match dtype {
                    DType::F16 | DType::F32 => RefTensor::from_f32(
                        s(&dims),
                        dtype,
                        (0..n).map(|_| rng.uniform(-4.0, 4.0)).collect(),
                    ),
                    DType::Bool => rand_ints(&mut rng, dtype, &dims, 0, 2),
                    _ => rand_ints(&mut rng, dtype, &dims, -100, 100),
                };
                let ctx = format!("{dtype} {dims:?}");
                check(
                    &gpu,
                    &mut k,
                    &Op::Squeeze(Squeeze { axes: None }),
                    &[&x],
                    EXACT,
                    &format!("squeeze {ctx}"),
                );
                check(
                    &gpu,
                    &mut k,
                    &Op::Squeeze(Squeeze {
                        axes: Some(vec![-1]),
                    }),
                    &[&x],
                    EXACT,
                    &format!("squeeze -1 {ctx}"),
                );
                check(
                    &gpu,
                    &mut k,
                    &Op::Unsqueeze(Unsqueeze { axes: vec![0, -1] }),
                    &[&x],
                    EXACT,
                    &format!("unsqueeze {ctx}"),
                );
                check(
                    &gpu,
                    &mut k,
                    &Op::Flatten(Flatten {
                        axis: (i as i64 % 3) - 1,
                    }),
                    &[&x],
                    EXACT,
                    &format!("flatten {ctx}"),
                );
                let target = ints(DType::I64, &[2], &[n as i64, -1]);
                check(
                    &gpu,
                    &mut k,
                    &Op::ReshapeTo(ReshapeTo { allow_zero: true }),
                    &[&x, &target],
                    EXACT,
                    &format!("reshape {ctx}"),
                );
            }
        }
        // allowzero: a 0 in the target is a zero extent, not a copy of the input's.
        let x = f32s(&mut rng, &[0, 3]);
        let target = ints(DType::I64, &[3], &[3, 0, 5]);
        let (out, _) = infer(
            &Op::ReshapeTo(ReshapeTo { allow_zero: true }),
            &[&x, &target],
        );
        assert_eq!(out, s(&[3, 0, 5]));
    }
}

#[test]
fn shape_constant_of_shape_range_and_trilu() {
    for gpu in gpus("shape_constant_of_shape_range_and_trilu") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(25);
        // Shape with start/end, as i64 (ONNX) and i32 (the builder's).
        let x = f32s(&mut rng, &[2, 3, 0, 7]);
        for (start, end, want) in [
            (0, None, vec![2, 3, 0, 7]),
            (1, Some(-1), vec![3, 0]),
            (-1, None, vec![7]),
            (3, Some(1), vec![]),
        ] {
            for dtype in [DType::I64, DType::I32] {
                let op = Op::ShapeOf(ShapeOf { start, end, dtype });
                let got = check(
                    &gpu,
                    &mut k,
                    &op,
                    &[&x],
                    EXACT,
                    &format!("shape {start}..{end:?} {dtype}"),
                );
                assert_eq!(got.values, Values::Int(want.clone()));
            }
        }
        // ConstantOfShape of every plain type (8- and 16-bit values repeat inside a word).
        let shape = ints(DType::I64, &[3], &[2, 3, 3]);
        for (dtype, bytes) in [
            (DType::F32, 1.5f32.to_le_bytes().to_vec()),
            (DType::I64, (-3i64).to_le_bytes().to_vec()),
            (DType::I32, 7i32.to_le_bytes().to_vec()),
            (DType::U8, vec![200]),
            (DType::Bool, vec![1]),
            (DType::F16, half::f16::from_f32(-2.5).to_le_bytes().to_vec()),
        ] {
            let fill = ConstantOfShape::from_le_bytes(dtype, &bytes).unwrap();
            let got = check(
                &gpu,
                &mut k,
                &Op::ConstantOfShape(fill),
                &[&shape],
                EXACT,
                &format!("constant_of_shape {dtype}"),
            );
            let host = got.to_host().unwrap();
            assert!(
                host.bytes
                    .chunks(bytes.len())
                    .all(|c| c == bytes.as_slice()),
                "{dtype}: {:?}",
                host.bytes
            );
        }
        let empty = ints(DType::I64, &[1], &[0]);
        check(
            &gpu,
            &mut k,
            &Op::ConstantOfShape(ConstantOfShape::f32(1.0)),
            &[&empty],
            EXACT,
            "constant_of_shape empty",
        );
        // Range: integers (the length needs host values), start and delta read on the device.
        for (dtype, start, limit, delta) in [
            (DType::I64, 3, 17, 3),
            (DType::I32, 10, -5, -4),
            (DType::I64, -2, 6, 1),
            (DType::I32, 0, 1000, 1),
        ] {
            let t = |v: i64| ints(dtype, &[], &[v]);
            let (a, b, c) = (t(start), t(limit), t(delta));
            check(
                &gpu,
                &mut k,
                &Op::Range(Range),
                &[&a, &b, &c],
                EXACT,
                &format!("range {dtype} {start}..{limit} by {delta}"),
            );
        }
        // f32: the caller knows the length (float values are not shape data).
        let t = |v: f32| RefTensor::from_f32(s(&[]), DType::F32, vec![v]);
        let got = check_out(
            &gpu,
            &mut k,
            &Op::Range(Range),
            &[&t(1.0), &t(2.0), &t(0.25)],
            &s(&[4]),
            DType::F32,
            Tol {
                atol: 1e-6,
                rtol: 0.0,
            },
            "range f32",
        );
        assert_eq!(got.to_f32(), vec![1.0, 1.25, 1.5, 1.75]);
        // Trilu: random shapes, k from an i64 or i32 input or none, 32- and 64-bit elements.
        for i in 0..24 {
            let dims = rand_dims(&mut rng, 2, 4, 6, true);
            let dtype = [DType::I64, DType::F32][i % 2];
            let x = rand_of(&mut rng, dtype, &dims);
            let upper = i % 4 < 2;
            let op = Op::Trilu(Trilu { upper });
            let kv = rng.range(0, 13) as i64 - 6;
            let k_in = ints([DType::I64, DType::I32][i % 3 % 2], &[], &[kv]);
            let ins: Vec<&RefTensor> = if i % 3 == 2 {
                vec![&x]
            } else {
                vec![&x, &k_in]
            };
            check(
                &gpu,
                &mut k,
                &op,
                &ins,
                EXACT,
                &format!("trilu #{i} {dims:?} upper {upper} k {kv} {dtype}"),
            );
        }
        // Known answer: the upper triangle above the main diagonal (k = 1) of a 3x3.
        let x = ints(DType::I64, &[3, 3], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let kk = ints(DType::I64, &[], &[1]);
        let got = check(
            &gpu,
            &mut k,
            &Op::Trilu(Trilu { upper: true }),
            &[&x, &kk],
            EXACT,
            "triu k=1",
        );
        assert_eq!(got.values, Values::Int(vec![0, 2, 3, 0, 0, 6, 0, 0, 0]));
        // A huge k held in an i64 saturates instead of wrapping to a small one.
        let big = ints(DType::I64, &[], &[1 << 40]);
        let got = check(
            &gpu,
            &mut k,
            &Op::Trilu(Trilu { upper: false }),
            &[&x, &big],
            EXACT,
            "tril k=2^40",
        );
        assert_eq!(got.values, x.values);
    }
}

#[test]
fn parameters_held_in_tensors_are_read_on_the_device() {
    for gpu in gpus("parameters_held_in_tensors_are_read_on_the_device") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(26);
        // slice_to: starts/ends/steps (and axes) as tensors, i32 or i64, 32- or 64-bit data.
        for i in 0..30 {
            let dims = rand_dims(&mut rng, 1, 4, 7, true);
            let dtype = [DType::F32, DType::I64][i % 2];
            let ptype = [DType::I64, DType::I32][i % 3 % 2];
            let x = rand_of(&mut rng, dtype, &dims);
            let rank = dims.len() as u64;
            let n = rng.range(1, rank + 1) as usize;
            let axes = rand_axes(&mut rng, rank as usize, n);
            let mut starts = Vec::new();
            let mut ends = Vec::new();
            let mut steps = Vec::new();
            for &a in &axes {
                let d = dims[a.rem_euclid(rank as i64) as usize] as i64;
                starts.push(rng.range(0, 2 * d as u64 + 3) as i64 - d - 1);
                ends.push(rng.range(0, 2 * d as u64 + 3) as i64 - d - 1);
                steps.push([1, 2, -1, -2][rng.range(0, 4) as usize]);
            }
            let t = |v: &[i64]| ints(ptype, &[v.len() as u64], v);
            let (st, en, sp, ax) = (t(&starts), t(&ends), t(&steps), t(&axes));
            let ctx = format!(
                "slice_to #{i} {dims:?} {axes:?} {starts:?}:{ends:?}:{steps:?} {dtype} {ptype}"
            );
            let fixed_axes = Op::SliceTo(SliceTo {
                axes: Some(axes.clone()),
            });
            check(&gpu, &mut k, &fixed_axes, &[&x, &st, &en, &sp], EXACT, &ctx);
            let fed_axes = Op::SliceTo(SliceTo { axes: None });
            check(
                &gpu,
                &mut k,
                &fed_axes,
                &[&x, &st, &en, &sp, &ax],
                EXACT,
                &format!("{ctx} axes fed"),
            );
            // Without steps or axes: the first n axes, step 1.
            let plain = Op::SliceTo(SliceTo { axes: None });
            check(
                &gpu,
                &mut k,
                &plain,
                &[&x, &st, &en],
                EXACT,
                &format!("{ctx} no steps"),
            );
        }
        // split_part with its sizes in a tensor; squeeze / unsqueeze with axes in one.
        for i in 0..12 {
            let dims = rand_dims(&mut rng, 1, 4, 6, true);
            let x = rand_of(&mut rng, [DType::F32, DType::I64][i % 2], &dims);
            let axis = rng.range(0, dims.len() as u64) as usize;
            let mut left = dims[axis] as i64;
            let mut sizes = Vec::new();
            for p in 0..3 {
                let take = if p == 2 {
                    left
                } else {
                    rng.range(0, left as u64 + 1) as i64
                };
                sizes.push(take);
                left -= take;
            }
            let sz = ints([DType::I64, DType::I32][i % 2], &[3], &sizes);
            for index in 0..3 {
                let op = Op::SplitPart(SplitPart {
                    axis: axis as i64,
                    sizes: None,
                    parts: 3,
                    index,
                });
                check(
                    &gpu,
                    &mut k,
                    &op,
                    &[&x, &sz],
                    EXACT,
                    &format!("split sized #{i} {dims:?} axis {axis} {sizes:?} part {index}"),
                );
            }
            let ones: Vec<i64> = (0..dims.len() as i64)
                .filter(|&a| dims[a as usize] == 1)
                .collect();
            let ax = ints(DType::I64, &[ones.len() as u64], &ones);
            check(
                &gpu,
                &mut k,
                &Op::Squeeze(Squeeze { axes: None }),
                &[&x, &ax],
                EXACT,
                &format!("squeeze fed #{i} {dims:?}"),
            );
            let at = ints(DType::I64, &[2], &[-1, 0]);
            check(
                &gpu,
                &mut k,
                &Op::Unsqueeze(Unsqueeze { axes: vec![] }),
                &[&x, &at],
                EXACT,
                &format!("unsqueeze fed #{i} {dims:?}"),
            );
        }
        // size_of: the element count as an i64 scalar.
        let x = f32s(&mut rng, &[3, 0, 5]);
        let got = check(
            &gpu,
            &mut k,
            &Op::SizeOf(SizeOf),
            &[&x],
            EXACT,
            "size_of empty",
        );
        assert_eq!(got.values, Values::Int(vec![0]));
        let x = f32s(&mut rng, &[3, 4, 5]);
        let got = check(&gpu, &mut k, &Op::SizeOf(SizeOf), &[&x], EXACT, "size_of");
        assert_eq!((got.shape.rank(), got.values), (0, Values::Int(vec![60])));
    }
}

/// A graph whose parameters come from a symbol through host-evaluated shape data: a range
/// starting at the past length, a slice of two rows starting there, a constant_of_shape and
/// an expand shaped by the past (inputs the kernels never read, with no buffer). Run through
/// the runtime for growing pasts on one request, against the reference: the range and the
/// slice keep their output shapes while their start moves.
#[test]
fn runtime_values_from_shapes_drive_range_slice_fill_and_expand() {
    use dynrt::graph::{reference, BinaryOp, Dim, GraphBuilder};
    use dynrt::memory::predictor::Policy;
    use dynrt::runtime::{HostTensor, InferRequest, Network, NetworkOptions, RunOptions};
    use dynrt::tensor::ConstData;

    let Some(gpu) = dynrt::gpu::testing::gpu_or_skip("runtime_values_from_shapes") else {
        return;
    };
    let mut b = GraphBuilder::new();
    let past = b.input("past", &[Dim::sym("p"), Dim::Fixed(2)], DType::F32);
    let table = b.constant("table", s(&[10, 2]), (0..20).map(|v| v as f32).collect());
    let row = b.constant("row", s(&[1, 2]), vec![3.5, -1.0]);
    let i64c = |b: &mut GraphBuilder, label: &str, dims: &[u64], v: &[i64]| {
        b.constant_bytes(label, s(dims), DType::I64, ConstData::from_i64(v))
    };
    let zero = i64c(&mut b, "zero", &[], &[0]);
    let one = i64c(&mut b, "one", &[], &[1]);
    let four = i64c(&mut b, "four", &[], &[4]);
    let two = i64c(&mut b, "two", &[1], &[2]);
    let shape = b.node(
        "shape",
        ShapeOf {
            start: 0,
            end: None,
            dtype: DType::I64,
        },
        &[past],
    );
    let p = b.node("p", Gather { axis: 0 }, &[shape, zero]);
    let lim = b.node("lim", BinaryOp::Add, &[p, four]);
    let range = b.node("range", Range, &[p, lim, one]);
    let start = b.node("start", Unsqueeze { axes: vec![0] }, &[p]);
    let end = b.node("end", BinaryOp::Add, &[start, two]);
    let rows = b.node(
        "rows",
        SliceTo {
            axes: Some(vec![0]),
        },
        &[table, start, end],
    );
    let fill = b.node("fill", ConstantOfShape::f32(1.5), &[shape]);
    let grown = b.node("grown", Expand, &[row, shape]);
    for o in [range, rows, fill, grown] {
        b.output(o);
    }
    let graph = b.build().expect("graph");
    let engine = dynrt::gpu::Engine::new(gpu);
    let net = Network::compile(&engine, graph.clone(), NetworkOptions::default()).expect("compile");
    let mut req = InferRequest::new(&net, RunOptions::new(Policy::OpenVino)).expect("request");
    for (step, p) in [1u64, 2, 3, 5, 8].into_iter().enumerate() {
        let values: Vec<f32> = (0..p * 2).map(|v| v as f32).collect();
        let feed = HostTensor::f32(s(&[p, 2]), &values);
        let got = req
            .infer_blocking(&[("past", &feed)], &["range", "rows", "fill", "grown"])
            .expect("run");
        let want = reference::evaluate_tensors(
            &graph,
            &[("past", RefTensor::from_f32(s(&[p, 2]), DType::F32, values))],
        )
        .expect("reference");
        for (g, id) in got.iter().zip([range, rows, fill, grown]) {
            let g = RefTensor::from_host(g).expect("typed");
            compare(
                &g,
                &want[id.index()],
                EXACT,
                &format!("step {step} (p = {p}) {}", graph.node(id).label),
            );
        }
        let r = RefTensor::from_host(&got[0]).expect("range");
        let p = p as i64;
        assert_eq!(
            r.values,
            Values::Int(vec![p, p + 1, p + 2, p + 3]),
            "range at p = {p}"
        );
    }
}
