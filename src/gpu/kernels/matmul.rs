//! The `matmul` family (`shaders/matmul.wgsl`): a tiled kernel (64x64 output tile per 8x8
//! workgroup, an 8x8 register block per invocation, K staged 16 at a time in workgroup
//! memory as vec4s; `matmul_tiled4` reads A and B from memory as vec4s where their layout
//! allows, `matmul_tiled` through any strides) and, for M <= [`SMALL_M_MAX`] (decode
//! steps), a small-M kernel where one 64-invocation workgroup covers one row and 256
//! columns; gemm (transposes as strides, an epilogue dispatch for alpha and C); convolution
//! as an implicit GEMM on the tiled kernel's register block (`matmul_conv4` reads the
//! weights as vec4s where K and their offset are multiples of 4, `matmul_conv` one f32 at a
//! time).
use super::cnn::per_axis;
use super::layout::{batch_strides, broadcast_strides, numel, operand_strides, span, u32_of};
use super::{f32_only, Encoder, Family, Kernel, KernelError, Operand};
use crate::graph::ops::matmul::dims;
use crate::graph::ops::{Conv, Gemm, MatMul};
use crate::shape::{DType, Shape};
use bytemuck::{Pod, Zeroable};

/// `shaders/matmul.wgsl` after the prelude.
pub const WGSL: &str = crate::gpu::pipeline::with_prelude!("matmul");

/// The family: entry points and their storage bindings.
pub const FAMILY: Family = Family {
    name: "matmul",
    source: || WGSL,
    bindings: |entry| match entry {
        "matmul_conv" | "matmul_conv4" => &[1, 2, 3, 4],
        "matmul_scale" => &[3],
        "matmul_bias" => &[3, 4],
        _ => &[1, 2, 3],
    },
    unchecked: &[],
};

/// Largest M for which the small-M kernel is used instead of the tiled one.
pub const SMALL_M_MAX: u64 = 8;

/// `MatMulParams` of `shaders/matmul.wgsl` (112 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct MatMulParams {
    /// Output rows.
    pub m: u32,
    /// Inner dimension.
    pub k: u32,
    /// Output columns.
    pub n: u32,
    /// Product of the batch dimensions.
    pub batch: u32,
    /// 64-row tiles.
    pub tiles_m: u32,
    /// 64-column tiles.
    pub tiles_n: u32,
    /// Number of batch dimensions (<= 4).
    pub batch_rank: u32,
    /// Padding.
    pub _pad0: u32,
    /// A element offset.
    pub a_offset: u32,
    /// B element offset.
    pub b_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad1: u32,
    /// A stride between rows.
    pub a_stride_m: u32,
    /// A stride along K.
    pub a_stride_k: u32,
    /// B stride along K.
    pub b_stride_k: u32,
    /// B stride along N.
    pub b_stride_n: u32,
    /// Batch dimensions of the output.
    pub batch_shape: [u32; 4],
    /// A strides per batch dimension (0 where broadcast).
    pub a_batch_strides: [u32; 4],
    /// B strides per batch dimension (0 where broadcast).
    pub b_batch_strides: [u32; 4],
}

/// `ConvParams` of `shaders/matmul.wgsl` (144 bytes); spatial vectors are `(d, h, w, 0)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct ConvParams {
    /// Output channels per group (GEMM rows).
    pub m: u32,
    /// Input channels per group times the kernel volume (GEMM depth).
    pub k: u32,
    /// Output pixels (GEMM columns).
    pub n: u32,
    /// Images times groups.
    pub batch: u32,
    /// 64-row tiles.
    pub tiles_m: u32,
    /// 64-column tiles.
    pub tiles_n: u32,
    /// Groups.
    pub group: u32,
    /// Input channels per group.
    pub cg: u32,
    /// x element offset.
    pub x_offset: u32,
    /// w element offset.
    pub w_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Bias element offset.
    pub bias_offset: u32,
    /// Input spatial extents.
    pub in_dims: [u32; 4],
    /// Output spatial extents.
    pub out_dims: [u32; 4],
    /// Kernel extents.
    pub kernel: [u32; 4],
    /// Strides.
    pub strides: [u32; 4],
    /// Dilations.
    pub dilations: [u32; 4],
    /// Padding before the first element.
    pub pads: [u32; 4],
}

