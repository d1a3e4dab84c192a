// The embedding gather and the weight reorders of the quant family (quant_gather,
// quant_regroup, quant_ungroup; GatherParams and its bindings are in shaders/quant.wgsl).

// Embedding rows from an f16 or block-quantized table [rows, row]: one invocation per
// 32-element block of the output for block formats (row % 32 == 0), per element for f16.
// Negative i32 ids in [-rows, 0) count from the end (ONNX Gather); other ids outside the
// table give zeros.
@compute @workgroup_size(64, 1, 1)
fn quant_gather(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = workgroup_index(wid, nwg) * 64u + lidx;
    if weight_is_block() {
        let per_row = gp.row / 32u;
        if i >= gp.num_ids * per_row {
            return;
        }
        let which = i / per_row;
        let c = i % per_row;
        let id = table_row(ids[gp.ids_offset + which]);
        let o = gp.out_offset + which * gp.row + c * 32u;
        var v: array<vec4<f32>, 8>;
        if id < gp.rows {
            v = block_values(gp.table_offset, id * per_row + c, 0u);
        }
        for (var j = 0u; j < 8u; j++) {
            dst[o + 4u * j] = v[j].x;
            dst[o + 4u * j + 1u] = v[j].y;
            dst[o + 4u * j + 2u] = v[j].z;
            dst[o + 4u * j + 3u] = v[j].w;
        }
    } else {
        if i >= gp.num_ids * gp.row {
            return;
        }
        let which = i / gp.row;
        let c = i % gp.row;
        let id = table_row(ids[gp.ids_offset + which]);
        var v = 0.0;
        if id < gp.rows {
            v = element_at(gp.table_offset, id * gp.row + c);
        }
        dst[gp.out_offset + i] = v;
    }
}

// Reorders a weight from its file layout (w, from word gp.table_offset) into the grouped
// planes of its format (ids, from word gp.out_offset): one invocation per word of the result,
// gp.num_ids words in all (whole groups), each gathered byte by byte from its place in the
// same group of the file. Run once per weight (the runtime's weight layouts), so simple.
@compute @workgroup_size(64, 1, 1)
fn quant_regroup(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = workgroup_index(wid, nwg) * 64u + lidx;
    if i >= gp.num_ids {
        return;
    }
    let gb = group_bytes();
    let group = (i * 4u) / gb;
    let within = (i * 4u) % gb;
    var word = 0u;
    for (var b = 0u; b < 4u; b++) {
        word |= byte_at(gp.table_offset, group * gb + grouped_source(within + b)) << (8u * b);
    }
    ids[gp.out_offset + i] = word;
}

// The inverse of quant_regroup: a weight in the grouped planes of its format (w, from word
// gp.table_offset) back in its file layout (ids, from word gp.out_offset), one invocation per
// word of the result, gp.num_ids words in all (whole groups).
@compute @workgroup_size(64, 1, 1)
fn quant_ungroup(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = workgroup_index(wid, nwg) * 64u + lidx;
    if i >= gp.num_ids {
        return;
    }
    let gb = group_bytes();
    let group = (i * 4u) / gb;
    let within = (i * 4u) % gb;
    var word = 0u;
    for (var b = 0u; b < 4u; b++) {
        word |= byte_at(gp.table_offset, group * gb + grouped_position(within + b)) << (8u * b);
    }
    ids[gp.out_offset + i] = word;
}
