//! Run one op on the GPU with fresh buffers: the kernel tests' and `dynrt bench kernels`' way
//! in (native only: it blocks on the device).

pub use super::{from_device_bytes, to_device_bytes};
use super::{Kernels, Operand, TensorRef, UniformArena};
use crate::graph::Op;
use crate::shape::{DType, Shape};

/// Why [`run_op`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunOpError {
    /// Encoding was refused.
    #[error(transparent)]
    Kernel(#[from] super::KernelError),
    /// The device reported an error (validation, out of memory) or the readback failed.
    #[error("device error: {message}")]
    Device {
        /// What the device said.
        message: String,
    },
}

/// A host tensor for [`run_op`]: shape, element type, and the values carried as f32 (integer
/// tensors hold exact integers, as in [`crate::graph::reference`]).
#[derive(Debug, Clone)]
pub struct HostTensor {
    /// Shape.
    pub shape: Shape,
    /// Element type on the device (f32, i32 or u32).
    pub dtype: DType,
    /// Values, row-major.
    pub values: Vec<f32>,
}

/// Runs `op` once: places every input and the output in one buffer (each at a multiple of
/// 256 bytes plus `skew_bytes`, a multiple of 4 that exercises unaligned tensor offsets),
/// fills the output with NaN bits first so unwritten elements show, dispatches, and reads the
/// output back.
///
/// # Errors
/// [`RunOpError::Kernel`] when encoding is refused, [`RunOpError::Device`] for device errors.
// The arguments are the op, its operands and where to put them; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub fn run_op(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    kernels: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    output_shape: &Shape,
    output_dtype: DType,
    skew_bytes: u64,
) -> Result<Vec<f32>, RunOpError> {
    let dev_err = |m: String| RunOpError::Device { message: m };
    let size_of = |s: &Shape| -> Result<u64, RunOpError> {
        s.size_bytes(DType::F32).map_err(|e| dev_err(e.to_string()))
    };
    let mut offsets = Vec::new();
    let mut at = 0u64;
    let mut sizes: Vec<u64> = inputs
        .iter()
        .map(|t| size_of(&t.shape))
        .collect::<Result<_, _>>()?;
    sizes.push(size_of(output_shape)?);
    for &s in &sizes {
        let off = at + skew_bytes;
        offsets.push(off);
        at = (off + s.max(4)).div_ceil(256) * 256;
    }
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let arena = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("run_op arena"),
        size: at.max(256),
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    for (t, &off) in inputs.iter().zip(&offsets) {
        let bytes = to_device_bytes(&t.values, t.dtype);
        if !bytes.is_empty() {
            queue.write_buffer(&arena, off, &bytes);
        }
    }
    let out_off = offsets[inputs.len()];
    let out_size = sizes[inputs.len()];
    if out_size > 0 {
        queue.write_buffer(&arena, out_off, &vec![0xFF; out_size as usize]);
    }
    let mut uniforms = UniformArena::new(device);
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("run_op"),
    });
    {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(op.name()),
            timestamp_writes: None,
        });
        let operands: Vec<Operand<'_>> = inputs
            .iter()
            .zip(&offsets)
            .zip(&sizes)
            .map(|((t, &off), &s)| Operand {
                tensor: TensorRef {
                    buffer: &arena,
                    offset_bytes: off,
                    size_bytes: s,
                },
                shape: &t.shape,
                dtype: t.dtype,
            })
            .collect();
        let out = Operand {
            tensor: TensorRef {
                buffer: &arena,
                offset_bytes: out_off,
                size_bytes: out_size,
            },
            shape: output_shape,
            dtype: output_dtype,
        };
        kernels.encode(&mut pass, &mut uniforms, op, &operands, &out)?;
    }
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("run_op readback"),
        size: out_size.max(4),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    if out_size > 0 {
        encoder.copy_buffer_to_buffer(&arena, out_off, &staging, 0, out_size);
    }
    uniforms.flush(queue);
    queue.submit([encoder.finish()]);
    if let Some(e) = pollster::block_on(oom.pop()) {
        return Err(dev_err(e.to_string()));
    }
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(dev_err(e.to_string()));
    }
    if out_size == 0 {
        return Ok(Vec::new());
    }
    Ok(from_device_bytes(
        &read_back(device, &staging)?,
        output_dtype,
    ))
}

/// Maps a `MAP_READ` buffer whose copies were submitted, waits for the device, and returns
/// its bytes (the buffer is unmapped again).
fn read_back(device: &wgpu::Device, staging: &wgpu::Buffer) -> Result<Vec<u8>, RunOpError> {
    let dev_err = |m: String| RunOpError::Device { message: m };
    let (tx, rx) = std::sync::mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| dev_err(e.to_string()))?;
    rx.recv()
        .map_err(|e| dev_err(e.to_string()))?
        .map_err(|e| dev_err(e.to_string()))?;
    let bytes = staging
        .get_mapped_range(..)
        .map_err(|e| dev_err(format!("{e:?}")))?
        .to_vec();
    staging.unmap();
    Ok(bytes)
}

