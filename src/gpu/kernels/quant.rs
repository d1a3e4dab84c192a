//! The `quant` family (`shaders/quant.wgsl`): kernels that read weights in their stored
//! format (every row of [`crate::formats::FORMATS`]; GGUF row layout) and dequantize as they
//! read, so a model's weights stay as compact on the device as in its file (no repacking:
//! q8_0's 34-byte blocks are read at either word alignment). The weight format is the
//! pipeline's specialisation constant, the index of its row in the table; the shader is the
//! file plus every format's WGSL decoder and a dispatch on that index ([`wgsl`]).
//!
//! The `linear` op (`y = x · wᵀ`) has a kernel per adapter class and size of M ([`LinearKernel`],
//! chosen in one place: [`QuantLayout::linear_kernel`]). For decode (M <=
//! [`QuantLayout::matvec_max_m`] rows of x): on software adapters each invocation owns several
//! output rows, so every loaded x value serves all of them and every weight word is loaded
//! once; on hardware GPUs the lanes of a subgroup share each output row, neighbouring lanes
//! reading neighbouring blocks, and meet by shuffles ([`FAMILY_SG`], where the device has
//! subgroup operations), else the invocations of a workgroup do and meet in workgroup memory.
//! For prefill: on software adapters a register-tiled kernel without workgroup memory (8 rows
//! of x x up to 64 weight rows per invocation), on hardware GPUs a GEMM that stages tiles of
//! x and of dequantized weights in workgroup memory. Why two: on llvmpipe a workgroup-memory
//! load costs as much as a storage load, so the register-tiled kernel is the faster one there
//! (`dynrt-bench kernels` measures both). Every linear kernel runs every fused epilogue of
//! `fused_linear` (shared WGSL: product, finish, store); a norm of the product (head norms, a
//! post-norm) needs a whole head or row, so decode runs the class's segment kernel (a
//! workgroup per head) and a post-norm or more rows the class's kernel, then
//! `quant_segment_finish` ([`QuantLayout::fused_kernel`]). The embedding `gather` from an f16 or block-quantized
//! table ([`encode_gather`]) dequantizes the rows it picks.
//!
//! The linear kernels read x as vec4s where its element offset and K are multiples of 4
//! ([`FAMILY_X4`], the same source with x bound as `array<vec4<f32>>`, and [`FAMILY_SG`]): on
//! lavapipe a load whose address differs between invocations is a loop over the SIMD lanes,
//! about as dear for a vec4 as for one f32, so 8 loads per block of x instead of 32 speed up
//! the register-tiled prefill kernel; a GPU moves 16 bytes per load instruction as cheaply
//! as 4.
//!
//! Runtime bounds checks stay on in every family: on Vulkan with `robustBufferAccess2`
//! (NVIDIA, lavapipe) wgpu leaves storage accesses to the driver already, and the kernels
//! index their register arrays with constants only, so there is nothing left for
//! `create_shader_module_trusted` to remove; the browser keeps them regardless.

use super::layout::{numel, rows, u32_of};
use super::{Encoder, Family, Kernel, KernelError, Operand, WeightLayout};
use crate::formats::{FORMATS, GROUP_BLOCKS};
/// The adapter class, decided in `gpu::class`; named here too, where its kernel choices are.
pub use crate::gpu::QuantLayout;
use crate::graph::ops::fused_linear::infer as fused_infer;
use crate::graph::ops::fused_linear::PLAIN;
use crate::graph::ops::linear::infer;
use crate::graph::ops::{FusedLinear, GateAct, Linear};
use crate::shape::DType;
use bytemuck::{Pod, Zeroable};

/// `shaders/quant.wgsl` after the prelude: what the kernels share, without the kernels
/// (`shaders/quant/*.wgsl`) and the format decoders.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("quant");

/// The family's kernels, one file each under `shaders/quant/`, composed after [`WGSL`] (whose
/// helpers, uniform structs and bindings they share).
const KERNELS: [&str; 5] = [
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/shaders/quant/matvec.wgsl"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/shaders/quant/regtile.wgsl"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/shaders/quant/mm.wgsl"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/shaders/quant/segment.wgsl"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/shaders/quant/gather.wgsl"
    )),
];

/// The subgroup matrix-vector kernel (`shaders/quant/matvec_sg.wgsl`), the one kernel of
/// [`FAMILY_SG`].
const KERNEL_SG: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/shaders/quant/matvec_sg.wgsl"
));

/// The family's source: [`WGSL`] (the prelude and `shaders/quant.wgsl`), x as f32s
/// (`X_F32`), the kernels (`shaders/quant/*.wgsl`), every format's decoder, and
/// `element_at`, `raw_block` and `weight_is_block` switching on `WEIGHT_FORMAT` (composed
/// once).
pub fn wgsl() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| compose(X_F32, &KERNELS))
}

/// The source of [`FAMILY_X4`]: [`wgsl`] with x read as vec4s (`X_VEC4`) and its entry
/// points renamed `quantx4_*`.
pub fn wgsl_x4() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| compose(X_VEC4, &KERNELS).replace("fn quant_", "fn quantx4_"))
}

/// The source of [`FAMILY_SG`]: the helpers of [`WGSL`], x read as vec4s and the subgroup
/// matrix-vector kernel, in a module of its own: a module that calls subgroup operations
/// fails to compile on a device without them, whichever entry point a pipeline takes.
pub fn wgsl_sg() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| compose(X_VEC4, &[KERNEL_SG]))
}

/// Binding 1 (x) of [`FAMILY`] and the two functions that read it: `x_elem(i)`, element i,
/// and `x_block(j)`, the 32 elements from j as 8 vec4s (32 loads).
const X_F32: &str = "
// ---- x as f32s (src/gpu/kernels/quant.rs, X_F32)
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

fn x_elem(i: u32) -> f32 {
    return x[i];
}

fn x_block(j: u32) -> array<vec4<f32>, 8> {
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let at = j + 4u * i;
        v[i] = vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
    }
    return v;
}

// Elements i .. i + 4 (those at or past `end` read as 0).
fn x_quad(i: u32, end: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if i + j < end {
            v[j] = x[i + j];
        }
    }
    return v;
}
";

/// x of [`FAMILY_X4`]: the same functions over vec4s, for an x whose element offset and row
/// length are multiples of 4 (so every block starts on a vec4 and the binding holds whole
/// vec4s). A block is 8 loads instead of 32: on lavapipe, where a load whose address differs
/// per invocation costs about as much for a vec4 as for one f32, that speeds up the
/// register-tiled prefill kernel (`dynrt-bench kernels` measures it).
const X_VEC4: &str = "
// ---- x as vec4s (src/gpu/kernels/quant.rs, X_VEC4)
@group(0) @binding(1) var<storage, read_write> x4: array<vec4<f32>>;

