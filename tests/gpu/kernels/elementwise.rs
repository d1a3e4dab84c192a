//! The elementwise family (`shaders/elementwise.wgsl`): binary ops with broadcasting, every
//! f32 binary op through every flat entry point, the unary ops, every element near workgroup
//! edges, and a dispatch of more than 65535 workgroups on the adapter's real limit.

use super::*;

#[test]
fn binary_ops_with_broadcasting() {
    for gpu in gpus("binary_ops_with_broadcasting") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(1);
        let mut cases = 0;
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::SiluMul,
        ] {
            let tol = match op {
                BinaryOp::Div => Tol {
                    atol: 0.0,
                    rtol: 1e-6,
                },
                BinaryOp::SiluMul => Tol {
                    atol: 1e-6,
                    rtol: 1e-5,
                },
                _ => EXACT,
            };
            // Fixed edge cases: same shape (vec4 path and scalar path), scalar, size 0, rank 6.
            let fixed: [(&[u64], &[u64]); 7] = [
                (&[4, 64], &[4, 64]),
                (&[3, 7], &[3, 7]),
                (&[5, 3], &[]),
                (&[1], &[2, 3, 4]),
                (&[0, 3], &[1, 3]),
                (&[2, 1, 3, 1, 2, 1], &[1, 4, 1, 5, 1, 3]),
                (&[1000], &[1000]),
            ];
            for (a, b) in fixed {
                let (ta, tb) = (f32_tensor(&mut rng, a), f32_tensor(&mut rng, b));
                check(
                    &gpu,
                    &mut k,
                    &Op::Binary(op),
                    &[ta, tb],
                    tol,
                    &format!("{} {a:?} {b:?}", op.name()),
                );
                cases += 1;
            }
            for i in 0..12 {
                let a = rand_shape(&mut rng, 4, 9);
                let b = broadcast_partner(&mut rng, &a);
                let (a, b) = if i % 2 == 0 { (a, b) } else { (b, a) };
                let (ta, tb) = (f32_tensor(&mut rng, &a), f32_tensor(&mut rng, &b));
                check(
                    &gpu,
                    &mut k,
                    &Op::Binary(op),
                    &[ta, tb],
                    tol,
                    &format!("{} #{i} {a:?} {b:?}", op.name()),
                );
                cases += 1;
            }
        }
        assert_eq!(cases, 95);
        let st = k.stats();
        // 5 ops x up to 5 pipelines (broadcast; flat and flat4, each also ALIGNED); every
        // other dispatch hit the cache (size-0 outputs dispatch nothing and look nothing up).
        assert!(st.misses <= 25 && st.hits + st.misses >= 75, "{st:?}");
        assert_eq!(st.pipelines as u64, st.misses);
    }
}

/// Every f32 binary op through every flat entry point: the context string's length decides
/// `check`'s skew, so `binary_ops_with_broadcasting` reaches the vec4 entry points for only
/// some op names; here each op runs at skews 0 (`flat4`, ALIGNED), 16 (`flat4`, element
/// offsets), 4 (`flat`) and, on an odd length, 0 (`flat`, ALIGNED), so a pipeline that
/// computed one op for all of them (or skipped the operator switch) fails.
#[test]
fn every_binary_op_on_every_flat_entry_point() {
    for gpu in gpus("every_binary_op_on_every_flat_entry_point") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(12);
        let mut cases = 0;
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Pow,
            BinaryOp::Min,
            BinaryOp::Max,
            BinaryOp::SiluMul,
        ] {
            let op = Op::Binary(op);
            for (len, skew) in [(256, 0), (256, 16), (256, 4), (255, 0)] {
                let (a, b) = (f32_tensor(&mut rng, &[len]), f32_tensor(&mut rng, &[len]));
                let out = s(&[len]);
                let want = reference::eval_op(&op, &[&a.reference(), &b.reference()], &out)
                    .unwrap()
                    .to_f32();
                let got = run(&gpu, &mut k, &op, &[a, b], &out, DType::F32, skew).unwrap();
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let ok = if w.is_nan() {
                        g.is_nan()
                    } else {
                        (g - w).abs() <= 1e-6 + 1e-5 * w.abs()
                    };
                    assert!(
                        ok,
                        "{} len {len} skew {skew} on {:?}: element {i}: gpu {g} vs ref {w}",
                        op.name(),
                        gpu.backend()
                    );
                }
                cases += 1;
            }
        }
        assert_eq!(cases, 32);
        // 8 ops x the 4 flat pipelines (2 entry points, each with and without ALIGNED).
        assert_eq!(k.stats().pipelines, 32);
    }
}