/// Runs a whole graph on the GPU the simple way: every node's output gets its own range of one
/// arena buffer (no reuse), inputs and constants are uploaded, all kernels go into one compute
/// pass of one submit, and the outputs are read back in the order they were marked. A
/// correctness yardstick for the memory-managed runtime, not a runtime.
///
/// # Errors
/// [`RunGraphError::Graph`] for bad inputs or failed shape inference,
/// [`RunGraphError::Node`] when a node's kernel cannot be encoded, [`RunGraphError::Op`] for
/// device failures.
pub fn run_graph(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    kernels: &mut Kernels,
    graph: &crate::graph::Graph,
    inputs: &[(&str, Shape, Vec<f32>)],
) -> Result<Vec<(Shape, Vec<f32>)>, RunGraphError> {
    let given: Vec<(&str, &Shape)> = inputs.iter().map(|(l, s, _)| (*l, s)).collect();
    let bindings = graph.bind(&given)?;
    let inferred = graph.infer_shapes(&bindings)?;
    let dev_err = |m: String| RunGraphError::Op(RunOpError::Device { message: m });
    let mut offsets = vec![0u64; graph.len()];
    let mut sizes = vec![0u64; graph.len()];
    let mut at = 0u64;
    for id in graph.ids() {
        let node = graph.node(id);
        let size = inferred.shapes[id.index()]
            .size_bytes(node.dtype)
            .map_err(|e| dev_err(e.to_string()))?;
        offsets[id.index()] = at;
        sizes[id.index()] = size;
        at = (at + size.max(4)).div_ceil(256) * 256;
    }
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let arena = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("run_graph arena"),
        size: at.max(256),
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    for id in graph.ids() {
        let node = graph.node(id);
        let values: Option<&[f32]> = match &node.op {
            Op::Constant { data, .. } => Some(data),
            Op::Input { .. } => inputs
                .iter()
                .find(|(l, _, _)| *l == node.label)
                .map(|(_, _, v)| v.as_slice()),
            _ => None,
        };
        if let Some(v) = values {
            if v.len() as u64 * 4 != sizes[id.index()] {
                return Err(RunGraphError::Graph(crate::graph::GraphError::DataLength {
                    node: node.label.clone(),
                    shape: inferred.shapes[id.index()].clone(),
                    expected: sizes[id.index()] / 4,
                    got: v.len(),
                }));
            }
            if !v.is_empty() {
                queue.write_buffer(&arena, offsets[id.index()], &to_device_bytes(v, node.dtype));
            }
        }
    }
    let mut uniforms = UniformArena::new(device);
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("run_graph"),
    });
    {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("run_graph"),
            timestamp_writes: None,
        });
        let operand = |id: crate::graph::NodeId| Operand {
            tensor: TensorRef {
                buffer: &arena,
                offset_bytes: offsets[id.index()],
                size_bytes: sizes[id.index()],
            },
            shape: &inferred.shapes[id.index()],
            dtype: graph.node(id).dtype,
        };
        for &id in graph.order() {
            let node = graph.node(id);
            if matches!(node.op, Op::Input { .. } | Op::Constant { .. }) {
                continue;
            }
            let ins: Vec<Operand<'_>> = node.inputs.iter().map(|&i| operand(i)).collect();
            kernels
                .encode(&mut pass, &mut uniforms, &node.op, &ins, &operand(id))
                .map_err(|e| RunGraphError::Node {
                    node: node.label.clone(),
                    source: e,
                })?;
        }
    }
    let total: u64 = graph
        .outputs()
        .iter()
        .map(|o| sizes[o.index()].div_ceil(4) * 4)
        .sum();
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("run_graph readback"),
        size: total.max(4),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut at = 0;
    for o in graph.outputs() {
        let s = sizes[o.index()];
        if s > 0 {
            encoder.copy_buffer_to_buffer(&arena, offsets[o.index()], &staging, at, s);
        }
        at += s.div_ceil(4) * 4;
    }
    uniforms.flush(queue);
    queue.submit([encoder.finish()]);
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(dev_err(e.to_string()));
    }
    let view = read_back(device, &staging)?;
    let mut out = Vec::new();
    let mut at = 0usize;
    for o in graph.outputs() {
        let s = sizes[o.index()] as usize;
        out.push((
            inferred.shapes[o.index()].clone(),
            from_device_bytes(&view[at..at + s], graph.node(*o).dtype),
        ));
        at += s.div_ceil(4) * 4;
    }
    Ok(out)
}

/// Why [`run_graph`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunGraphError {
    /// The graph or its inputs were rejected.
    #[error(transparent)]
    Graph(#[from] crate::graph::GraphError),
    /// A node's kernel could not be encoded.
    #[error("node `{node}`: {source}")]
    Node {
        /// Label of the node.
        node: String,
        /// Why.
        source: super::KernelError,
    },
    /// A device failure.
    #[error(transparent)]
    Op(#[from] RunOpError),
}
