//! The reduce family against the CPU reference on every test backend: softmax and
//! log-softmax on any axis (both kernels: a workgroup per row, one invocation per row), layer norm (with and without shift) and RMS norm over trailing
//! axes, reductions over any axes (sum, mean, max, min, inverse standard deviation; keepdims
//! or not; nothing to reduce), cumulative sums (f32 and i32, exclusive, reverse).
//!
//! Tolerances (|gpu - ref| <= atol + rtol |ref|, ref in f64): softmax atol 2e-6 rtol 1e-4,
//! log-softmax atol 1e-5 rtol 1e-5, norms atol 1e-4 rtol 1e-4, sums and means atol 1e-5 * n
//! (f32 accumulation of n terms in [-1, 1)), max and min exact, i32 cumulative sums exact.

use super::*;
use dynrt::gpu::kernels::quant::QuantLayout;
use dynrt::gpu::kernels::Kernels;
use dynrt::graph::ops::{CumSum, LayerNorm, Reduce, ReduceAxes, ReduceKind, RmsNorm, Softmax};
use dynrt::graph::reference::{RefTensor, Values};
use dynrt::graph::Op;
use dynrt::rng::SplitMix64;
use dynrt::shape::DType;

#[test]
fn softmax_and_log_softmax_on_any_axis() {
    for gpu in gpus("softmax_and_log_softmax_on_any_axis") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(31);
        for i in 0..30 {
            let dims = rand_dims(&mut rng, 1, 4, 9, true);
            let mut x = f32s(&mut rng, &dims);
            if i % 5 == 0 {
                // Large values: the max is subtracted first.
                if let Values::F32(v) = &mut x.values {
                    v.iter_mut().for_each(|e| *e *= 1000.0);
                }
            }
            let axis = rng.range(0, dims.len() as u64) as i64
                - if i % 2 == 0 { dims.len() as i64 } else { 0 };
            for log in [false, true] {
                let tol = if log {
                    Tol {
                        atol: 1e-5,
                        rtol: 1e-5,
                    }
                } else {
                    Tol {
                        atol: 2e-6,
                        rtol: 1e-4,
                    }
                };
                check(
                    &gpu,
                    &mut k,
                    &Op::Softmax(Softmax { axis, log }),
                    &[&x],
                    tol,
                    &format!("softmax #{i} {dims:?} axis {axis} log {log}"),
                );
            }
        }
        // Many short rows (an encoder's attention scores), scaled up, on the last and on a
        // middle axis: a software layout runs one invocation per row, a GPU one a workgroup
        // per row; both forced, so every adapter runs both kernels.
        let mut x = f32s(&mut rng, &[6, 12, 17, 33]);
        if let Values::F32(v) = &mut x.values {
            v.iter_mut().for_each(|e| *e *= 30.0);
        }
        for layout in [
            QuantLayout::Cpu { threads: 2 },
            QuantLayout::Gpu { subgroup: None },
        ] {
            k.set_quant_layout(layout);
            for (axis, log) in [(-1, false), (-1, true), (2, false)] {
                let tol = Tol {
                    atol: if log { 1e-5 } else { 2e-6 },
                    rtol: if log { 1e-5 } else { 1e-4 },
                };
                check(
                    &gpu,
                    &mut k,
                    &Op::Softmax(Softmax { axis, log }),
                    &[&x],
                    tol,
                    &format!("softmax of many rows, {layout:?}, axis {axis} log {log}"),
                );
            }
        }
        k.set_quant_layout(QuantLayout::of(&gpu));
        // Known answer: log-softmax of [0, ln 3] is [-ln 4, ln 3 - ln 4].
        let x = RefTensor::from_f32(s(&[2]), DType::F32, vec![0.0, 3f32.ln()]);
        let got = check(
            &gpu,
            &mut k,
            &Op::Softmax(Softmax { axis: 0, log: true }),
            &[&x],
            Tol {
                atol: 1e-6,
                rtol: 0.0,
            },
            "log_softmax known",
        );
        let want = [-(4f32.ln()), 3f32.ln() - 4f32.ln()];
        assert!(
            got.to_f32()
                .iter()
                .zip(want)
                .all(|(g, w)| (g - w).abs() < 1e-6),
            "{:?}",
            got.to_f32()
        );
    }
}

