//! The families of a transformer layer besides matmul: softmax, layer norm and RMS norm
//! (`shaders/reduce.wgsl`), rotary embedding (`shaders/rotary.wgsl`) and grouped-query
//! attention over a growing cache (`shaders/attention.wgsl`).

use super::*;
use dynrt::gpu::kernels::quant::QuantLayout;

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

/// The attention cases of [`grouped_query_attention_over_a_growing_cache`]: (queries S, keys
/// T, heads, kv heads, head_dim, value scale, window).
pub(super) type AttentionCase = (u64, u64, u32, u32, u64, f32, u32);

/// Runs each case against the CPU reference, twice: aligned (the vec4 entry point) and skewed
/// by one element (the scalar one; `check` skews by the context's length mod 3).
pub(super) fn check_attention(
    gpu: &Gpu,
    k: &mut Kernels,
    rng: &mut SplitMix64,
    cases: &[AttentionCase],
    label: &str,
) {
    for &(s_q, t, h, kvh, d, scale, window) in cases {
        let mut q = f32_tensor(rng, &[s_q, u64::from(h) * d]);
        let mut kk = f32_tensor(rng, &[t, u64::from(kvh) * d]);
        let v = f32_tensor(rng, &[t, u64::from(kvh) * d]);
        // Sharp scores (scale 4): probabilities near 0 and 1, the running max moves.
        q.values.iter_mut().for_each(|x| *x *= scale);
        kk.values.iter_mut().for_each(|x| *x *= scale);
        let op = Op::Attention(ops::Attention {
            num_heads: h,
            num_kv_heads: kvh,
            window,
        });
        let tol = Tol {
            atol: if scale > 1.0 { 1e-5 } else { 2e-6 },
            rtol: 1e-4,
        };
        let mut ctx = format!(
            "{label}: attention S {s_q} T {t} H {h} KVH {kvh} D {d} scale {scale} window {window}"
        );
        while ctx.len() % 3 != 0 {
            ctx.push(' ');
        }
        let ins = [q, kk, v];
        check(gpu, k, &op, &ins, tol, &ctx);
        check(gpu, k, &op, &ins, tol, &format!("{ctx} skewed"));
        // A KV cache stored as f16: the reference reads the same f16 values, so the
        // tolerance stays (the kernels convert each exactly).
        let ins = [ins[0].clone(), as_f16(&ins[1]), as_f16(&ins[2])];
        check(gpu, k, &op, &ins, tol, &format!("{ctx} f16 cache"));
    }
}

/// `t` rounded to f16 and typed so.
fn as_f16(t: &HostTensor) -> HostTensor {
    let typed =
        dynrt::tensor::HostTensor::from_f32_values(t.shape.clone(), DType::F16, &t.values).unwrap();
    HostTensor {
        shape: t.shape.clone(),
        dtype: DType::F16,
        values: typed.to_f32(),
    }
}