fn x_elem(i: u32) -> f32 {
    return x4[i / 4u][i % 4u];
}

fn x_block(j: u32) -> array<vec4<f32>, 8> {
    let v = j / 4u;
    return array<vec4<f32>, 8>(x4[v], x4[v + 1u], x4[v + 2u], x4[v + 3u], x4[v + 4u],
        x4[v + 5u], x4[v + 6u], x4[v + 7u]);
}

// Elements i .. i + 4 (i a multiple of 4, and so is the row length: `end` is never inside
// the quad).
fn x_quad(i: u32, end: u32) -> vec4<f32> {
    return x4[i / 4u];
}
";

/// [`WGSL`], then `x_binding` (the declaration of x and the functions that read it), the
/// `kernels`, and the formats' decoders with the dispatch on `WEIGHT_FORMAT`.
fn compose(x_binding: &str, kernels: &[&str]) -> String {
    use std::fmt::Write;
    let mut s = String::from(WGSL);
    s.push_str(x_binding);
    for k in kernels {
        s.push_str(k);
    }
    let mut elements = String::new();
    let mut blocks = String::new();
    let mut grouped = String::new();
    let mut sources = String::new();
    let mut positions = String::new();
    let mut group_bytes = String::new();
    let mut first_block = FORMATS.len();
    for (code, f) in FORMATS.iter().enumerate() {
        let _ = write!(
            s,
            "\n// ---- {} (src/formats, WEIGHT_FORMAT {code})\n{}",
            f.name, f.wgsl
        );
        if let Some(g) = &f.grouped {
            let _ = write!(s, "{}", g.wgsl);
            let _ = writeln!(
                grouped,
                "            case {code}u: {{ return {}_block_g8(wo, blk, dm); }}",
                f.name
            );
            let _ = writeln!(
                group_bytes,
                "        case {code}u: {{ return {}u; }}",
                GROUP_BLOCKS as u32 * f.block_bytes
            );
            // The byte of the file's group a byte of the grouped one comes from
            // (crate::formats::grouped_source), plane by plane.
            let _ = writeln!(sources, "        case {code}u: {{");
            let mut plane = 0;
            for &(offset, bytes) in g.fields {
                let end = plane + GROUP_BLOCKS as u32 * bytes;
                let _ = writeln!(
                    sources,
                    "            if at < {end}u {{ return (at - {plane}u) / {bytes}u * {}u + {offset}u + (at - {plane}u) % {bytes}u; }}",
                    f.block_bytes
                );
                plane = end;
            }
            let _ = writeln!(sources, "            return at;\n        }}");
            // The inverse: where a byte of the file's group lies in the grouped one.
            let _ = writeln!(
                positions,
                "        case {code}u: {{\n            let j = at / {bb}u;\n            let b = at % {bb}u;",
                bb = f.block_bytes
            );
            let mut plane = 0;
            for &(offset, bytes) in g.fields {
                let _ = writeln!(
                    positions,
                    "            if b < {end}u {{ return {plane}u + j * {bytes}u + b - {offset}u; }}",
                    end = offset + bytes
                );
                plane += GROUP_BLOCKS as u32 * bytes;
            }
            let _ = writeln!(positions, "            return at;\n        }}");
        }
        if f.is_block() {
            first_block = first_block.min(code);
            let _ = writeln!(
                blocks,
                "        case {code}u: {{ return {}_block(wo, blk, dm); }}",
                f.name
            );
        } else {
            let _ = writeln!(
                elements,
                "        case {code}u: {{ return {}_element(wo, e); }}",
                f.name
            );
            let _ = writeln!(
                blocks,
                "        case {code}u: {{ *dm = vec2<f32>(1.0, 0.0); return {}_run(wo, e); }}",
                f.name
            );
        }
    }
    let _ = write!(
        s,
        "
// ---- the dispatch on the format (src/gpu/kernels/quant.rs)
fn element_at_as(format: u32, wo: u32, e: u32) -> f32 {{
    switch format {{
{elements}        default: {{ return 0.0; }}
    }}
}}

fn element_at(wo: u32, e: u32) -> f32 {{
    return element_at_as(WEIGHT_FORMAT, wo, e);
}}

fn raw_block_as(format: u32, grouped: u32, wo: u32, blk: u32, e: u32,
    dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {{
    if grouped == 1u {{
        switch format {{
{grouped}            default: {{}}
        }}
    }}
    switch format {{
{blocks}        default: {{ *dm = vec2<f32>(1.0, 0.0); return array<vec4<f32>, 8>(); }}
    }}
}}

fn raw_block(wo: u32, blk: u32, e: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {{
    return raw_block_as(WEIGHT_FORMAT, WEIGHT_LAYOUT, wo, blk, e, dm);
}}

// Bytes of a group of the grouped layout (4 for a format without one).
fn group_bytes() -> u32 {{
    switch WEIGHT_FORMAT {{
{group_bytes}        default: {{ return 4u; }}
    }}
}}

// The byte of a group in the file layout that byte `at` of the same group in the grouped
// layout holds.
fn grouped_source(at: u32) -> u32 {{
    switch WEIGHT_FORMAT {{
{sources}        default: {{ return at; }}
    }}
}}

// The byte of a group in the grouped layout that byte `at` of the same group in the file
// layout lands on (the inverse of grouped_source).
fn grouped_position(at: u32) -> u32 {{
    switch WEIGHT_FORMAT {{
{positions}        default: {{ return at; }}
    }}
}}

fn weight_is_block() -> bool {{
    return WEIGHT_FORMAT >= {first_block}u;
}}
"
    );
    s
}

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "quant",
    source: wgsl,
    bindings,
    unchecked: &[],
};

/// The same kernels reading x as vec4s ([`wgsl_x4`]), which the linear kernels use when x's
/// element offset and K are multiples of 4. A second family rather than a pipeline constant:
/// an entry point may not read two variables of one binding, and the f32 x must stay for
/// the rest.
pub const FAMILY_X4: Family = Family {
    name: "quantx4",
    source: wgsl_x4,
    bindings,
    unchecked: &[],
};

/// The subgroup matrix-vector kernel ([`wgsl_sg`]), for devices with `Features::SUBGROUP`
/// ([`QuantLayout::Gpu`]'s `subgroup`). x is read as vec4s (the linear kernels take it where x's
/// offset and K are multiples of 4).
pub const FAMILY_SG: Family = Family {
    name: "quantsg",
    source: wgsl_sg,
    bindings,
    unchecked: &[],
};

/// Storage bindings of an entry point of [`FAMILY`], [`FAMILY_X4`] or [`FAMILY_SG`].
fn bindings(entry: &str) -> &'static [u32] {
    if entry.ends_with("_gather") {
        &[2, 3, 4]
    } else if entry.ends_with("_regroup") || entry.ends_with("_ungroup") {
        &[2, 4]
    } else {
        &[1, 2, 3, 5, 6, 7, 8, 9]
    }
}

