//! Run one op, or a whole graph the simple way, on the GPU with fresh engine buffers: the
//! kernel tests' and `dynrt-bench kernels`' way in (native only: it blocks on the device).
//! Every buffer comes from the [`Engine`] (counted like the runtime's).

pub use crate::tensor::HostTensor;

use super::{KernelError, Kernels, Operand, TensorRef, UniformArena, WeightLayout};
use crate::gpu::{AllocError, Buffer, BufferDesc, Engine, Frame};
use crate::graph::Op;
use crate::memory::AllocKind;
use crate::shape::{DType, Shape};

/// Why [`run_op`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunOpError {
    /// Encoding was refused.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The device reported an error (validation, out of memory) or a transfer failed.
    #[error("device error: {message}")]
    Device {
        /// What the device said.
        message: String,
    },
}

fn dev_err(e: impl std::fmt::Display) -> RunOpError {
    RunOpError::Device {
        message: e.to_string(),
    }
}

/// A tensor's byte range with its last word: at least one word (the arena gives every tensor
/// that much), a multiple of 4.
fn word_padded(bytes: u64) -> u64 {
    bytes.div_ceil(4).max(1) * 4
}

/// Bytes rounded up to the copy alignment.
fn pad4(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes.resize(bytes.len().div_ceil(4) * 4, 0);
    bytes
}

/// One arena holding every tensor at a multiple of 256 bytes plus `skew_bytes`.
fn arena(
    engine: &Engine,
    sizes: &[u64],
    skew_bytes: u64,
) -> Result<(Buffer, Vec<u64>), AllocError> {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut at = 0u64;
    for &s in sizes {
        let off = at + skew_bytes;
        offsets.push(off);
        at = (off + s.max(4)).div_ceil(256) * 256;
    }
    let buf = engine.allocate(&BufferDesc {
        label: "run_op arena",
        size_bytes: at.max(256),
        kind: AllocKind::UsmDevice,
    })?;
    Ok((buf, offsets))
}

/// Runs `op` once: places every input and the output in one engine buffer (each at a
/// multiple of 256 bytes plus `skew_bytes`, a multiple of 4 that exercises unaligned tensor
/// offsets), fills the output with 0xFF bytes first so unwritten elements show (NaN in f32),
/// dispatches, and reads the output back as a typed tensor.
///
/// # Errors
/// [`RunOpError::Kernel`] when encoding is refused, [`RunOpError::Device`] for device and
/// transfer errors.
pub fn run_op(
    engine: &Engine,
    kernels: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    output_shape: &Shape,
    output_dtype: DType,
    skew_bytes: u64,
) -> Result<HostTensor, RunOpError> {
    let layouts = vec![WeightLayout::File; inputs.len()];
    run_op_in(
        engine,
        kernels,
        op,
        inputs,
        &layouts,
        output_shape,
        output_dtype,
        skew_bytes,
    )
}

/// [`run_op`] with the layout of each input's bytes given ([`WeightLayout::Grouped`] for a
/// weight whose bytes are already in its format's grouped planes, as
/// [`crate::formats::regroup`] makes them).
///
/// # Errors
/// As [`run_op`].
#[allow(clippy::too_many_arguments)]
pub fn run_op_in(
    engine: &Engine,
    kernels: &mut Kernels,
    op: &Op,
    inputs: &[HostTensor],
    layouts: &[WeightLayout],
    output_shape: &Shape,
    output_dtype: DType,
    skew_bytes: u64,
) -> Result<HostTensor, RunOpError> {
    let mut sizes: Vec<u64> = inputs.iter().map(|t| t.bytes.len() as u64).collect();
    let out_size = output_shape.size_bytes(output_dtype).map_err(dev_err)?;
    sizes.push(out_size);
    let (buf, offsets) = arena(engine, &sizes, skew_bytes).map_err(dev_err)?;
    for (t, &off) in inputs.iter().zip(&offsets) {
        t.check("run_op input").map_err(dev_err)?;
        engine
            .write(&buf, off, &pad4(t.bytes.clone()))
            .map_err(dev_err)?;
    }
    let out_off = offsets[inputs.len()];
    engine
        .write(
            &buf,
            out_off,
            &vec![0xFF; out_size.div_ceil(4) as usize * 4],
        )
        .map_err(dev_err)?;
    // Each tensor's range covers its last word (the arena leaves room), as the runtime's do:
    // kernels that move whole words of 8- and 16-bit types bind it.
    let operands: Vec<Operand<'_>> = inputs
        .iter()
        .zip(&offsets)
        .zip(layouts.iter().chain(std::iter::repeat(&WeightLayout::File)))
        .map(|((t, &off), &layout)| Operand {
            tensor: TensorRef {
                buffer: &buf,
                offset_bytes: off,
                size_bytes: word_padded(t.bytes.len() as u64),
            },
            shape: &t.shape,
            dtype: t.dtype,
            strides: None,
            layout,
        })
        .collect();
    let out = Operand {
        tensor: TensorRef {
            buffer: &buf,
            offset_bytes: out_off,
            size_bytes: word_padded(out_size),
        },
        shape: output_shape,
        dtype: output_dtype,
        strides: None,
        layout: WeightLayout::File,
    };
    let mut frame = Frame::begin(engine, kernels, UniformArena::new(engine), op.name());
    if let Err(e) = frame.encode(op, &operands, &out) {
        frame.abandon();
        return Err(e.into());
    }
    let (submitted, _uniforms, _) = frame.submit();
    pollster::block_on(submitted.check()).map_err(dev_err)?;
    let bytes = engine
        .read_blocking(&buf, out_off, out_size)
        .map_err(dev_err)?;
    Ok(HostTensor {
        shape: output_shape.clone(),
        dtype: output_dtype,
        bytes,
    })
}

