//! A graph compiled for one device: the device-free plan ([`super::compile`]) plus what lives
//! on the device: the constants and the pipeline cache. See the module docs of
//! [`crate::runtime`] for the design.

use super::compile::{Compiled, NetworkOptions, Role, Target};
use super::RunError;
use crate::gpu::kernels::{kernel_of, Kernels};
use crate::gpu::{Buffer, BufferDesc, Engine, KindRequest};
use crate::graph::{Graph, NodeId, Op};
use crate::memory::AllocKind;
use crate::shape::DType;
use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) struct Inner {
    pub engine: Engine,
    pub compiled: Arc<Compiled>,
    /// Device copies of the constants, by node id (shared by every request, and by the
    /// networks specialised from this one).
    pub constants: Arc<Vec<Option<Buffer>>>,
    /// The pipeline cache, shared by the requests and the specialised networks (recording a
    /// dispatch may compile one).
    pub kernels: Arc<Mutex<Kernels>>,
}

impl Inner {
    /// The kernels (a poisoned lock only means a panic elsewhere; the cache stays consistent).
    pub fn kernels(&self) -> MutexGuard<'_, Kernels> {
        self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A compiled network. Cheap to clone (an `Arc`); clones share constants and the pipeline
/// cache. Create [`InferRequest`](super::InferRequest)s from it to run it.
#[derive(Clone)]
pub struct Network {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.inner.compiled;
        f.debug_struct("Network")
            .field("nodes", &c.nodes.len())
            .field("states", &c.states.len())
            .field("arena_bytes", &c.arena_bytes)
            .finish()
    }
}

/// What specialised networks share: device constants and the pipeline cache.
type Shared = (Arc<Vec<Option<Buffer>>>, Arc<Mutex<Kernels>>);

impl Network {
    /// Compiles `graph` for `engine`'s device.
    ///
    /// # Errors
    /// [`RunError::BadState`] for a state that does not name a past input and a concat of it;
    /// [`RunError::Graph`] when static shape inference fails; [`RunError::UnsupportedDType`]
    /// for a node whose kernel does not run on its element types (named);
    /// [`RunError::Alloc`] when the constants cannot be uploaded; [`RunError::Plan`] when the
    /// static plan fails.
    pub fn compile(
        engine: &Engine,
        graph: Graph,
        options: NetworkOptions,
    ) -> Result<Network, RunError> {
        Self::compile_inner(engine, graph, options, None)
    }

    /// The same graph compiled again with other options (typically other fixed symbols: a
    /// prefill network with `seq = P, past = 0` beside a decode network with `seq = 1`),
    /// sharing this network's device constants and pipeline cache: nothing is uploaded twice.
    /// A request's KV cache moves between such siblings with
    /// [`InferRequest::take_states`](super::InferRequest::take_states) and
    /// [`InferRequest::put_states`](super::InferRequest::put_states).
    ///
    /// # Errors
    /// As [`Network::compile`].
    pub fn specialize(&self, options: NetworkOptions) -> Result<Network, RunError> {
        let shared = (
            Arc::clone(&self.inner.constants),
            Arc::clone(&self.inner.kernels),
        );
        Self::compile_inner(
            &self.inner.engine,
            self.inner.compiled.graph.clone(),
            options,
            Some(shared),
        )
    }

    fn compile_inner(
        engine: &Engine,
        graph: Graph,
        options: NetworkOptions,
        shared: Option<Shared>,
    ) -> Result<Network, RunError> {
        let gpu = engine.gpu();
        // The reference kind rule: memory the host locks goes to usm_shared where the adapter
        // maps storage buffers; kernels bind inputs and outputs, so where it cannot, they are
        // usm_device with staging (usm_host is not bindable on wgpu).
        let io_kind = options.io_kind.unwrap_or_else(|| {
            engine.preferred_kind(&KindRequest {
                host_access: true,
                kernel_access: true,
                kernel_io_bytes: 0,
            })
        });
        let target = Target {
            align_bytes: u64::from(gpu.limits().min_storage_buffer_offset_alignment).max(4),
            io_kind,
        };
        let compiled = Compiled::build(graph, &options, target)?;
        check_kernel_dtypes(&compiled)?;
        let (constants, kernels) = match shared {
            Some(shared) => shared,
            None => (
                Arc::new(upload_constants(engine, &compiled)?),
                Arc::new(Mutex::new(Kernels::new(gpu))),
            ),
        };
        Ok(Network {
            inner: Arc::new(Inner {
                engine: engine.clone(),
                compiled: Arc::new(compiled),
                constants,
                kernels,
            }),
        })
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.inner.compiled.graph
    }

