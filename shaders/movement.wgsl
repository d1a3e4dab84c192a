// Data movement on 32-bit words: values are copied as bits, so f32, i32 and u32 move alike,
// and a 64-bit element (i64) is two words (the Rust side adds a trailing dimension of 2).
//
// Entry points (workgroup size 256, linear_index of the prelude):
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
//   movement_check_ids  the index check of a gather whose indices a kernel computed: one
//                    workgroup finds the first id (ids_kind as movement_gather) outside
//                    [-rows, rows) and writes (1, its position, its low word, its high word,
//                    sign-extended for i32) to dst[fault_offset..+4]; writes nothing when every
//                    id is in range (the runtime zeroes the record before the submit and reads
//                    it back after).
//   movement_fill    dst[i] = values[i] for i < n <= 16 (ShapeOf: the shape travels in the
//                    uniform, so no host write races with earlier dispatches of the same submit).
//   movement_slice   a slice whose starts (and steps: movement_slice_steps) are read from
//                    their buffers (i32, or i64 saturated to i32): per listed axis the ONNX
//                    start rule (negative from the end, clamped to [0, dim], or [0, dim - 1]
//                    for a negative step) is applied here, then the strided copy as above;
//                    the ends only shape the output, whose extents the uniform carries.
//   movement_slice_axes  the same with steps and the axes read too (binding 5; negative ones
//                    from the end): axis_of[0][0] holds the axes' word offset and
//                    axis_of[1][3] 1 for 64-bit elements (the word dimension is not an axis).
//   movement_split_sized  part `steps_offset` of a split whose sizes are read from binding 2
//                    (SliceParams with n_axes = 1, axis_of[0] the split axis): the start is
//                    the sum of the sizes before the part, then as movement_slice.
//   movement_splat   dst[i] = lo for even i, hi for odd i, i < n (ConstantOfShape: an 8- or
//                    16-bit value is repeated inside lo = hi, a 32-bit one is lo = hi, a
//                    64-bit one is the (lo, hi) pair).
//
// Bindings (group 0):
//   0 uniform  CopyParams | GatherParams | CheckIdsParams | FillParams | SplatParams |
//              SliceParams (dynamic offset)
//   1 storage read_write  src (copy, slice) / table (gather)
//   2 storage read_write  ids (gather, check_ids) / starts (slice) / sizes (split_sized)
//   3 storage read_write  dst (copy, gather, fill, splat, slice) / the fault record (check_ids)
//   4 storage read_write  steps (movement_slice_steps, movement_slice_axes)
//   5 storage read_write  axes (movement_slice_axes)
//
// Rust mirrors (src/gpu/kernels/movement.rs, #[repr(C)], bytemuck::Pod):
//   struct CopyParams { numel: u32, rank: u32, in_offset: u32, out_offset: u32,
//                       shape: [[u32; 4]; 2], in_strides: [[u32; 4]; 2],
//                       out_strides: [[u32; 4]; 2] }                        // 112 bytes
//   struct GatherParams { num_ids: u32, row: u32, rows: u32, table_offset: u32,
//                         ids_offset: u32, out_offset: u32, outer: u32, ids_kind: u32 } // 32 bytes
//   struct CheckIdsParams { num_ids: u32, rows: u32, ids_offset: u32, fault_offset: u32,
//                           ids_kind: u32, _pad: [u32; 3] }                  // 32 bytes
//   struct FillParams { n: u32, out_offset: u32, _pad: [u32; 2], values: [[u32; 4]; 4] } // 80 bytes
//   struct SplatParams { n: u32, out_offset: u32, lo: u32, hi: u32 }    // 16 bytes
//   struct SliceParams { numel: u32, rank: u32, in_offset: u32, out_offset: u32,
//                        n_axes: u32, starts_offset: u32, steps_offset: u32, param_words: u32,
//                        shape: [[u32; 4]; 2], in_strides: [[u32; 4]; 2],
//                        dims: [[u32; 4]; 2], axis_of: [[u32; 4]; 2] }      // 160 bytes
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

