//! `#[repr(C)]` mirrors of the WGSL uniform blocks in `shaders/` (field order and padding as the
//! WGSL uniform layout rules require: every array element is a 16-byte `vec4<u32>`).

use bytemuck::{Pod, Zeroable};

/// Highest rank the strided kernels (broadcast, copy, where) address: 8 (two `vec4<u32>`).
pub const MAX_RANK: usize = 8;

/// `shaders/elementwise.wgsl` / `shaders/mask.wgsl` `BroadcastParams`: up to three inputs read
/// through per-input strides over the output shape.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BroadcastParams {
    /// Output elements.
    pub numel: u32,
    /// Output rank (<= [`MAX_RANK`]).
    pub rank: u32,
    /// Output element offset in its binding.
    pub out_offset: u32,
    /// Bit 0: the condition of `where` is f32.
    pub flags: u32,
    /// Element offsets of inputs 0, 1, 2 in their bindings.
    pub offsets: [u32; 4],
    /// Output shape.
    pub shape: [[u32; 4]; 2],
    /// Input 0 strides over the output shape (0 on broadcast dimensions).
    pub strides0: [[u32; 4]; 2],
    /// Input 1 strides.
    pub strides1: [[u32; 4]; 2],
    /// Input 2 strides.
    pub strides2: [[u32; 4]; 2],
}

/// `shaders/elementwise.wgsl` `FlatParams`: contiguous operands of one shape.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct FlatParams {
    /// Elements (vec4 elements for the `*4` entry points).
    pub numel: u32,
    /// Input 0 offset, in elements of the entry point's array type.
    pub in0_offset: u32,
    /// Input 1 offset.
    pub in1_offset: u32,
    /// Output offset.
    pub out_offset: u32,
}

/// `shaders/matmul.wgsl` `MatMulParams`.
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

/// `shaders/reduce.wgsl` `RowParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RowParams {
    /// Rows (product of all but the last dimension).
    pub rows: u32,
    /// Row length (last dimension).
    pub d: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// gamma element offset.
    pub gamma_offset: u32,
    /// beta element offset.
    pub beta_offset: u32,
    /// Epsilon added to the variance / mean square.
    pub eps: f32,
    /// Padding.
    pub _pad: u32,
}

/// `shaders/movement.wgsl` `CopyParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct CopyParams {
    /// Elements copied.
    pub numel: u32,
    /// Rank of the iteration shape.
    pub rank: u32,
    /// Source word offset.
    pub in_offset: u32,
    /// Destination word offset.
    pub out_offset: u32,
    /// Iteration shape.
    pub shape: [[u32; 4]; 2],
    /// Source strides per iteration dimension.
    pub in_strides: [[u32; 4]; 2],
    /// Destination strides per iteration dimension.
    pub out_strides: [[u32; 4]; 2],
}

/// `shaders/movement.wgsl` `GatherParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct GatherParams {
    /// Number of ids.
    pub num_ids: u32,
    /// Words per table row.
    pub row: u32,
    /// Rows in the table.
    pub rows: u32,
    /// Table word offset.
    pub table_offset: u32,
    /// Ids word offset.
    pub ids_offset: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad: [u32; 2],
}

/// `shaders/movement.wgsl` `FillParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct FillParams {
    /// Words written (<= 8).
    pub n: u32,
    /// Output word offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad: [u32; 2],
    /// The words.
    pub values: [[u32; 4]; 2],
}

/// `shaders/mask.wgsl` `CausalParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct CausalParams {
    /// Elements.
    pub numel: u32,
    /// Queries (second-to-last dimension).
    pub s: u32,
    /// Keys (last dimension).
    pub t: u32,
    /// Past length `t - s`.
    pub past: u32,
    /// x element offset.
    pub x_offset: u32,
    /// Output element offset.
    pub out_offset: u32,
    /// Padding.
    pub _pad: [u32; 2],
}

/// Packs up to [`MAX_RANK`] values into the `array<vec4<u32>, 2>` layout.
pub fn pack8(v: &[u32]) -> [[u32; 4]; 2] {
    let mut out = [[0u32; 4]; 2];
    for (i, &x) in v.iter().take(MAX_RANK).enumerate() {
        out[i / 4][i % 4] = x;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_wgsl_layouts() {
        assert_eq!(std::mem::size_of::<BroadcastParams>(), 160);
        assert_eq!(std::mem::size_of::<FlatParams>(), 16);
        assert_eq!(std::mem::size_of::<MatMulParams>(), 112);
        assert_eq!(std::mem::size_of::<RowParams>(), 32);
        assert_eq!(std::mem::size_of::<CopyParams>(), 112);
        assert_eq!(std::mem::size_of::<GatherParams>(), 32);
        assert_eq!(std::mem::size_of::<FillParams>(), 48);
        assert_eq!(std::mem::size_of::<CausalParams>(), 32);
        assert_eq!(pack8(&[1, 2, 3, 4, 5]), [[1, 2, 3, 4], [5, 0, 0, 0]]);
    }
}
