//! A graph compiled for one device: roles of the nodes, constants on the device, memory
//! dependencies, static shapes and the static arena plan. See the module docs of
//! [`crate::runtime`] for the design.

use super::RunError;
use crate::gpu::kernels::Kernels;
use crate::gpu::{wgpu, Buffer, BufferDesc, Engine};
use crate::graph::deps::{basic_dependencies, lifetimes, DepGraph};
use crate::graph::{Bindings, Dim, Graph, NodeId, Op};
use crate::memory::planner::{self, PlanBuffer, PlanOptions, Strategy};
use crate::memory::pool::NetworkId;
use crate::memory::AllocKind;
use crate::shape::{DType, Shape};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A KV-cache state: the graph input that holds the past and the output that holds the past
/// with this step's rows appended (a `Concat` along axis 0 of the input and one more tensor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateBinding {
    /// Label of the past input (`[t, ...]`, grows along axis 0).
    pub past: String,
    /// Label of the present output (a `Concat { axis: 0 }` of `past` and the new rows).
    pub present: String,
}

/// How to compile a network.
#[derive(Debug, Clone)]
pub struct NetworkOptions {
    /// Pack outputs whose shapes are known at compile time into one arena with the static
    /// planner (DESIGN §6). Off: they are acquired from the pool at request creation, largest
    /// first.
    pub planner: bool,
    /// Symbols fixed for every run of this network (`seq = 1` for a decode-only network):
    /// nodes whose shapes then no longer depend on a free symbol are static.
    pub fixed: Bindings,
    /// The KV-cache states.
    pub states: Vec<StateBinding>,
    /// Kind of network inputs and outputs; `None` picks `usm_shared` where the adapter maps
    /// storage buffers and `usm_device` (with staging) otherwise.
    pub io_kind: Option<AllocKind>,
}

impl Default for NetworkOptions {
    fn default() -> Self {
        NetworkOptions {
            planner: true,
            fixed: Bindings::new(),
            states: Vec::new(),
            io_kind: None,
        }
    }
}

/// What the runtime does for a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A network input written by the host; `state` when it is the past of a KV-cache state.
    Input { state: Option<usize> },
    /// A constant held by the network.
    Constant,
    /// The concat of a state: appends in place into the state buffer.
    StateConcat { state: usize },
    /// Output bytes equal input 0's bytes (reshape): a buffer copy, no kernel.
    Copy,
    /// Concatenation whose inputs are contiguous blocks of the output: buffer copies.
    ConcatCopy,
    /// Values computed on the host from shapes and only used as shape data: no device work.
    ShapeOnly,
    /// Values computed on the host from shapes but read by kernels: uploaded each time they change.
    HostValue,
    /// A compute kernel.
    Kernel,
}

/// A node as the runtime sees it, in processing order.
#[derive(Debug, Clone)]
pub(crate) struct CNode {
    pub id: NodeId,
    pub role: Role,
    pub dtype: DType,
    /// Shape when it is known at compile time.
    pub static_shape: Option<Shape>,
    /// Positions (as `NodeId(position)`) whose memory this node must not share.
    pub restrictions: BTreeSet<NodeId>,
    pub is_output: bool,
    /// Offset in the static arena when planned there.
    pub arena_offset: Option<u64>,
}

#[derive(Debug, Clone)]
pub(crate) struct CState {
    pub past: NodeId,
    pub present: NodeId,
}

pub(crate) struct Inner {
    pub engine: Engine,
    pub graph: Graph,
    pub network_id: NetworkId,
    /// By processing position.
    pub nodes: Vec<CNode>,
    /// Processing position of each node id.
    pub pos_of: Vec<usize>,
    /// Device copies of the constants, by node id (shared by every request, and by the
    /// networks specialised from this one).
    pub constants: Arc<Vec<Option<Buffer>>>,
    pub states: Vec<CState>,
    /// Bytes of the static arena (0 when nothing is planned).
    pub arena_bytes: u64,
    pub io_kind: AllocKind,
    /// The pipeline cache, shared by the requests and the specialised networks (recording a
    /// dispatch may compile one).
    pub kernels: Arc<Mutex<Kernels>>,
    /// Symbols fixed at compile time.
    pub fixed: Bindings,
}