/// `EpilogueParams` of `shaders/matmul.wgsl` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct EpilogueParams {
    /// Output elements.
    pub numel: u32,
    /// Output columns.
    pub n: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// C element offset.
    pub c_offset: u32,
    /// C stride between rows (0: broadcast).
    pub c_stride_m: u32,
    /// C stride between columns (0: broadcast).
    pub c_stride_n: u32,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of C.
    pub beta: f32,
}

/// One matmul dispatch over operands whose layout is given by strides.
struct Gemm2 {
    m: u64,
    k: u64,
    n: u64,
    batch: Shape,
    a_batch: Vec<u64>,
    b_batch: Vec<u64>,
    a_stride: (u64, u64),
    b_stride: (u64, u64),
}

/// Whether the tiled kernel may stage A and B as vec4s (`matmul_tiled4`): both contiguous
/// along their last axis (K for A, N for B) and every offset, stride, K and N a multiple of 4,
/// so that each aligned group of 4 elements it reads lies wholly inside the operand or wholly
/// outside the matrix. On lavapipe and SwiftShader a vec4 storage load costs about what one
/// f32 load does (docs/benchmarks/2026-11-23-matmul-vec4-tiles.md).
fn vec4_operands(p: &MatMulParams) -> bool {
    let all4 = |v: &[u32]| v.iter().all(|x| x % 4 == 0);
    p.a_stride_k == 1
        && p.b_stride_n == 1
        && all4(&[p.k, p.n, p.a_offset, p.b_offset, p.a_stride_m, p.b_stride_k])
        && all4(&p.a_batch_strides)
        && all4(&p.b_batch_strides)
}

/// Records the tiled or small-M dispatch of `g`.
fn encode_gemm(
    e: &mut Encoder<'_, '_>,
    a: &Operand<'_>,
    b: &Operand<'_>,
    out: &Operand<'_>,
    g: &Gemm2,
) -> Result<(), KernelError> {
    if g.batch.rank() > 4 {
        return Err(KernelError::RankTooLarge {
            rank: g.batch.rank() + 2,
            max: 6,
        });
    }
    let n_out = numel("output", out.shape)?;
    let (ba, oa) = e.bind("input 0", &a.tensor, span("input 0", a)? * 4)?;
    let (bb, ob) = e.bind("input 1", &b.tensor, span("input 1", b)? * 4)?;
    let (bo, oo) = e.bind("output", &out.tensor, n_out * 4)?;
    let mut p = MatMulParams {
        m: u32_of("output", g.m)?,
        k: u32_of("input 0", g.k)?,
        n: u32_of("output", g.n)?,
        batch: u32_of("output", g.batch.checked_num_elements().unwrap_or(0))?,
        tiles_m: u32_of("output", g.m.div_ceil(64))?,
        tiles_n: u32_of("output", g.n.div_ceil(64))?,
        batch_rank: g.batch.rank() as u32,
        _pad0: 0,
        a_offset: oa,
        b_offset: ob,
        out_offset: oo,
        _pad1: 0,
        a_stride_m: u32_of("input 0", g.a_stride.0)?,
        a_stride_k: u32_of("input 0", g.a_stride.1)?,
        b_stride_k: u32_of("input 1", g.b_stride.0)?,
        b_stride_n: u32_of("input 1", g.b_stride.1)?,
        batch_shape: [1; 4],
        a_batch_strides: [0; 4],
        b_batch_strides: [0; 4],
    };
    for i in 0..g.batch.rank() {
        p.batch_shape[i] = u32_of("output", g.batch.dims()[i])?;
        p.a_batch_strides[i] = u32_of("input 0", g.a_batch[i])?;
        p.b_batch_strides[i] = u32_of("input 1", g.b_batch[i])?;
    }
    // Specialisation by shape: below 9 rows (decode steps) a 64-row tile would mostly
    // compute padding, so one workgroup covers one row and 256 columns instead.
    let entry = if g.m <= SMALL_M_MAX {
        p.tiles_m = p.m;
        p.tiles_n = u32_of("output", g.n.div_ceil(256))?;
        "matmul_small_m"
    } else if vec4_operands(&p) {
        "matmul_tiled4"
    } else {
        "matmul_tiled"
    };
    let workgroups = u64::from(p.batch) * u64::from(p.tiles_m) * u64::from(p.tiles_n);
    e.dispatch(FAMILY.key(entry), &p, &[ba, bb, bo], workgroups)
}

