//! The matmul family (matmul with vectors and deep batches, gemm, convolution as an implicit
//! GEMM), the cnn family (max and average pooling, batch norm) and the rotary family against
//! the CPU reference on every test backend, on seeded random shapes that are not multiples of
//! the 64x64 tiles.
//!
//! Tolerances (|gpu - ref| <= atol + rtol |ref|, ref in f64, inputs in [-1, 1)): products
//! atol 1e-6 * K + 1e-5 (f32 accumulation over K terms, K the inner length: C / g * kernel
//! for a convolution), rtol 1e-5; pooling max exact, average atol 1e-6 rtol 1e-5; batch norm
//! and rotary atol 1e-5 rtol 1e-5.

use super::*;
use dynrt::gpu::kernels::Kernels;
use dynrt::graph::ops::conv::{AutoPad, Window};
use dynrt::graph::ops::{BatchNorm, Conv, Gemm, MatMul, Pool, PoolKind, RotaryEmbedding};
use dynrt::graph::reference::RefTensor;
use dynrt::graph::Op;
use dynrt::rng::SplitMix64;
use dynrt::shape::DType;

fn product_tol(k: u64) -> Tol {
    Tol {
        atol: 1e-6 * k as f32 + 1e-5,
        rtol: 1e-5,
    }
}

#[test]
fn matmul_with_vectors_and_deep_batches() {
    for gpu in gpus("matmul_with_vectors_and_deep_batches") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(41);
        let cases: &[(&[u64], &[u64])] = &[
            (&[70], &[70]),
            (&[33], &[33, 70]),
            (&[2, 3, 33], &[33]),
            (&[33], &[4, 33, 9]),
            (&[2, 1, 3, 65, 17], &[1, 4, 1, 17, 66]),
            (&[5, 70], &[70, 3]),
            (&[1, 8], &[3, 2, 8, 5]),
        ];
        for (a, b) in cases {
            let (x, y) = (f32s(&mut rng, a), f32s(&mut rng, b));
            let kdim = a[a.len() - 1];
            check(
                &gpu,
                &mut k,
                &Op::MatMul(MatMul { transpose_b: false }),
                &[&x, &y],
                product_tol(kdim),
                &format!("matmul {a:?} x {b:?}"),
            );
        }
    }
}

#[test]
fn gemm_with_transposes_alpha_beta_and_broadcast_c() {
    for gpu in gpus("gemm_with_transposes_alpha_beta_and_broadcast_c") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(42);
        for i in 0..16 {
            let (m, kk, n) = (rng.range(1, 80), rng.range(1, 80), rng.range(1, 80));
            let (trans_a, trans_b) = (i % 2 == 1, i % 4 >= 2);
            let a = f32s(&mut rng, &if trans_a { [kk, m] } else { [m, kk] });
            let b = f32s(&mut rng, &if trans_b { [n, kk] } else { [kk, n] });
            let c_dims: Vec<u64> = match i % 5 {
                0 => vec![],
                1 => vec![n],
                2 => vec![m, 1],
                3 => vec![1, n],
                _ => vec![m, n],
            };
            let c = f32s(&mut rng, &c_dims);
            let (alpha, beta) = [(1.0, 1.0), (0.5, 2.0), (-1.5, 0.0), (1.0, 0.25)][i % 4];
            let op = Op::Gemm(Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            });
            let ctx = format!(
                "gemm #{i} {m}x{kk}x{n} ta {trans_a} tb {trans_b} c {c_dims:?} a {alpha} b {beta}"
            );
            let tol = product_tol(kk * 2);
            check(&gpu, &mut k, &op, &[&a, &b, &c], tol, &ctx);
            check(&gpu, &mut k, &op, &[&a, &b], tol, &format!("{ctx} no c"));
        }
    }
}