impl Inner {
    /// The kernels (a poisoned lock only means a panic elsewhere; the cache stays consistent).
    pub fn kernels(&self) -> MutexGuard<'_, Kernels> {
        self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The value of a symbol fixed at compile time.
    pub fn graph_fixed(&self, sym: &str) -> Option<u64> {
        self.fixed.get(sym).copied()
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
        f.debug_struct("Network")
            .field("nodes", &self.inner.nodes.len())
            .field("states", &self.inner.states.len())
            .field("arena_bytes", &self.inner.arena_bytes)
            .finish()
    }
}

/// What specialised networks share: device constants and the pipeline cache.
type Shared = (Arc<Vec<Option<Buffer>>>, Arc<Mutex<Kernels>>);

static NEXT_NETWORK: AtomicU32 = AtomicU32::new(0);

/// Bytes of `shape` with `dtype` elements, rounded up to wgpu's 4-byte copy alignment.
pub(crate) fn padded_bytes(shape: &Shape, dtype: DType) -> Result<u64, RunError> {
    let b = shape.size_bytes(dtype)?;
    Ok(b.div_ceil(4) * 4)
}

/// Host bytes of a constant: f32 little-endian, or i32 for integer constants (the graph
/// carries integer constants as exact f32 values).
fn constant_bytes(data: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::I32 | DType::U32 => data
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect(),
        _ => bytemuck::cast_slice(data).to_vec(),
    }
}

impl Network {
    /// Compiles `graph` for `engine`'s device.
    ///
    /// # Errors
    /// [`RunError::BadState`] for a state that does not name a past input and a concat of it;
    /// [`RunError::Graph`] when static shape inference fails; [`RunError::Alloc`] when the
    /// constants cannot be uploaded; [`RunError::Plan`] when the static plan fails.
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
            self.inner.graph.clone(),
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
        let n = graph.len();
        let order: Vec<NodeId> = graph.order().to_vec();
        let mut pos_of = vec![0usize; n];
        for (k, id) in order.iter().enumerate() {
            pos_of[id.index()] = k;
        }

        // States: past must be an input, present a Concat{axis 0} whose input 0 is past.
        let mut states = Vec::new();
        let mut state_of_input = vec![None; n];
        let mut state_of_concat = vec![None; n];
        for (si, s) in options.states.iter().enumerate() {
            let bad = |reason: &str| RunError::BadState {
                past: s.past.clone(),
                present: s.present.clone(),
                reason: reason.to_string(),
            };
            let past = graph
                .find(&s.past)
                .ok_or_else(|| bad("past is not a node of the graph"))?;
            let present = graph
                .find(&s.present)
                .ok_or_else(|| bad("present is not a node of the graph"))?;
            if !matches!(graph.node(past).op, Op::Input { .. }) {
                return Err(bad("past is not an input"));
            }
            let pn = graph.node(present);
            if !matches!(pn.op, Op::Concat { axis: 0 }) || pn.inputs.first() != Some(&past) {
                return Err(bad(
                    "present must be a concat along axis 0 whose first input is past",
                ));
            }
            if !graph.outputs().contains(&present) {
                return Err(bad("present is not a network output"));
            }
            if state_of_input[past.index()].is_some() || state_of_concat[present.index()].is_some()
            {
                return Err(bad("a node is bound to two states"));
            }
            let users = graph.users();
            if users[past.index()]
                .iter()
                .any(|&u| u != present && pos_of[u.index()] > pos_of[present.index()])
            {
                return Err(bad(
                    "past is read after present is written (the append would change it)",
                ));
            }
            state_of_input[past.index()] = Some(si);
            state_of_concat[present.index()] = Some(si);
            states.push(CState { past, present });
        }

