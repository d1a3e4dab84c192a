// Data movement on 32-bit words: values are copied as bits, so f32, i32 and u32 move alike,
// and a 64-bit element (i64) is two words (the Rust side adds a trailing dimension of 2).
//
// Entry points (workgroup size 256, 2-D grid for large tensors, linear index
// (wid.x + wid.y * num_workgroups.x) * 256 + local index):
//   movement_copy    strided copy over an iteration shape of rank <= 8:
//                    dst[out_offset + sum(i_k * out_strides_k)] = src[in_offset + sum(i_k * in_strides_k)]
//                    Serves reshape and the other views (rank 1, unit strides), transpose
//                    (permuted input strides), slice and split parts (start folded into
//                    in_offset, steps into in_strides: a negative step is a negative stride,
//                    passed as its two's complement, which u32 arithmetic wraps back), expand
//                    (stride 0 on broadcast dimensions) and concat (one dispatch per input
//                    writing its slab of the output: only the new part of a growing KV cache is
//                    written when the old part is already in place).
//   movement_gather  gather along an axis: output word i = (o, j, c) over (outer, num_ids,
//                    row) reads table[(o * rows + id_j) * row + c]. ids_kind 0: u32 ids; 1: i32
//                    ids, negative ones counted from the end; 2: i64 ids as (low, high) word
//                    pairs, likewise. Ids outside [-rows, rows) give 0.
//   movement_fill    dst[i] = values[i] for i < n <= 16 (ShapeOf: the shape travels in the
//                    uniform, so no host write races with earlier dispatches of the same submit).
//   movement_splat   dst[i] = lo for even i, hi for odd i, i < n (ConstantOfShape: an 8- or
//                    16-bit value is repeated inside lo = hi, a 32-bit one is lo = hi, a
//                    64-bit one is the (lo, hi) pair).
//
// Bindings (group 0):
//   0 uniform  CopyParams | GatherParams | FillParams | SplatParams (dynamic offset)
//   1 storage read_write  src (copy) / table (gather)
//   2 storage read_write  ids (gather)
//   3 storage read_write  dst (copy, gather, fill, splat)
//
// Rust mirrors (src/gpu/kernels/movement.rs, #[repr(C)], bytemuck::Pod):
//   struct CopyParams { numel: u32, rank: u32, in_offset: u32, out_offset: u32,
//                       shape: [[u32; 4]; 2], in_strides: [[u32; 4]; 2],
//                       out_strides: [[u32; 4]; 2] }                        // 112 bytes
//   struct GatherParams { num_ids: u32, row: u32, rows: u32, table_offset: u32,
//                         ids_offset: u32, out_offset: u32, outer: u32, ids_kind: u32 } // 32 bytes
//   struct FillParams { n: u32, out_offset: u32, _pad: [u32; 2], values: [[u32; 4]; 4] } // 80 bytes
//   struct SplatParams { n: u32, out_offset: u32, lo: u32, hi: u32 }    // 16 bytes
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
    outer: u32,
    ids_kind: u32,
}

struct FillParams {
    n: u32,
    out_offset: u32,
    _pad0: u32,
    _pad1: u32,
    values: array<vec4<u32>, 4>,
}

struct SplatParams {
    n: u32,
    out_offset: u32,
    lo: u32,
    hi: u32,
}

@group(0) @binding(0) var<uniform> cp: CopyParams;
@group(0) @binding(0) var<uniform> gp: GatherParams;
@group(0) @binding(0) var<uniform> fp: FillParams;
@group(0) @binding(0) var<uniform> sp: SplatParams;
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
    if i >= gp.outer * gp.num_ids * gp.row {
        return;
    }
    let c = i % gp.row;
    let t = i / gp.row;
    let which = t % gp.num_ids;
    let o = t / gp.num_ids;
    // The id as an index in [0, rows), or rows (out of range) when it is not one.
    var id = gp.rows;
    if gp.ids_kind == 2u {
        let lo = ids[gp.ids_offset + 2u * which];
        let hi = ids[gp.ids_offset + 2u * which + 1u];
        if hi == 0u && lo < gp.rows {
            id = lo;
        } else if hi == 0xffffffffu && lo >= 0u - gp.rows && gp.rows > 0u {
            id = lo + gp.rows;
        }
    } else {
        let raw = ids[gp.ids_offset + which];
        if gp.ids_kind == 1u && bitcast<i32>(raw) < 0 {
            let back = 0u - raw;
            if back <= gp.rows {
                id = gp.rows - back;
            }
        } else if raw < gp.rows {
            id = raw;
        }
    }
    var v = 0u;
    if id < gp.rows {
        v = src[gp.table_offset + (o * gp.rows + id) * gp.row + c];
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

@compute @workgroup_size(256)
fn movement_splat(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= sp.n {
        return;
    }
    dst[sp.out_offset + i] = select(sp.lo, sp.hi, (i & 1u) == 1u);
}
