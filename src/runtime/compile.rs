//! The device-free half of compiling a network: what the runtime does for each node (its
//! [`Role`]), the KV-cache states, the shapes known at compile time, the memory dependencies
//! and the static arena plan. [`super::Network::compile`] adds the device half (constants on
//! the device, the kernels' dtype rules).

use super::RunError;
use crate::graph::deps::{basic_dependencies, lifetimes, DepGraph};
use crate::graph::{ops, Bindings, Dim, Graph, GraphError, InferError, NodeId, Op, Position};
use crate::memory::planner::{self, PlanBuffer, PlanOptions, Strategy};
use crate::memory::pool::NetworkId;
use crate::memory::AllocKind;
use crate::shape::{DType, Shape};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};

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
    /// Kind of network inputs and outputs; `None` lets the engine's reference kind rule
    /// decide (`Engine::preferred_kind`: `usm_shared` where the adapter maps storage
    /// buffers, else `usm_device` with staging).
    pub io_kind: Option<AllocKind>,
    /// Inferences in flight the placeholders are sized for: how many copies of the inputs
    /// and outputs the data region keeps room for, and how many free copies the network's
    /// placeholder pool keeps for its next requests.
    pub inflight: usize,
}

impl Default for NetworkOptions {
    fn default() -> Self {
        NetworkOptions {
            planner: true,
            fixed: Bindings::new(),
            states: Vec::new(),
            io_kind: None,
            inflight: 2,
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
    /// Values computed on the host from shapes but read by kernels: uploaded each time they
    /// change.
    HostValue,
    /// A compute kernel.
    Kernel,
}

/// A node as the runtime sees it, at its position in processing order.
#[derive(Debug, Clone)]
pub(crate) struct CNode {
    pub id: NodeId,
    pub role: Role,
    pub dtype: DType,
    /// Shape when it is known at compile time.
    pub static_shape: Option<Shape>,
    /// Positions whose memory this node must not share.
    pub restrictions: BTreeSet<Position>,
    pub is_output: bool,
    /// Offset in the static arena when planned there.
    pub arena_offset: Option<u64>,
}

#[derive(Debug, Clone)]
pub(crate) struct CState {
    pub past: NodeId,
    pub present: NodeId,
}

/// Device facts the device-free compile step needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    /// `min_storage_buffer_offset_alignment`: arena offsets are multiples of it.
    pub align_bytes: u64,
    /// Kind of network inputs and outputs.
    pub io_kind: AllocKind,
}

/// A graph compiled for the runtime, device-free.
pub(crate) struct Compiled {
    pub graph: Graph,
    pub network_id: NetworkId,
    /// By processing position.
    pub nodes: Vec<CNode>,
    /// Processing position of each node id.
    pub pos_of: Vec<Position>,
    pub states: Vec<CState>,
    /// Bytes of the static arena (0 when nothing is planned).
    pub arena_bytes: u64,
    pub io_kind: AllocKind,
    /// Symbols fixed at compile time.
    pub fixed: Bindings,
}

static NEXT_NETWORK: AtomicU32 = AtomicU32::new(0);

/// Bytes of `shape` with `dtype` elements, rounded up to wgpu's 4-byte copy alignment.
pub(crate) fn padded_bytes(shape: &Shape, dtype: DType) -> Result<u64, RunError> {
    let b = shape.size_bytes(dtype)?;
    Ok(b.div_ceil(4) * 4)
}

impl Compiled {
    /// The node at a position.
    pub fn node(&self, p: Position) -> &CNode {
        &self.nodes[p.index()]
    }

    /// The position of a node id.
    pub fn pos(&self, id: NodeId) -> Position {
        self.pos_of[id.index()]
    }

    /// The value of a symbol fixed at compile time.
    pub fn fixed(&self, sym: &str) -> Option<u64> {
        self.fixed.get(sym).copied()
    }

