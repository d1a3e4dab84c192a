// The attention family of a llama-style decoder: rotary position embedding on adjacent pairs
// or halves, and causal grouped-query attention over a sequence-major KV cache.
//
// Entry points:
//   attention_rope  workgroup size 256, one invocation per pair (x[a], x[b]) of x [rows,
//                   width]: pair j of a head is a = 2j, b = 2j + 1 when interleaved, else
//                   a = j, b = j + rope_dim / 2 (halves) for j < rope_dim / 2 and 2j, 2j + 1
//                   (passed through) beyond; out = (x0 cos - x1 sin, x0 sin + x1 cos) with cos/sin of
//                   the row's position p = hi * block + lo summed from the table's rows lo
//                   and block + hi (two levels), for the first rope_dim elements of each
//                   head; later elements pass through; a position outside the table writes
//                   zeros. Invocation index: linear_index of the prelude.
//   attention_gqa   workgroup size WG (64, or 16 on software adapters), one workgroup per
//                   (query row s, head h): the prelude's workgroup_index = s * heads + h.
//                   Query s sees keys 0..=past + s (past = t - s) of KV head
//                   h / (heads / kv_heads). Each invocation takes keys lid, lid + WG, ... and
//                   keeps its own online softmax (running max m, sum l, accumulator
//                   acc[head_dim]) so any number of keys works with registers of one head;
//                   the WG partial results are then merged
//                   in workgroup memory (max, rescaled sums, then the accumulators 32 dims at a
//                   time). head_dim <= 512 (MAX_D), CHUNK = 128 output dims per workgroup
//                   (a head of D dims takes ceil(D / CHUNK) workgroups per row).
//                   Split keys (splits > 1, flash-decoding): the keys a row sees are cut
//                   into splits chunks of chunk_keys (from the row's first key), one
//                   workgroup per (s, h, split, dim chunk): workgroup_index =
//                   ((s * heads + h) * splits + split) * ceil(D / CHUNK) + dim chunk. Each
//                   writes its chunk's partial softmax to the workspace (binding 4) instead
//                   of the output: record r = (s * heads + h) * splits + split at r * (D + 2)
//                   holds the chunk's max m, its sum l of exp(score - m), then D sums of
//                   exp(score - m) * v (not divided by l). An empty chunk writes m =
//                   F32_LOWEST, l = 0 and zeros.
//                   With KV_F16 it reads k and v stored as f16 pairs (unpack2x16float; no
//                   shader-f16 needed).
//   attention_gqa4  the same with vec4 loads and vec4 registers, when head_dim and the q, k, v
//                   element offsets are multiples of 4 (the usual case): fewer loads, which on
//                   lavapipe cost the same for a vec4 as for an f32. Sharing each K/V load
//                   between the query heads of a group through per-invocation arrays is
//                   slower there: the arrays it needs spill.
//   attention_combine  workgroup size 64, one workgroup per (s, h) (workgroup_index = s * heads
//                   + h) after a split-key attention_gqa(4): merges the row's splits records
//                   (max M of the m, weights exp(m - M)) into out, one invocation per dim.
//   PAGED (a pipeline constant of attention_gqa(4)): keys and values are pools of pages
//                   (paged_attention); query row s reads its page-table row and position p
//                   from binding 5 (rows [S, 2]) and sees positions 0..=p (within the
//                   window), position j at pool row pages[seq, j / page_size] * page_size
//                   + j % page_size (binding 6, the page table [seqs, pages_per_seq]). Off,
//                   bindings 5 and 6 are the encoder's pad and never read. Split keys work
//                   the same (chunk_keys from the most keys a page-table row holds).
//   attention_scatter  workgroup size 256, one invocation per 32-bit word of rows [S, W]
//                   (an f32, or two f16: W counts words): row i is written to row slots[i]
//                   of the pool (binding 4: in place on the state's buffer) as bits; a slot
//                   outside the pool is skipped.
//
// Bindings (group 0):
//   attention_rope: 0 uniform RopeParams, 1 x [rows, width], 2 positions [rows] (i32),
//                   3 table [block + blocks, rope_dim], 4 out [rows, width]
//   attention_gqa(4): 0 uniform GqaParams, 1 q [s, heads * head_dim],
//                   2 k [t, kv_heads * head_dim], 3 v [t, kv_heads * head_dim],
//                   4 out [s, heads * head_dim], or the workspace when splits > 1
//                   5 rows [s, 2] (i32, paged), 6 pages [seqs, pages_per_seq] (i32, paged)
//   attention_combine: 0 uniform GqaParams, 1 the workspace, 4 out [s, heads * head_dim]
//   attention_scatter: 0 uniform ScatterParams, 1 rows [S, W], 2 slots [S] (i32), 4 pool
//
// Rust mirrors (src/gpu/kernels/attention.rs, #[repr(C)], bytemuck::Pod):
//   struct RopeParams { rows: u32, width: u32, head_dim: u32, rope_dim: u32,
//                       table_rows: u32, x_offset: u32, pos_offset: u32, table_offset: u32,
//                       out_offset: u32, block: u32, interleaved: u32, _pad: u32 } // 48 bytes
//   struct GqaParams { s: u32, t: u32, heads: u32, kv_heads: u32, head_dim: u32,
//                      q_offset: u32, k_offset: u32, v_offset: u32, out_offset: u32,
//                      scale: f32, window: u32, splits: u32, chunk_keys: u32,
//                      rows_offset: u32, pages_offset: u32, page_size: u32,
//                      pages_per_seq: u32, seqs: u32, _pad: [u32; 2] }           // 80 bytes
//   struct ScatterParams { rows: u32, width: u32, pool_rows: u32, src_offset: u32,
//                          slot_offset: u32, dst_offset: u32, _pad: [u32; 2] }   // 32 bytes
// Offsets are in elements from the start of each binding.

