//! How kernels of any family are dispatched: 2-D grids when the workgroups exceed the
//! per-dimension limit, several dispatches in one pass (each with its own uniforms, each
//! seeing the earlier writes), bind groups reused until forgotten, and bad operands refused
//! with typed errors.

use super::*;

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
            layout: dynrt::gpu::kernels::WeightLayout::File,
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
        {
            // Raw wgpu on the shared test device: other test threads may be using it (GL).
            let _device = gpu.lock_device();
            gpu.queue().submit([enc.finish()]);
        }
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
        let _device = gpu.lock_device();
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
    let _device = gpu.lock_device();
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
        layout: dynrt::gpu::kernels::WeightLayout::File,
    }
}
