//! The matmul family (`shaders/matmul.wgsl`): the tiled kernel's vec4 staging, the
//! convolution's vec4 weight staging, and batched, broadcast and transposed products.

use super::*;

/// The tiled kernel's vec4 staging (`matmul_tiled4`: K and N multiples of 4, offsets too) at
/// tile edges and broadcast batches, against the strided staging of the same shapes (a 4-byte
/// skew makes the offsets odd). The pipeline count shows that the two are different entry
/// points and which skews take which.
#[test]
fn matmul_vec4_staging() {
    for gpu in gpus("matmul_vec4_staging") {
        let mut rng = SplitMix64::new(17);
        let cases = [
            (vec![], vec![], 9, 4, 8),
            (vec![], vec![], 70, 36, 132),
            (vec![2, 1], vec![3], 65, 20, 68),
            (vec![1], vec![2], 128, 64, 64),
        ];
        for (mut a, mut b, m, kk, n) in cases {
            let mut k = Kernels::new(&gpu);
            a.extend([m, kk]);
            b.extend([kk, n]);
            let (ta, tb) = (f32_tensor(&mut rng, &a), f32_tensor(&mut rng, &b));
            let tol = Tol {
                atol: 1e-6 * kk as f32 + 1e-5,
                rtol: 0.0,
            };
            let op = Op::MatMul(ops::MatMul { transpose_b: false });
            let inputs = [ta, tb];
            for (skew, pipelines) in [(0, 1), (16, 1), (4, 2), (12, 2)] {
                let ctx = format!("matmul {a:?} x {b:?} skew {skew}");
                check_at(&gpu, &mut k, &op, &inputs, tol, &ctx, skew);
                assert_eq!(k.stats().pipelines, pipelines, "{ctx}: pipelines");
            }
        }
    }
}

/// The convolution's vec4 weight staging (`matmul_conv4`: K = C / g * kernel and the
/// weights' offset multiples of 4) against the f32 staging (`matmul_conv`, taken for K = 27
/// and for a 4-byte skew), with groups, tile edges (70 output channels, 9x9 = 81 pixels) and
/// K past a multiple of the 16-wide K tile. The pipeline count shows which entry point ran.
#[test]
fn conv_vec4_weights() {
    for gpu in gpus("conv_vec4_weights") {
        let mut rng = SplitMix64::new(19);
        // (input channels, output channels, group, kernel h, kernel w): K = 36, 20, 27.
        let cases = [(4, 70, 1, 3, 3), (8, 6, 2, 2, 5), (3, 68, 1, 3, 3)];
        for (c, oc, group, kh, kw) in cases {
            let mut k = Kernels::new(&gpu);
            let x = f32_tensor(&mut rng, &[2, c, 9, 9]);
            let w = f32_tensor(&mut rng, &[oc, c / group, kh, kw]);
            let b = f32_tensor(&mut rng, &[oc]);
            let kdim = c / group * kh * kw;
            let tol = Tol {
                atol: 1e-6 * kdim as f32 + 1e-5,
                rtol: 1e-5,
            };
            let op = Op::Conv(ops::Conv {
                window: ops::conv::Window {
                    pads: vec![1, 2, 1, 2],
                    ..ops::conv::Window::default()
                },
                group,
            });
            let vec4 = kdim % 4 == 0;
            let inputs = [x, w, b];
            for (skew, pipelines) in [(0, 1), (16, 1), (4, if vec4 { 2 } else { 1 })] {
                let ctx = format!("conv c {c} oc {oc} g {group} {kh}x{kw} skew {skew}");
                check_at(&gpu, &mut k, &op, &inputs, tol, &ctx, skew);
                assert_eq!(k.stats().pipelines, pipelines, "{ctx}: pipelines");
            }
        }
    }
}

#[test]
fn matmul_batched_broadcast_transposed() {
    for gpu in gpus("matmul_batched_broadcast_transposed") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(3);
        let run = |k: &mut Kernels,
                   rng: &mut SplitMix64,
                   ba: &[u64],
                   bb: &[u64],
                   m: u64,
                   kk: u64,
                   n: u64,
                   tb: bool| {
            let mut a = ba.to_vec();
            a.extend([m, kk]);
            let mut b = bb.to_vec();
            b.extend(if tb { [n, kk] } else { [kk, n] });
            let tol = Tol {
                atol: 1e-6 * kk as f32 + 1e-5,
                rtol: 0.0,
            };
            let (ta, tbt) = (f32_tensor(rng, &a), f32_tensor(rng, &b));
            check(
                &gpu,
                k,
                &Op::MatMul(ops::MatMul { transpose_b: tb }),
                &[ta, tbt],
                tol,
                &format!("matmul {a:?} x {b:?} tb={tb}"),
            );
        };
        run(&mut k, &mut rng, &[], &[], 64, 64, 64, false);
        run(&mut k, &mut rng, &[], &[], 1, 1, 1, false);
        run(&mut k, &mut rng, &[], &[], 65, 17, 130, false);
        run(&mut k, &mut rng, &[], &[], 3, 0, 5, false); // K = 0: zeros
        run(&mut k, &mut rng, &[], &[], 0, 4, 5, false); // M = 0: no dispatch
        run(&mut k, &mut rng, &[2, 3], &[3], 7, 33, 9, true); // broadcast batch, transposed B
        run(&mut k, &mut rng, &[4, 1], &[1, 5], 1, 64, 100, false); // decode-like M = 1
        run(&mut k, &mut rng, &[1], &[], 200, 100, 150, true);
        // The tiled kernel's 8x8 register blocks at every edge offset: M = 9 (just above the
        // small-M limit), N and M one past and seven past a multiple of 8, K past a multiple
        // of the 16-wide K tile.
        run(&mut k, &mut rng, &[], &[], 9, 31, 71, false);
        run(&mut k, &mut rng, &[], &[], 71, 47, 9, true);
        run(&mut k, &mut rng, &[2], &[2], 127, 16, 129, false);
        // Small M (decode): the small-M kernel, including N not a multiple of 4 or 256.
        run(&mut k, &mut rng, &[], &[], 1, 96, 300, false);
        run(&mut k, &mut rng, &[2, 2], &[2, 1], 8, 17, 257, true);
        run(&mut k, &mut rng, &[3], &[], 5, 1, 3, false);
        run(&mut k, &mut rng, &[], &[], 9, 40, 70, false); // first size on the tiled kernel
        for i in 0..8 {
            let ba = rand_shape(&mut rng, 2, 3);
            let bb = broadcast_partner(&mut rng, &ba);
            let (m, kk, n) = (rng.range(1, 90), rng.range(1, 90), rng.range(1, 90));
            run(&mut k, &mut rng, &ba, &bb, m, kk, n, i % 2 == 1);
        }
    }
}