struct RopeParams {
    rows: u32,
    width: u32,
    head_dim: u32,
    rope_dim: u32,
    table_rows: u32,
    x_offset: u32,
    pos_offset: u32,
    table_offset: u32,
    out_offset: u32,
    block: u32,
    interleaved: u32,
    _pad: u32,
}

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

struct ScatterParams {
    rows: u32,
    width: u32,
    pool_rows: u32,
    src_offset: u32,
    slot_offset: u32,
    dst_offset: u32,
    _pad0: u32,
    _pad1: u32,
}

// Paged attention (paged_attention op): keys and values are read through a page table.
// Off, the bindings 5 and 6 are the encoder's pad and never read.
override PAGED: bool = false;
// Keys and values stored as f16, two to a 32-bit word in pack2x16float's layout (offsets and
// strides count f16 elements): attention_gqa only.
override KV_F16: bool = false;

// Element i of k: an f32, or an f16 of a packed pair.
fn k_at(i: u32) -> f32 {
    if KV_F16 {
        return unpack2x16float(kw[i / 2u])[i % 2u];
    }
    return bitcast<f32>(kw[i]);
}

// Element i of v, as k_at.
fn v_at(i: u32) -> f32 {
    if KV_F16 {
        return unpack2x16float(vw[i / 2u])[i % 2u];
    }
    return bitcast<f32>(vw[i]);
}

@group(0) @binding(0) var<uniform> rp: RopeParams;
@group(0) @binding(0) var<uniform> gp: GqaParams;
@group(0) @binding(0) var<uniform> sp: ScatterParams;

@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> positions: array<i32>;
@group(0) @binding(3) var<storage, read_write> table: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

@group(0) @binding(1) var<storage, read_write> q: array<f32>;
// The scalar entry reads k and v as words: f32 values, or f16 pairs with KV_F16.
@group(0) @binding(2) var<storage, read_write> kw: array<u32>;
@group(0) @binding(3) var<storage, read_write> vw: array<u32>;

@group(0) @binding(1) var<storage, read_write> q4: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> k4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> v4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> paging_rows: array<i32>;
// attention_scatter's rows and pool, moved as bits.
@group(0) @binding(1) var<storage, read_write> rows_w: array<u32>;
@group(0) @binding(4) var<storage, read_write> pool_w: array<u32>;
@group(0) @binding(6) var<storage, read_write> paging_pages: array<i32>;