    /// The engine the network allocates from.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Kind of the network's inputs and outputs (`usm_shared` or `usm_device`).
    pub fn io_kind(&self) -> AllocKind {
        self.inner.compiled.io_kind
    }

    /// Bytes of the static arena each request allocates (0 when nothing was planned).
    pub fn arena_bytes(&self) -> u64 {
        self.inner.compiled.arena_bytes
    }

    /// Nodes whose shapes are known at compile time (planned or pooled at request creation).
    pub fn static_nodes(&self) -> usize {
        self.inner
            .compiled
            .nodes
            .iter()
            .filter(|c| {
                c.static_shape.is_some()
                    && matches!(c.role, Role::Kernel | Role::Copy | Role::ConcatCopy)
            })
            .count()
    }

    /// Pipeline cache counters `(hits, misses)` of this network (shared by its requests and
    /// its specialisations).
    pub fn pipeline_cache_counts(&self) -> (u64, u64) {
        let s = self.inner.kernels().stats();
        (s.hits, s.misses)
    }
}

/// Every node the device computes must have a kernel for its element types (never float
/// maths on integer bits): refused here, naming the node, before anything is allocated.
fn check_kernel_dtypes(c: &Compiled) -> Result<(), RunError> {
    let graph = &c.graph;
    for node in &c.nodes {
        let n = graph.node(node.id);
        let inputs: Vec<DType> = n.inputs.iter().map(|i| graph.node(*i).dtype).collect();
        let refused = |reason: &'static str| RunError::UnsupportedDType {
            node: n.label.clone(),
            op: n.op.name(),
            inputs: inputs.clone(),
            output: n.dtype,
            reason,
        };
        match node.role {
            Role::Kernel => {
                let kernel = kernel_of(&n.op).ok_or_else(|| refused("a kernel"))?;
                kernel.check_dtypes(&inputs, n.dtype).map_err(refused)?;
            }
            // Byte copies; the fallback when source and destination share a buffer is the
            // whole-word copy of the views (any plain type) or the concat's own kernel.
            Role::Copy if n.dtype.bits().is_none() => {
                return Err(refused(
                    "a plain (not block-quantized) type for a device copy",
                ));
            }
            Role::ConcatCopy => {
                let kernel = kernel_of(&n.op).ok_or_else(|| refused("a kernel"))?;
                kernel.check_dtypes(&inputs, n.dtype).map_err(refused)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Constants in two phases: host staging first, then device buffers once the users are known
/// (`reference/openvino-gpu-memory-allocation.md`). Returns the device buffers by node id.
fn upload_constants(engine: &Engine, c: &Compiled) -> Result<Vec<Option<Buffer>>, RunError> {
    let graph = &c.graph;
    let n = graph.len();
    let alloc_err = |what: String| move |source| RunError::Alloc { what, source };
    // Phase 1: every constant into usm_host staging, before we look at who uses it.
    let mut staged: Vec<(NodeId, Buffer, u64)> = Vec::new();
    for node in &c.nodes {
        if node.role != Role::Constant {
            continue;
        }
        let gn = graph.node(node.id);
        let Op::Constant(k) = &gn.op else {
            continue;
        };
        let bytes = k.data.bytes();
        let size = (bytes.len() as u64).div_ceil(4).max(1) * 4;
        let label = format!("{} (staging)", gn.label);
        let buf = engine
            .allocate_init(
                &BufferDesc {
                    label: &label,
                    size_bytes: size,
                    kind: AllocKind::UsmHost,
                },
                bytes,
            )
            .map_err(alloc_err(format!("staging constant `{}`", gn.label)))?;
        staged.push((node.id, buf, size));
    }
    // Phase 2: the users are known now; constants read by kernels move to usm_device.
    let users = graph.users();
    let mut out: Vec<Option<Buffer>> = (0..n).map(|_| None).collect();
    for (id, staging, size) in &staged {
        let on_device = users[id.index()]
            .iter()
            .any(|u| c.node(c.pos(*u)).role != Role::ShapeOnly);
        if !on_device {
            continue;
        }
        let label = graph.node(*id).label.clone();
        let dev = engine
            .allocate(&BufferDesc {
                label: &label,
                size_bytes: *size,
                kind: AllocKind::UsmDevice,
            })
            .map_err(alloc_err(format!("constant `{label}`")))?;
        engine
            .copy(staging, 0, &dev, 0, *size)
            .map_err(alloc_err(format!("constant `{label}`")))?;
        out[id.index()] = Some(dev);
    }
    // Staging buffers are freed here; wgpu keeps them alive until the copies have run.
    drop(staged);
    Ok(out)
}
