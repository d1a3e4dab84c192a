// The next token from rows of logits (the `sample` op, src/graph/ops/sample.rs): greedy,
// full-vocabulary sampling (Gumbel-max) and top-k sampling, each row by its own parameters.
//
// Entry points (workgroup size 256; a row's vocabulary in chunks of CHUNK = 4096 logits,
// so a 262,144-token row is 64 workgroups):
//   sample_chunks  one workgroup per (row, chunk): the chunk's largest logit and its first
//                  index into region A; for a top-k row also the chunk's k best (value, then
//                  lower index) into region C.
//   sample_gumbel  one workgroup per (row, chunk), full-vocabulary rows only: the row's
//                  largest logit m from region A, then the chunk's best key
//                  logit / T + gumbel(seed, step, index) over the logits >= m + T ln(min_p)
//                  into region B.
//   sample_pick    one workgroup per row: greedy rows reduce A, full rows reduce B, top-k rows
//                  merge the chunks' lists of C into the k best, then draw; writes the token.
// Every entry point reads the row's mode from its parameters (loaded uniformly), so one set
// of three dispatches serves rows of any mode; a row that has nothing to do in a pass leaves
// at once.
//
// Bindings (group 0):
//   0 uniform  SampleParams (dynamic offset)
//   1 storage read_write  logits [rows, vocab] f32        (chunks, gumbel)
//   2 storage read_write  params [rows, 8] u32: temperature, top_k, top_p, min_p (f32 bits),
//                         seed lo, seed hi, step, 0
//   3 storage read_write  ws: the kernel workspace, regions A, B ([rows, chunks] pairs of
//                         value bits and index) and C ([rows, chunks, TOP_K_MAX] pairs)
//   4 storage read_write  tokens [rows] i32                (pick)
//
// Rust mirror (src/gpu/kernels/sample.rs, #[repr(C)], bytemuck::Pod):
//   struct SampleParams { rows: u32, vocab: u32, chunks: u32, logits_offset: u32,
//                         params_offset: u32, out_offset: u32, ws_max: u32, ws_key: u32,
//                         ws_top: u32, _pad: [u32; 3] }                        // 48 bytes
// Offsets are in 32-bit words from the start of each binding.
//
// Ties and NaN as the CPU's argmax: a larger value wins, an equal one at a lower index; NaN
// is never a candidate; a greedy row with nothing above -inf gives token 0. The random
// numbers are mix32 chained over (seed lo, seed hi, step, index) as in the reference.

