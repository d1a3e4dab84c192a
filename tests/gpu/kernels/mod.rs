//! Every op's WGSL kernel against the CPU reference on seeded random shapes, on every test
//! backend (Vulkan/lavapipe and GL/llvmpipe unless WGPU_BACKEND picks). Covers broadcasting
//! edge cases, size-1 and size-0 dimensions, sizes that are not multiples of the workgroup,
//! unaligned tensor offsets, 2-D dispatch grids, and several dispatches in one pass. The
//! typed elementwise kernels are in [`logic`], the quantized weights in [`quant`], and a
//! decoder layer run node by node in [`graph`].
//!
//! Tolerances (|gpu - ref| <= atol + rtol * |ref|, ref computed with f64 intermediates):
//! * add, sub, mul, relu, data movement, gather, where, causal mask, shape_of: exact
//! * div: rtol 1e-6 (WGSL allows 2.5 ULP)
//! * exp, gelu, silu, silu_mul (the SwiGLU gate), sqrt: atol 1e-6, rtol 1e-5
//! * rope: atol 1e-6, rtol 1e-5 (two products and a sum in f32, the table exact)
//! * attention (q, k, v in [-1, 1)): atol 2e-6, rtol 1e-4 (f32 dot products, an online
//!   softmax merged across 64 invocations)
//! * matmul (inputs in [-1, 1)): atol 1e-6 * K + 1e-5 (f32 accumulation over K terms)
//! * softmax: atol 2e-6, rtol 1e-4; layer_norm, rms_norm: atol 1e-4, rtol 1e-4

mod graph;
mod logic;
mod quant;

use dynrt::gpu::kernels::run::{run_op, RunOpError};
use dynrt::gpu::kernels::{KernelError, Kernels, Operand, TensorRef, UniformArena};
use dynrt::gpu::{testing, Buffer, BufferDesc, Engine, Gpu};
use dynrt::graph::ops::{self, MASK_VALUE};
use dynrt::graph::reference::{self, RefTensor};
use dynrt::graph::{BinaryOp, Op, UnaryOp};
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};
use dynrt::tensor::ConstData;

/// A test tensor: values carried as f32 (integers exact), typed on the way to the device and
/// the reference.
#[derive(Debug, Clone)]
struct HostTensor {
    shape: Shape,
    dtype: DType,
    values: Vec<f32>,
}

impl HostTensor {
    fn typed(&self) -> dynrt::tensor::HostTensor {
        dynrt::tensor::HostTensor::from_f32_values(self.shape.clone(), self.dtype, &self.values)
            .unwrap()
    }
    fn reference(&self) -> RefTensor {
        RefTensor::from_f32(self.shape.clone(), self.dtype, self.values.clone())
    }
}

/// `run_op` on the engine of `gpu`, returning f32 carriers.
fn run(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    out: &Shape,
    dtype: DType,
    skew: u64,
) -> Result<Vec<f32>, RunOpError> {
    let engine = Engine::new(gpu.clone());
    let typed: Vec<_> = inputs.iter().map(HostTensor::typed).collect();
    run_op(&engine, k, op, &typed, out, dtype, skew).map(|t| t.to_f32())
}

#[derive(Clone, Copy, Debug)]
struct Tol {
    atol: f32,
    rtol: f32,
}

const EXACT: Tol = Tol {
    atol: 0.0,
    rtol: 0.0,
};

fn s(d: &[u64]) -> Shape {
    Shape::new(d.to_vec())
}