#[test]
fn convolution_as_an_implicit_gemm() {
    for gpu in gpus("convolution_as_an_implicit_gemm") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(43);
        for i in 0..20 {
            let spatial = [2, 2, 1, 3][i % 4];
            let group = [1, 2, 3][i % 3];
            let cg = rng.range(1, 4);
            let ocg = rng.range(1, 5);
            let batch = rng.range(1, 3);
            let kernel: Vec<u64> = (0..spatial).map(|_| rng.range(1, 4)).collect();
            let strides: Vec<u64> = (0..spatial).map(|_| rng.range(1, 3)).collect();
            let dilations: Vec<u64> = (0..spatial).map(|_| rng.range(1, 3)).collect();
            let mut pads: Vec<u64> = (0..2 * spatial).map(|_| rng.range(0, 3)).collect();
            let auto_pad = [
                AutoPad::NotSet,
                AutoPad::NotSet,
                AutoPad::SameUpper,
                AutoPad::SameLower,
                AutoPad::Valid,
            ][i % 5];
            if auto_pad != AutoPad::NotSet {
                pads.clear();
            }
            let input: Vec<u64> = kernel
                .iter()
                .zip(&dilations)
                .map(|(&kk, &d)| (kk - 1) * d + 1 + rng.range(0, if spatial == 3 { 4 } else { 12 }))
                .collect();
            let mut xd = vec![batch, cg * group];
            xd.extend(&input);
            let mut wd = vec![ocg * group, cg];
            wd.extend(&kernel);
            let (x, w, b) = (
                f32s(&mut rng, &xd),
                f32s(&mut rng, &wd),
                f32s(&mut rng, &[ocg * group]),
            );
            let op = Op::Conv(Conv {
                window: Window {
                    strides: strides.clone(),
                    pads: pads.clone(),
                    dilations: dilations.clone(),
                    auto_pad,
                    ceil_mode: false,
                },
                group,
            });
            let kdim = cg * kernel.iter().product::<u64>();
            check(&gpu, &mut k, &op, &[&x, &w, &b], product_tol(kdim), &format!("conv #{i} x {xd:?} w {wd:?} g {group} s {strides:?} d {dilations:?} p {pads:?} {auto_pad:?}"));
        }
        // A layer larger than one tile each way: 3x3, pad 1, 70 output channels, 20x20.
        let (x, w, b) = (
            f32s(&mut rng, &[1, 8, 20, 20]),
            f32s(&mut rng, &[70, 8, 3, 3]),
            f32s(&mut rng, &[70]),
        );
        let op = Op::Conv(Conv {
            window: Window {
                pads: vec![1, 1, 1, 1],
                ..Window::default()
            },
            group: 1,
        });
        check(
            &gpu,
            &mut k,
            &op,
            &[&x, &w, &b],
            product_tol(72),
            "conv 8->70 20x20",
        );
    }
}

#[test]
fn max_and_average_pooling() {
    for gpu in gpus("max_and_average_pooling") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(44);
        for i in 0..30 {
            let spatial = [2, 1, 3][i % 3];
            let kernel: Vec<u64> = (0..spatial).map(|_| rng.range(1, 4)).collect();
            let strides: Vec<u64> = (0..spatial).map(|_| rng.range(1, 3)).collect();
            let dilations: Vec<u64> = (0..spatial)
                .map(|_| if i % 4 == 0 { 2 } else { 1 })
                .collect();
            // Padding smaller than the kernel (ONNX's rule), so every window holds an element.
            let pads: Vec<u64> = (0..2 * spatial)
                .map(|j| rng.range(0, kernel[j % spatial]))
                .collect();
            let input: Vec<u64> = kernel
                .iter()
                .zip(&dilations)
                .map(|(&kk, &d)| (kk - 1) * d + 1 + rng.range(0, 8))
                .collect();
            let mut xd = vec![rng.range(1, 3), rng.range(1, 4)];
            xd.extend(&input);
            let x = f32s(&mut rng, &xd);
            let ceil_mode = i % 2 == 0;
            let auto_pad = if i % 7 == 3 {
                AutoPad::SameUpper
            } else {
                AutoPad::NotSet
            };
            let window = Window {
                strides: strides.clone(),
                pads: if auto_pad == AutoPad::NotSet {
                    pads.clone()
                } else {
                    vec![]
                },
                dilations: dilations.clone(),
                auto_pad,
                ceil_mode: ceil_mode && auto_pad == AutoPad::NotSet,
            };
            for (kind, tol) in [
                (PoolKind::Max, EXACT),
                (
                    PoolKind::Avg {
                        count_include_pad: false,
                    },
                    Tol {
                        atol: 1e-6,
                        rtol: 1e-5,
                    },
                ),
                (
                    PoolKind::Avg {
                        count_include_pad: true,
                    },
                    Tol {
                        atol: 1e-6,
                        rtol: 1e-5,
                    },
                ),
            ] {
                let op = Op::Pool(Pool {
                    kind,
                    kernel: kernel.clone(),
                    window: window.clone(),
                });
                check(&gpu, &mut k, &op, &[&x], tol, &format!("pool #{i} {kind:?} x {xd:?} k {kernel:?} s {strides:?} d {dilations:?} p {pads:?} ceil {ceil_mode} {auto_pad:?}"));
            }
        }
        // Known answer (ONNX averagepool_2d_pads_count_include_pad's rule): a 2x2 window with
        // pad 1 over [[1, 2], [3, 4]] at the corner holds 1 element of 4 positions.
        let x = RefTensor::from_f32(s(&[1, 1, 2, 2]), DType::F32, vec![1.0, 2.0, 3.0, 4.0]);
        let window = Window {
            pads: vec![1, 1, 1, 1],
            ..Window::default()
        };
        let avg = |count_include_pad| {
            Op::Pool(Pool {
                kind: PoolKind::Avg { count_include_pad },
                kernel: vec![2, 2],
                window: window.clone(),
            })
        };
        let got = check(&gpu, &mut k, &avg(true), &[&x], EXACT, "avg include pad");
        assert_eq!(got.to_f32()[0], 0.25);
        let got = check(&gpu, &mut k, &avg(false), &[&x], EXACT, "avg without pad");
        assert_eq!(got.to_f32()[0], 1.0);
    }
}