#[test]
fn grouped_query_attention_over_a_growing_cache() {
    for gpu in gpus("grouped_query_attention_over_a_growing_cache") {
        let mut rng = SplitMix64::new(22);
        // SmolLM2's decode and prefill shapes, prefill on top of a past, plain multi-head
        // attention, more keys than invocations per workgroup, no queries; Gemma 3's heads of
        // 256 (two chunks of output dims per head) and a head of 200 (a partial second
        // chunk), a head of 130 (the scalar entry point past one chunk); sliding windows in
        // decode and in a prefill on top of a past, narrower and wider than the keys.
        let short: [AttentionCase; 16] = [
            (1, 1, 9, 3, 64, 1.0, 0),
            (1, 37, 9, 3, 64, 1.0, 0),
            (1, 300, 4, 2, 16, 1.0, 0),
            (5, 5, 4, 2, 16, 1.0, 0),
            (7, 20, 6, 2, 32, 1.0, 0),
            (4, 4, 2, 2, 8, 1.0, 0),
            (3, 130, 2, 1, 128, 1.0, 0),
            (16, 16, 9, 3, 64, 1.0, 0),
            (2, 70, 4, 4, 24, 4.0, 0),
            (0, 3, 2, 1, 8, 1.0, 0),
            (3, 90, 4, 1, 256, 1.0, 0),
            (2, 9, 2, 1, 200, 1.0, 0),
            (2, 9, 2, 2, 130, 1.0, 0),
            (1, 300, 4, 1, 256, 1.0, 16),
            (9, 40, 4, 2, 16, 4.0, 5),
            (5, 8, 2, 1, 32, 1.0, 64),
        ];
        // Long contexts, where keys are split across workgroups: SmolLM2's decode and a
        // prefill of a few rows on top of a long past, sharp scores, a sliding window inside
        // the keys, heads of two output-dim chunks, and a prefill whose first rows see fewer
        // keys than the chunks cover (empty chunks).
        let long: [AttentionCase; 6] = [
            (1, 3000, 9, 3, 64, 1.0, 0),
            (5, 3000, 9, 3, 64, 1.0, 0),
            (1, 2048, 4, 2, 16, 4.0, 0),
            (4, 3000, 4, 2, 64, 1.0, 1000),
            (2, 1500, 2, 1, 256, 1.0, 0),
            (200, 400, 1, 1, 8, 1.0, 0),
        ];
        // The adapter's own choice of splits (one pass on software adapters with fewer
        // threads than rows x heads), in workgroups of both sizes (`WG`: a software adapter's
        // and a GPU's, from the quantized kernels' layout) whatever the adapter; then every
        // case split wherever it has keys enough.
        for layout in [
            QuantLayout::Cpu { threads: 2 },
            QuantLayout::gpu_class(&gpu),
        ] {
            let mut k = Kernels::new(&gpu);
            k.set_quant_layout(layout);
            let label = format!("{layout:?}");
            check_attention(&gpu, &mut k, &mut rng, &short, &label);
            check_attention(&gpu, &mut k, &mut rng, &long, &label);
            // Both entry points ran, and the grouped kernel where the class has subgroups.
            assert!(k.stats().pipelines >= 2, "{:?}", k.stats());
            let grouped = matches!(layout, QuantLayout::Gpu { subgroup: Some(_) });
            assert_eq!(k.has_pipeline("gqa_grouped"), grouped, "{label}");
        }
        let mut k = Kernels::new(&gpu);
        k.set_attention_workgroups(1 << 20);
        check_attention(&gpu, &mut k, &mut rng, &short, "split");
        check_attention(&gpu, &mut k, &mut rng, &long, "split");

        // The split path is the one a long decode takes where the adapter wants more
        // workgroups than rows x heads (a hardware GPU's 512): it compiles the combine
        // pipeline besides the two entry points (aligned and skewed), which a short decode,
        // and the same long one with splitting off, do not.
        let decode = |t: u64, workgroups: u64| {
            let mut k = Kernels::new(&gpu);
            k.set_attention_workgroups(workgroups);
            let mut rng = SplitMix64::new(t);
            check_attention(
                &gpu,
                &mut k,
                &mut rng,
                &[(1, t, 9, 3, 64, 1.0, 0)],
                "decode",
            );
            k.stats().pipelines
        };
        // (The f16 cache takes the scalar entry, specialised: a third pipeline.)
        assert_eq!(decode(64, 512), 3, "context 64 is one pass");
        assert_eq!(decode(3000, 512), 4, "context 3000 splits");
        assert_eq!(decode(3000, 1), 3, "splitting off");

        // A head beyond the kernel's registers is a typed error, not a wrong answer.
        let op = Op::Attention(ops::Attention {
            num_heads: 1,
            num_kv_heads: 1,
            window: 0,
        });
        let ins = [
            f32_tensor(&mut rng, &[1, 516]),
            f32_tensor(&mut rng, &[2, 516]),
            f32_tensor(&mut rng, &[2, 516]),
        ];
        let e = run(&gpu, &mut k, &op, &ins, &s(&[1, 516]), DType::F32, 0).unwrap_err();
        assert!(e.to_string().contains("head_dim 516"), "{e}");
    }
}

