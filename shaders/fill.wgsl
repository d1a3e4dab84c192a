// Kernel family `fill`: write an affine ramp into a buffer.
//
// Bindings (group 0):
//   0: var<uniform> params: FillParams      — mirrored by `dynrt::gpu::FillParams` (#[repr(C)], 16 bytes)
//   1: var<storage, read_write> dst: array<f32>
//
// Entry points:
//   fill_affine: dst[i] = params.scale * f32(i) + params.bias for i < params.len
//
// Dispatch: workgroups of 64 along x; when more than 65535 workgroups are needed the grid
// wraps into y, and `params.row_elements` (= x workgroups * 64) linearises the index.

struct FillParams {
    len: u32,
    row_elements: u32,
    scale: f32,
    bias: f32,
}

@group(0) @binding(0) var<uniform> params: FillParams;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn fill_affine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * params.row_elements + gid.x;
    if (i >= params.len) {
        return;
    }
    dst[i] = params.scale * f32(i) + params.bias;
}