#[test]
fn batch_norm_and_rotary_embedding() {
    for gpu in gpus("batch_norm_and_rotary_embedding") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(45);
        let tol = Tol {
            atol: 1e-5,
            rtol: 1e-5,
        };
        for dims in [vec![2u64, 3, 5, 4], vec![1, 7], vec![3, 2, 9]] {
            let x = f32s(&mut rng, &dims);
            let c = dims[1];
            let (scale, bias, mean) = (
                f32s(&mut rng, &[c]),
                f32s(&mut rng, &[c]),
                f32s(&mut rng, &[c]),
            );
            let var = RefTensor::from_f32(
                s(&[c]),
                DType::F32,
                (0..c).map(|_| rng.uniform(0.1, 2.0)).collect(),
            );
            check(
                &gpu,
                &mut k,
                &Op::BatchNorm(BatchNorm { eps: 1e-5 }),
                &[&x, &scale, &bias, &mean, &var],
                tol,
                &format!("batch_norm {dims:?}"),
            );
        }
        for i in 0..12 {
            let (b, h, seq, d) = (
                rng.range(1, 3),
                rng.range(1, 4),
                rng.range(1, 6),
                [4u64, 8, 6][i % 3],
            );
            let rotary_dim = if i % 4 == 3 { d / 2 - (d / 2) % 2 } else { 0 };
            let half = if rotary_dim == 0 { d } else { rotary_dim } / 2;
            let packed = i % 2 == 1;
            let x = if packed {
                f32s(&mut rng, &[b, seq, h * d])
            } else {
                f32s(&mut rng, &[b, h, seq, d])
            };
            let op = Op::RotaryEmbedding(RotaryEmbedding {
                interleaved: i % 3 == 0,
                rotary_dim,
                num_heads: if packed { h } else { 0 },
            });
            let ctx =
                format!("rotary #{i} b {b} h {h} s {seq} d {d} rd {rotary_dim} packed {packed}");
            if i % 3 == 1 {
                let (cos, sin) = (
                    f32s(&mut rng, &[b, seq, half]),
                    f32s(&mut rng, &[b, seq, half]),
                );
                check(
                    &gpu,
                    &mut k,
                    &op,
                    &[&x, &cos, &sin],
                    tol,
                    &format!("{ctx} no positions"),
                );
            } else {
                let max_pos = 16;
                let (cos, sin) = (
                    f32s(&mut rng, &[max_pos, half]),
                    f32s(&mut rng, &[max_pos, half]),
                );
                let pos = rand_ints(
                    &mut rng,
                    [DType::I64, DType::I32][i % 2],
                    &[b, seq],
                    0,
                    max_pos as i64,
                );
                check(
                    &gpu,
                    &mut k,
                    &op,
                    &[&x, &cos, &sin, &pos],
                    tol,
                    &format!("{ctx} positions"),
                );
            }
        }
    }
}
