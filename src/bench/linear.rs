//! The `linear` section of `dynrt-bench kernels`: the `linear` op on the projection shapes of
//! SmolLM2-135M (width 576, FFN 1536, 9 query / 3 KV heads of 64, vocabulary 49152; Q4_1
//! projections, the tied Q8_0 head), at M = 1 (decode, the matrix-vector kernel) and the
//! prefill sizes (the tiled kernel). Weights are random values quantized with ggml's rounding:
//! the kernels' speed does not depend on the values.
//!
//! Per shape: ms per call, weight bytes streamed per second (the matrix-vector kernel reads
//! every weight byte once per call; at prefill sizes the same bytes count, so the figure shows
//! how far a call is from streaming), and how often a token runs it. The whole model's
//! projections + head per token at M = 1 is the sum over shapes of count x ms; at M = 128 and
//! 512, the projections' ms per call divided by M gives ms per prompt token (the head runs
//! once per prompt, for the last position only).

use super::kernels::{best_seconds, time_typed, Bench};
use dynrt::gpu::kernels::quant::QuantLayout;
use dynrt::gpu::kernels::WeightLayout;
use dynrt::gpu::BufferDesc;
use dynrt::graph::ops::{Linear, MatMul};
use dynrt::graph::Op;
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;
use dynrt::shape::{DType, Shape};
use dynrt::tensor::{decode_f32, HostTensor};

/// One projection shape of the model.
struct Proj {
    name: &'static str,
    k: u64,
    n: u64,
    dtype: DType,
    /// Calls per token (30 layers; q and o, k and v, gate and up share a shape); 0 for the
    /// rows that compare layouts, which no SmolLM2 token runs.
    per_token: u32,
    /// Whether the kernel reads the weight in its format's grouped planes (what the runtime
    /// reorders q4_0 and q5_0 weights into), not the file's blocks.
    grouped: bool,
}

/// SmolLM2-135M's projections: `576→576` (q, o), `576→192` (k, v), `576→1536` (gate, up),
/// `1536→576` (down), 30 layers, and the tied head `576→49152` (q8_0); then the head in the
/// grouped layout and a q5_0 and a q8_0 shape in both layouts, which compare the layouts
/// (not counted per token; the kernels' choices are `LinearKernel::weight_layout`).
const SHAPES: [Proj; 10] = [
    Proj {
        name: "q,o",
        k: 576,
        n: 576,
        dtype: DType::Q4_1,
        per_token: 60,
        grouped: false,
    },
    Proj {
        name: "k,v",
        k: 576,
        n: 192,
        dtype: DType::Q4_1,
        per_token: 60,
        grouped: false,
    },
    Proj {
        name: "gate,up",
        k: 576,
        n: 1536,
        dtype: DType::Q4_1,
        per_token: 60,
        grouped: false,
    },
    Proj {
        name: "down",
        k: 1536,
        n: 576,
        dtype: DType::Q4_1,
        per_token: 30,
        grouped: false,
    },
    Proj {
        name: "head",
        k: 576,
        n: 49152,
        dtype: DType::Q8_0,
        per_token: 1,
        grouped: false,
    },
    Proj {
        name: "head (grouped)",
        k: 576,
        n: 49152,
        dtype: DType::Q8_0,
        per_token: 0,
        grouped: true,
    },
    // Qwen2.5-0.5B's q and o projections are q5_0 [896, 896]: 22-byte blocks.
    Proj {
        name: "q5_0 896x896",
        k: 896,
        n: 896,
        dtype: DType::Q5_0,
        per_token: 0,
        grouped: false,
    },
    Proj {
        name: "q5_0 896x896 (grouped)",
        k: 896,
        n: 896,
        dtype: DType::Q5_0,
        per_token: 0,
        grouped: true,
    },
    // q8_0 at a projection's size, in both layouts: the prefill kernels' choice.
    Proj {
        name: "q8_0 896x896",
        k: 896,
        n: 896,
        dtype: DType::Q8_0,
        per_token: 0,
        grouped: false,
    },
    Proj {
        name: "q8_0 896x896 (grouped)",
        k: 896,
        n: 896,
        dtype: DType::Q8_0,
        per_token: 0,
        grouped: true,
    },
];

/// One measurement: a shape at one M with one kernel.
#[derive(serde::Serialize)]
pub(super) struct Point {
    /// Rows of x.
    m: u64,
    /// The kernel ([`dynrt::gpu::kernels::quant::LinearKernel::name`]).
    kernel: &'static str,
    /// The adapter class it ran as (`QuantLayout`, forced where it is not the adapter's own).
    class: String,
    /// Milliseconds per call, wall-clock (best of the rounds).
    ms: f64,
    /// CPU milliseconds per call, all threads of the process (the software adapter's): the
    /// work, less disturbed than `ms` by other load on the machine. `None` off Linux.
    cpu_ms: Option<f64>,
    /// Weight bytes per wall-clock second, GB/s (every call reads the whole weight).
    weight_gbps: f64,
    /// `weight_gbps` over the run's buffer copy (`copy_gbps` of the report), which counts
    /// the bytes read and written: a kernel that streams its weight at the copy's pace
    /// reads at half of it.
    of_copy: f64,
    /// 2 M N K / wall-clock second, GFLOP/s.
    gflops: f64,
}