        // Static shapes: a node is static when its shape does not depend on a free symbol.
        let mut shapes = vec![Shape::default(); n];
        let mut values: Vec<Option<Vec<i64>>> = vec![None; n];
        let mut is_static = vec![false; n];
        for &id in &order {
            let node = graph.node(id);
            let st = match &node.op {
                Op::Input { dims } => dims.iter().all(|d| match d {
                    Dim::Fixed(_) => true,
                    Dim::Sym(s) => options.fixed.contains_key(s),
                }),
                _ => node.inputs.iter().all(|i| is_static[i.index()]),
            };
            if st {
                let (s, v) = graph.infer_node(id, &options.fixed, &shapes, &values)?;
                shapes[id.index()] = s;
                values[id.index()] = v;
                is_static[id.index()] = true;
            }
        }

        // Roles.
        let mut roles = Vec::with_capacity(n);
        for &id in &order {
            let node = graph.node(id);
            let role = if graph.is_shape_only(id) {
                Role::ShapeOnly
            } else {
                match &node.op {
                    Op::Input { .. } => Role::Input {
                        state: state_of_input[id.index()],
                    },
                    Op::Constant { .. } => Role::Constant,
                    Op::Concat { .. } if state_of_concat[id.index()].is_some() => {
                        Role::StateConcat {
                            state: state_of_concat[id.index()].unwrap_or(0),
                        }
                    }
                    Op::Concat { axis: 0 } => Role::ConcatCopy,
                    Op::Reshape { .. } | Op::ReshapeTo => Role::Copy,
                    Op::ShapeOf => Role::HostValue,
                    _ if matches!(node.dtype, DType::I32 | DType::U32)
                        && is_static[id.index()]
                        && values[id.index()].is_some() =>
                    {
                        Role::HostValue
                    }
                    _ => Role::Kernel,
                }
            };
            roles.push(role);
        }

        // Memory dependencies once: basic pass plus lifetime overlap (module docs).
        let (inputs, is_output) = graph.dag_in_order();
        let dag = DepGraph { inputs, is_output };
        let mut restrictions =
            basic_dependencies(&dag).map_err(|e| RunError::Plan(e.to_string()))?;
        let lifetimes = lifetimes(&dag).map_err(|e| RunError::Plan(e.to_string()))?;
        for i in 0..n {
            for j in (i + 1)..n {
                let (a, b) = (lifetimes[i], lifetimes[j]);
                if a.first <= b.last && b.first <= a.last {
                    restrictions[i].insert(NodeId(j as u32));
                    restrictions[j].insert(NodeId(i as u32));
                }
            }
        }

        let gpu = engine.gpu();
        let io_kind = options.io_kind.unwrap_or(if gpu.supports_shared() {
            AllocKind::UsmShared
        } else {
            AllocKind::UsmDevice
        });

        let mut nodes: Vec<CNode> = order
            .iter()
            .enumerate()
            .map(|(k, &id)| CNode {
                id,
                role: roles[k],
                dtype: graph.node(id).dtype,
                static_shape: is_static[id.index()].then(|| shapes[id.index()].clone()),
                restrictions: std::mem::take(&mut restrictions[k]),
                is_output: dag.is_output[k],
                arena_offset: None,
            })
            .collect();

        // Static arena plan: static, device-only activations (outputs stay host-reachable).
        let mut arena_bytes = 0;
        if options.planner {
            let align = u64::from(gpu.limits().min_storage_buffer_offset_alignment).max(4);
            let mut members = Vec::new();
            let mut buffers = Vec::new();
            for (k, c) in nodes.iter().enumerate() {
                let plannable =
                    matches!(c.role, Role::Kernel | Role::Copy | Role::ConcatCopy) && !c.is_output;
                if let (true, Some(shape)) = (plannable, &c.static_shape) {
                    let size = padded_bytes(shape, c.dtype)?;
                    if size == 0 {
                        continue;
                    }
                    members.push(k);
                    buffers.push(PlanBuffer {
                        id: graph.node(c.id).label.clone(),
                        lower: lifetimes[k].first as u64,
                        upper: lifetimes[k].last as u64 + 1,
                        size_bytes: size,
                        align_bytes: align,
                    });
                }
            }
            if !buffers.is_empty() {
                let plan = planner::build(
                    &buffers,
                    &PlanOptions {
                        strategy: Strategy::Best,
                        capacity: None,
                        time_limit: std::time::Duration::from_millis(200),
                        min_align_bytes: align,
                    },
                )
                .map_err(|e| RunError::Plan(e.to_string()))?;
                for (m, &k) in members.iter().enumerate() {
                    nodes[k].arena_offset = Some(plan.offsets[m]);
                }
                arena_bytes = plan.height;
            }
        }