/// Paged attention (`paged_attention`: keys and values read through a page table) against the
/// CPU reference: rows of several sequences at different positions in one dispatch (a batch
/// of decode rows and a prefill chunk), pages scattered over the pool in any order, heads of
/// 64 (vec4 entry) and 130 (scalar), grouped queries, a sliding window, rows of a sequence
/// whose page table is shorter than another's, and keys split across workgroups.
#[test]
fn paged_attention_reads_keys_through_the_page_table() {
    for gpu in gpus("paged_attention_reads_keys_through_the_page_table") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(31);
        // (heads, kv heads, head_dim, page size, window)
        for (h, kvh, d, page, window) in [
            (9u32, 3u32, 64u64, 16u32, 0u32),
            (4, 2, 16, 4, 0),
            (2, 1, 130, 8, 0),
            (4, 1, 32, 4, 7),
        ] {
            // Three sequences: positions 0..=299, 0..=5 and 0..=17 hold keys; the rows of
            // this step are the last one of the first two (decode) and the last 5 of the
            // third (a prefill chunk). The pool has a few pages more than they hold.
            let lens = [300u64, 6, 18];
            let pool_pages: u64 = lens
                .iter()
                .map(|l| l.div_ceil(u64::from(page)))
                .sum::<u64>()
                + 5;
            let r = pool_pages * u64::from(page);
            let per_seq = lens
                .iter()
                .map(|l| l.div_ceil(u64::from(page)))
                .max()
                .unwrap();
            // Pages from the pool in a shuffled order, none given twice.
            let mut free: Vec<u64> = (0..pool_pages).collect();
            for i in (1..free.len()).rev() {
                free.swap(i, rng.range(0, i as u64 + 1) as usize);
            }
            let mut pages = vec![0f32; lens.len() * per_seq as usize];
            for (n, &len) in lens.iter().enumerate() {
                for p in 0..len.div_ceil(u64::from(page)) {
                    pages[n * per_seq as usize + p as usize] = free.pop().unwrap() as f32;
                }
            }
            let mut rows = Vec::new();
            for (seq, pos) in [
                (0u64, 299u64),
                (1, 5),
                (2, 13),
                (2, 14),
                (2, 15),
                (2, 16),
                (2, 17),
            ] {
                rows.extend([seq as f32, pos as f32]);
            }
            let s_q = rows.len() as u64 / 2;
            let q = f32_tensor(&mut rng, &[s_q, u64::from(h) * d]);
            let kk = f32_tensor(&mut rng, &[r, u64::from(kvh) * d]);
            let v = f32_tensor(&mut rng, &[r, u64::from(kvh) * d]);
            let int = |dims: &[u64], values: Vec<f32>| HostTensor {
                shape: s(dims),
                dtype: DType::I32,
                values,
            };
            let op = Op::PagedAttention(ops::PagedAttention {
                num_heads: h,
                num_kv_heads: kvh,
                window,
                page_size: page,
            });
            let ins = [
                q,
                kk,
                v,
                int(&[s_q, 2], rows),
                int(&[lens.len() as u64, per_seq], pages),
            ];
            let tol = Tol {
                atol: 2e-6,
                rtol: 1e-4,
            };
            let mut ctx = format!("paged H {h} KVH {kvh} D {d} page {page} window {window}");
            while ctx.len() % 3 != 0 {
                ctx.push(' ');
            }
            check(&gpu, &mut k, &op, &ins, tol, &ctx);
            check(&gpu, &mut k, &op, &ins, tol, &format!("{ctx} skewed"));
            // Pools of f16 (the reference reads the same f16 values).
            let ins16 = [
                ins[0].clone(),
                as_f16(&ins[1]),
                as_f16(&ins[2]),
                ins[3].clone(),
                ins[4].clone(),
            ];
            check(&gpu, &mut k, &op, &ins16, tol, &format!("{ctx} f16"));
            // The hardware-GPU kernels (the grouped one where the adapter has subgroups),
            // f32 and f16, in one pass and split.
            let mut gk = Kernels::new(&gpu);
            gk.set_quant_layout(QuantLayout::gpu_class(&gpu));
            check(&gpu, &mut gk, &op, &ins, tol, &format!("{ctx} gpu"));
            check(&gpu, &mut gk, &op, &ins16, tol, &format!("{ctx} gpu f16"));
            gk.set_attention_workgroups(1 << 20);
            check(
                &gpu,
                &mut gk,
                &op,
                &ins16,
                tol,
                &format!("{ctx} gpu f16 split"),
            );
            // Keys split into chunks wherever they are enough (the path of a hardware GPU
            // with few rows), the rows that see fewer keys leaving their last chunks empty.
            let mut split = Kernels::new(&gpu);
            split.set_attention_workgroups(1 << 20);
            check(&gpu, &mut split, &op, &ins, tol, &format!("{ctx} split"));
            // Without a window the 300 keys of the first sequence split (the combine is a
            // pipeline of its own); a window of 7 is one chunk.
            let pipelines = split.stats().pipelines;
            assert_eq!(pipelines >= 2, window == 0, "{ctx}: {:?}", split.stats());
        }
    }
}