impl Kernel for MatMul {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }

    /// Both sides are addressed through strides (rows, columns and batches): a strided view
    /// such as a padded KV cache is read in place.
    fn reads_strided(&self, _input: usize) -> bool {
        true
    }

    /// A 1-D operand is one row (or column) with no batch dimensions: the strides below
    /// read it as `[1, K]` (or `[K, 1]`), and the output layout is the same either way.
    /// Each side is read through its own strides (row-major, or a strided view's).
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (a, b) = (&inputs[0], &inputs[1]);
        let d = dims(a.shape, b.shape, self.transpose_b).map_err(|source| KernelError::Infer {
            op: "matmul",
            cause: source,
        })?;
        let (ra, rb) = (a.shape.rank(), b.shape.rank());
        let (sta, stb) = (operand_strides(a), operand_strides(b));
        let (a_stride, a_batch) = if d.a_vector {
            ((d.k, sta[0]), vec![0; d.batch.rank()])
        } else {
            let rows = (sta[ra - 2], sta[ra - 1]);
            (rows, batch_strides(a.shape.dims(), &sta, ra - 2, &d.batch))
        };
        let (b_stride, b_batch) = if d.b_vector {
            ((stb[0], 1), vec![0; d.batch.rank()])
        } else {
            let cols = if self.transpose_b {
                (stb[rb - 1], stb[rb - 2])
            } else {
                (stb[rb - 2], stb[rb - 1])
            };
            (cols, batch_strides(b.shape.dims(), &stb, rb - 2, &d.batch))
        };
        let g = Gemm2 {
            m: d.m,
            k: d.k,
            n: d.n,
            batch: d.batch,
            a_batch,
            b_batch,
            a_stride,
            b_stride,
        };
        encode_gemm(e, a, b, out, &g)?;
        Ok(1)
    }
}

impl Kernel for Gemm {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }

    /// The product through the matmul kernels (transposes are strides), then, unless alpha
    /// is 1 and there is no C, one epilogue dispatch over the output in place.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let shapes: Vec<&Shape> = inputs.iter().map(|o| o.shape).collect();
        let (m, k, n) = self.dims(&shapes).map_err(|source| KernelError::Infer {
            op: "gemm",
            cause: source,
        })?;
        let g = Gemm2 {
            m,
            k,
            n,
            batch: Shape::new(vec![]),
            a_batch: vec![],
            b_batch: vec![],
            a_stride: if self.trans_a { (1, m) } else { (k, 1) },
            b_stride: if self.trans_b { (1, k) } else { (n, 1) },
        };
        encode_gemm(e, &inputs[0], &inputs[1], out, &g)?;
        let c = inputs.get(2);
        if self.alpha == 1.0 && (c.is_none() || self.beta == 0.0) {
            return Ok(1);
        }
        let numel_out = numel("output", out.shape)?;
        let (bo, oo) = e.bind("output", &out.tensor, numel_out * 4)?;
        let mut p = EpilogueParams {
            numel: u32_of("output", numel_out)?,
            n: u32_of("output", n.max(1))?,
            out_offset: oo,
            c_offset: 0,
            c_stride_m: 0,
            c_stride_n: 0,
            alpha: self.alpha,
            beta: self.beta,
        };
        match c.filter(|_| self.beta != 0.0) {
            Some(c) => {
                let st = broadcast_strides(c.shape, out.shape);
                let (bc, oc) = e.bind("input 2", &c.tensor, numel("input 2", c.shape)? * 4)?;
                p.c_offset = oc;
                p.c_stride_m = u32_of("input 2", st[0])?;
                p.c_stride_n = u32_of("input 2", st[1])?;
                e.dispatch(
                    FAMILY.key("matmul_bias"),
                    &p,
                    &[bo, bc],
                    numel_out.div_ceil(256),
                )?;
            }
            None => e.dispatch(
                FAMILY.key("matmul_scale"),
                &p,
                &[bo],
                numel_out.div_ceil(256),
            )?,
        }
        Ok(2)
    }
}