@compute @workgroup_size(256)
fn attention_rope(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let pair = linear_index(wid, nwg, lid);
    let half_width = rp.width / 2u;
    if pair >= rp.rows * half_width {
        return;
    }
    let row = pair / half_width;
    let in_row = pair % half_width;
    let half_head = rp.head_dim / 2u;
    let half_rope = rp.rope_dim / 2u;
    let j = in_row % half_head;
    var a = 2u * j;
    var b = a + 1u;
    if rp.interleaved == 0u && j < half_rope {
        a = j;
        b = j + half_rope;
    }
    let head = row * rp.width + (in_row / half_head) * rp.head_dim;
    let xa = rp.x_offset + head + a;
    let xb = rp.x_offset + head + b;
    let oa = rp.out_offset + head + a;
    let ob = rp.out_offset + head + b;
    let p = positions[rp.pos_offset + row];
    // Two-level table: p = hi * block + lo, angle(p) = angle(lo) + angle(hi * block).
    if p < 0 || u32(p) / rp.block >= rp.table_rows - rp.block {
        dst[oa] = 0.0;
        dst[ob] = 0.0;
        return;
    }
    let x0 = x[xa];
    let x1 = x[xb];
    if j >= half_rope {
        dst[oa] = x0;
        dst[ob] = x1;
        return;
    }
    let lo = rp.table_offset + (u32(p) % rp.block) * rp.rope_dim + 2u * j;
    let hi = rp.table_offset + (rp.block + u32(p) / rp.block) * rp.rope_dim + 2u * j;
    let c = table[lo] * table[hi] - table[lo + 1u] * table[hi + 1u];
    let sn = table[lo + 1u] * table[hi] + table[lo] * table[hi + 1u];
    dst[oa] = x0 * c - x1 * sn;
    dst[ob] = x0 * sn + x1 * c;
}

// Invocations of a workgroup of attention_gqa(4), a power of two from 16 to 64 (the host's
// choice per adapter, `workgroup_size` in src/gpu/kernels/attention.rs): 64 on GPUs, 16 on
// software adapters, whose merge of the partial softmaxes through workgroup memory and
// barriers then costs a fraction of 64's (on lavapipe that merge was half of a decode step's
// attention at short contexts).
override WG: u32 = 64u;
// attention_combine's workgroup (it is not specialised on WG).
const COMBINE_WG: u32 = 64u;
// Output dims one workgroup accumulates (its registers): a head of D dims takes
// ceil(D / CHUNK) workgroups, each computing every score and its own CHUNK dims of the sum.
const CHUNK: u32 = 128u;
// Largest head: the query is shared by the workgroup's invocations in q_sh / q4_sh.
const MAX_D: u32 = 512u;

var<workgroup> m_sh: array<f32, 64>;
var<workgroup> l_sh: array<f32, 64>;
var<workgroup> acc_sh: array<f32, 2048>;
var<workgroup> q_sh: array<f32, MAX_D>;
var<workgroup> q4_sh: array<vec4<f32>, 128>;

// Merges the WG partial softmaxes of a workgroup (each invocation's running max m and sum
// l): returns this invocation's rescale factor exp(m - max) and 1 / (the rescaled total).
// Called by every invocation in uniform control flow.
fn merge_softmax(lid: u32, m: f32, l: f32) -> vec2<f32> {
    m_sh[lid] = m;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if lid < stride {
            m_sh[lid] = max(m_sh[lid], m_sh[lid + stride]);
        }
        workgroupBarrier();
    }
    let f = exp(m - m_sh[0]);
    l_sh[lid] = l * f;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if lid < stride {
            l_sh[lid] += l_sh[lid + stride];
        }
        workgroupBarrier();
    }
    return vec2<f32>(f, 1.0 / l_sh[0]);
}

// After every invocation wrote its rescaled accumulators of dims c..c+32 to acc_sh: sums
// each dim over the WG invocations into the output row at ob, scaled by inv.
fn store_dims(lid: u32, c: u32, hd: u32, ob: u32, inv: f32) {
    workgroupBarrier();
    for (var d = lid; d < 32u && c + d < hd; d += WG) {
        var sum = 0.0;
        for (var i = 0u; i < WG; i++) {
            sum += acc_sh[i * 32u + d];
        }
        dst[ob + c + d] = sum * inv;
    }
    workgroupBarrier();
}

// One workgroup's item: query row s, head h, its chunk of output dims [c0, c1) and of keys
// [first, end), and where its result goes: element ob of dst (the output row, or the dims of
// its workspace record) scaled by 1 / l when norm, the record's m and l at rec otherwise.
struct GqaItem {
    s: u32,
    seq: u32,
    h: u32,
    g: u32,
    c0: u32,
    c1: u32,
    first: u32,
    end: u32,
    ob: u32,
    rec: u32,
    norm: bool,
}

// The output dims [c0, c1) of workgroup item `item` (GqaItem's c0 and c1).
fn item_dims(item: u32) -> vec2<u32> {
    let c0 = (item % ((gp.head_dim + CHUNK - 1u) / CHUNK)) * CHUNK;
    return vec2<u32>(c0, min(c0 + CHUNK, gp.head_dim));
}