fn rand_values(rng: &mut SplitMix64, shape: &Shape) -> Vec<f32> {
    let n = shape.num_elements().unwrap() as usize;
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

fn f32_tensor(rng: &mut SplitMix64, dims: &[u64]) -> HostTensor {
    let shape = s(dims);
    HostTensor {
        values: rand_values(rng, &shape),
        shape,
        dtype: DType::F32,
    }
}

/// Runs `op` on the GPU (with a 4-byte skew every other call) and compares with the CPU
/// reference. Returns the GPU values.
fn check(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    tol: Tol,
    ctx: &str,
) -> Vec<f32> {
    let skew = (ctx.len() as u64 % 3) * 4;
    check_at(gpu, k, op, inputs, tol, ctx, skew)
}

/// [`check`] with every operand `skew` bytes past its buffer's aligned start.
fn check_at(
    gpu: &Gpu,
    k: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    tol: Tol,
    ctx: &str,
    skew: u64,
) -> Vec<f32> {
    let shapes: Vec<&Shape> = inputs.iter().map(|t| &t.shape).collect();
    let out_shape = op
        .infer(&shapes, &[])
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let refs: Vec<RefTensor> = inputs.iter().map(HostTensor::reference).collect();
    let ref_refs: Vec<&RefTensor> = refs.iter().collect();
    let want = reference::eval_op(op, &ref_refs, &out_shape)
        .unwrap_or_else(|e| panic!("{ctx}: reference: {e}"))
        .to_f32();
    let dtype = op
        .output_dtype(&inputs.iter().map(|t| t.dtype).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("{ctx}: dtype {e:?}"));
    let got = run(gpu, k, op, inputs, &out_shape, dtype, skew)
        .unwrap_or_else(|e| panic!("{ctx} on {:?}: {e}", gpu.backend()));
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() || tol.atol == 0.0 && tol.rtol == 0.0 {
            g.to_bits() == w.to_bits() || g == w
        } else {
            (g - w).abs() <= tol.atol + tol.rtol * w.abs()
        };
        assert!(
            ok,
            "{ctx} ({} on {:?}, out {out_shape}): element {i}: gpu {g} vs ref {w} (tol {tol:?})",
            op.name(),
            gpu.backend()
        );
    }
    got
}

fn gpus(test: &str) -> Vec<Gpu> {
    testing::gpus_or_skip(test)
}

/// A random shape of rank 0..=4 with dims in 0..=max; zeros are rare.
fn rand_shape(rng: &mut SplitMix64, max_rank: u64, max: u64) -> Vec<u64> {
    let rank = rng.range(0, max_rank + 1);
    (0..rank)
        .map(|_| match rng.range(0, 12) {
            0 => 0,
            1 | 2 => 1,
            _ => rng.range(1, max + 1),
        })
        .collect()
}

/// A shape that broadcasts against `a`: some dims set to 1, some leading dims dropped.
fn broadcast_partner(rng: &mut SplitMix64, a: &[u64]) -> Vec<u64> {
    let drop = rng.range(0, a.len() as u64 + 1) as usize;
    a[drop..]
        .iter()
        .map(|&d| if rng.range(0, 3) == 0 { 1 } else { d })
        .collect()
}

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

#[test]
fn softmax_layer_norm_rms_norm() {
    for gpu in gpus("softmax_layer_norm_rms_norm") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(4);
        let sm = Tol {
            atol: 2e-6,
            rtol: 1e-4,
        };
        let nt = Tol {
            atol: 1e-4,
            rtol: 1e-4,
        };
        for dims in [
            vec![1],
            vec![3, 1],
            vec![2, 64],
            vec![5, 65],
            vec![2, 3, 700],
            vec![0, 8],
            vec![4, 0],
            vec![300, 7],
        ] {
            let d = *dims.last().unwrap();
            let x = f32_tensor(&mut rng, &dims);
            let mut xs = x.clone();
            xs.values.iter_mut().for_each(|v| *v *= 30.0); // large logits: stability
            check(
                &gpu,
                &mut k,
                &Op::Softmax(ops::Softmax::LAST),
                &[xs],
                sm,
                &format!("softmax {dims:?}"),
            );
            let g = f32_tensor(&mut rng, &[d]);
            let b = f32_tensor(&mut rng, &[d]);
            check(
                &gpu,
                &mut k,
                &Op::LayerNorm(ops::LayerNorm {
                    eps: 1e-5,
                    axis: -1,
                }),
                &[x.clone(), g.clone(), b],
                nt,
                &format!("layer_norm {dims:?}"),
            );
            check(
                &gpu,
                &mut k,
                &Op::RmsNorm(ops::RmsNorm {
                    eps: 1e-6,
                    axis: -1,
                }),
                &[x, g],
                nt,
                &format!("rms_norm {dims:?}"),
            );
        }
        // Masked rows (all but one entry at the mask value) stay finite.
        let mut x = f32_tensor(&mut rng, &[2, 5]);
        for v in x.values.iter_mut().skip(1) {
            *v = MASK_VALUE;
        }
        let out = check(
            &gpu,
            &mut k,
            &Op::Softmax(ops::Softmax::LAST),
            &[x],
            sm,
            "softmax masked",
        );
        assert!((out[0] - 1.0).abs() < 1e-6 && out.iter().all(|v| v.is_finite()));
    }
}

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

