// Grouped-query attention for hardware GPUs with subgroup operations (compiled only on
// devices that have them): one workgroup per (query row s, KV head g, key chunk) serves the
// GROUP query heads that share KV head g, so every key and value row is read once for all of
// them. The contiguous and paged forms and the split-key records are those of
// shaders/attention.wgsl (whose attention_combine merges the records).
//
// Entry point:
//   gqa_grouped  workgroup size 64. workgroup_index = (s * kv_heads + g) * splits + split.
//                Query row s sees keys 0..=past + s (past = t - s), or through its page-table
//                row and position when PAGED, cut to the window, and the item takes chunk
//                `split` of them (chunk_keys keys from the first). Each subgroup takes every
//                num_subgroups-th key of the chunk; its lanes split a head's elements in
//                pairs (lane l holds pairs l, l + lanes, ...: UPL of them, a pipeline constant
//                sized for half the adapter's smallest subgroup, since a device may run fewer
//                lanes than it reports; fewer still give NaN), so per key a lane
//                loads its pairs of k and v once and dots them with the GROUP heads' queries
//                it holds in registers; a score is a subgroupAdd, and each head keeps its own
//                online softmax (running max and sum, the same on every lane) and
//                accumulators. The subgroups then merge head by head in workgroup memory:
//                with one split the output row, else the chunk's record (max, sum, head_dim
//                unnormalised sums) at ((s * heads + h) * splits + split) * (head_dim + 2)
//                of the workspace.
//                K and V are read as 32-bit words: f32 values (bitcast), or with KV_F16 pairs
//                of f16 packed two to a word (pack2x16float's layout; unpack2x16float reads
//                them: no shader-f16 needed).
//
// Bindings (group 0): 0 uniform GqaParams, 1 q [s, heads * head_dim] f32,
//   2 k, 3 v [t, kv_heads * head_dim] (words), 4 out [s, heads * head_dim] or the workspace,
//   5 rows [s, 2] (i32, paged), 6 pages [seqs, pages_per_seq] (i32, paged).
//
// Rust mirror: GqaParams of src/gpu/kernels/attention.rs (the struct of
// shaders/attention.wgsl); offsets in elements (f32 or f16) from each binding's start.

struct GqaParams {
    s: u32,
    t: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    out_offset: u32,
    scale: f32,
    window: u32,
    splits: u32,
    chunk_keys: u32,
    rows_offset: u32,
    pages_offset: u32,
    page_size: u32,
    pages_per_seq: u32,
    seqs: u32,
    _pad0: u32,
    _pad1: u32,
}

override PAGED: bool = false;
override KV_F16: bool = false;
// Query heads per KV head (at most MAX_GROUP).
override GROUP: u32 = 1u;
// Pairs of a head's elements per lane (at most MAX_UPL).
override UPL: u32 = 1u;

const MAX_GROUP: u32 = 8u;
const MAX_UPL: u32 = 8u;
// Pairs of partial sums the workgroup merges at once: subgroups x head_dim / 2.
const MERGE_PAIRS: u32 = 1024u;

@group(0) @binding(0) var<uniform> gp: GqaParams;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> kw: array<u32>;
@group(0) @binding(3) var<storage, read_write> vw: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
@group(0) @binding(5) var<storage, read_write> paging_rows: array<i32>;
@group(0) @binding(6) var<storage, read_write> paging_pages: array<i32>;

var<workgroup> m_sg: array<f32, 64>;
var<workgroup> l_sg: array<f32, 64>;
var<workgroup> acc_sg: array<vec2<f32>, MERGE_PAIRS>;
var<workgroup> short_wg: u32;

// Elements e, e + 1 (e even) of k or v from element offset `at`.
fn pair_k(at: u32) -> vec2<f32> {
    if KV_F16 {
        return unpack2x16float(kw[at / 2u]);
    }
    return vec2<f32>(bitcast<f32>(kw[at]), bitcast<f32>(kw[at + 1u]));
}

fn pair_v(at: u32) -> vec2<f32> {
    if KV_F16 {
        return unpack2x16float(vw[at / 2u]);
    }
    return vec2<f32>(bitcast<f32>(vw[at]), bitcast<f32>(vw[at + 1u]));
}

// The cache row of key j of sequence seq: j itself, or its row in the paged pool.
fn pool_row(seq: u32, j: u32) -> u32 {
    if PAGED {
        let page = paging_pages[gp.pages_offset + seq * gp.pages_per_seq + j / gp.page_size];
        return u32(page) * gp.page_size + j % gp.page_size;
    }
    return j;
}