#[test]
fn unary_ops() {
    for gpu in gpus("unary_ops") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(2);
        for op in [
            UnaryOp::Relu,
            UnaryOp::Gelu,
            UnaryOp::Silu,
            UnaryOp::Exp,
            UnaryOp::Sqrt,
        ] {
            let tol = if op == UnaryOp::Relu {
                EXACT
            } else {
                Tol {
                    atol: 1e-6,
                    rtol: 1e-5,
                }
            };
            for dims in [
                vec![],
                vec![0],
                vec![1],
                vec![257],
                vec![4, 256],
                vec![3, 0, 2],
            ] {
                let t = f32_tensor(&mut rng, &dims);
                check(
                    &gpu,
                    &mut k,
                    &Op::Unary(op),
                    &[t],
                    tol,
                    &format!("{} {dims:?}", op.name()),
                );
            }
            // Large magnitudes: gelu/silu saturate without NaN.
            let mut t = f32_tensor(&mut rng, &[9]);
            t.values = vec![-80.0, -20.0, -5.0, -0.5, 0.0, 0.5, 5.0, 20.0, 80.0];
            if op == UnaryOp::Exp {
                t.values.truncate(8);
                t.shape = s(&[8]);
            }
            check(
                &gpu,
                &mut k,
                &Op::Unary(op),
                &[t],
                tol,
                &format!("{} extremes", op.name()),
            );
            if op == UnaryOp::Sqrt {
                // Random values are half negative (NaN on both sides): positives too.
                let mut t = f32_tensor(&mut rng, &[4, 65]);
                t.values.iter_mut().for_each(|v| *v = v.abs() * 100.0);
                let out = check(&gpu, &mut k, &Op::Unary(op), &[t], tol, "sqrt positives");
                assert!(out.iter().all(|v| v.is_finite()));
            }
            for i in 0..6 {
                let dims = rand_shape(&mut rng, 4, 20);
                let t = f32_tensor(&mut rng, &dims);
                check(
                    &gpu,
                    &mut k,
                    &Op::Unary(op),
                    &[t],
                    tol,
                    &format!("{} #{i} {dims:?}", op.name()),
                );
            }
        }
    }
}

#[test]
fn flat_elementwise_kernels_cover_every_element_near_workgroup_edges() {
    // The flat and unary entry points run without wgpu's bounds checks (their indices are in
    // bounds by construction): sizes just below, at and above multiples of a workgroup (256
    // invocations) must write every element, with and without an offset skew (the context
    // string's length sets the skew: 0, 4 or 8 bytes), on the scalar (odd) and vec4 paths.
    let mut sizes = vec![1, 2, 3];
    for m in [1, 2, 3] {
        sizes.extend([m * 256 - 1, m * 256, m * 256 + 1]);
    }
    for gpu in gpus("flat_elementwise_kernels_cover_every_element_near_workgroup_edges") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(11);
        let mut cases = 0;
        for &n in &sizes {
            for len in [n, 4 * n] {
                for ctx in ["add", "add.", "add.."] {
                    let (a, b) = (f32_tensor(&mut rng, &[len]), f32_tensor(&mut rng, &[len]));
                    let name = format!("{ctx} {len}");
                    let got = check(
                        &gpu,
                        &mut k,
                        &Op::Binary(BinaryOp::Add),
                        &[a, b],
                        EXACT,
                        &name,
                    );
                    assert_eq!(got.len() as u64, len);
                    cases += 1;
                }
                // exp is never 0, so an element the kernel skipped cannot pass as computed.
                let x = f32_tensor(&mut rng, &[len]);
                let tol = Tol {
                    atol: 1e-6,
                    rtol: 1e-5,
                };
                check(
                    &gpu,
                    &mut k,
                    &Op::Unary(UnaryOp::Exp),
                    &[x],
                    tol,
                    &format!("exp {len}"),
                );
                cases += 1;
            }
            // A skew of 16 or 32 bytes: the vec4 entry points with element offsets.
            for skew in [16, 32] {
                let len = 4 * n;
                let (a, b) = (f32_tensor(&mut rng, &[len]), f32_tensor(&mut rng, &[len]));
                let want: Vec<f32> = a.values.iter().zip(&b.values).map(|(x, y)| x + y).collect();
                let op = Op::Binary(BinaryOp::Add);
                let got = run(&gpu, &mut k, &op, &[a, b], &s(&[len]), DType::F32, skew).unwrap();
                assert_eq!(got, want, "add {len} skew {skew}");
                cases += 1;
            }
        }
        assert_eq!(cases, sizes.len() * (2 * 4 + 2));
    }
}

#[test]
fn elementwise_beyond_65535_workgroups_on_the_real_limit() {
    // Only the environment's default backend: this moves 2 x 68 MB.
    let Some(gpu) = testing::gpu_or_skip("elementwise_beyond_65535_workgroups") else {
        return;
    };
    let max = gpu.limits().max_compute_workgroups_per_dimension as u64;
    // The scalar relu path (odd count) dispatches ceil(n / 256) workgroups: above the limit.
    let n = max * 256 + 1001;
    assert!(n.div_ceil(256) > max);
    let values: Vec<f32> = (0..n)
        .map(|i| if i % 3 == 0 { -(i as f32) } else { i as f32 })
        .collect();
    let x = HostTensor {
        shape: s(&[n]),
        dtype: DType::F32,
        values,
    };
    let mut k = Kernels::new(&gpu);
    let out = run(
        &gpu,
        &mut k,
        &Op::Unary(UnaryOp::Relu),
        &[x],
        &s(&[n]),
        DType::F32,
        0,
    )
    .unwrap();
    assert_eq!(out.len() as u64, n);
    for (i, &v) in out.iter().enumerate() {
        let want = if i % 3 == 0 { 0.0 } else { i as f32 };
        assert_eq!(v, want, "element {i}");
    }
}