        let (constants, kernels) = match shared {
            Some(shared) => shared,
            None => (
                Arc::new(upload_constants(engine, &graph, &nodes)?),
                Arc::new(Mutex::new(Kernels::new(gpu.device()))),
            ),
        };
        Ok(Network {
            inner: Arc::new(Inner {
                engine: engine.clone(),
                graph,
                network_id: NetworkId(NEXT_NETWORK.fetch_add(1, Ordering::Relaxed)),
                nodes,
                pos_of,
                constants,
                states,
                arena_bytes,
                io_kind,
                kernels,
                fixed: options.fixed.clone(),
            }),
        })
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.inner.graph
    }

    /// The engine the network allocates from.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Kind of the network's inputs and outputs (`usm_shared` or `usm_device`).
    pub fn io_kind(&self) -> AllocKind {
        self.inner.io_kind
    }

    /// Bytes of the static arena each request allocates (0 when nothing was planned).
    pub fn arena_bytes(&self) -> u64 {
        self.inner.arena_bytes
    }

    /// Nodes whose shapes are known at compile time (planned or pooled at request creation).
    pub fn static_nodes(&self) -> usize {
        self.inner
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

/// Constants in two phases: host staging first, then device buffers once the users are known
/// (`reference/openvino-gpu-memory-allocation.md`). Returns the device buffers by node id.
fn upload_constants(
    engine: &Engine,
    graph: &Graph,
    nodes: &[CNode],
) -> Result<Vec<Option<Buffer>>, RunError> {
    let n = graph.len();
    let alloc_err = |what: String| move |source| RunError::Alloc { what, source };
    // Phase 1: every constant into usm_host staging, before we look at who uses it.
    let mut staged: Vec<(NodeId, Buffer, u64)> = Vec::new();
    for c in nodes {
        if c.role != Role::Constant {
            continue;
        }
        let node = graph.node(c.id);
        let Op::Constant { data, .. } = &node.op else {
            continue;
        };
        let bytes = constant_bytes(data, node.dtype);
        let size = (bytes.len() as u64).div_ceil(4).max(1) * 4;
        let label = format!("{} (staging)", node.label);
        let buf = engine
            .allocate_init(
                &BufferDesc {
                    label: &label,
                    size_bytes: size,
                    kind: AllocKind::UsmHost,
                },
                &bytes,
            )
            .map_err(alloc_err(format!("staging constant `{}`", node.label)))?;
        staged.push((c.id, buf, size));
    }
    // Phase 2: the users are known now; constants read by kernels move to usm_device.
    let users = graph.users();
    let pos_of: Vec<usize> = {
        let mut p = vec![0; n];
        for (k, c) in nodes.iter().enumerate() {
            p[c.id.index()] = k;
        }
        p
    };
    let mut out: Vec<Option<Buffer>> = (0..n).map(|_| None).collect();
    let gpu = engine.gpu();
    let mut enc = gpu
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("dynrt constants to usm_device"),
        });
    for (id, staging, size) in &staged {
        let on_device = users[id.index()]
            .iter()
            .any(|u| nodes[pos_of[u.index()]].role != Role::ShapeOnly);
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
        enc.copy_buffer_to_buffer(staging.raw(), 0, dev.raw(), 0, *size);
        out[id.index()] = Some(dev);
    }
    gpu.queue().submit([enc.finish()]);
    // Staging buffers are freed here; wgpu keeps them alive until the copies have run.
    drop(staged);
    Ok(out)
}