/// Most output rows one invocation owns (`ROWS_MAX` in the WGSL).
pub const ROWS_MAX: u64 = 64;

/// Invocations (lanes) per output row of `quant_matvec_coop` for rows of `blocks` 32-element
/// blocks: about two blocks per lane, a power of two from 2 to 32, so that a workgroup of 64
/// holds 64 / lanes rows (an even number: gated and rotated projections keep their pairs of
/// rows together).
fn coop_lanes(blocks: u64) -> u64 {
    let half = (blocks / 2).max(1);
    // The largest power of two not above `half`.
    (1u64 << (63 - half.leading_zeros())).clamp(2, 32)
}

/// How `quantsg_matvec` spreads a projection over the lanes of subgroups of at least
/// `subgroup` invocations: `rows` weight rows per subgroup at a time, `lanes / rows` lanes
/// per row taking about two 32-element blocks each (of `blocks` per row), and
/// `rows_per_workgroup` for the 64-invocation workgroup. `pairs`: gated and rotated
/// projections keep pairs of rows in one subgroup (an even `rows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubgroupPlan {
    /// Weight rows a subgroup takes at once.
    pub rows: u32,
    /// Virtual weight rows per workgroup (a multiple of `rows`).
    pub rows_per_workgroup: u32,
}

impl SubgroupPlan {
    /// The plan for rows of `blocks` blocks on subgroups of at least `subgroup` invocations.
    pub fn new(subgroup: u32, blocks: u64, pairs: bool) -> SubgroupPlan {
        let lanes = u64::from(subgroup.clamp(1, 64));
        let half = (blocks / 2).max(1);
        // Lanes per row: the largest power of two not above half the blocks, at most all.
        let per_row = (1u64 << (63 - half.leading_zeros())).min(lanes);
        let mut rows = lanes / per_row;
        if pairs && rows < 2 && lanes >= 2 {
            rows = 2;
        }
        SubgroupPlan {
            rows: rows as u32,
            rows_per_workgroup: (rows * (64 / lanes)) as u32,
        }
    }
}

/// The linear kernels (entry points of `shaders/quant/*.wgsl`): which one a shape takes on an
/// adapter class is [`QuantLayout::linear_kernel`]'s choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinearKernel {
    /// `quant_matvec_wg8`: decode on software adapters, several output rows per invocation.
    MatvecWg8,
    /// `quant_matvec_coop`: decode on hardware GPUs without subgroups, the invocations of a
    /// workgroup sharing each output row and summing in workgroup memory.
    MatvecCoop,
    /// `quantsg_matvec`: decode on hardware GPUs with subgroups.
    MatvecSubgroup,
    /// `quant_regtile`: prefill on software adapters, register tiles without workgroup memory.
    RegTile,
    /// `quant_mm`: prefill on hardware GPUs, tiles through workgroup memory.
    Mm,
    /// `quant_segment_wg8`: decode with a norm of the product (head norms, a post-norm) on
    /// software adapters, a workgroup of 8 per head or row.
    SegmentWg8,
    /// `quant_segment_wg64`: the same on hardware GPUs, a workgroup of 64.
    SegmentWg64,
}

impl LinearKernel {
    /// The layout of a `dtype` weight this kernel reads best (every kernel reads every
    /// layout: this is what the runtime's reordered-weights cache gives it where it can,
    /// `update_weights`). q4_0 and q5_0 in their grouped planes everywhere: their file blocks
    /// are not word-aligned, and the planes are faster at one row of x and at many
    /// (docs/benchmarks/2026-11-26-weight-layouts-lavapipe.md). q8_0
    /// in its planes only for the GPU GEMM, which decodes each block once per 64 rows of x
    /// into workgroup memory from word-aligned quants; the matrix-vector kernels read its
    /// file blocks, whose scale and quants share a cache line (the grouped layout is slower
    /// for them at M = 1, same report), and so does the register-tiled kernel (`dynrt-bench
    /// kernels` times a q8_0 projection in both layouts with each kernel).
    pub fn weight_layout(self, dtype: DType) -> WeightLayout {
        match (self, dtype) {
            (_, DType::Q4_0 | DType::Q5_0) | (LinearKernel::Mm, DType::Q8_0) => {
                WeightLayout::Grouped
            }
            _ => WeightLayout::File,
        }
    }

    /// A short name (`matvec_sg`, `mm`...), as benchmarks report it.
    pub fn name(self) -> &'static str {
        match self {
            LinearKernel::MatvecWg8 => "matvec_wg8",
            LinearKernel::MatvecCoop => "matvec_coop",
            LinearKernel::MatvecSubgroup => "matvec_sg",
            LinearKernel::RegTile => "regtile",
            LinearKernel::Mm => "mm",
            LinearKernel::SegmentWg8 => "segment_wg8",
            LinearKernel::SegmentWg64 => "segment_wg64",
        }
    }

    /// The entry point, with x read as vec4s (`aligned`: x's offset and K multiples of 4)
    /// where the kernel has that variant. The coop kernel keeps f32 x (one row's lanes read
    /// neighbouring blocks, each of them 8 loads either way); the subgroup kernel reads only
    /// vec4s ([`QuantLayout::linear_kernel`] gives it aligned x only).
    pub fn entry(self, aligned: bool) -> &'static str {
        match (self, aligned) {
            (LinearKernel::MatvecWg8, true) => "quantx4_matvec_wg8",
            (LinearKernel::MatvecWg8, false) => "quant_matvec_wg8",
            (LinearKernel::MatvecCoop, _) => "quant_matvec_coop",
            (LinearKernel::MatvecSubgroup, _) => "quantsg_matvec",
            (LinearKernel::RegTile, true) => "quantx4_regtile",
            (LinearKernel::RegTile, false) => "quant_regtile",
            (LinearKernel::Mm, true) => "quantx4_mm",
            (LinearKernel::Mm, false) => "quant_mm",
            (LinearKernel::SegmentWg8, true) => "quantx4_segment_wg8",
            (LinearKernel::SegmentWg8, false) => "quant_segment_wg8",
            (LinearKernel::SegmentWg64, true) => "quantx4_segment_wg64",
            (LinearKernel::SegmentWg64, false) => "quant_segment_wg64",
        }
    }
}

