//! The subgroup kernels at other subgroup sizes than the adapter's default: lavapipe runs 4
//! lanes with 128-bit vectors (`LP_NATIVE_VECTOR_WIDTH=128`), and with 1024-bit vectors it
//! reports subgroups of 32 (NVIDIA's size) while running 16 lanes of each, a device the
//! kernels must stay right on. A child process of this binary runs the cases at each width
//! (the variable is read when the driver starts); elsewhere than on lavapipe the test has
//! nothing to vary and skips.
//!
//! The cases: linear in the formats of the models, decode rows (M = 1, 3, 8: the subgroup
//! kernel), with a fused gate, and the attention block's epilogues (a bias with RoPE, Q/K/V
//! as one projection writing its keys and values, a post-norm); grouped-query attention with the groups of
//! SmolLM2 (3:1, heads of 64), Qwen2.5 (7:1) and Gemma 3 (4:1, heads of 256), f32 and f16
//! keys, in one pass and split. Tolerances as in `quant`, `fused` and `transformer`.

use super::fused::{epilogue_inputs, skewed};
use super::quant::{block_len, check, linear_tol, s, values, weight};
use super::transformer::{check_attention, AttentionCase};
use crate::common;
use dynrt::gpu::kernels::attention::grouped_constants;
use dynrt::gpu::kernels::quant::QuantLayout;
use dynrt::gpu::kernels::Kernels;
use dynrt::gpu::{testing, GpuOptions};
use dynrt::graph::ops::fused_linear::PLAIN;
use dynrt::graph::ops::{rope_block, FusedLinear, GateAct, KvSplit, Linear, Rope};
use dynrt::graph::Op;
use dynrt::rng::SplitMix64;
use dynrt::shape::DType;
use dynrt::tensor::HostTensor;