@compute @workgroup_size(64)
fn gqa_grouped(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) num_sg: u32,
) {
    // The lanes the subgroup really has (every invocation is active here: a device may run
    // fewer than the subgroup size it reports, and a subgroup larger than the workgroup has
    // only its 64 invocations).
    let lanes = min(subgroupAdd(1u), 64u);
    if lid == 0u {
        short_wg = 0u;
    }
    workgroupBarrier();
    // Uniform per workgroup (builtins and uniforms only): the early return keeps every
    // barrier below in uniform control flow.
    let item = workgroup_index(wid, nwg);
    if item >= gp.s * gp.kv_heads * gp.splits {
        return;
    }
    let split = item % gp.splits;
    let sg_item = item / gp.splits;
    let s = sg_item / gp.kv_heads;
    let g = sg_item % gp.kv_heads;
    let hd = gp.head_dim;
    let pairs = hd / 2u;
    // Too few lanes for the pairs their registers hold, or subgroups for the merge's
    // workgroup memory (the host sized both for half the adapter's smallest subgroup): the
    // results are NaN rather than wrong.
    if (lanes * UPL < pairs || num_sg * pairs > MERGE_PAIRS) && lane == 0u {
        short_wg = 1u;
    }
    // The keys the row sees, then this item's chunk of them.
    var last = gp.t - gp.s + s;
    var seq = 0u;
    var count = last + 1u;
    if PAGED {
        // A row outside the page table sees no keys (its output is NaN, as the reference
        // refuses it).
        let sq = paging_rows[gp.rows_offset + 2u * s];
        let p = paging_rows[gp.rows_offset + 2u * s + 1u];
        seq = u32(sq);
        last = u32(p);
        count = last + 1u;
        if sq < 0 || seq >= gp.seqs || p < 0 || last / gp.page_size >= gp.pages_per_seq {
            count = 0u;
        }
    }
    var first = 0u;
    if gp.window > 0u && last + 1u > gp.window {
        first = last + 1u - gp.window;
    }
    let lo = min(first + split * gp.chunk_keys, count);
    let end = lo + min(gp.chunk_keys, count - lo);

    // The GROUP queries' pairs this lane holds, scaled.
    var qr: array<vec2<f32>, 64>;
    let qb = gp.q_offset + s * gp.heads * hd + g * GROUP * hd;
    for (var h = 0u; h < GROUP; h++) {
        for (var i = 0u; i < UPL; i++) {
            let u = lane + lanes * i;
            if u < pairs {
                let at = qb + h * hd + 2u * u;
                qr[h * MAX_UPL + i] = vec2<f32>(q[at], q[at + 1u]) * gp.scale;
            }
        }
    }
    var acc: array<vec2<f32>, 64>;
    var m: array<f32, MAX_GROUP>;
    var l: array<f32, MAX_GROUP>;
    for (var h = 0u; h < GROUP; h++) {
        m[h] = F32_LOWEST;
    }
    let kv_row = gp.kv_heads * hd;
    for (var j = lo + sg_id; j < end; j += num_sg) {
        let row = pool_row(seq, j);
        let kb = gp.k_offset + row * kv_row + g * hd;
        let vb = gp.v_offset + row * kv_row + g * hd;
        var kp: array<vec2<f32>, MAX_UPL>;
        var vp: array<vec2<f32>, MAX_UPL>;
        for (var i = 0u; i < UPL; i++) {
            let u = lane + lanes * i;
            if u < pairs {
                kp[i] = pair_k(kb + 2u * u);
                vp[i] = pair_v(vb + 2u * u);
            }
        }
        for (var h = 0u; h < GROUP; h++) {
            var part = 0.0;
            for (var i = 0u; i < UPL; i++) {
                part += dot(qr[h * MAX_UPL + i], kp[i]);
            }
            let score = subgroupAdd(part);
            if score > m[h] {
                // A new running max: rescale what was summed so far.
                let corr = exp(m[h] - score);
                l[h] *= corr;
                for (var i = 0u; i < UPL; i++) {
                    acc[h * MAX_UPL + i] *= corr;
                }
                m[h] = score;
            }
            let wgt = exp(score - m[h]);
            l[h] += wgt;
            for (var i = 0u; i < UPL; i++) {
                acc[h * MAX_UPL + i] += wgt * vp[i];
            }
        }
    }

    // Head by head, the subgroups' partial softmaxes meet in workgroup memory.
    let rec_row = (s * gp.heads + g * GROUP) * gp.splits + split;
    for (var h = 0u; h < GROUP; h++) {
        if lane == 0u {
            m_sg[sg_id] = m[h];
            l_sg[sg_id] = l[h];
        }
        workgroupBarrier();
        var mx = F32_LOWEST;
        for (var i = 0u; i < num_sg; i++) {
            mx = max(mx, m_sg[i]);
        }
        var total = 0.0;
        for (var i = 0u; i < num_sg; i++) {
            total += l_sg[i] * exp(m_sg[i] - mx);
        }
        let f = exp(m[h] - mx);
        for (var i = 0u; i < UPL; i++) {
            let u = lane + lanes * i;
            if u < pairs {
                acc_sg[sg_id * pairs + u] = acc[h * MAX_UPL + i] * f;
            }
        }
        workgroupBarrier();
        let hq = g * GROUP + h;
        var ob = gp.out_offset + s * gp.heads * hd + hq * hd;
        var scale = 1.0 / total;
        if short_wg != 0u {
            scale = nan_f32();
        }
        if gp.splits > 1u {
            let rec = (rec_row + h * gp.splits) * (hd + 2u);
            ob = rec + 2u;
            scale = 1.0;
            if lid == 0u {
                dst[rec] = mx;
                dst[rec + 1u] = total;
            }
        }
        for (var u = lid; u < pairs; u += 64u) {
            var sum = vec2<f32>(0.0);
            for (var i = 0u; i < num_sg; i++) {
                sum += acc_sg[i * pairs + u];
            }
            dst[ob + 2u * u] = sum.x * scale;
            dst[ob + 2u * u + 1u] = sum.y * scale;
        }
        workgroupBarrier();
    }
}