impl QuantLayout {
    /// The layout of a `dtype` weight that the linear kernel for `m` rows of x reads best on
    /// this class ([`LinearKernel::weight_layout`]): what `update_weights` gives it.
    pub fn weight_layout(self, m: u64, dtype: DType) -> WeightLayout {
        self.linear_kernel(m, true).weight_layout(dtype)
    }

    /// The linear kernel for `m` rows of x (`aligned`: x's offset and K are multiples of 4):
    /// up to [`QuantLayout::matvec_max_m`] rows the adapter class's matrix-vector kernel
    /// (the subgroup one where the device has subgroups and x is aligned), beyond it its
    /// prefill kernel.
    pub fn linear_kernel(self, m: u64, aligned: bool) -> LinearKernel {
        match (m <= self.matvec_max_m(), self) {
            (true, QuantLayout::Cpu { .. }) => LinearKernel::MatvecWg8,
            (true, QuantLayout::Gpu { subgroup: Some(_) }) if aligned => {
                LinearKernel::MatvecSubgroup
            }
            (true, QuantLayout::Gpu { .. }) => LinearKernel::MatvecCoop,
            (false, QuantLayout::Cpu { .. }) => LinearKernel::RegTile,
            (false, QuantLayout::Gpu { .. }) => LinearKernel::Mm,
        }
    }

    /// The kernel for `m` rows of x of a projection whose epilogue norms segments of
    /// `segment` outputs (a head, the row; `None`: no norm of the product), `segments` of
    /// them per row of x, and whether `quant_segment_finish` must then finish them: the
    /// class's segment kernel where its matrix-vector kernel would run, a row has several
    /// segments (heads) and one fits in workgroup memory ([`SEG_MAX`]), else
    /// [`QuantLayout::linear_kernel`]'s, which stores the products for the finish. A
    /// post-norm's one segment per row would put a decode step's whole product in one
    /// workgroup, leaving the rest of the device idle.
    pub fn fused_kernel(
        self,
        m: u64,
        aligned: bool,
        segment: Option<u64>,
        segments: u64,
    ) -> (LinearKernel, bool) {
        match segment {
            None => (self.linear_kernel(m, aligned), false),
            Some(len) if m <= self.matvec_max_m() && len <= SEG_MAX && segments > 1 => match self {
                QuantLayout::Cpu { .. } => (LinearKernel::SegmentWg8, false),
                QuantLayout::Gpu { .. } => (LinearKernel::SegmentWg64, false),
            },
            Some(_) => (self.linear_kernel(m, aligned), true),
        }
    }
}

/// Rows per invocation for `n` output rows spread over at least `lanes_wanted` invocations
/// (a multiple of the SIMD width), at most [`ROWS_MAX`], and as many as that allows: when `n`
/// needs more invocations than `lanes_wanted` at [`ROWS_MAX`] rows, the next multiple of
/// `lanes_wanted` that fits.
fn rows_per_lane(n: u64, lanes_wanted: u64) -> u64 {
    let lanes_wanted = lanes_wanted.max(1);
    let c = n.div_ceil(lanes_wanted * ROWS_MAX).max(1);
    // Rounded down: `n / rows` invocations are then at least `lanes_wanted * c` (rounding up
    // gave 17 rows 2 per invocation, 9 invocations for 16 wanted).
    (n / (lanes_wanted * c)).clamp(1, ROWS_MAX)
}

/// `LinearParams` of `shaders/quant.wgsl` (128 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct LinearParams {
    /// Rows of x (the product of its leading dimensions).
    pub m: u32,
    /// Inner dimension.
    pub k: u32,
    /// Weight rows (all three weights' with a KV split).
    pub n: u32,
    /// Whole 32-element blocks per weight row (`K / 32`).
    pub blocks: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Weight word offset (the queries' with a KV split).
    pub w_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// 64-column tiles (`quant_mm`); virtual rows per workgroup (`quantsg_matvec`).
    pub tiles_n: u32,
    /// Output rows per invocation (`quant_matvec_wg8`, `quant_regtile`), per workgroup
    /// (`quant_matvec_coop`), per subgroup at a time (`quantsg_matvec`).
    pub rows: u32,
    /// Gamma element offset in the parameters (a fused RMSNorm of x).
    pub gamma_offset: u32,
    /// Residual element offset (a fused residual).
    pub res_offset: u32,
    /// Epsilon of a fused RMSNorm of x.
    pub eps: f32,
    /// Elements per head (a fused RoPE or head norm).
    pub head_dim: u32,
    /// Rotated elements per head (the table's row length).
    pub rope_dim: u32,
    /// Rows of the table's first level.
    pub rope_block: u32,
    /// Rows of the table.
    pub table_rows: u32,
    /// Positions element offset in the integers.
    pub pos_offset: u32,
    /// Table element offset.
    pub table_offset: u32,
    /// Bias element offset in the parameters.
    pub bias_offset: u32,
    /// Head-norm weights' element offset in the parameters.
    pub hn_offset: u32,
    /// Rows stored to the output: the queries with a KV split, else all (`n`).
    pub n_q: u32,
    /// Key rows (and value rows) of a KV split.
    pub n_k: u32,
    /// Word offset of the keys' weight.
    pub w_k_offset: u32,
    /// Word offset of the values' weight.
    pub w_v_offset: u32,
    /// Element offset of the key rows' destination.
    pub k_dst_offset: u32,
    /// Element offset of the value rows' destination.
    pub v_dst_offset: u32,
    /// Slots element offset in the integers.
    pub slots_offset: u32,
    /// Rows of the destinations (a slot at or above it is skipped).
    pub kv_rows: u32,
    /// Post-norm weights' element offset in the parameters.
    pub post_offset: u32,
    /// Epsilon of the head norms.
    pub hn_eps: f32,
    /// Epsilon of the post-norm.
    pub post_eps: f32,
    /// Outputs per segment of the segment kernels (a head, or the row).
    pub seg_len: u32,
}

/// `GatherParams` of `shaders/quant.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct GatherParams {
    /// Number of ids.
    pub num_ids: u32,
    /// Elements per table row.
    pub row: u32,
    /// Rows in the table.
    pub rows: u32,
    /// Table word offset.
    pub table_offset: u32,
    /// Ids word offset.
    pub ids_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// 1 when the ids are i32 (negative ones count from the end), 0 for u32.
    pub ids_signed: u32,
    /// Padding.
    pub _pad: u32,
}

/// The `WEIGHT_FORMAT` constant of the WGSL for a weight type (the index of its row in
/// [`FORMATS`]), `None` for types the kernels do not read.
pub fn weight_format(dtype: DType) -> Option<u32> {
    FORMATS
        .iter()
        .position(|f| f.dtype == dtype)
        .map(|i| i as u32)
}