/// Runs a whole graph on the GPU the simple way: every node's output gets its own range of one
/// arena buffer (no reuse), inputs and constants are uploaded, all kernels go into one compute
/// pass of one submit, and the outputs are read back in the order they were marked (values
/// as f32 carriers, integers exact). A correctness yardstick for the memory-managed runtime,
/// not a runtime.
///
/// # Errors
/// [`RunGraphError::Graph`] for bad inputs or failed shape inference,
/// [`RunGraphError::Node`] when a node's kernel cannot be encoded, [`RunGraphError::Op`] for
/// device failures.
pub fn run_graph(
    engine: &Engine,
    kernels: &mut Kernels,
    graph: &crate::graph::Graph,
    inputs: &[(&str, Shape, Vec<f32>)],
) -> Result<Vec<(Shape, Vec<f32>)>, RunGraphError> {
    let given: Vec<(&str, &Shape)> = inputs.iter().map(|(l, s, _)| (*l, s)).collect();
    let bindings = graph.bind(&given)?;
    let inferred = graph.infer_shapes(&bindings)?;
    let mut sizes = Vec::with_capacity(graph.len());
    for id in graph.ids() {
        let size = inferred.shapes[id.index()]
            .size_bytes(graph.node(id).dtype)
            .map_err(dev_err)?;
        sizes.push(size);
    }
    let (buf, offsets) = arena(engine, &sizes, 0).map_err(dev_err)?;
    for id in graph.ids() {
        let node = graph.node(id);
        let bytes = match &node.op {
            Op::Constant(c) => c.data.bytes().to_vec(),
            Op::Input(_) => {
                let Some((_, shape, v)) = inputs.iter().find(|(l, _, _)| *l == node.label) else {
                    continue;
                };
                HostTensor::from_f32_values(shape.clone(), node.dtype, v)
                    .map_err(dev_err)?
                    .bytes
            }
            _ => continue,
        };
        if bytes.len() as u64 != sizes[id.index()] {
            let n = inferred.shapes[id.index()].num_elements().unwrap_or(0);
            return Err(RunGraphError::Graph(crate::graph::GraphError::DataLength {
                node: node.label.clone(),
                shape: inferred.shapes[id.index()].clone(),
                expected: n,
                got: bytes.len() / (node.dtype.bits().unwrap_or(8) as usize / 8).max(1),
            }));
        }
        engine
            .write(&buf, offsets[id.index()], &pad4(bytes))
            .map_err(dev_err)?;
    }
    let operand = |id: crate::graph::NodeId| Operand {
        tensor: TensorRef {
            buffer: &buf,
            offset_bytes: offsets[id.index()],
            size_bytes: word_padded(sizes[id.index()]),
        },
        shape: &inferred.shapes[id.index()],
        dtype: graph.node(id).dtype,
        strides: None,
        layout: WeightLayout::File,
    };
    let mut frame = Frame::begin(engine, kernels, UniformArena::new(engine), "run_graph");
    for &id in graph.order() {
        let node = graph.node(id);
        if matches!(node.op, Op::Input(_) | Op::Constant(_)) {
            continue;
        }
        let ins: Vec<Operand<'_>> = node.inputs.iter().map(|&i| operand(i)).collect();
        if let Err(e) = frame.encode(&node.op, &ins, &operand(id)) {
            frame.abandon();
            return Err(RunGraphError::Node {
                node: node.label.clone(),
                cause: e,
            });
        }
    }
    let (submitted, _uniforms, _) = frame.submit();
    pollster::block_on(submitted.check()).map_err(dev_err)?;
    let mut out = Vec::new();
    for o in graph.outputs() {
        let bytes = engine
            .read_blocking(&buf, offsets[o.index()], sizes[o.index()])
            .map_err(dev_err)?;
        let t = HostTensor {
            shape: inferred.shapes[o.index()].clone(),
            dtype: graph.node(*o).dtype,
            bytes,
        };
        out.push((t.shape.clone(), t.to_f32()));
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
    #[error("node `{node}`: {cause}")]
    Node {
        /// Label of the node.
        node: String,
        /// Why.
        cause: KernelError,
    },
    /// A device failure.
    #[error(transparent)]
    Op(#[from] RunOpError),
}