#[test]
fn layer_norm_and_rms_norm_over_trailing_axes() {
    for gpu in gpus("layer_norm_and_rms_norm_over_trailing_axes") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(32);
        let tol = Tol {
            atol: 1e-4,
            rtol: 1e-4,
        };
        for i in 0..24 {
            let dims = rand_dims(&mut rng, 1, 4, 9, false);
            let axis = rng.range(0, dims.len() as u64) as usize;
            let x = f32s(&mut rng, &dims);
            let params = &dims[axis..];
            let gamma = f32s(&mut rng, params);
            let beta = f32s(&mut rng, params);
            let a = axis as i64 - if i % 2 == 0 { dims.len() as i64 } else { 0 };
            let ln = Op::LayerNorm(LayerNorm { eps: 1e-5, axis: a });
            check(
                &gpu,
                &mut k,
                &ln,
                &[&x, &gamma, &beta],
                tol,
                &format!("layer_norm #{i} {dims:?} axis {a}"),
            );
            check(
                &gpu,
                &mut k,
                &ln,
                &[&x, &gamma],
                tol,
                &format!("layer_norm no bias #{i} {dims:?} axis {a}"),
            );
            let rms = Op::RmsNorm(RmsNorm { eps: 1e-6, axis: a });
            check(
                &gpu,
                &mut k,
                &rms,
                &[&x, &gamma],
                tol,
                &format!("rms_norm #{i} {dims:?} axis {a}"),
            );
        }
        // Known answer: [1, 3] normalises to [-1, 1] (eps 0, unit scale, no shift).
        let x = RefTensor::from_f32(s(&[1, 2]), DType::F32, vec![1.0, 3.0]);
        let one = RefTensor::from_f32(s(&[2]), DType::F32, vec![1.0, 1.0]);
        let got = check(
            &gpu,
            &mut k,
            &Op::LayerNorm(LayerNorm { eps: 0.0, axis: -1 }),
            &[&x, &one],
            tol,
            "layer_norm known",
        );
        assert_eq!(got.to_f32(), vec![-1.0, 1.0]);
    }
}