const LINEAR_DTYPES: &str = "f32 x, weights in a format of dynrt::formats and an f32 output";

fn linear_dtypes_ok(inputs: &[DType], output: DType) -> bool {
    inputs.first() == Some(&DType::F32)
        && inputs.get(1).and_then(|&w| weight_format(w)).is_some()
        && output == DType::F32
}

impl Kernel for Linear {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        if linear_dtypes_ok(inputs, output) {
            Ok(())
        } else {
            Err(LINEAR_DTYPES)
        }
    }

    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        infer(inputs[0].shape, inputs[1].shape).map_err(|source| KernelError::Infer {
            op: "linear",
            cause: source,
        })?;
        encode_linear(e, &PLAIN, inputs, out)
    }
}

impl Kernel for FusedLinear {
    /// With a KV split, the key and value rows' destinations.
    fn extra_operands(&self) -> usize {
        if self.kv.is_some() {
            2
        } else {
            0
        }
    }

    /// The dtypes of the op's inputs; after them, with a KV split, the key and value rows'
    /// destinations the runtime passes (f32).
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        let weights = 1..1 + self.weights();
        let ints = self.ints_input();
        let graph_inputs = self.graph_inputs();
        let destinations = if self.kv.is_some() { 2 } else { 0 };
        let ok = output == DType::F32
            && inputs.first() == Some(&DType::F32)
            && inputs.len() >= graph_inputs
            && inputs.len() <= graph_inputs + destinations
            && inputs.iter().enumerate().skip(1).all(|(i, &d)| {
                if weights.contains(&i) {
                    weight_format(d).is_some()
                } else if Some(i) == ints {
                    d == DType::I32
                } else {
                    d == DType::F32
                }
            });
        if ok {
            Ok(())
        } else {
            Err("f32 x, parameters, residual and table, i32 positions and slots, weights in a format of dynrt::formats and an f32 output")
        }
    }

    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = self.graph_inputs().min(inputs.len());
        let shapes: Vec<&crate::shape::Shape> = inputs[..n].iter().map(|o| o.shape).collect();
        fused_infer(self, &shapes).map_err(|source| KernelError::Infer {
            op: "fused_linear",
            cause: source,
        })?;
        encode_linear(e, self, inputs, out)
    }
}

/// The `EPILOGUE` constant of `shaders/quant.wgsl` for `op`: bit 0 RMSNorm, bit 1 residual,
/// bits 2 and 3 the gate activation ([`GateAct::code`]), bit 4 RoPE, bit 5 RoPE on halves,
/// bit 6 bias, bit 7 KV split, bit 8 head norms, bit 9 post-norm, bit 10 the KV split's
/// slots.
pub fn epilogue(op: &FusedLinear) -> u32 {
    u32::from(op.norm.is_some())
        | u32::from(op.residual) << 1
        | op.gate.map_or(0, GateAct::code) << 2
        | op.rope
            .map_or(0, |r| 1 << 4 | u32::from(!r.interleaved) << 5)
        | u32::from(op.bias) << 6
        | u32::from(op.kv.is_some()) << 7
        | u32::from(op.head_norm.is_some()) << 8
        | u32::from(op.post_norm.is_some()) << 9
        | u32::from(op.kv.is_some_and(|kv| kv.slots)) << 10
}

/// Most outputs a segment of the segment kernels holds in workgroup memory (`SEG_MAX` in the
/// WGSL): a longer one (a post-norm of a wider row) is finished from where it was stored.
pub const SEG_MAX: u64 = 4000;

/// The weights of a linear, bound as one: `(binding, word offset of each)`. The three
/// weights of a KV split must lie in one buffer (the runtime places them side by side): one
/// binding covers them.
fn bind_weights<'t>(
    e: &Encoder<'_, '_>,
    ws: &[Operand<'t>],
) -> Result<(super::encoder::Bound<'t>, [u32; 3]), KernelError> {
    let bytes = |w: &Operand<'_>| -> Result<u64, KernelError> {
        let b = w
            .shape
            .size_bytes(w.dtype)
            .map_err(|_| KernelError::TooManyElements {
                what: "input 1",
                elements: u64::MAX,
                max: u64::from(u32::MAX),
            })?;
        // Whole words: the last q8_0 block (or an odd f16 count) may end halfway through one.
        Ok(b.div_ceil(4) * 4)
    };
    let first = &ws[0];
    if ws.len() == 1 {
        let (b, o) = e.bind("input 1", &first.tensor, bytes(first)?)?;
        return Ok((b, [o; 3]));
    }
    let uid = first.tensor.buffer.uid();
    if ws.iter().any(|w| w.tensor.buffer.uid() != uid) {
        return Err(KernelError::Unsupported {
            op: "fused_linear",
            reason: "the three weights of a KV split must lie in one buffer (side by side)".into(),
        });
    }
    let start = ws.iter().map(|w| w.tensor.offset_bytes).min().unwrap_or(0);
    let mut end = start;
    for w in ws {
        end = end.max(w.tensor.offset_bytes + bytes(w)?);
    }
    let span = super::TensorRef {
        buffer: first.tensor.buffer,
        offset_bytes: start,
        size_bytes: end - start,
    };
    let (b, o) = e.bind("input 1", &span, end - start)?;
    let word = |w: &Operand<'_>| o + ((w.tensor.offset_bytes - start) / 4) as u32;
    Ok((b, [word(&ws[0]), word(&ws[1]), word(&ws[2])]))
}