#[test]
fn two_dimensional_grids_when_workgroups_exceed_the_limit() {
    for gpu in gpus("two_dimensional_grids") {
        // A limit of 3 workgroups per dimension forces 2-D grids on small tensors for every
        // family (the kernels linearise wid.x + wid.y * num_workgroups.x).
        let mut k = Kernels::new(&gpu);
        k.set_max_workgroups_per_dim(3);
        let mut rng = SplitMix64::new(7);
        let x = f32_tensor(&mut rng, &[5, 300]); // 1500 elements: 6 workgroups of 256
        let y = f32_tensor(&mut rng, &[1, 300]);
        check(
            &gpu,
            &mut k,
            &Op::Binary(BinaryOp::Add),
            &[x.clone(), y],
            EXACT,
            "grid add",
        );
        check(
            &gpu,
            &mut k,
            &Op::Unary(UnaryOp::Relu),
            std::slice::from_ref(&x),
            EXACT,
            "grid relu",
        );
        check(
            &gpu,
            &mut k,
            &Op::Softmax(ops::Softmax::LAST),
            std::slice::from_ref(&x),
            Tol {
                atol: 2e-6,
                rtol: 1e-4,
            },
            "grid softmax rows",
        );
        check(
            &gpu,
            &mut k,
            &Op::Transpose(ops::Transpose { perm: vec![1, 0] }),
            std::slice::from_ref(&x),
            EXACT,
            "grid transpose",
        );
        check(
            &gpu,
            &mut k,
            &Op::CausalMask(ops::CausalMask),
            &[f32_tensor(&mut rng, &[2, 10, 40])],
            EXACT,
            "grid causal",
        );
        let (a, b) = (
            f32_tensor(&mut rng, &[2, 70, 20]),
            f32_tensor(&mut rng, &[20, 70]),
        );
        check(
            &gpu,
            &mut k,
            &Op::MatMul(ops::MatMul { transpose_b: false }),
            &[a, b],
            Tol {
                atol: 1e-4,
                rtol: 0.0,
            },
            "grid matmul",
        );
        // 3 x 3 = 9 workgroups is the most this grid holds: more is an error, not a wrong run.
        // (An odd count takes the scalar path: one element per invocation, 11 workgroups.)
        let big = f32_tensor(&mut rng, &[10 * 256 + 1]);
        let err = run(
            &gpu,
            &mut k,
            &Op::Unary(UnaryOp::Relu),
            &[big],
            &s(&[2561]),
            DType::F32,
            0,
        );
        let err = err.map(|v| v.len());
        assert!(
            matches!(
                err,
                Err(RunOpError::Kernel(KernelError::TooManyWorkgroups {
                    workgroups: 11,
                    max: 3
                }))
            ),
            "{err:?}"
        );
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

#[test]
fn dispatches_in_one_pass_get_their_own_uniforms_and_see_earlier_writes() {
    for gpu in gpus("one_pass_chain") {
        let device = gpu.device();
        let engine = Engine::new(gpu.clone());
        let mut k = Kernels::new(&gpu);
        let mut u = UniformArena::new(&engine);
        // x [3, 5] -> relu -> add row bias -> softmax -> mul by x, all in one pass of one
        // buffer, each step reading the previous step's output.
        let mut rng = SplitMix64::new(8);
        let xs = s(&[3, 5]);
        let bs = s(&[5]);
        let x = rand_values(&mut rng, &xs);
        let bias = rand_values(&mut rng, &bs);
        let buf = device_buffer(&engine, "chain", 4096);
        engine.write(&buf, 0, bytemuck::cast_slice(&x)).unwrap();
        engine
            .write(&buf, 256, bytemuck::cast_slice(&bias))
            .unwrap();
        let t = |off: u64, shape: &'static Shape| Operand {
            tensor: TensorRef {
                buffer: &buf,
                offset_bytes: off,
                size_bytes: 60,
            },
            shape,
            dtype: DType::F32,
            strides: None,
        };
        static XS: std::sync::OnceLock<Shape> = std::sync::OnceLock::new();
        static BS: std::sync::OnceLock<Shape> = std::sync::OnceLock::new();
        let xs_ = XS.get_or_init(|| s(&[3, 5]));
        let bs_ = BS.get_or_init(|| s(&[5]));
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            k.encode(
                &mut pass,
                &mut u,
                &Op::Unary(UnaryOp::Relu),
                &[t(0, xs_)],
                &t(512, xs_),
            )
            .unwrap();
            k.encode(
                &mut pass,
                &mut u,
                &Op::Binary(BinaryOp::Add),
                &[t(512, xs_), t(256, bs_)],
                &t(1024, xs_),
            )
            .unwrap();
            k.encode(
                &mut pass,
                &mut u,
                &Op::Softmax(ops::Softmax::LAST),
                &[t(1024, xs_)],
                &t(1536, xs_),
            )
            .unwrap();
            k.encode(
                &mut pass,
                &mut u,
                &Op::Binary(BinaryOp::Mul),
                &[t(1536, xs_), t(0, xs_)],
                &t(2048, xs_),
            )
            .unwrap();
        }
        assert_eq!(u.slots_used(), 4);
        // Four distinct (pipeline, ranges) combinations: four bind groups cached.
        assert_eq!(k.cached_bind_groups(), 4);
        u.flush();
        gpu.queue().submit([enc.finish()]);
        let got: Vec<f32> =
            bytemuck::cast_slice(&engine.read_blocking(&buf, 2048, 60).unwrap()).to_vec();
        // Reference, op by op.
        let ev = |op: Op, ins: &[&RefTensor]| reference::eval_op(&op, ins, &ins[0].shape).unwrap();
        let xr = RefTensor::from_f32(xs.clone(), DType::F32, x.clone());
        let br = RefTensor::from_f32(bs.clone(), DType::F32, bias.clone());
        let r = ev(Op::Unary(UnaryOp::Relu), &[&xr]);
        let r = ev(Op::Binary(BinaryOp::Add), &[&r, &br]);
        let r = ev(Op::Softmax(ops::Softmax::LAST), &[&r]);
        let want = ev(Op::Binary(BinaryOp::Mul), &[&r, &xr]).to_f32();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5, "{got:?} vs {want:?}");
        }
    }
}

