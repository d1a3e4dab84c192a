// Data movement on 32-bit words (f32, i32 and u32 alike: values are copied as bits).
//
// Entry points (workgroup size 256, 2-D grid for large tensors, linear index
// (wid.x + wid.y * num_workgroups.x) * 256 + local index):
//   movement_copy    strided copy over an iteration shape of rank <= 8:
//                    dst[out_offset + sum(i_k * out_strides_k)] = src[in_offset + sum(i_k * in_strides_k)]
//                    Serves reshape (rank 1, unit strides), transpose (permuted input strides),
//                    slice (start folded into in_offset, steps into in_strides) and concat (one
//                    dispatch per input writing its slab of the output: only the new part of a
//                    growing KV cache is written when the old part is already in place).
//   movement_gather  embedding lookup along axis 0: dst[i * row + c] = table[ids[i] * row + c];
//                    ids >= rows (including negative i32 seen as u32) give 0.
//   movement_fill    dst[i] = values[i] for i < n <= 8 (ShapeOf: the shape travels in the
//                    uniform, so no host write races with earlier dispatches of the same submit).
//
// Bindings (group 0):
//   0 uniform  CopyParams | GatherParams | FillParams (dynamic offset)
//   1 storage read_write  src (copy) / table (gather)
//   2 storage read_write  ids (gather)
//   3 storage read_write  dst (copy, gather, fill)
//
// Rust mirrors (src/gpu/kernels/movement.rs, #[repr(C)], bytemuck::Pod):
//   struct CopyParams { numel: u32, rank: u32, in_offset: u32, out_offset: u32,
//                       shape: [[u32; 4]; 2], in_strides: [[u32; 4]; 2],
//                       out_strides: [[u32; 4]; 2] }                        // 112 bytes
//   struct GatherParams { num_ids: u32, row: u32, rows: u32, table_offset: u32,
//                         ids_offset: u32, out_offset: u32, _pad: [u32; 2] } // 32 bytes
//   struct FillParams { n: u32, out_offset: u32, _pad: [u32; 2], values: [[u32; 4]; 2] } // 48 bytes
// Offsets and strides are in 32-bit words from the start of each binding.

struct CopyParams {
    numel: u32,
    rank: u32,
    in_offset: u32,
    out_offset: u32,
    shape: array<vec4<u32>, 2>,
    in_strides: array<vec4<u32>, 2>,
    out_strides: array<vec4<u32>, 2>,
}

struct GatherParams {
    num_ids: u32,
    row: u32,
    rows: u32,
    table_offset: u32,
    ids_offset: u32,
    out_offset: u32,
    _pad0: u32,
    _pad1: u32,
}

struct FillParams {
    n: u32,
    out_offset: u32,
    _pad0: u32,
    _pad1: u32,
    values: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> cp: CopyParams;
@group(0) @binding(0) var<uniform> gp: GatherParams;
@group(0) @binding(0) var<uniform> fp: FillParams;
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

fn linear_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * 256u + lid;
}

@compute @workgroup_size(256)
fn movement_copy(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= cp.numel {
        return;
    }
    var rem = i;
    var si = cp.in_offset;
    var di = cp.out_offset;
    for (var k = 0u; k < cp.rank; k++) {
        let d = cp.rank - 1u - k;
        let ext = cp.shape[d / 4u][d % 4u];
        let idx = rem % ext;
        rem = rem / ext;
        si += idx * cp.in_strides[d / 4u][d % 4u];
        di += idx * cp.out_strides[d / 4u][d % 4u];
    }
    dst[di] = src[si];
}

@compute @workgroup_size(256)
fn movement_gather(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= gp.num_ids * gp.row {
        return;
    }
    let which = i / gp.row;
    let c = i % gp.row;
    let id = ids[gp.ids_offset + which];
    var v = 0u;
    if id < gp.rows {
        v = src[gp.table_offset + id * gp.row + c];
    }
    dst[gp.out_offset + i] = v;
}

@compute @workgroup_size(256)
fn movement_fill(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= fp.n {
        return;
    }
    dst[fp.out_offset + i] = fp.values[i / 4u][i % 4u];
}