fn gqa_item(item: u32) -> GqaItem {
    let chunks = (gp.head_dim + CHUNK - 1u) / CHUNK;
    let c0 = (item % chunks) * CHUNK;
    let shp = item / chunks;
    let split = shp % gp.splits;
    let sh = shp / gp.splits;
    let s = sh / gp.heads;
    let h = sh % gp.heads;
    var last = gp.t - gp.s + s;
    var seq = 0u;
    var count = last + 1u;
    if PAGED {
        // The row's page-table row and absolute position; a row outside the table sees
        // no keys (its output is NaN, as the reference refuses it).
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
    let rec = shp * (gp.head_dim + 2u);
    var ob = gp.out_offset + s * gp.heads * gp.head_dim + h * gp.head_dim;
    if gp.splits > 1u {
        ob = rec + 2u;
    }
    return GqaItem(s, seq, h, h / (gp.heads / gp.kv_heads), c0, min(c0 + CHUNK, gp.head_dim), lo,
        end, ob, rec, gp.splits == 1u);
}

// The cache row of key j of the item's sequence: j itself, or its row in the paged pool.
fn kv_row(seq: u32, j: u32) -> u32 {
    if PAGED {
        let page = paging_pages[gp.pages_offset + seq * gp.pages_per_seq + j / gp.page_size];
        return u32(page) * gp.page_size + j % gp.page_size;
    }
    return j;
}

// After merge_softmax: the scale of the stored sums (1 / l, or 1 for a partial record), and
// a partial record's m and l (written once per record, by its first dim chunk).
fn finish_item(lid: u32, it: GqaItem, inv: f32) -> f32 {
    if it.norm {
        return inv;
    }
    if lid == 0u && it.c0 == 0u {
        dst[it.rec] = m_sh[0];
        dst[it.rec + 1u] = l_sh[0];
    }
    return 1.0;
}

@compute @workgroup_size(WG)
fn attention_gqa(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Uniform per workgroup (builtins and uniforms only): the early return keeps every
    // barrier below in uniform control flow.
    let item = workgroup_index(wid, nwg);
    let chunks = (gp.head_dim + CHUNK - 1u) / CHUNK;
    if item >= gp.s * gp.heads * gp.splits * chunks {
        return;
    }
    let it = gqa_item(item);
    let hd = gp.head_dim;
    let kw = gp.kv_heads * hd;
    let qb = gp.q_offset + it.s * gp.heads * hd + it.h * hd;
    for (var e = lid; e < hd; e += WG) {
        q_sh[e] = q[qb + e] * gp.scale;
    }
    workgroupBarrier();

    var acc: array<f32, CHUNK>;
    let n = it.c1 - it.c0;
    for (var e = 0u; e < n; e++) {
        acc[e] = 0.0;
    }
    var m = F32_LOWEST;
    var l = 0.0;
    for (var j = it.first + lid; j < it.end; j += WG) {
        let row = kv_row(it.seq, j);
        let kb = gp.k_offset + row * kw + it.g * hd;
        var score = 0.0;
        for (var e = 0u; e < hd; e++) {
            score += q_sh[e] * k_at(kb + e);
        }
        if score > m {
            // A new running max: rescale what was summed so far.
            let corr = exp(m - score);
            l *= corr;
            for (var e = 0u; e < n; e++) {
                acc[e] *= corr;
            }
            m = score;
        }
        let w = exp(score - m);
        l += w;
        let vb = gp.v_offset + row * kw + it.g * hd + it.c0;
        for (var e = 0u; e < n; e++) {
            acc[e] += w * v_at(vb + e);
        }
    }

    let fi = merge_softmax(lid, m, l);
    let inv = finish_item(lid, it, fi.y);
    // The loop's bounds from the uniform item alone (its barriers need uniform control
    // flow; `it` holds values read from storage when PAGED).
    let dims = item_dims(item);
    for (var c = dims.x; c < dims.y; c += 32u) {
        for (var e = 0u; e < 32u; e++) {
            if c + e < it.c1 {
                acc_sh[lid * 32u + e] = acc[c - it.c0 + e] * fi.x;
            }
        }
        store_dims(lid, c, it.c1, it.ob, inv);
    }
}

// attention_gqa with vec4 loads and registers: head_dim and the q/k/v element offsets are
// multiples of 4 (offsets in the uniform are still in f32 elements).
@compute @workgroup_size(WG)
fn attention_gqa4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let item = workgroup_index(wid, nwg);
    let chunks = (gp.head_dim + CHUNK - 1u) / CHUNK;
    if item >= gp.s * gp.heads * gp.splits * chunks {
        return;
    }
    let it = gqa_item(item);
    let hd4 = gp.head_dim / 4u;
    let kw4 = gp.kv_heads * hd4;
    let qb = gp.q_offset / 4u + it.s * gp.heads * hd4 + it.h * hd4;
    for (var e = lid; e < hd4; e += WG) {
        q4_sh[e] = q4[qb + e] * gp.scale;
    }
    workgroupBarrier();

    var acc: array<vec4<f32>, 32>;
    let c04 = it.c0 / 4u;
    let n4 = (it.c1 - it.c0) / 4u;
    for (var e = 0u; e < n4; e++) {
        acc[e] = vec4<f32>(0.0);
    }
    var m = F32_LOWEST;
    var l = 0.0;
    for (var j = it.first + lid; j < it.end; j += WG) {
        let row = kv_row(it.seq, j);
        let kb = gp.k_offset / 4u + row * kw4 + it.g * hd4;
        var score = 0.0;
        for (var e = 0u; e < hd4; e++) {
            score += dot(q4_sh[e], k4[kb + e]);
        }
        if score > m {
            let corr = exp(m - score);
            l *= corr;
            for (var e = 0u; e < n4; e++) {
                acc[e] *= corr;
            }
            m = score;
        }
        let w = exp(score - m);
        l += w;
        let vb = gp.v_offset / 4u + row * kw4 + it.g * hd4 + c04;
        for (var e = 0u; e < n4; e++) {
            acc[e] += w * v4[vb + e];
        }
    }

    let fi = merge_softmax(lid, m, l);
    let inv = finish_item(lid, it, fi.y);
    // The loop's bounds from the uniform item alone (its barriers need uniform control
    // flow; `it` holds values read from storage when PAGED).
    let dims = item_dims(item);
    for (var c = dims.x; c < dims.y; c += 32u) {
        for (var e = 0u; e < 8u; e++) {
            let i4 = (c - it.c0) / 4u + e;
            if i4 < n4 {
                let a = acc[i4] * fi.x;
                acc_sh[lid * 32u + e * 4u] = a.x;
                acc_sh[lid * 32u + e * 4u + 1u] = a.y;
                acc_sh[lid * 32u + e * 4u + 2u] = a.z;
                acc_sh[lid * 32u + e * 4u + 3u] = a.w;
            }
        }
        store_dims(lid, c, it.c1, it.ob, inv);
    }
}