struct CheckIdsParams {
    num_ids: u32,
    rows: u32,
    ids_offset: u32,
    fault_offset: u32,
    ids_kind: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
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
@group(0) @binding(0) var<uniform> kp: CheckIdsParams;
struct SliceParams {
    numel: u32,
    rank: u32,
    in_offset: u32,
    out_offset: u32,
    n_axes: u32,
    starts_offset: u32,
    steps_offset: u32,
    param_words: u32,
    shape: array<vec4<u32>, 2>,
    in_strides: array<vec4<u32>, 2>,
    dims: array<vec4<u32>, 2>,
    axis_of: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> sp: SplatParams;
@group(0) @binding(0) var<uniform> lp: SliceParams;
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;
@group(0) @binding(4) var<storage, read_write> steps_buf: array<u32>;
@group(0) @binding(5) var<storage, read_write> axes_buf: array<u32>;

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

// The smallest bad position each invocation found (0xffffffff: none), reduced to the first.
var<workgroup> first_bad: array<u32, 256>;

// Whether id `which` of movement_check_ids lies outside [-rows, rows).
fn id_out_of_range(which: u32) -> bool {
    if kp.ids_kind == 2u {
        let lo = ids[kp.ids_offset + 2u * which];
        let hi = ids[kp.ids_offset + 2u * which + 1u];
        let forward = hi == 0u && lo < kp.rows;
        let back = hi == 0xffffffffu && kp.rows > 0u && lo >= 0u - kp.rows;
        return !(forward || back);
    }
    let raw = ids[kp.ids_offset + which];
    if kp.ids_kind == 1u && bitcast<i32>(raw) < 0 {
        return 0u - raw > kp.rows;
    }
    return raw >= kp.rows;
}

@compute @workgroup_size(256)
fn movement_check_ids(@builtin(local_invocation_index) lid: u32) {
    var bad = 0xffffffffu;
    for (var j = lid; j < kp.num_ids; j += 256u) {
        if id_out_of_range(j) {
            bad = j;
            break;
        }
    }
    first_bad[lid] = bad;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if lid < s {
            first_bad[lid] = min(first_bad[lid], first_bad[lid + s]);
        }
        workgroupBarrier();
    }
    if lid == 0u && first_bad[0] != 0xffffffffu {
        let p = first_bad[0];
        var lo = 0u;
        var hi = 0u;
        if kp.ids_kind == 2u {
            lo = ids[kp.ids_offset + 2u * p];
            hi = ids[kp.ids_offset + 2u * p + 1u];
        } else {
            lo = ids[kp.ids_offset + p];
            if kp.ids_kind == 1u && bitcast<i32>(lo) < 0 {
                hi = 0xffffffffu;
            }
        }
        dst[kp.fault_offset] = 1u;
        dst[kp.fault_offset + 1u] = p;
        dst[kp.fault_offset + 2u] = lo;
        dst[kp.fault_offset + 3u] = hi;
    }
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

// The sliced dimensions of the uniform.
fn uniform_axes() -> array<u32, 8> {
    var axes = array<u32, 8>();
    for (var k = 0u; k < 8u; k++) {
        axes[k] = lp.axis_of[k / 4u][k % 4u];
    }
    return axes;
}

// Copies output element i of a slice whose k-th start and step apply to dimension axes[k].
fn slice_copy(i: u32, starts: array<i32, 8>, steps: array<i32, 8>, axes: array<u32, 8>) {
    var start = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    var step = array<i32, 8>(1, 1, 1, 1, 1, 1, 1, 1);
    for (var k = 0u; k < lp.n_axes; k++) {
        let a = axes[k];
        let d = i32(lp.dims[a / 4u][a % 4u]);
        var s = starts[k];
        if s < 0 {
            s += d;
        }
        if steps[k] > 0 {
            s = clamp(s, 0, d);
        } else {
            s = clamp(s, 0, d - 1);
        }
        start[a] = s;
        step[a] = steps[k];
    }
    var rem = i;
    var si = lp.in_offset;
    for (var k = 0u; k < lp.rank; k++) {
        let d = lp.rank - 1u - k;
        let ext = lp.shape[d / 4u][d % 4u];
        let idx = i32(rem % ext);
        rem = rem / ext;
        si += bitcast<u32>(start[d] + idx * step[d]) * lp.in_strides[d / 4u][d % 4u];
    }
    dst[lp.out_offset + i] = src[si];
}

@compute @workgroup_size(256)
fn movement_slice(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= lp.numel {
        return;
    }
    var starts = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    let ones = array<i32, 8>(1, 1, 1, 1, 1, 1, 1, 1);
    for (var k = 0u; k < lp.n_axes; k++) {
        let at = lp.starts_offset + k * lp.param_words;
        starts[k] = i32_saturated(ids[at], ids[at + lp.param_words - 1u], lp.param_words);
    }
    slice_copy(i, starts, ones, uniform_axes());
}

@compute @workgroup_size(256)
fn movement_slice_steps(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= lp.numel {
        return;
    }
    var starts = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    var steps = array<i32, 8>(1, 1, 1, 1, 1, 1, 1, 1);
    for (var k = 0u; k < lp.n_axes; k++) {
        let at = lp.starts_offset + k * lp.param_words;
        starts[k] = i32_saturated(ids[at], ids[at + lp.param_words - 1u], lp.param_words);
        let st = lp.steps_offset + k * lp.param_words;
        steps[k] = i32_saturated(steps_buf[st], steps_buf[st + lp.param_words - 1u], lp.param_words);
    }
    slice_copy(i, starts, steps, uniform_axes());
}

@compute @workgroup_size(256)
fn movement_slice_axes(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= lp.numel {
        return;
    }
    var starts = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    var steps = array<i32, 8>(1, 1, 1, 1, 1, 1, 1, 1);
    var axes = array<u32, 8>();
    // The data's rank: the iteration rank less the word dimension of 64-bit elements.
    let rank = i32(lp.rank) - i32(lp.axis_of[1][3]);
    for (var k = 0u; k < lp.n_axes; k++) {
        let at = lp.starts_offset + k * lp.param_words;
        starts[k] = i32_saturated(ids[at], ids[at + lp.param_words - 1u], lp.param_words);
        let st = lp.steps_offset + k * lp.param_words;
        steps[k] = i32_saturated(steps_buf[st], steps_buf[st + lp.param_words - 1u], lp.param_words);
        let ax = lp.axis_of[0][0] + k * lp.param_words;
        var a = i32_saturated(axes_buf[ax], axes_buf[ax + lp.param_words - 1u], lp.param_words);
        if a < 0 {
            a += rank;
        }
        axes[k] = u32(clamp(a, 0, rank - 1));
    }
    slice_copy(i, starts, steps, axes);
}

@compute @workgroup_size(256)
fn movement_split_sized(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= lp.numel {
        return;
    }
    var start = 0i;
    for (var k = 0u; k < lp.steps_offset; k++) {
        let at = lp.starts_offset + k * lp.param_words;
        start += i32_saturated(ids[at], ids[at + lp.param_words - 1u], lp.param_words);
    }
    var starts = array<i32, 8>(start, 0, 0, 0, 0, 0, 0, 0);
    let ones = array<i32, 8>(1, 1, 1, 1, 1, 1, 1, 1);
    slice_copy(i, starts, ones, uniform_axes());
}