impl Kernel for Conv {
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str> {
        f32_only(inputs, output)
    }

    /// One implicit-GEMM dispatch: per (image, group) a `[OC / g, C / g * kernel]` by
    /// `[C / g * kernel, out pixels]` product whose right side is gathered from x while it is
    /// staged, bias added in the stores.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let (x, w, bias) = (&inputs[0], &inputs[1], &inputs[2]);
        let shapes: Vec<&Shape> = inputs.iter().map(|o| o.shape).collect();
        let axes = self.axes(&shapes).map_err(|source| KernelError::Infer {
            op: "conv",
            cause: source,
        })?;
        let group = self.group;
        let (images, oc) = (x.shape.dims()[0], w.shape.dims()[0]);
        let m = oc / group;
        let cg = w.shape.dims()[1];
        let kvol: u64 = axes.iter().map(|a| a.kernel).product();
        let pixels: u64 = axes.iter().map(|a| a.output).product();
        let (bx, ox) = e.bind("input 0", &x.tensor, numel("input 0", x.shape)? * 4)?;
        let (bw, ow) = e.bind("input 1", &w.tensor, numel("input 1", w.shape)? * 4)?;
        let (bb, obias) = e.bind("input 2", &bias.tensor, numel("input 2", bias.shape)? * 4)?;
        let (bo, oo) = e.bind("output", &out.tensor, numel("output", out.shape)? * 4)?;
        let p = ConvParams {
            m: u32_of("input 1", m)?,
            k: u32_of("input 1", cg * kvol)?,
            n: u32_of("output", pixels)?,
            batch: u32_of("output", images * group)?,
            tiles_m: u32_of("output", m.div_ceil(64))?,
            tiles_n: u32_of("output", pixels.div_ceil(64))?,
            group: u32_of("input 1", group)?,
            cg: u32_of("input 1", cg)?,
            x_offset: ox,
            w_offset: ow,
            out_offset: oo,
            bias_offset: obias,
            in_dims: per_axis("input 0", &axes, 1, |a| a.input)?,
            out_dims: per_axis("output", &axes, 1, |a| a.output)?,
            kernel: per_axis("input 1", &axes, 1, |a| a.kernel)?,
            strides: per_axis("input 0", &axes, 1, |a| a.stride)?,
            dilations: per_axis("input 0", &axes, 1, |a| a.dilation)?,
            pads: per_axis("input 0", &axes, 0, |a| a.pad_begin)?,
        };
        // The weights are contiguous (a conv reads contiguous inputs): with K and their
        // offset multiples of 4, each group's rows start on a vec4 and `matmul_conv4` stages
        // them with vec4 loads (on SwiftShader, where every storage index is clamped, a
        // quarter of the loads; docs/benchmarks/2026-11-23-matmul-vec4-tiles.md).
        let entry = if p.k % 4 == 0 && p.w_offset % 4 == 0 {
            "matmul_conv4"
        } else {
            "matmul_conv"
        };
        let workgroups = u64::from(p.batch) * u64::from(p.tiles_m) * u64::from(p.tiles_n);
        e.dispatch(FAMILY.key(entry), &p, &[bx, bw, bo, bb], workgroups)?;
        Ok(1)
    }
}