#[test]
fn repeated_dispatches_reuse_their_bind_group_until_forgotten() {
    for gpu in gpus("bind_group_cache") {
        let device = gpu.device();
        let engine = Engine::new(gpu.clone());
        let mut k = Kernels::new(&gpu);
        let mut u = UniformArena::new(&engine);
        let buf = device_buffer(&engine, "bind group cache", 1024);
        let xs = s(&[16]);
        let relu = Op::Unary(UnaryOp::Relu);
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..3 {
                k.encode(
                    &mut pass,
                    &mut u,
                    &relu,
                    &[opnd(&buf, 0, 64, &xs)],
                    &opnd(&buf, 256, 64, &xs),
                )
                .unwrap();
            }
            assert_eq!(
                u.slots_used(),
                3,
                "each dispatch keeps its own uniform slot"
            );
            assert_eq!(
                k.cached_bind_groups(),
                1,
                "same buffers and ranges: one group"
            );
            // Another output range is another group.
            k.encode(
                &mut pass,
                &mut u,
                &relu,
                &[opnd(&buf, 0, 64, &xs)],
                &opnd(&buf, 512, 64, &xs),
            )
            .unwrap();
            assert_eq!(k.cached_bind_groups(), 2);
        }
        k.forget_bind_groups();
        assert_eq!(k.cached_bind_groups(), 0);
        u.flush();
        gpu.queue().submit([enc.finish()]);
    }
}