#[test]
fn reductions_over_any_axes() {
    for gpu in gpus("reductions_over_any_axes") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(33);
        let kinds = [
            ReduceKind::Sum,
            ReduceKind::Mean,
            ReduceKind::Max,
            ReduceKind::Min,
            ReduceKind::InvStdDev { eps: 1e-5 },
        ];
        for i in 0..40 {
            let dims = rand_dims(&mut rng, 1, 5, 6, true);
            let x = f32s(&mut rng, &dims);
            let rank = dims.len() as u64;
            let axes = match i % 4 {
                0 => ReduceAxes::All,
                1 => ReduceAxes::From(rng.range(0, rank + 1) as i64),
                _ => {
                    let mut a: Vec<i64> =
                        (0..rank as i64).filter(|_| rng.range(0, 2) == 0).collect();
                    if a.is_empty() {
                        a.push(rng.range(0, rank) as i64 - rank as i64);
                    }
                    ReduceAxes::List(a)
                }
            };
            let kind = kinds[i % kinds.len()];
            let keepdims = i % 3 != 0;
            let op = Op::Reduce(Reduce {
                kind,
                axes: axes.clone(),
                keepdims,
            });
            let n = dims.iter().product::<u64>().max(1) as f32;
            let tol = match kind {
                ReduceKind::Max | ReduceKind::Min => EXACT,
                ReduceKind::InvStdDev { .. } => Tol {
                    atol: 1e-3,
                    rtol: 1e-3,
                },
                _ => Tol {
                    atol: 1e-5 * n,
                    rtol: 1e-5,
                },
            };
            check(
                &gpu,
                &mut k,
                &op,
                &[&x],
                tol,
                &format!("reduce #{i} {kind:?} {dims:?} {axes:?} keepdims {keepdims}"),
            );
        }
        // Axes held in a tensor (read on the device), negative ones from the end; none listed
        // reduces every axis, or nothing with noop_with_empty_axes.
        for i in 0..16 {
            let dims = rand_dims(&mut rng, 1, 5, 6, true);
            let x = f32s(&mut rng, &dims);
            let rank = dims.len() as i64;
            let mut listed = Vec::new();
            for a in 0..rank {
                match rng.range(0, 3) {
                    0 => listed.push(a),
                    1 => listed.push(a - rank),
                    _ => {}
                }
            }
            let axes = ints(
                [DType::I64, DType::I32][i % 2],
                &[listed.len() as u64],
                &listed,
            );
            let kind = kinds[i % 4];
            let noop = i % 3 == 0;
            let op = Op::Reduce(Reduce {
                kind,
                axes: ReduceAxes::Input {
                    noop_with_empty_axes: noop,
                },
                keepdims: i % 2 == 0,
            });
            let n = dims.iter().product::<u64>().max(1) as f32;
            let tol = match kind {
                ReduceKind::Max | ReduceKind::Min => EXACT,
                _ => Tol {
                    atol: 1e-5 * n,
                    rtol: 1e-5,
                },
            };
            check(
                &gpu,
                &mut k,
                &op,
                &[&x, &axes],
                tol,
                &format!("reduce fed #{i} {kind:?} {dims:?} {listed:?} noop {noop}"),
            );
        }
        // Nothing to reduce: sum 0, mean NaN, max -inf, min +inf (ONNX's empty-set rules).
        let x = f32s(&mut rng, &[2, 0, 3]);
        for (kind, want) in [
            (ReduceKind::Sum, 0.0),
            (ReduceKind::Mean, f32::NAN),
            (ReduceKind::Max, f32::NEG_INFINITY),
            (ReduceKind::Min, f32::INFINITY),
        ] {
            let op = Op::Reduce(Reduce {
                kind,
                axes: ReduceAxes::List(vec![1]),
                keepdims: true,
            });
            let got = check(&gpu, &mut k, &op, &[&x], EXACT, &format!("empty {kind:?}"));
            assert_eq!(got.shape, s(&[2, 1, 3]));
            assert!(
                got.to_f32()
                    .iter()
                    .all(|&v| v == want || (v.is_nan() && want.is_nan())),
                "{kind:?}: {:?}",
                got.to_f32()
            );
        }
    }
}

#[test]
fn cumulative_sums() {
    for gpu in gpus("cumulative_sums") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(34);
        for i in 0..24 {
            let dims = rand_dims(&mut rng, 1, 4, 9, true);
            let axis = rng.range(0, dims.len() as u64) as i64
                - if i % 2 == 0 { dims.len() as i64 } else { 0 };
            let (exclusive, reverse) = (i % 4 >= 2, i % 2 == 1);
            let op = Op::CumSum(CumSum {
                axis,
                exclusive,
                reverse,
            });
            let f = f32s(&mut rng, &dims);
            check(
                &gpu,
                &mut k,
                &op,
                &[&f],
                Tol {
                    atol: 1e-5 * 9.0,
                    rtol: 1e-5,
                },
                &format!("cumsum f32 #{i} {dims:?} axis {axis} ex {exclusive} rev {reverse}"),
            );
            let n = rand_ints(&mut rng, DType::I32, &dims, -1 << 30, 1 << 30);
            check(
                &gpu,
                &mut k,
                &op,
                &[&n],
                EXACT,
                &format!("cumsum i32 #{i} {dims:?} axis {axis}"),
            );
        }
        // Known answer (ONNX's example): [1, 2, 3, 4, 5] exclusive and reversed.
        let x = ints(DType::I32, &[5], &[1, 2, 3, 4, 5]);
        let op = Op::CumSum(CumSum {
            axis: 0,
            exclusive: true,
            reverse: true,
        });
        let got = check(&gpu, &mut k, &op, &[&x], EXACT, "cumsum known");
        assert_eq!(got.values, Values::Int(vec![14, 12, 9, 5, 0]));
    }
}