/// Records a linear (shapes checked by the caller) with what `op` folds in: one dispatch, or
/// two for a norm of the product over more rows of x than the matrix-vector kernels take
/// (the product, then `quant_segment_finish`). With a KV split, `inputs` end with the key and
/// value rows' destinations: the step's rows (`[M, kv_rows]`), or with slots the whole pool.
fn encode_linear(
    e: &mut Encoder<'_, '_>,
    op: &FusedLinear,
    inputs: &[Operand<'_>],
    out: &Operand<'_>,
) -> Result<usize, KernelError> {
    let x = &inputs[0];
    let ws = &inputs[1..1 + op.weights()];
    let name = if *op == PLAIN {
        "linear"
    } else {
        "fused_linear"
    };
    let mut formats = [0u32; 3];
    for (f, w) in formats.iter_mut().zip(ws.iter().cycle()) {
        *f = weight_format(w.dtype).ok_or(KernelError::DType {
            op: name,
            inputs: vec![x.dtype, w.dtype],
            output: out.dtype,
            expected: crate::formats::dtype_names(),
        })?;
    }
    let (m, k) = rows(x.shape);
    // Weight rows: with a gate, gate and up rows alternate as the kernels walk them.
    let n: u64 = ws.iter().map(|w| w.shape.dims()[0]).sum();
    for w in ws {
        if let Some(block) = w.dtype.block() {
            if k % u64::from(block.elements) != 0 {
                return Err(KernelError::PartialBlock {
                    what: "input 1",
                    dtype: w.dtype,
                    k,
                    block: block.elements,
                });
            }
        }
        check_layout(name, w)?;
    }
    let out_len = numel("output", out.shape)?;
    let n_out = out.shape.dims().last().copied().unwrap_or(0);
    let (bx, ox) = e.bind("input 0", &x.tensor, numel("input 0", x.shape)? * 4)?;
    let (bw, [ow, owk, owv]) = bind_weights(e, ws)?;
    let (bo, oo) = e.bind("output", &out.tensor, out_len * 4)?;
    let at = op.param_offsets(k as usize, n as usize, n_out as usize);
    let (bg, og) = match op.params_input() {
        Some(i) => e.bind("parameters", &inputs[i].tensor, at.len as u64 * 4)?,
        None => (e.unused(), 0),
    };
    let graph_inputs = op.graph_inputs();
    let (kv_rows, n_k) = match op.kv {
        Some(kv) => {
            let missing = || KernelError::Unsupported {
                op: "fused_linear",
                reason: "a KV split writes the key and value rows into the cache: the \
                         destinations follow the inputs"
                    .into(),
            };
            let kd = inputs.get(graph_inputs).ok_or_else(missing)?;
            let vd = inputs.get(graph_inputs + 1).ok_or_else(missing)?;
            let rows_of = |d: &Operand<'_>| d.shape.dims().first().copied().unwrap_or(0);
            if kd.shape != vd.shape
                || kd.shape.dims().get(1) != Some(&u64::from(kv.kv_rows))
                || (!kv.slots && rows_of(kd) != m)
            {
                return Err(KernelError::Unsupported {
                    op: "fused_linear",
                    reason: "the key and value destinations must be [rows, kv_rows]: the \
                             step's rows, or the pool's with slots"
                        .into(),
                });
            }
            (rows_of(kd), u64::from(kv.kv_rows))
        }
        None => (0, 0),
    };
    let ((br, or), (bv, ov)) = match op.kv {
        Some(_) => {
            let kd = &inputs[graph_inputs];
            let vd = &inputs[graph_inputs + 1];
            (
                e.bind("key rows", &kd.tensor, numel("key rows", kd.shape)? * 4)?,
                e.bind("value rows", &vd.tensor, numel("value rows", vd.shape)? * 4)?,
            )
        }
        None => (
            match op.residual_input() {
                Some(i) => e.bind("residual", &inputs[i].tensor, out_len * 4)?,
                None => (e.unused(), 0),
            },
            (e.unused(), 0),
        ),
    };
    let (bi, oi) = match op.ints_input() {
        Some(i) => {
            let t = &inputs[i];
            e.bind("integers", &t.tensor, numel("integers", t.shape)? * 4)?
        }
        None => (e.unused(), 0),
    };
    let (bt, ot, rope_dim, table_rows) = match op.table_input() {
        Some(i) => {
            let table = &inputs[i];
            let (tb, to) = e.bind("table", &table.tensor, numel("table", table.shape)? * 4)?;
            let td = table.shape.dims();
            (tb, to, u32_of("table", td[1])?, u32_of("table", td[0])?)
        }
        None => (e.unused(), 0, 0, 0),
    };
    let head_dim = op
        .rope
        .map(|r| r.head_dim)
        .or(op.head_norm.map(|h| h.head_dim))
        .unwrap_or(0);
    let u = |v: usize| u32_of("parameters", v as u64);
    let mut p = LinearParams {
        m: u32_of("input 0", m)?,
        k: u32_of("input 0", k)?,
        n: u32_of("input 1", n)?,
        blocks: u32_of("input 0", k / 32)?,
        x_offset: ox,
        w_offset: ow,
        out_offset: oo,
        tiles_n: u32_of("output", n.div_ceil(64))?,
        rows: 1,
        gamma_offset: og + u(at.gamma)?,
        res_offset: or,
        eps: op.norm.unwrap_or(0.0),
        head_dim,
        rope_dim,
        rope_block: op.rope.map_or(0, |r| r.block),
        table_rows,
        pos_offset: oi,
        table_offset: ot,
        bias_offset: og + u(at.bias)?,
        hn_offset: og + u(at.head_norm)?,
        n_q: u32_of("output", if op.kv.is_some() { n_out } else { n })?,
        n_k: u32_of("input 2", n_k)?,
        w_k_offset: owk,
        w_v_offset: owv,
        k_dst_offset: or,
        v_dst_offset: ov,
        slots_offset: oi + u32_of("input 0", if op.rope.is_some() { m } else { 0 })?,
        kv_rows: u32_of("key rows", kv_rows)?,
        post_offset: og + u(at.post_norm)?,
        hn_eps: op.head_norm.map_or(0.0, |h| h.eps),
        post_eps: op.post_norm.unwrap_or(0.0),
        seg_len: 0,
    };
    // A gated projection's invocations own whole (gate, up) pairs, a rotated one whole
    // rotation pairs: an even row count.
    let pairs = |rows: u64| {
        if op.gate.is_some() || op.rope.is_some() {
            (rows + rows % 2).min(ROWS_MAX)
        } else {
            rows
        }
    };
    let layout = e.kernels.quant_layout;
    // x as vec4s where every block of it starts on one (and the binding is whole vec4s).
    let aligned = ox % 4 == 0 && k % 4 == 0;
    let kv_formats = match ws {
        [_, wk, wv] => {
            formats[1] | wk.layout.code() << 8 | formats[2] << 16 | wv.layout.code() << 24
        }
        _ => 0,
    };
    let key = |entry: &'static str| {
        let family = if entry.starts_with("quantsg_") {
            &FAMILY_SG
        } else if entry.starts_with("quantx4_") {
            &FAMILY_X4
        } else {
            &FAMILY
        };
        let key = family
            .key(entry)
            .with("WEIGHT_FORMAT", formats[0])
            .with("WEIGHT_LAYOUT", ws[0].layout.code())
            .with("EPILOGUE", epilogue(op));
        if op.kv.is_some() {
            key.with("KV_FORMATS", kv_formats)
        } else {
            key
        }
    };
    let bound = [bx, bw, bo, bg, br, bi, bt, bv];
    // A norm of the product needs whole segments (a head, the row) in one workgroup.
    let segment = match (op.head_norm, op.post_norm) {
        (Some(h), _) => Some(u64::from(h.head_dim)),
        (None, Some(_)) => Some(n_out),
        (None, None) => None,
    }
    .filter(|&l| l > 0);
    if let Some(len) = segment {
        p.seg_len = u32_of("output", len)?;
    }
    let segments = segment.map_or(0, |len| n / len);
    let (kernel, finish) = layout.fused_kernel(m, aligned, segment, segments);
    let (entry, workgroups, xrows) = match (kernel, layout) {
        (LinearKernel::SegmentWg8 | LinearKernel::SegmentWg64, _) => {
            let len = segment.unwrap_or(1).max(1);
            (kernel.entry(aligned), m * (n / len), None)
        }
        (LinearKernel::MatvecWg8, QuantLayout::Cpu { threads }) => {
            let rows = pairs(rows_per_lane(n, 8 * u64::from(threads)));
            p.rows = rows as u32;
            (
                kernel.entry(aligned),
                (m * n.div_ceil(rows)).div_ceil(8),
                None,
            )
        }
        (LinearKernel::MatvecSubgroup, QuantLayout::Gpu { subgroup: Some(sg) }) => {
            let plan = SubgroupPlan::new(sg, k / 32, op.gate.is_some() || op.rope.is_some());
            p.rows = plan.rows;
            p.tiles_n = plan.rows_per_workgroup;
            // Rows of x per workgroup: the weight is read once for all of them.
            let xrows = m.next_power_of_two().min(8);
            let workgroups = m.div_ceil(xrows) * n.div_ceil(u64::from(plan.rows_per_workgroup));
            (kernel.entry(aligned), workgroups, Some(xrows as u32))
        }
        (LinearKernel::RegTile, QuantLayout::Cpu { threads }) => {
            // Invocations of 8 x rows each; enough weight-row groups to give every thread
            // a SIMD group.
            let row_blocks = m.div_ceil(8);
            let groups = (8 * u64::from(threads)).div_ceil(row_blocks);
            let rows = pairs(n.div_ceil(groups).clamp(1, ROWS_MAX));
            p.rows = rows as u32;
            (
                kernel.entry(aligned),
                (row_blocks * n.div_ceil(rows)).div_ceil(8),
                None,
            )
        }
        (LinearKernel::Mm, _) => (kernel.entry(aligned), m.div_ceil(64) * n.div_ceil(64), None),
        _ => {
            // The coop kernel (the one left): 64 / lanes rows per workgroup.
            let rows = 64 / coop_lanes(k / 32);
            p.rows = rows as u32;
            (kernel.entry(aligned), m * n.div_ceil(rows), None)
        }
    };
    let mut first = key(entry);
    if let Some(xrows) = xrows {
        first = first.with("XROWS", xrows);
    }
    e.dispatch(first, &p, &bound, workgroups)?;
    match segment.filter(|_| finish) {
        // The products stored, each segment with a norm finished in place.
        Some(len) => {
            let normed = match op.head_norm {
                Some(_) => (n - n_k) / len,
                None => 1,
            };
            let entry = if aligned {
                "quantx4_segment_finish"
            } else {
                "quant_segment_finish"
            };
            e.dispatch(key(entry), &p, &bound, m * normed)?;
            Ok(2)
        }
        None => Ok(1),
    }
}