/// `scatter_rows` (the paged cache's append, in place on the pool) writes each row into its
/// slot and leaves the other rows: f32 rows, and f16 rows (moved as words, two elements
/// each, bit for bit: the test's pool holds f16 patterns that are denormal or NaN as f32).
#[test]
fn scatter_rows_writes_f32_and_f16_rows_into_their_slots() {
    for gpu in gpus("scatter_rows_writes_f32_and_f16_rows") {
        let mut k = Kernels::new(&gpu);
        let mut rng = SplitMix64::new(33);
        for dtype in [DType::F32, DType::F16] {
            for (pool_rows, rows, width) in [(10u64, 3u64, 8u64), (7, 7, 2), (300, 5, 192)] {
                let pool = f32_tensor(&mut rng, &[pool_rows, width]);
                let mut new = f32_tensor(&mut rng, &[rows, width]);
                // Zeros beside small values: as f32 words, f16 pairs (0, x) are denormals.
                new.values.iter_mut().step_by(2).for_each(|v| *v = 0.0);
                let (pool, new) = if dtype == DType::F16 {
                    (as_f16(&pool), as_f16(&new))
                } else {
                    (pool, new)
                };
                // Distinct slots, the last of them the pool's last row.
                let slots: Vec<f32> = (0..rows)
                    .map(|i| ((pool_rows - 1 - i * 3) % pool_rows) as f32)
                    .collect();
                let slots = HostTensor {
                    shape: s(&[rows]),
                    dtype: DType::I32,
                    values: slots,
                };
                let op = Op::ScatterRows(ops::ScatterRows);
                let want = reference::eval_op(
                    &op,
                    &[&pool.reference(), &new.reference(), &slots.reference()],
                    &pool.shape,
                )
                .unwrap()
                .to_f32();
                let got = run_in_place(&gpu, &mut k, &op, &[pool, new, slots], dtype);
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{dtype} pool {pool_rows} rows {rows} width {width}"
                );
            }
        }
    }
}

/// Runs `op` with its output bound to input 0's range (an op that runs in place on its
/// first input), returning that input's values afterwards.
fn run_in_place(gpu: &Gpu, k: &mut Kernels, op: &Op, ins: &[HostTensor], dtype: DType) -> Vec<f32> {
    use dynrt::gpu::Frame;
    let engine = Engine::new(gpu.clone());
    let typed: Vec<_> = ins.iter().map(HostTensor::typed).collect();
    let bufs: Vec<Buffer> = typed
        .iter()
        .map(|t| {
            let b = engine
                .allocate(&BufferDesc {
                    label: "in place",
                    size_bytes: (t.bytes.len() as u64).div_ceil(4).max(1) * 4,
                    kind: AllocKind::UsmDevice,
                })
                .unwrap();
            let mut bytes = t.bytes.clone();
            bytes.resize(b.size_bytes() as usize, 0);
            engine.write(&b, 0, &bytes).unwrap();
            b
        })
        .collect();
    let operands: Vec<Operand<'_>> = bufs
        .iter()
        .zip(&typed)
        .map(|(b, t)| {
            Operand::contiguous(
                TensorRef {
                    buffer: b,
                    offset_bytes: 0,
                    size_bytes: b.size_bytes(),
                },
                &t.shape,
                t.dtype,
            )
        })
        .collect();
    let out = operands[0];
    let mut frame = Frame::begin(&engine, k, UniformArena::new(&engine), op.name());
    frame.encode(op, &operands, &out).unwrap();
    let (submitted, _, _) = frame.submit();
    pollster::block_on(submitted.check()).unwrap();
    let bytes = engine
        .read_blocking(&bufs[0], 0, typed[0].bytes.len() as u64)
        .unwrap();
    dynrt::tensor::HostTensor {
        shape: typed[0].shape.clone(),
        dtype,
        bytes,
    }
    .to_f32()
}