/// One shape's figures.
#[derive(serde::Serialize)]
pub(super) struct ShapeReport {
    name: &'static str,
    k: u64,
    n: u64,
    dtype: DType,
    /// Bytes of the weight (as in the GGUF: the device holds exactly these).
    weight_bytes: u64,
    /// Calls per generated token.
    per_token: u32,
    points: Vec<Point>,
}

/// The prefill kernel on a square problem beside the f32 tiled matmul of the same size.
#[derive(serde::Serialize)]
pub(super) struct SquareReport {
    /// M = N = K.
    size: u64,
    /// The weight's format.
    dtype: DType,
    /// The prefill kernel of each class measured, with its GFLOP/s.
    kernels: Vec<(String, &'static str, f64)>,
    /// The f32 tiled matmul (`matmul`, both operands f32) of the same size, GFLOP/s.
    f32_matmul_gflops: f64,
}

/// The section's report.
#[derive(serde::Serialize)]
pub(super) struct LinearReport {
    /// A buffer copy (`copy_buffer_to_buffer`) of [`COPY_BYTES`], bytes read plus written
    /// per second, GB/s: what streaming a weight is measured against (`of_copy`).
    copy_gbps: f64,
    /// The adapter's own class (the others measured are forced).
    class: String,
    shapes: Vec<ShapeReport>,
    /// Sum over shapes of calls per token x ms at M = 1 (the adapter's own class): the
    /// projections + head of one decode step, wall-clock.
    decode_ms_per_token: Option<f64>,
    /// The same sum of CPU ms.
    decode_cpu_ms_per_token: Option<f64>,
    /// Per prefill size M: the projections' ms per prompt token (sum of calls per token x ms
    /// / M, the head excluded: it runs once per prompt; the adapter's own class).
    prefill_ms_per_token: Vec<(u64, f64)>,
    /// The prefill kernels on a square q4_1 problem against the f32 matmul.
    square: Option<SquareReport>,
}

/// Bytes of the buffer copy the section measures (large enough that a GPU's copy is not
/// bounded by the cost of starting it).
const COPY_BYTES: u64 = 128 << 20;

fn weight(rng: &mut SplitMix64, p: &Proj) -> anyhow::Result<(HostTensor, Vec<f32>)> {
    let v: Vec<f32> = (0..p.n * p.k).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let bytes = dynrt::formats::of_dtype(p.dtype)
        .ok_or_else(|| anyhow::anyhow!("{}: no weight format {}", p.name, p.dtype))?
        .quantize_all(&v)
        .ok_or_else(|| anyhow::anyhow!("{}: K is not a whole number of blocks", p.name))?;
    let values = decode_f32(p.dtype, &bytes)?;
    let t = HostTensor {
        shape: Shape::new(vec![p.n, p.k]),
        dtype: p.dtype,
        bytes,
    };
    Ok((t, values))
}

/// Checks rows 0 and M - 1 of a measured output against the dequantized weight in f64, so a
/// figure never comes from a kernel that computed something else (or nothing: a pipeline the
/// device refused leaves the output as it was).
fn spot_check(p: &Proj, x: &[f32], w: &[f32], m: u64, got: &[f32]) -> anyhow::Result<()> {
    let k = p.k as usize;
    let n = p.n as usize;
    for row in [0, m as usize - 1] {
        for j in 0..n {
            let want: f64 = x[row * k..(row + 1) * k]
                .iter()
                .zip(&w[j * k..(j + 1) * k])
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let g = f64::from(got[row * n + j]);
            anyhow::ensure!(
                (g - want).abs() <= 2e-6 * p.k as f64 + 1e-5 + 1e-5 * want.abs(),
                "{} at M = {m}: output [{row}, {j}] is {g}, the reference {want}",
                p.name
            );
        }
    }
    Ok(())
}

/// The classes the section measures: the adapter's own, then on a hardware GPU the other
/// GPU kernels (without subgroups, where it has them); with `gpu_classes`, the GPU classes on
/// a software adapter too (forced, as the tests run them).
fn classes(b: &Bench, gpu_classes: bool) -> Vec<QuantLayout> {
    let own = QuantLayout::of(&b.gpu);
    let mut v = vec![own];
    let gpu = matches!(own, QuantLayout::Gpu { .. });
    if gpu || gpu_classes {
        for l in [
            QuantLayout::gpu_class(&b.gpu),
            QuantLayout::Gpu { subgroup: None },
        ] {
            if !v.contains(&l) {
                v.push(l);
            }
        }
    }
    v
}

/// Measures every shape at every M of `ms` (the head at M = 1 only unless `head_prefill`),
/// with every class of [`classes`], then the square problem (`square`, 0 for none).
pub(super) fn run(
    b: &mut Bench,
    ms: &[u64],
    head_prefill: bool,
    gpu_classes: bool,
    square: u64,
) -> anyhow::Result<LinearReport> {
    let copy_gbps = copy_gbps(b)?;
    let classes = classes(b, gpu_classes);
    let own = classes[0];
    let mut rng = SplitMix64::new(11);
    let mut shapes = Vec::new();
    for p in &SHAPES {
        let (mut w, wv) = weight(&mut rng, p)?;
        let weight_bytes = w.bytes.len() as u64;
        let mut layouts = vec![WeightLayout::File; 2];
        if p.grouped {
            let f = dynrt::formats::of_dtype(p.dtype)
                .ok_or_else(|| anyhow::anyhow!("{}: no weight format {}", p.name, p.dtype))?;
            w.bytes = dynrt::formats::regroup(f, &w.bytes)
                .ok_or_else(|| anyhow::anyhow!("{}: no grouped layout of {}", p.name, p.dtype))?;
            layouts[1] = WeightLayout::Grouped;
        }
        let mut points = Vec::new();
        for &m in ms.iter().filter(|&&m| m > 0) {
            if p.name.starts_with("head") && m > 1 && !head_prefill {
                continue;
            }
            let xv: Vec<f32> = (0..m * p.k).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let x = HostTensor::f32(Shape::new(vec![m, p.k]), &xv);
            let out = Shape::new(vec![m, p.n]);
            // Several calls per submit where one is short, so the submit's own cost does not
            // count for much.
            let reps = if m == 1 { 20 } else { 1 };
            let mut seen = Vec::new();
            for &class in &classes {
                // Each kernel once (two classes may take the same one at this M).
                let kernel = class.linear_kernel(m, true);
                if seen.contains(&kernel) {
                    continue;
                }
                seen.push(kernel);
                b.kernels.set_quant_layout(class);
                let (t, got) = time_typed(
                    b,
                    &Op::Linear(Linear),
                    &[x.clone(), w.clone()],
                    &layouts,
                    &out,
                    reps,
                )?;
                spot_check(p, &xv, &wv, m, &got)?;
                let weight_gbps = weight_bytes as f64 / t.best_s / 1e9;
                points.push(Point {
                    m,
                    kernel: kernel.name(),
                    class: format!("{class:?}"),
                    ms: t.best_s * 1e3,
                    cpu_ms: t.cpu_s.map(|c| c * 1e3),
                    weight_gbps,
                    of_copy: weight_gbps / copy_gbps,
                    gflops: 2.0 * (m * p.n * p.k) as f64 / t.best_s / 1e9,
                });
            }
        }
        shapes.push(ShapeReport {
            name: p.name,
            k: p.k,
            n: p.n,
            dtype: p.dtype,
            weight_bytes,
            per_token: p.per_token,
            points,
        });
    }
    b.kernels.set_quant_layout(own);
    let own_class = format!("{own:?}");
    let at = |s: &ShapeReport, m: u64| -> Option<(f64, Option<f64>)> {
        s.points
            .iter()
            .find(|p| p.m == m && p.class == own_class)
            .map(|p| (p.ms, p.cpu_ms))
    };
    let decode_ms_per_token = shapes
        .iter()
        .map(|s| at(s, 1).map(|(ms, _)| ms * f64::from(s.per_token)))
        .sum::<Option<f64>>();
    let decode_cpu_ms_per_token = shapes
        .iter()
        .map(|s| {
            at(s, 1)
                .and_then(|(_, c)| c)
                .map(|c| c * f64::from(s.per_token))
        })
        .sum::<Option<f64>>();
    let prefill_ms_per_token = ms
        .iter()
        .filter(|&&m| m > 1)
        .filter_map(|&m| {
            shapes
                .iter()
                .filter(|s| !s.name.starts_with("head"))
                .map(|s| at(s, m).map(|(ms, _)| ms * f64::from(s.per_token) / m as f64))
                .sum::<Option<f64>>()
                .map(|t| (m, t))
        })
        .collect();
    let square = match square {
        0 => None,
        n => Some(square_report(b, &classes, n)?),
    };
    Ok(LinearReport {
        copy_gbps,
        class: own_class,
        shapes,
        decode_ms_per_token,
        decode_cpu_ms_per_token,
        prefill_ms_per_token,
        square,
    })
}

/// The buffer copy of [`COPY_BYTES`]: GB/s counting the bytes read and written.
fn copy_gbps(b: &Bench) -> anyhow::Result<f64> {
    let buffer = |label| {
        b.engine.allocate(&BufferDesc {
            label,
            size_bytes: COPY_BYTES,
            kind: AllocKind::UsmDevice,
        })
    };
    let (src, dst) = (buffer("bench copy src")?, buffer("bench copy dst")?);
    let reps = 4;
    let s = best_seconds(&b.gpu, b.rounds, |enc| {
        for _ in 0..reps {
            enc.copy(&src, &dst, COPY_BYTES);
        }
        Ok(())
    })? / f64::from(reps);
    Ok(2.0 * COPY_BYTES as f64 / s / 1e9)
}

/// The prefill kernel of every class on a q4_1 [size, size] weight at M = size, and the f32
/// tiled matmul of the same size.
fn square_report(
    b: &mut Bench,
    classes: &[QuantLayout],
    size: u64,
) -> anyhow::Result<SquareReport> {
    let mut rng = SplitMix64::new(12);
    let p = Proj {
        name: "square",
        k: size,
        n: size,
        dtype: DType::Q4_1,
        per_token: 0,
        grouped: false,
    };
    let (w, wv) = weight(&mut rng, &p)?;
    let xv: Vec<f32> = (0..size * size).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let x = HostTensor::f32(Shape::new(vec![size, size]), &xv);
    let out = Shape::new(vec![size, size]);
    let flops = 2.0 * (size as f64).powi(3);
    let mut kernels = Vec::new();
    let own = b.kernels.quant_layout();
    for &class in classes {
        let kernel = class.linear_kernel(size, true);
        if kernels.iter().any(|(_, k, _)| *k == kernel.name()) {
            continue;
        }
        b.kernels.set_quant_layout(class);
        let (t, got) = time_typed(
            b,
            &Op::Linear(Linear),
            &[x.clone(), w.clone()],
            &[],
            &out,
            1,
        )?;
        spot_check(&p, &xv, &wv, size, &got)?;
        kernels.push((format!("{class:?}"), kernel.name(), flops / t.best_s / 1e9));
    }
    b.kernels.set_quant_layout(own);
    let a: Vec<f32> = (0..size * size).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let s = Shape::new(vec![size, size]);
    let f32_in = [
        HostTensor::f32(s.clone(), &a),
        HostTensor::f32(s.clone(), &a),
    ];
    let (t, _) = time_typed(
        b,
        &Op::MatMul(MatMul { transpose_b: false }),
        &f32_in,
        &[],
        &s,
        1,
    )?;
    Ok(SquareReport {
        size,
        dtype: DType::Q4_1,
        kernels,
        f32_matmul_gflops: flops / t.best_s / 1e9,
    })
}

/// Prints the section as text.
pub(super) fn print(r: &LinearReport) {
    println!(
        "linear (x · wᵀ) on SmolLM2-135M's shapes (ms wall-clock, cpu ms of all threads), class {}; buffer copy {:.1} GB/s (read + write):",
        r.class, r.copy_gbps
    );
    for s in &r.shapes {
        println!(
            "  {:8} {:>4}->{:<5} {} x{:<2} {:>9} bytes",
            s.name, s.k, s.n, s.dtype, s.per_token, s.weight_bytes
        );
        for p in &s.points {
            let cpu = p
                .cpu_ms
                .map_or(String::new(), |c| format!(", cpu {c:.3} ms"));
            println!(
                "      M={:<4} {:<11} {:>9.3} ms{cpu}, {:.2} GB/s of weights ({:.2} of the copy), {:.2} GFLOP/s",
                p.m, p.kernel, p.ms, p.weight_gbps, p.of_copy, p.gflops
            );
        }
    }
    if let Some(t) = r.decode_ms_per_token {
        let cpu = r
            .decode_cpu_ms_per_token
            .map_or(String::new(), |c| format!(" (cpu {c:.1} ms)"));
        println!("  decode, projections + head: {t:.1} ms per token{cpu}");
    }
    for (m, t) in &r.prefill_ms_per_token {
        println!("  prefill M={m}, projections: {t:.2} ms per prompt token");
    }
    if let Some(sq) = &r.square {
        for (class, kernel, g) in &sq.kernels {
            println!(
                "  {} [{n}, {n}] at M = {n}: {kernel} ({class}) {g:.1} GFLOP/s",
                sq.dtype,
                n = sq.size
            );
        }
        println!(
            "  f32 matmul {n}x{n}x{n}: {:.1} GFLOP/s",
            sq.f32_matmul_gflops,
            n = sq.size
        );
    }
}