/// The types of table [`encode_gather`] dequantizes: every format but f32 (gathered as
/// plain 32-bit values).
pub fn is_gather_table(dtype: DType) -> bool {
    dtype != DType::F32 && weight_format(dtype).is_some()
}

/// Records the embedding lookup of `ids` (i32 or u32, shape checked by the caller) in an f16,
/// bf16 or block-quantized `table` `[V, ...]` into the f32 `out`: each picked row dequantized;
/// negative i32 ids in `[-V, 0)` count from the end, other ids outside `0..V` give zeros. Block tables need their last dimension to hold whole blocks.
///
/// # Errors
/// [`KernelError::DType`] for another table type, [`KernelError::PartialBlock`], and the
/// binding and size errors of [`Encoder::bind`].
pub fn encode_gather(
    e: &mut Encoder<'_, '_>,
    table: &Operand<'_>,
    ids: &Operand<'_>,
    out: &Operand<'_>,
) -> Result<usize, KernelError> {
    let format = weight_format(table.dtype)
        .filter(|_| is_gather_table(table.dtype))
        .ok_or(KernelError::DType {
            op: "gather",
            inputs: vec![table.dtype, ids.dtype],
            output: out.dtype,
            expected: "a table in a format of dynrt::formats other than f32",
        })?;
    let dims = table.shape.dims();
    let rows_in_table = dims.first().copied().unwrap_or(0);
    let row: u64 = dims.iter().skip(1).product();
    if let Some(block) = table.dtype.block() {
        let last = dims.last().copied().unwrap_or(1);
        if dims.len() < 2 || last % u64::from(block.elements) != 0 {
            return Err(KernelError::PartialBlock {
                what: "input 0",
                dtype: table.dtype,
                k: last,
                block: block.elements,
            });
        }
    }
    let table_bytes =
        table
            .shape
            .size_bytes(table.dtype)
            .map_err(|_| KernelError::TooManyElements {
                what: "input 0",
                elements: u64::MAX,
                max: u64::from(u32::MAX),
            })?;
    let n = numel("output", out.shape)?;
    let num_ids = numel("input 1", ids.shape)?;
    let (bt, ot) = e.bind(
        "input 0",
        &table.tensor,
        (table_bytes.div_ceil(4) * 4).max(4),
    )?;
    let (bi, oi) = e.bind("input 1", &ids.tensor, num_ids * 4)?;
    let (bo, oo) = e.bind("output", &out.tensor, n * 4)?;
    let p = GatherParams {
        num_ids: u32_of("input 1", num_ids)?,
        row: u32_of("input 0", row)?,
        rows: u32_of("input 0", rows_in_table)?,
        table_offset: ot,
        ids_offset: oi,
        out_offset: oo,
        ids_signed: u32::from(ids.dtype == DType::I32),
        _pad: 0,
    };
    // One invocation per 32-element chunk of output values (block tables) or per value.
    let lanes = if table.dtype.block().is_some() {
        n / 32
    } else {
        n
    };
    check_layout("gather", table)?;
    let key = FAMILY
        .key("quant_gather")
        .with("WEIGHT_FORMAT", format)
        .with("WEIGHT_LAYOUT", table.layout.code());
    e.dispatch(key, &p, &[bt, bo, bi], lanes.div_ceil(64))?;
    Ok(1)
}

