//! The movement family (`shaders/movement.wgsl`: data movement ops) and the causal mask and
//! `where` (`shaders/mask.wgsl`).

use super::*;

#[test]
fn data_movement_ops() {
    for gpu in gpus("data_movement_ops") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(5);
        for i in 0..10 {
            let dims = rand_shape(&mut rng, 5, 6);
            let x = f32_tensor(&mut rng, &dims);
            // Reshape: flatten then split the first dimension back.
            check(
                &gpu,
                &mut k,
                &Op::Reshape(ops::Reshape { target: vec![-1] }),
                std::slice::from_ref(&x),
                EXACT,
                &format!("reshape #{i} {dims:?}"),
            );
            // Transpose: a random permutation.
            let mut perm: Vec<usize> = (0..dims.len()).collect();
            for j in (1..perm.len()).rev() {
                perm.swap(j, rng.range(0, j as u64 + 1) as usize);
            }
            check(
                &gpu,
                &mut k,
                &Op::Transpose(ops::Transpose { perm: perm.clone() }),
                std::slice::from_ref(&x),
                EXACT,
                &format!("transpose #{i} {dims:?} {perm:?}"),
            );
            if dims.is_empty() {
                continue;
            }
            // Slice a random axis with a random start/end/step (negative starts too).
            let axis = rng.range(0, dims.len() as u64) as usize;
            let d = dims[axis] as i64;
            let start = rng.range(0, d as u64 + 2) as i64 - 1;
            let end = if i % 3 == 0 {
                i64::MAX
            } else {
                rng.range(0, d as u64 + 2) as i64
            };
            let step = rng.range(1, 4) as i64;
            let op = Op::Slice(ops::Slice {
                axes: vec![axis as i64],
                starts: vec![start],
                ends: vec![end],
                steps: vec![step],
            });
            check(
                &gpu,
                &mut k,
                &op,
                std::slice::from_ref(&x),
                EXACT,
                &format!("slice #{i} {dims:?} {axis} {start}:{end}:{step}"),
            );
            // Concat three tensors along the axis (one of them possibly empty along it).
            let parts: Vec<HostTensor> = (0..3)
                .map(|_| {
                    let mut p = dims.clone();
                    p[axis] = rng.range(0, 4);
                    f32_tensor(&mut rng, &p)
                })
                .collect();
            check(
                &gpu,
                &mut k,
                &Op::Concat(ops::Concat { axis: axis as i64 }),
                &parts,
                EXACT,
                &format!("concat #{i} {dims:?} axis {axis}"),
            );
        }
        // Gather: i32 and u32 ids; negative i32 ones count from the end (ONNX; out of range
        // is an error the runtime reports: tests/hostile/onnx.rs).
        for (dtype, ids) in [
            (DType::I32, vec![3.0, 0.0, -1.0, -5.0, 2.0, 3.0]),
            (DType::U32, vec![1.0, 4.0, 0.0, 3.0, 2.0, 2.0]),
        ] {
            let table = f32_tensor(&mut rng, &[5, 33]);
            let ids = HostTensor {
                shape: s(&[2, 3]),
                dtype,
                values: ids,
            };
            check(
                &gpu,
                &mut k,
                &Op::Gather(ops::Gather::default()),
                &[table, ids],
                EXACT,
                &format!("gather {dtype}"),
            );
        }
        let table = f32_tensor(&mut rng, &[5, 4]);
        let ids = HostTensor {
            shape: s(&[0]),
            dtype: DType::I32,
            values: vec![],
        };
        check(
            &gpu,
            &mut k,
            &Op::Gather(ops::Gather::default()),
            &[table, ids],
            EXACT,
            "gather no ids",
        );
        // ShapeOf writes the shape as i32 through the uniform.
        let x = f32_tensor(&mut rng, &[2, 3, 0, 7]);
        let out = check(
            &gpu,
            &mut k,
            &Op::ShapeOf(ops::ShapeOf::default()),
            &[x],
            EXACT,
            "shape_of",
        );
        assert_eq!(out, vec![2.0, 3.0, 0.0, 7.0]);
        // Integer tensors move as bits (shape tensors are i32).
        let t = HostTensor {
            shape: s(&[2, 2]),
            dtype: DType::I32,
            values: vec![-1.0, 2.0, 3.0, -4.0],
        };
        let out = check(
            &gpu,
            &mut k,
            &Op::Transpose(ops::Transpose { perm: vec![1, 0] }),
            &[t],
            EXACT,
            "transpose i32",
        );
        assert_eq!(out, vec![-1.0, 3.0, 2.0, -4.0]);
    }
}

#[test]
fn causal_mask_and_where() {
    for gpu in gpus("causal_mask_and_where") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(6);
        // Prefill (past 0), decode (one query over a long past), chunked (several queries).
        for dims in [[2, 4, 4], [2, 1, 37], [3, 5, 12], [1, 300, 300]] {
            let x = f32_tensor(&mut rng, &dims);
            let out = check(
                &gpu,
                &mut k,
                &Op::CausalMask(ops::CausalMask),
                &[x],
                EXACT,
                &format!("causal {dims:?}"),
            );
            let (sq, t) = (dims[1] as usize, dims[2] as usize);
            let past = t - sq;
            let hidden = out.iter().filter(|&&v| v == MASK_VALUE).count();
            // Query i hides keys past+i+1..t: sum over i of (t - past - i - 1).
            let want: usize = (0..sq).map(|i| t - past - i - 1).sum::<usize>() * dims[0] as usize;
            assert_eq!(hidden, want, "causal {dims:?}");
        }
        for i in 0..10 {
            let dims = rand_shape(&mut rng, 4, 6);
            let c_dims = broadcast_partner(&mut rng, &dims);
            let b_dims = broadcast_partner(&mut rng, &dims);
            let mut cond = f32_tensor(&mut rng, &c_dims);
            let int_cond = i % 2 == 0;
            cond.values.iter_mut().for_each(|v| {
                *v = if *v > 0.0 {
                    1.0
                } else if int_cond {
                    0.0
                } else {
                    -0.0
                }
            });
            if int_cond {
                cond.dtype = DType::U32;
            }
            let a = f32_tensor(&mut rng, &dims);
            let b = f32_tensor(&mut rng, &b_dims);
            check(
                &gpu,
                &mut k,
                &Op::Where(ops::Where),
                &[cond, a, b],
                EXACT,
                &format!("where #{i} {c_dims:?} {dims:?} {b_dims:?}"),
            );
        }
    }
}