    /// Compiles `graph`: states, static shapes, roles, memory dependencies, arena plan.
    ///
    /// # Errors
    /// [`RunError::BadState`], [`RunError::Graph`] for static shape inference,
    /// [`RunError::Plan`].
    pub fn build(
        graph: Graph,
        options: &NetworkOptions,
        target: Target,
    ) -> Result<Compiled, RunError> {
        let n = graph.len();
        let order: Vec<NodeId> = graph.order().to_vec();
        let pos_of = graph.positions();

        // States: past must be an input, present a Concat{axis 0} whose input 0 is past.
        let mut states = Vec::new();
        let mut state_of_input = vec![None; n];
        let mut state_of_concat = vec![None; n];
        let users = graph.users();
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
            if !matches!(graph.node(past).op, Op::Input(_)) {
                return Err(bad("past is not an input"));
            }
            let pn = graph.node(present);
            if !matches!(pn.op, Op::Concat(ops::Concat { axis: 0 }))
                || pn.inputs.first() != Some(&past)
            {
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
                Op::Input(i) => i.dims.iter().all(|d| match d {
                    Dim::Fixed(_) => true,
                    Dim::Sym(s) => options.fixed.contains_key(s),
                }),
                _ => node.inputs.iter().all(|i| is_static[i.index()]),
            };
            if st {
                match graph.infer_node(id, &options.fixed, &shapes, &values) {
                    Ok((s, v)) => {
                        shapes[id.index()] = s;
                        values[id.index()] = v;
                        is_static[id.index()] = true;
                    }
                    // A shape rule that needs values known only per run (a target fed as an
                    // input): the node and what follows are dynamic.
                    Err(GraphError::Infer {
                        source: InferError::MissingShapeData { .. },
                        ..
                    }) => {}
                    Err(e) => return Err(e.into()),
                }
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
                    Op::Input(_) => Role::Input {
                        state: state_of_input[id.index()],
                    },
                    Op::Constant(_) => Role::Constant,
                    Op::Concat(_) if state_of_concat[id.index()].is_some() => Role::StateConcat {
                        state: state_of_concat[id.index()].unwrap_or(0),
                    },
                    Op::Concat(ops::Concat { axis: 0 }) => Role::ConcatCopy,
                    Op::Reshape(_) | Op::ReshapeTo(_) => Role::Copy,
                    Op::ShapeOf(_) => Role::HostValue,
                    _ if node.dtype.is_int()
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

        // Memory dependencies once: basic pass plus lifetime overlap. The reference adds the
        // "skipped branch" pass to the basic one for the same reason: a node processed
        // between a tensor's producer and its last user must not take that tensor's memory,
        // or an in-order queue would overwrite a live value.
        let (inputs, is_output) = graph.dag_in_order();
        let dag = DepGraph { inputs, is_output };
        let mut restrictions =
            basic_dependencies(&dag).map_err(|e| RunError::Plan(e.to_string()))?;
        let lifetimes = lifetimes(&dag).map_err(|e| RunError::Plan(e.to_string()))?;
        for i in 0..n {
            for j in (i + 1)..n {
                let (a, b) = (lifetimes[i], lifetimes[j]);
                if a.first <= b.last && b.first <= a.last {
                    restrictions[i].insert(Position(j as u32));
                    restrictions[j].insert(Position(i as u32));
                }
            }
        }

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

        // Static arena plan: static, device-only activations (inputs and outputs are
        // placeholders the host reaches).
        let mut arena_bytes = 0;
        if options.planner {
            let align = target.align_bytes.max(4);
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
                        lower: u64::from(lifetimes[k].first),
                        upper: u64::from(lifetimes[k].last) + 1,
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

        Ok(Compiled {
            graph,
            network_id: NetworkId(NEXT_NETWORK.fetch_add(1, Ordering::Relaxed)),
            nodes,
            pos_of,
            states,
            arena_bytes,
            io_kind: target.io_kind,
            fixed: options.fixed.clone(),
        })
    }
}