struct SampleParams {
    rows: u32,
    vocab: u32,
    chunks: u32,
    logits_offset: u32,
    params_offset: u32,
    out_offset: u32,
    ws_max: u32,
    ws_key: u32,
    ws_top: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> sp: SampleParams;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> rowp: array<u32>;
@group(0) @binding(3) var<storage, read_write> ws: array<u32>;
@group(0) @binding(4) var<storage, read_write> tokens: array<i32>;

const WG: u32 = 256u;
const CHUNK: u32 = 4096u;
const PER: u32 = 16u; // CHUNK / WG
const TOP_K_MAX: u32 = 64u;
const NONE: u32 = 0xffffffffu;

const MODE_GREEDY: u32 = 0u;
const MODE_FULL: u32 = 1u;
const MODE_TOPK: u32 = 2u;

var<workgroup> red_v: array<f32, 256>;
var<workgroup> red_i: array<u32, 256>;
var<workgroup> wg_mode: u32;
var<workgroup> wg_k: u32;
var<workgroup> top_v: array<f32, 64>;
var<workgroup> top_i: array<u32, 64>;

fn mix32(v: u32) -> u32 {
    var x = v;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

fn random_u32(seed_lo: u32, seed_hi: u32, step: u32, i: u32) -> u32 {
    let h = mix32(seed_lo ^ 0x9e3779b9u);
    let h2 = mix32(h ^ seed_hi);
    let h3 = mix32(h2 ^ step);
    return mix32(h3 ^ i);
}

fn uniform01(r: u32) -> f32 {
    return (f32(r >> 8u) + 0.5) * (1.0 / 16777216.0);
}

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

fn param(row: u32, k: u32) -> u32 {
    return rowp[sp.params_offset + row * 8u + k];
}

fn param_f(row: u32, k: u32) -> f32 {
    return bitcast<f32>(param(row, k));
}

// The row's mode, and k for a top-k row (0 or above TOP_K_MAX: TOP_K_MAX).
fn mode_of(row: u32) -> u32 {
    let t = param_f(row, 0u);
    if !(t > 0.0) {
        return MODE_GREEDY;
    }
    if param(row, 1u) == 0u && param_f(row, 2u) >= 1.0 {
        return MODE_FULL;
    }
    return MODE_TOPK;
}

fn k_of(row: u32) -> u32 {
    let k = param(row, 1u);
    if k == 0u || k > TOP_K_MAX {
        return TOP_K_MAX;
    }
    return k;
}

// The workgroup's best (value, index) of every invocation's (v, i): red_v[0], red_i[0] after
// the call. Called in uniform control flow.
fn wg_best(lid: u32, v: f32, i: u32) {
    red_v[lid] = v;
    red_i[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            let ov = red_v[lid + s];
            let oi = red_i[lid + s];
            if better(ov, oi, red_v[lid], red_i[lid]) {
                red_v[lid] = ov;
                red_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
}

// Loads the row's mode and k into workgroup memory and returns them uniformly.
fn load_mode(lid: u32, row: u32) -> vec2<u32> {
    if lid == 0u {
        wg_mode = mode_of(row);
        wg_k = k_of(row);
    }
    let mode = workgroupUniformLoad(&wg_mode);
    let k = workgroupUniformLoad(&wg_k);
    return vec2<u32>(mode, k);
}

@compute @workgroup_size(256)
fn sample_chunks(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = workgroup_index(wid, nwg);
    let row = min(g / sp.chunks, sp.rows - 1u);
    let chunk = g % sp.chunks;
    let base = sp.logits_offset + row * sp.vocab;
    let start = chunk * CHUNK;
    let end = min(start + CHUNK, sp.vocab);
    let mk = load_mode(lid, row);
    var bv = -inf_f32();
    var bi = NONE;
    for (var j = 0u; j < PER; j++) {
        let i = start + lid + j * WG;
        if i < end {
            let v = logits[base + i];
            if better(v, i, bv, bi) {
                bv = v;
                bi = i;
            }
        }
    }
    wg_best(lid, bv, bi);
    let slot = row * sp.chunks + chunk;
    if lid == 0u && g < sp.rows * sp.chunks {
        ws[sp.ws_max + 2u * slot] = bitcast<u32>(red_v[0]);
        ws[sp.ws_max + 2u * slot + 1u] = red_i[0];
    }
    if mk.x != MODE_TOPK || g >= sp.rows * sp.chunks {
        return;
    }
    // The chunk's k best: k rounds, each taking the best not taken yet (bit j of `taken`:
    // this invocation's element start + lid + j * WG).
    var taken = 0u;
    for (var r = 0u; r < mk.y; r++) {
        workgroupBarrier();
        var cv = -inf_f32();
        var ci = NONE;
        for (var j = 0u; j < PER; j++) {
            let i = start + lid + j * WG;
            if i < end && (taken & (1u << j)) == 0u {
                let v = logits[base + i];
                if better(v, i, cv, ci) {
                    cv = v;
                    ci = i;
                }
            }
        }
        wg_best(lid, cv, ci);
        let wv = red_v[0];
        let wi = red_i[0];
        if wi != NONE && wi >= start && (wi - start) % WG == lid {
            taken |= 1u << ((wi - start) / WG);
        }
        if lid == 0u {
            let at = sp.ws_top + 2u * (slot * TOP_K_MAX + r);
            ws[at] = bitcast<u32>(wv);
            ws[at + 1u] = wi;
        }
    }
}

@compute @workgroup_size(256)
fn sample_gumbel(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = workgroup_index(wid, nwg);
    let row = min(g / sp.chunks, sp.rows - 1u);
    let chunk = g % sp.chunks;
    let mk = load_mode(lid, row);
    if mk.x != MODE_FULL || g >= sp.rows * sp.chunks {
        return;
    }
    // The row's largest logit, from every chunk's.
    var mv = -inf_f32();
    var mi = NONE;
    for (var c = lid; c < sp.chunks; c += WG) {
        let at = sp.ws_max + 2u * (row * sp.chunks + c);
        let v = bitcast<f32>(ws[at]);
        let i = ws[at + 1u];
        if better(v, i, mv, mi) {
            mv = v;
            mi = i;
        }
    }
    wg_best(lid, mv, mi);
    let m = red_v[0];
    let t = param_f(row, 0u);
    let min_p = param_f(row, 3u);
    var floor_v = -inf_f32();
    if min_p > 0.0 {
        floor_v = m + t * log(min_p);
    }
    let seed_lo = param(row, 4u);
    let seed_hi = param(row, 5u);
    let step = param(row, 6u);
    let base = sp.logits_offset + row * sp.vocab;
    let start = chunk * CHUNK;
    let end = min(start + CHUNK, sp.vocab);
    var bv = -inf_f32();
    var bi = NONE;
    for (var j = 0u; j < PER; j++) {
        let i = start + lid + j * WG;
        if i < end {
            let v = logits[base + i];
            if v >= floor_v {
                let u = uniform01(random_u32(seed_lo, seed_hi, step, i));
                let key = v / t - log(-log(u));
                if better(key, i, bv, bi) {
                    bv = key;
                    bi = i;
                }
            }
        }
    }
    workgroupBarrier();
    wg_best(lid, bv, bi);
    if lid == 0u {
        let at = sp.ws_key + 2u * (row * sp.chunks + chunk);
        ws[at] = bitcast<u32>(red_v[0]);
        ws[at + 1u] = red_i[0];
    }
}

// The best pair of region `region` over the row's chunks (the row's answer of that pass).
fn reduce_region(lid: u32, row: u32, region: u32) -> vec2<u32> {
    var bv = -inf_f32();
    var bi = NONE;
    for (var c = lid; c < sp.chunks; c += WG) {
        let at = region + 2u * (row * sp.chunks + c);
        let v = bitcast<f32>(ws[at]);
        let i = ws[at + 1u];
        if better(v, i, bv, bi) {
            bv = v;
            bi = i;
        }
    }
    wg_best(lid, bv, bi);
    return vec2<u32>(bitcast<u32>(red_v[0]), red_i[0]);
}

@compute @workgroup_size(256)
fn sample_pick(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = min(workgroup_index(wid, nwg), sp.rows - 1u);
    let mk = load_mode(lid, row);
    let greedy = reduce_region(lid, row, sp.ws_max);
    var token = greedy.y;
    if bitcast<f32>(greedy.x) == -inf_f32() || greedy.y == NONE {
        token = 0u;
    }
    if mk.x == MODE_FULL {
        workgroupBarrier();
        let best = reduce_region(lid, row, sp.ws_key);
        if best.y != NONE {
            token = best.y;
        }
    }
    if mk.x == MODE_TOPK {
        // Merge the chunks' lists: k rounds over every candidate, each taking the best not
        // taken yet (taken ones get the index NONE in the workspace).
        // Only the first k entries of each chunk's list were written for this row.
        let n = sp.chunks * mk.y;
        let first = sp.ws_top + 2u * row * sp.chunks * TOP_K_MAX;
        for (var r = 0u; r < mk.y; r++) {
            workgroupBarrier();
            var cv = -inf_f32();
            var ci = NONE;
            var cat = NONE;
            for (var c = lid; c < n; c += WG) {
                let at = first + 2u * ((c / mk.y) * TOP_K_MAX + c % mk.y);
                let v = bitcast<f32>(ws[at]);
                let i = ws[at + 1u];
                if i != NONE && better(v, i, cv, ci) {
                    cv = v;
                    ci = i;
                    cat = at;
                }
            }
            wg_best(lid, cv, ci);
            let wi = red_i[0];
            if wi != NONE && ci == wi {
                ws[cat + 1u] = NONE;
            }
            if lid == 0u {
                top_v[r] = red_v[0];
                top_i[r] = wi;
            }
        }
        workgroupBarrier();
        if lid == 0u && top_i[0] != NONE {
            token = draw(row, mk.y);
        }
    }
    if lid == 0u && workgroup_index(wid, nwg) < sp.rows {
        tokens[sp.out_offset + row] = i32(token);
    }
}

// The top-k draw over top_v/top_i (best first): probabilities relative to the first, the
// top-p and min-p prefixes, one uniform (as `draw` of the reference).
fn draw(row: u32, k: u32) -> u32 {
    let t = param_f(row, 0u);
    let top_p = param_f(row, 2u);
    let min_p = param_f(row, 3u);
    let v0 = top_v[0];
    var n = 0u;
    var total = 0.0;
    for (var j = 0u; j < k; j++) {
        if top_i[j] == NONE {
            break;
        }
        let p = exp((top_v[j] - v0) / t);
        top_v[j] = p;
        total += p;
        n = j + 1u;
    }
    var keep = n;
    if top_p < 1.0 {
        var acc = 0.0;
        for (var j = 0u; j < n; j++) {
            acc += top_v[j] / total;
            if acc >= top_p {
                keep = min(keep, j + 1u);
                break;
            }
        }
    }
    if min_p > 0.0 {
        for (var j = 0u; j < n; j++) {
            if top_v[j] < min_p {
                keep = min(keep, max(j, 1u));
                break;
            }
        }
    }
    var mass = 0.0;
    for (var j = 0u; j < keep; j++) {
        mass += top_v[j];
    }
    let u = uniform01(random_u32(param(row, 4u), param(row, 5u), param(row, 6u), NONE)) * mass;
    var acc = 0.0;
    for (var j = 0u; j < keep; j++) {
        acc += top_v[j];
        if u < acc {
            return top_i[j];
        }
    }
    return top_i[keep - 1u];
}