#[test]
fn bad_operands_are_typed_errors() {
    let Some(gpu) = testing::gpu_or_skip("bad_operands_are_typed_errors") else {
        return;
    };
    let (device, queue) = (gpu.device(), gpu.queue());
    let engine = Engine::new(gpu.clone());
    let mut k = Kernels::new(&gpu);
    let mut u = UniformArena::new(&engine);
    let buf = device_buffer(&engine, "bad", 256);
    let (a, wrong) = (s(&[4, 4]), s(&[4, 5]));
    let op = |off: u64, size: u64, shape| opnd(&buf, off, size, shape);
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        let relu = Op::Unary(UnaryOp::Relu);
        let e = k
            .encode(
                &mut pass,
                &mut u,
                &relu,
                &[op(0, 64, &a)],
                &op(64, 80, &wrong),
            )
            .unwrap_err();
        assert!(matches!(e, KernelError::OutputShape { .. }), "{e}");
        let e = k
            .encode(&mut pass, &mut u, &relu, &[op(0, 32, &a)], &op(64, 64, &a))
            .unwrap_err();
        assert!(
            matches!(
                e,
                KernelError::TooSmall {
                    needed_bytes: 64,
                    ..
                }
            ),
            "{e}"
        );
        let e = k
            .encode(&mut pass, &mut u, &relu, &[op(2, 64, &a)], &op(64, 64, &a))
            .unwrap_err();
        assert!(
            matches!(
                e,
                KernelError::Unaligned {
                    offset_bytes: 2,
                    ..
                }
            ),
            "{e}"
        );
        let e = k
            .encode(&mut pass, &mut u, &relu, &[op(0, 64, &a)], &op(224, 64, &a))
            .unwrap_err();
        assert!(matches!(e, KernelError::TooSmall { .. }), "{e}");
        let c = Op::Constant(ops::Constant {
            shape: a.clone(),
            dtype: DType::F32,
            data: ConstData::from_f32(&[0.0; 16]),
        });
        let e = k
            .encode(&mut pass, &mut u, &c, &[], &op(0, 64, &a))
            .unwrap_err();
        assert!(matches!(e, KernelError::NotAKernel { .. }), "{e}");
        // A kernel refuses element types it was not written for: an f16 add (f16 arithmetic
        // would need SHADER_F16; integer adds have their own kernel now).
        let mut int = op(0, 64, &a);
        int.dtype = DType::F16;
        let mut int_out = op(64, 64, &a);
        int_out.dtype = DType::F16;
        let e = k
            .encode(
                &mut pass,
                &mut u,
                &Op::Binary(BinaryOp::Add),
                &[int, int],
                &int_out,
            )
            .unwrap_err();
        assert!(matches!(e, KernelError::DType { .. }), "{e}");
        // A usm_host buffer cannot be bound.
        let host = engine
            .allocate(&BufferDesc {
                label: "host",
                size_bytes: 256,
                kind: AllocKind::UsmHost,
            })
            .unwrap();
        let e = k
            .encode(
                &mut pass,
                &mut u,
                &relu,
                &[opnd(&host, 0, 64, &a)],
                &op(64, 64, &a),
            )
            .unwrap_err();
        assert!(matches!(e, KernelError::NotBindable { .. }), "{e}");
    }
    assert_eq!(
        u.slots_used(),
        0,
        "refused encodes must not take uniform slots"
    );
    queue.submit([enc.finish()]);
}

/// A `usm_device` buffer from the engine.
fn device_buffer(engine: &Engine, label: &str, size_bytes: u64) -> Buffer {
    engine
        .allocate(&BufferDesc {
            label,
            size_bytes,
            kind: AllocKind::UsmDevice,
        })
        .unwrap()
}

fn opnd<'a>(
    buffer: &'a Buffer,
    offset_bytes: u64,
    size_bytes: u64,
    shape: &'a Shape,
) -> Operand<'a> {
    Operand {
        tensor: TensorRef {
            buffer,
            offset_bytes,
            size_bytes,
        },
        shape,
        dtype: DType::F32,
        strides: None,
    }
}

/// An i32 tensor (positions, ids) carried as f32.
fn i32_tensor(dims: &[u64], values: Vec<i32>) -> HostTensor {
    HostTensor {
        shape: s(dims),
        dtype: DType::I32,
        values: values.into_iter().map(|v| v as f32).collect(),
    }
}

#[test]
fn rope_on_adjacent_pairs() {
    for gpu in gpus("rope_on_adjacent_pairs") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(21);
        let tol = Tol {
            atol: 1e-6,
            rtol: 1e-5,
        };
        // (rows, heads, head_dim, rope_dim, positions covered, base): SmolLM2's heads, a partial
        // rotation, odd row counts, a table as long as SmolLM2's context.
        let cases: [(u64, u64, u32, u32, u32, f64); 6] = [
            (1, 9, 64, 64, 64, 100_000.0),
            (7, 3, 64, 64, 8192, 100_000.0),
            (5, 2, 16, 8, 32, 10_000.0),
            (3, 4, 2, 2, 4, 10_000.0),
            (33, 1, 128, 128, 40, 500_000.0),
            (0, 3, 16, 16, 4, 10_000.0),
        ];
        for (rows, heads, d, r, p_rows, base) in cases {
            let x = f32_tensor(&mut rng, &[rows, heads * u64::from(d)]);
            // Positions anywhere in the table, the last row, and (when there are rows enough)
            // one below and one past it: those rows must come out as zeros.
            // The two-level table covers block * (rows - block) >= p_rows positions.
            let block = ops::rope_block(p_rows);
            let t_rows = ops::rope_table_rows(p_rows);
            let covered = block * (t_rows - block);
            let mut pos: Vec<i32> = (0..rows)
                .map(|_| rng.range(0, u64::from(p_rows)) as i32)
                .collect();
            if rows >= 3 {
                pos[0] = covered as i32 - 1;
                pos[1] = -1;
                pos[2] = covered as i32;
            }
            let table = HostTensor {
                shape: s(&[u64::from(t_rows), u64::from(r)]),
                dtype: DType::F32,
                values: ops::rope_table(base, r, p_rows),
            };
            // Adjacent pairs (GGUF llama) and halves (qwen2, gemma), each against the CPU
            // reference.
            for interleaved in [true, false] {
                let ctx = format!("rope rows {rows} heads {heads} d {d} r {r} table {p_rows} interleaved {interleaved}");
                let op = Op::Rope(ops::Rope {
                    head_dim: d,
                    block,
                    interleaved,
                });
                let got = check(
                    &gpu,
                    &mut k,
                    &op,
                    &[x.clone(), i32_tensor(&[rows], pos.clone()), table.clone()],
                    tol,
                    &ctx,
                );
                if rows >= 3 {
                    let w = (heads * u64::from(d)) as usize;
                    assert!(got[w..3 * w].iter().all(|&v| v == 0.0), "{ctx}");
                    // A rotation keeps the norm of each pair.
                    let n0: f32 = x.values[..w].iter().map(|v| v * v).sum();
                    let n1: f32 = got[..w].iter().map(|v| v * v).sum();
                    assert!((n0 - n1).abs() < 1e-4 * n0.max(1.0), "{ctx}: {n0} vs {n1}");
                }
            }
        }
    }
}