/// Whether `dtype` has a grouped layout ([`crate::formats::Grouped`]) and a tensor of
/// `bytes` holds whole groups of it: what [`WeightLayout::Grouped`] needs.
pub fn can_group(dtype: DType, bytes: u64) -> bool {
    crate::formats::of_dtype(dtype).is_some_and(|f| {
        f.grouped.is_some()
            && bytes > 0
            && bytes % (GROUP_BLOCKS as u64 * u64::from(f.block_bytes)) == 0
    })
}

/// A weight operand in the grouped layout must be of a format that has one, in whole groups.
fn check_layout(op: &'static str, w: &Operand<'_>) -> Result<(), KernelError> {
    if w.layout == WeightLayout::File {
        return Ok(());
    }
    let bytes = w.shape.size_bytes(w.dtype).unwrap_or(0);
    if can_group(w.dtype, bytes) {
        Ok(())
    } else {
        Err(KernelError::DType {
            op,
            inputs: vec![w.dtype],
            output: DType::F32,
            expected: "grouped weights in q4_0, q5_0 or q8_0, whole groups of 8 blocks",
        })
    }
}

/// Records the reorder of the weight `src` into `dst` (the same bytes in another layout:
/// `src.layout` to `dst.layout`): one dispatch of `quant_regroup` (file to grouped) or
/// `quant_ungroup` (grouped to file), one invocation per word.
///
/// # Errors
/// [`KernelError::DType`] for a type without a grouped layout, a size that is not whole
/// groups or two equal layouts, and the binding and size errors of [`Encoder::bind`].
pub fn encode_regroup(
    e: &mut Encoder<'_, '_>,
    src: &Operand<'_>,
    dst: &Operand<'_>,
) -> Result<usize, KernelError> {
    let bytes = src.shape.size_bytes(src.dtype).unwrap_or(0);
    let entry = match (src.layout, dst.layout) {
        (WeightLayout::File, WeightLayout::Grouped) => Some("quant_regroup"),
        (WeightLayout::Grouped, WeightLayout::File) => Some("quant_ungroup"),
        _ => None,
    };
    let (format, entry) = weight_format(src.dtype)
        .filter(|_| can_group(src.dtype, bytes))
        .zip(entry)
        .ok_or(KernelError::DType {
            op: "regroup",
            inputs: vec![src.dtype],
            output: dst.dtype,
            expected: "q4_0, q5_0 or q8_0 in whole groups of 8 blocks, between two layouts",
        })?;
    let (bs, os) = e.bind("input 0", &src.tensor, bytes)?;
    let (bd, od) = e.bind("output", &dst.tensor, bytes)?;
    let words = bytes / 4;
    let p = GatherParams {
        num_ids: u32_of("input 0", words)?,
        row: 0,
        rows: 0,
        table_offset: os,
        ids_offset: 0,
        out_offset: od,
        ids_signed: 0,
        _pad: 0,
    };
    let key = FAMILY.key(entry).with("WEIGHT_FORMAT", format);
    e.dispatch(key, &p, &[bs, bd], words.div_ceil(64))?;
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_per_lane_gives_every_thread_a_simd_group() {
        // SmolLM2-135M's shapes on 2 threads (16 invocations wanted).
        assert_eq!(rows_per_lane(576, 16), 36);
        assert_eq!(rows_per_lane(192, 16), 12);
        assert_eq!(rows_per_lane(1536, 16), 48);
        assert_eq!(rows_per_lane(49152, 16), 64);
        assert_eq!(rows_per_lane(7, 16), 1);
        assert_eq!(rows_per_lane(0, 16), 1);
        for n in 1..3000 {
            let r = rows_per_lane(n, 16);
            assert!((1..=ROWS_MAX).contains(&r), "{n}");
            assert!(n.div_ceil(r) >= 16.min(n), "{n}: {r}");
        }
    }

    #[test]
    fn coop_lanes_give_about_two_blocks_each_and_even_rows() {
        // SmolLM2-135M: K = 576 (18 blocks), 1536 (48); Qwen2.5-1.5B's down projection 8960.
        assert_eq!(coop_lanes(18), 8);
        assert_eq!(coop_lanes(48), 16);
        assert_eq!(coop_lanes(280), 32);
        assert_eq!(coop_lanes(0), 2);
        for blocks in 0..1000 {
            let lanes = coop_lanes(blocks);
            assert!(
                lanes.is_power_of_two() && (2..=32).contains(&lanes),
                "{blocks}"
            );
            assert_eq!((64 / lanes) % 2, 0, "{blocks}");
        }
    }

    #[test]
    fn subgroup_plans_give_lanes_about_two_blocks_and_pairs_an_even_row_count() {
        // 32 lanes (NVIDIA): SmolLM2's K = 576 (18 blocks) in 4 rows of 8 lanes, its
        // K = 1536 (48) in 2 of 16, Qwen2.5-0.5B's K = 4864 (152) in 1 of 32 (2 when paired).
        let p = SubgroupPlan::new(32, 18, false);
        assert_eq!((p.rows, p.rows_per_workgroup), (4, 8));
        assert_eq!(SubgroupPlan::new(32, 48, false).rows, 2);
        assert_eq!(SubgroupPlan::new(32, 152, false).rows, 1);
        assert_eq!(SubgroupPlan::new(32, 152, true).rows, 2);
        // lavapipe's 8 lanes: one row of 8 lanes per subgroup, 8 subgroups a workgroup.
        let p = SubgroupPlan::new(8, 18, false);
        assert_eq!((p.rows, p.rows_per_workgroup), (1, 8));
        for sg in [4, 8, 16, 32, 64, 128] {
            let lanes = sg.min(64);
            for blocks in 0..400u64 {
                for pairs in [false, true] {
                    let p = SubgroupPlan::new(sg, blocks, pairs);
                    assert!(p.rows.is_power_of_two() && p.rows <= lanes, "{sg} {blocks}");
                    assert_eq!(p.rows_per_workgroup % p.rows, 0, "{sg} {blocks}");
                    assert_eq!(p.rows_per_workgroup / p.rows, 64 / lanes, "{sg} {blocks}");
                    assert!(!pairs || p.rows % 2 == 0, "{sg} {blocks}");
                    // A lane takes at least one block unless the row has fewer than two.
                    let per_row = u64::from(lanes / p.rows);
                    assert!(per_row <= (blocks / 2).max(1), "{sg} {blocks} {pairs}");
                }
            }
        }
    }

    #[test]
    fn every_format_has_a_weight_format_index() {
        for f in FORMATS {
            assert!(weight_format(f.dtype).is_some(), "{}", f.name);
        }
        assert_eq!(weight_format(DType::I8), None);
        assert!(!is_gather_table(DType::F32) && is_gather_table(DType::Q6_K));
    }
}