// The reduction of split-key attention: out[s, h, d] = sum_i exp(m_i - M) * acc_i[d] /
// sum_i exp(m_i - M) * l_i over the row's records i (M = max_i m_i; empty chunks weigh 0).
@compute @workgroup_size(COMBINE_WG)
fn attention_combine(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let sh = workgroup_index(wid, nwg);
    if sh >= gp.s * gp.heads {
        return;
    }
    let hd = gp.head_dim;
    let stride = hd + 2u;
    let base = sh * gp.splits * stride;
    var mx = F32_LOWEST;
    for (var i = 0u; i < gp.splits; i++) {
        mx = max(mx, part[base + i * stride]);
    }
    var l = 0.0;
    for (var i = 0u; i < gp.splits; i++) {
        let r = base + i * stride;
        l += part[r + 1u] * exp(part[r] - mx);
    }
    let ob = gp.out_offset + sh * hd;
    for (var d = lid; d < hd; d += COMBINE_WG) {
        var sum = 0.0;
        for (var i = 0u; i < gp.splits; i++) {
            let r = base + i * stride;
            sum += part[r + 2u + d] * exp(part[r] - mx);
        }
        dst[ob + d] = sum / l;
    }
}

// Rows written into their slots of a pool (scatter_rows, in place on the state buffer):
// dst[slot[i], :] = x[i, :]; a slot outside the pool is skipped. One invocation per element.
@compute @workgroup_size(256)
fn attention_scatter(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= sp.rows * sp.width {
        return;
    }
    let row = i / sp.width;
    let slot = positions[sp.slot_offset + row];
    if slot < 0 || u32(slot) >= sp.pool_rows {
        return;
    }
    pool_w[sp.dst_offset + u32(slot) * sp.width + i % sp.width] = rows_w[sp.src_offset + i];
}