#[test]
fn grouped_query_attention_over_a_growing_cache() {
    for gpu in gpus("grouped_query_attention_over_a_growing_cache") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(22);
        let tol = Tol {
            atol: 2e-6,
            rtol: 1e-4,
        };
        // (queries S, keys T, heads, kv heads, head_dim, value scale): SmolLM2's decode and
        // prefill shapes, prefill on top of a past, plain multi-head attention, the largest
        // head, more keys than invocations per workgroup, no queries.
        let cases: [(u64, u64, u32, u32, u64, f32); 10] = [
            (1, 1, 9, 3, 64, 1.0),
            (1, 37, 9, 3, 64, 1.0),
            (1, 300, 4, 2, 16, 1.0),
            (5, 5, 4, 2, 16, 1.0),
            (7, 20, 6, 2, 32, 1.0),
            (4, 4, 2, 2, 8, 1.0),
            (3, 130, 2, 1, 128, 1.0),
            (16, 16, 9, 3, 64, 1.0),
            (2, 70, 4, 4, 24, 4.0),
            (0, 3, 2, 1, 8, 1.0),
        ];
        for (s_q, t, h, kvh, d, scale) in cases {
            let mut q = f32_tensor(&mut rng, &[s_q, u64::from(h) * d]);
            let mut kk = f32_tensor(&mut rng, &[t, u64::from(kvh) * d]);
            let v = f32_tensor(&mut rng, &[t, u64::from(kvh) * d]);
            // Sharp scores (scale 4): probabilities near 0 and 1, the running max moves.
            q.values.iter_mut().for_each(|x| *x *= scale);
            kk.values.iter_mut().for_each(|x| *x *= scale);
            let op = Op::Attention(ops::Attention {
                num_heads: h,
                num_kv_heads: kvh,
            });
            let tol = if scale > 1.0 {
                Tol {
                    atol: 1e-5,
                    rtol: 1e-4,
                }
            } else {
                tol
            };
            // Twice: aligned (the vec4 entry point) and skewed by one element (the scalar
            // one); `check` skews by the context's length mod 3.
            let mut ctx = format!("attention S {s_q} T {t} H {h} KVH {kvh} D {d} scale {scale}");
            while ctx.len() % 3 != 0 {
                ctx.push(' ');
            }
            let ins = [q, kk, v];
            check(&gpu, &mut k, &op, &ins, tol, &ctx);
            check(&gpu, &mut k, &op, &ins, tol, &format!("{ctx} skewed"));
        }
        // Both entry points ran.
        assert!(k.stats().pipelines >= 2, "{:?}", k.stats());
        // A head beyond the kernel's registers is a typed error, not a wrong answer.
        let op = Op::Attention(ops::Attention {
            num_heads: 1,
            num_kv_heads: 1,
        });
        let ins = [
            f32_tensor(&mut rng, &[1, 130]),
            f32_tensor(&mut rng, &[2, 130]),
            f32_tensor(&mut rng, &[2, 130]),
        ];
        let e = run(&gpu, &mut k, &op, &ins, &s(&[1, 130]), DType::F32, 0).unwrap_err();
        assert!(e.to_string().contains("head_dim 130"), "{e}");
    }
}