/// The cases, on the Vulkan adapter of this process, with the hardware-GPU kernels forced.
fn run_cases(want_subgroup: u32) {
    let gpu = dynrt::gpu::Gpu::new_blocking(
        GpuOptions::default().with_backend(dynrt::gpu::wgpu::Backend::Vulkan),
    )
    .expect("the child's Vulkan adapter");
    let class = QuantLayout::gpu_class(&gpu);
    // The precondition: the driver took the width (its subgroup size).
    assert_eq!(
        class,
        QuantLayout::Gpu {
            subgroup: Some(want_subgroup)
        }
    );
    let mut k = Kernels::new(&gpu);
    k.set_quant_layout(class);
    let mut rng = SplitMix64::new(90);
    for dtype in [DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::F16] {
        for m in [1u64, 3, 8] {
            let kd = 4 * block_len(dtype).max(32);
            for (op, n) in [
                (Op::Linear(Linear), 37),
                (
                    Op::FusedLinear(FusedLinear {
                        norm: Some(1e-5),
                        gate: Some(GateAct::Silu),
                        residual: true,
                        ..PLAIN
                    }),
                    19,
                ),
            ] {
                let gated = matches!(op, Op::FusedLinear(_));
                let mut ins = vec![
                    HostTensor::f32(s(&[m, kd]), &values(&mut rng, m * kd)),
                    weight(&mut rng, dtype, if gated { 2 * n } else { n }, kd),
                ];
                if gated {
                    ins.push(HostTensor::f32(s(&[kd]), &values(&mut rng, kd)));
                    ins.push(HostTensor::f32(s(&[m, n]), &values(&mut rng, m * n)));
                }
                let mut tol = linear_tol(kd);
                tol.atol *= 4.0;
                tol.rtol *= 10.0;
                check(
                    &gpu,
                    &mut k,
                    &op,
                    &ins,
                    tol,
                    &format!(
                        "subgroup {want_subgroup}: {} {dtype} M {m} K {kd}",
                        op.name()
                    ),
                );
            }
        }
    }
    // The attention block's epilogues through the subgroup kernel (its `finish`): a bias with
    // RoPE on halves; Q/K/V as one projection over three formats writing its keys and values
    // (the queries checked); a post-norm of a row longer than the segment kernels hold (the
    // products stored, then quant_segment_finish).
    let rope = Some(Rope {
        head_dim: 16,
        block: rope_block(40),
        interleaved: false,
    });
    let epilogues = [
        (
            FusedLinear {
                norm: Some(1e-5),
                bias: true,
                rope,
                ..PLAIN
            },
            [DType::Q4_1; 3],
            48,
        ),
        (
            FusedLinear {
                norm: Some(1e-5),
                bias: true,
                kv: Some(KvSplit {
                    kv_rows: 16,
                    slots: false,
                }),
                rope,
                ..PLAIN
            },
            [DType::Q8_0, DType::Q4_K, DType::F16],
            32,
        ),
        (
            FusedLinear {
                post_norm: Some(1e-6),
                residual: true,
                ..PLAIN
            },
            [DType::Q8_0; 3],
            dynrt::gpu::kernels::quant::SEG_MAX + 100,
        ),
    ];
    for (op, formats, nq) in &epilogues {
        let kd = 2 * formats
            .iter()
            .map(|&f| block_len(f).max(32))
            .max()
            .unwrap_or(32);
        for m in [1u64, 3, 8] {
            let ins = epilogue_inputs(&mut rng, op, *formats, m, kd, *nq);
            let mut tol = linear_tol(kd);
            tol.atol *= 4.0;
            tol.rtol *= 10.0;
            check(
                &gpu,
                &mut k,
                &Op::FusedLinear(*op),
                &ins,
                tol,
                // x on a vec4: the subgroup kernel reads it as vec4s.
                &skewed(
                    format!("subgroup {want_subgroup}: {op:?} {formats:?} M {m} K {kd}"),
                    0,
                ),
            );
        }
    }
    assert!(k.has_pipeline("quantsg_matvec"));
    let cases: [AttentionCase; 4] = [
        (1, 300, 9, 3, 64, 1.0, 0),
        (3, 40, 14, 2, 64, 4.0, 0),
        (1, 90, 4, 1, 256, 1.0, 0),
        (2, 500, 4, 1, 256, 1.0, 64),
    ];
    let mut k = Kernels::new(&gpu);
    k.set_quant_layout(class);
    check_attention(
        &gpu,
        &mut k,
        &mut rng,
        &cases,
        &format!("subgroup {want_subgroup}"),
    );
    k.set_attention_workgroups(1 << 20);
    check_attention(
        &gpu,
        &mut k,
        &mut rng,
        &cases,
        &format!("subgroup {want_subgroup} split"),
    );
    // The grouped kernel ran where it takes the heads on this subgroup size (at 4 lanes
    // none: their pairs would not fit its registers, the per-head kernel serves them).
    let takes = cases.iter().any(|&(_, _, h, kvh, d, _, _)| {
        grouped_constants(u64::from(h), u64::from(kvh), d, want_subgroup).is_some()
    });
    assert_eq!(k.has_pipeline("gqa_grouped"), takes);
    assert_eq!(takes, want_subgroup >= 8);
}

#[test]
fn subgroup_kernels_hold_at_other_subgroup_sizes() {
    const TEST: &str = "subgroup_kernels_hold_at_other_subgroup_sizes";
    if common::in_child(module_path!(), TEST) {
        let want = std::env::var("DYNRT_TEST_SUBGROUP")
            .ok()
            .and_then(|v| v.parse().ok())
            .expect("the subgroup size the parent asked for");
        run_cases(want);
        return;
    }
    let on_lavapipe = testing::gpus_or_skip(TEST).iter().any(|g| {
        g.backend() == dynrt::gpu::wgpu::Backend::Vulkan
            && g.adapter_info().name.contains("llvmpipe")
    });
    if !on_lavapipe {
        eprintln!("{TEST}: skipped, no lavapipe adapter to run other subgroup sizes on");
        return;
    }
    for (width, subgroup) in [("128", "4"), ("1024", "32")] {
        let out = common::run_alone(
            module_path!(),
            TEST,
            &[
                ("LP_NATIVE_VECTOR_WIDTH", width),
                ("DYNRT_TEST_SUBGROUP", subgroup),
            ],
        );
        assert!(
            out.status.success(),
            "vector width {width}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
