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
/// with this step's rows appended (a `Concat` of the input and one more tensor, along any
/// axis: axis 0 for a `[t, dim]` cache, the sequence axis 2 of the `[batch, heads, t,
/// head_dim]` caches exported models write). [`find_states`] recognises them in a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateBinding {
    /// Label of the past input (grows along the concat's axis).
    pub past: String,
    /// Label of the present output: a `Concat` of `past` and the new rows, or a
    /// `ScatterRows` into `past` (an in-place state: a paged pool).
    pub present: String,
}

/// The KV-cache states of `graph`, recognised by their pattern: a graph output computed by a
/// two-input `Concat` whose first input is a graph input that nothing else reads as values
/// (shape-only readers such as `Shape` are fine) and whose extent along the concat's axis is
/// a symbol (`past_sequence_length`). This is how exported decoders write their caches
/// (`past_key_values.*` → `Concat(axis = 2)` → `present.*`); the pairs are returned in the
/// order of the graph's outputs.
pub fn find_states(graph: &Graph) -> Vec<StateBinding> {
    let users = graph.users();
    let mut found = Vec::new();
    for &out in graph.outputs() {
        let node = graph.node(out);
        let Op::Concat(ops::Concat { axis }) = node.op else {
            continue;
        };
        let [past, _] = node.inputs[..] else {
            continue;
        };
        let Op::Input(ops::Input { dims, .. }) = &graph.node(past).op else {
            continue;
        };
        let axis = ops::axis_index(axis, dims.len()).unwrap_or(usize::MAX);
        let growing = matches!(dims.get(axis), Some(Dim::Sym(_)));
        let only_concat = users[past.index()]
            .iter()
            .all(|&u| u == out || !graph.node(u).op.def().reads_values() || graph.is_shape_only(u));
        let once = found
            .iter()
            .all(|s: &StateBinding| s.past != graph.node(past).label);
        if growing && only_concat && once {
            found.push(StateBinding {
                past: graph.node(past).label.clone(),
                present: node.label.clone(),
            });
        }
    }
    found
}

/// How to compile a network.
#[derive(Debug, Clone)]
pub struct NetworkOptions {
    /// Pack outputs whose shapes are known at compile time into one arena with the static
    /// planner (docs/design.md). Off: they are acquired from the pool at request creation, largest
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
    /// Run the rewrites of [`crate::graph::fuse`] on the graph before compiling it (a linear's
    /// RMSNorm, gated activation and residual folded into one dispatch). A network made by
    /// [`super::Network::specialize`] keeps its parent's graph, rewritten or not.
    pub fuse: bool,
    /// Reorder the weights that only the quantized kernels read, in the formats they read
    /// best in grouped planes on this adapter (q4_0 and q5_0), into those planes on the device when the constants are uploaded
    /// (`update_weights`; see [`crate::formats::Grouped`]): same bytes, every field
    /// word-aligned. Native only (the web keeps the file layout). A network made by
    /// [`super::Network::specialize`] or [`super::Network::compile_sharing`] reads its donor's
    /// weights in the layout they are in.
    pub regroup_weights: bool,
    /// The class of kernels the network runs (`None`: its adapter's,
    /// [`crate::gpu::kernels::quant::QuantLayout::of`]). Tests and benchmarks force the
    /// hardware-GPU kernels on a software adapter with it. A network made by
    /// [`super::Network::specialize`] or [`super::Network::compile_sharing`] shares its
    /// donor's kernels.
    pub kernels: Option<crate::gpu::kernels::quant::QuantLayout>,
    /// Bytes the copies of weights in other layouts may take beside the weights (the
    /// reordered-weights cache of `update_weights`; `None`: a tenth of the weights' bytes,
    /// so device weight bytes stay within 1.10x of them). A weight whose copy does not fit is
    /// converted in place on demand instead. Set by the network that uploads the weights.
    pub weight_copies_bytes: Option<u64>,
}

impl Default for NetworkOptions {
    fn default() -> Self {
        NetworkOptions {
            planner: true,
            fixed: Bindings::new(),
            states: Vec::new(),
            io_kind: None,
            inflight: 2,
            fuse: true,
            regroup_weights: true,
            kernels: None,
            weight_copies_bytes: None,
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
    /// The scatter of an in-place state: its kernel writes rows into the state buffer.
    StateScatter { state: usize },
    /// The key or value rows of a fused projection ([`ops::KvRows`]), which that node's
    /// kernel writes straight into the state whose present reads them: no buffer, no work
    /// (nor for that present).
    KvRows,
    /// A transpose of a state's past, present or of another such view, read by kernels that
    /// take strided inputs: no device work, its output is a strided view of the state buffer.
    StateView { state: usize },
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
    /// The states (keys', values') a fused projection's kernel writes the rows of.
    pub kv_states: Option<[usize; 2]>,
}

#[derive(Debug, Clone)]
pub(crate) struct CState {
    pub past: NodeId,
    pub present: NodeId,
    /// The growing axis (the concat's; 0 for an in-place state).
    pub axis: usize,
    /// The present is a [`ops::ScatterRows`] of the past: the state keeps its shape and the
    /// step writes its rows in place (a paged KV pool).
    pub in_place: bool,
    /// The fused projection whose kernel writes this iteration's rows (the present's rows
    /// are its [`ops::KvRows`]): the present then does nothing itself.
    pub written_by: Option<NodeId>,
}

impl CState {
    /// Whether the state buffer is a padded layout (`[.., capacity, ..]` with dimensions
    /// before the growing axis): its tensors are strided views. Axis-0 states are contiguous
    /// whatever their capacity.
    pub fn padded(&self) -> bool {
        self.axis > 0
    }
}

/// Device facts the device-free compile step needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    /// `min_storage_buffer_offset_alignment`: arena offsets are multiples of it.
    pub align_bytes: u64,
    /// Kind of network inputs and outputs.
    pub io_kind: AllocKind,
    /// Whether the kernel of an op reads input `i` through strides
    /// ([`crate::gpu::kernels::Kernel::reads_strided`]).
    pub reads_strided: fn(&Op, usize) -> bool,
}

/// The states named in `bindings`, checked: the past is an input, the present a graph output
/// computed by a two-input `Concat` whose first input is the past, no node in two states, and
/// no kernel reads the past's values after the present is written (the append would change
/// them).
fn resolve_states(graph: &Graph, bindings: &[StateBinding]) -> Result<Vec<CState>, RunError> {
    let n = graph.len();
    let pos_of = graph.positions();
    let users = graph.users();
    let mut bound = vec![false; n];
    let mut states = Vec::with_capacity(bindings.len());
    for s in bindings {
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
        let rank = match &graph.node(past).op {
            Op::Input(ops::Input { dims, .. }) => dims.len(),
            _ => 0,
        };
        let (axis, in_place) = match pn.op {
            Op::Concat(ops::Concat { axis }) if pn.inputs.len() == 2 && pn.inputs[0] == past => (
                ops::axis_index(axis, rank).map_err(|e| bad(&e.to_string()))?,
                false,
            ),
            Op::ScatterRows(_) if pn.inputs.first() == Some(&past) => (0, true),
            _ => {
                return Err(bad(
                    "present must be a concat of two inputs whose first input is past, or a \
                     scatter_rows into past",
                ))
            }
        };
        if !graph.outputs().contains(&present) {
            return Err(bad("present is not a network output"));
        }
        if std::mem::replace(&mut bound[past.index()], true)
            || std::mem::replace(&mut bound[present.index()], true)
        {
            return Err(bad("a node is bound to two states"));
        }
        let reads_later = users[past.index()].iter().any(|&u| {
            u != present
                && pos_of[u.index()] > pos_of[present.index()]
                && graph.node(u).op.def().reads_values()
                && !graph.is_shape_only(u)
        });
        if reads_later {
            return Err(bad(
                "past is read after present is written (the append would change it)",
            ));
        }
        // Rows a fused projection writes: its KV split must be of the present's kind.
        let rows = pn.inputs.get(1).copied();
        let written_by = match rows.map(|r| (r, &graph.node(r).op)) {
            Some((r, Op::KvRows(_))) => {
                let producer = graph.node(r).inputs[0];
                match &graph.node(producer).op {
                    Op::FusedLinear(ops::FusedLinear { kv: Some(kv), .. })
                        if kv.slots == in_place && axis == 0 && rank == 2 =>
                    {
                        Some(producer)
                    }
                    _ => {
                        return Err(bad(
                            "its rows are the keys or values of a projection whose KV split \
                             does not write this kind of cache",
                        ))
                    }
                }
            }
            _ => None,
        };
        states.push(CState {
            past,
            present,
            axis,
            in_place,
            written_by,
        });
    }
    Ok(states)
}

/// Which nodes' outputs are strided views of a padded state buffer.
struct Layouts {
    /// Per node id: the state whose buffer holds the output as a strided view (its past, its
    /// present, and the [`Role::StateView`]s over them).
    state: Vec<Option<usize>>,
    /// Per node id: a view computed without device work ([`Role::StateView`]).
    view: Vec<bool>,
}

/// Ops whose output can be a strided view of their input's layout (a stride permutation).
fn is_view_op(op: &Op) -> bool {
    matches!(op, Op::Transpose(_))
}

/// Whether node `u` can read node `id`'s output as a strided view: it does not read values,
/// it is a view itself, or its kernel reads every input position that `id` feeds through
/// strides.
fn reads_layout(
    graph: &Graph,
    u: NodeId,
    id: NodeId,
    view: &[bool],
    reads_strided: fn(&Op, usize) -> bool,
) -> bool {
    let node = graph.node(u);
    !node.op.def().reads_values()
        || graph.is_shape_only(u)
        || view[u.index()]
        || node
            .inputs
            .iter()
            .enumerate()
            .filter(|&(_, &i)| i == id)
            .all(|(pos, _)| reads_strided(&node.op, pos))
}

/// The strided layouts of `graph`: a padded state's past and present, and each transpose of
/// one (or of another view) whose readers all take strided inputs — such a transpose is a
/// view, no copy. A transpose with a reader that needs a contiguous tensor runs its kernel
/// (a strided copy) instead.
fn layouts(graph: &Graph, states: &[CState], reads_strided: fn(&Op, usize) -> bool) -> Layouts {
    let n = graph.len();
    let order = graph.order();
    let mut state = vec![None; n];
    for (si, s) in states.iter().enumerate() {
        if s.padded() {
            state[s.past.index()] = Some(si);
            state[s.present.index()] = Some(si);
        }
    }
    let mut candidate = vec![false; n];
    for &id in order {
        let node = graph.node(id);
        if is_view_op(&node.op) && !graph.is_shape_only(id) {
            if let Some(s) = node.inputs.first().and_then(|i| state[i.index()]) {
                state[id.index()] = Some(s);
                candidate[id.index()] = true;
            }
        }
    }
    // Readers first (reverse order): a candidate is a view when every reader takes it.
    let users = graph.users();
    let mut view = vec![false; n];
    for &id in order.iter().rev() {
        if candidate[id.index()] {
            view[id.index()] = users[id.index()]
                .iter()
                .all(|&u| reads_layout(graph, u, id, &view, reads_strided));
        }
    }
    // A view of a candidate that copies is a view of a contiguous tensor, not of the state:
    // it runs its kernel like any other node.
    for &id in order {
        if candidate[id.index()] {
            let from = graph.node(id).inputs.first().map(|i| i.index());
            let over_state = from.is_some_and(|i| state[i].is_some() && (view[i] || !candidate[i]));
            if !(view[id.index()] && over_state) {
                view[id.index()] = false;
                state[id.index()] = None;
            }
        }
    }
    Layouts { state, view }
}

/// `graph` with a contiguous copy (an identity transpose, a strided copy kernel labelled
/// `<node>#contiguous`) in front of every kernel that reads a padded state's strided layout
/// but cannot take strides; `graph` itself when there is none.
///
/// # Errors
/// [`RunError::BadState`] for invalid states; [`RunError::Graph`] when the graph cannot be
/// rebuilt.
fn with_contiguous_copies(
    graph: Graph,
    options: &NetworkOptions,
    target: Target,
) -> Result<Graph, RunError> {
    let states = resolve_states(&graph, &options.states)?;
    let l = layouts(&graph, &states, target.reads_strided);
    let users = graph.users();
    let mut needs: Vec<(NodeId, NodeId)> = Vec::new();
    for id in graph.ids() {
        if l.state[id.index()].is_none() {
            continue;
        }
        for &u in &users[id.index()] {
            let is_present_of_past = states.iter().any(|s| s.past == id && s.present == u);
            if !is_present_of_past && !reads_layout(&graph, u, id, &l.view, target.reads_strided) {
                needs.push((id, u));
            }
        }
    }
    if needs.is_empty() {
        return Ok(graph);
    }
    let rank_of = |id: NodeId| -> usize {
        // Views are transposes, which keep the rank of the state they view.
        let s = &states[l.state[id.index()].unwrap_or(0)];
        match &graph.node(s.past).op {
            Op::Input(ops::Input { dims, .. }) => dims.len(),
            _ => 0,
        }
    };
    let mut nodes = graph.nodes().to_vec();
    let mut copy_of: Vec<(NodeId, NodeId)> = Vec::new();
    for (src, user) in needs {
        let copy = match copy_of.iter().find(|(s, _)| *s == src) {
            Some(&(_, c)) => c,
            None => {
                let c = NodeId(nodes.len() as u32);
                let mut label = format!("{}#contiguous", graph.node(src).label);
                while graph.find(&label).is_some() {
                    label.push('_');
                }
                nodes.push(crate::graph::Node {
                    label,
                    op: Op::Transpose(ops::Transpose {
                        perm: (0..rank_of(src)).collect(),
                    }),
                    inputs: vec![src],
                    dtype: graph.node(src).dtype,
                });
                copy_of.push((src, c));
                c
            }
        };
        for i in &mut nodes[user.index()].inputs {
            if *i == src {
                *i = copy;
            }
        }
    }
    Ok(Graph::from_nodes(nodes, graph.outputs().to_vec())?)
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
        // Kernels that cannot read a state's strided layout get a contiguous copy in front.
        let graph = with_contiguous_copies(graph, options, target)?;
        let n = graph.len();
        let order: Vec<NodeId> = graph.order().to_vec();
        let pos_of = graph.positions();
        let states = resolve_states(&graph, &options.states)?;
        let mut state_of_input = vec![None; n];
        let mut state_of_concat = vec![None; n];
        for (si, s) in states.iter().enumerate() {
            state_of_input[s.past.index()] = Some(si);
            state_of_concat[s.present.index()] = Some(si);
        }
        let layouts = layouts(&graph, &states, target.reads_strided);

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
                        cause: InferError::MissingShapeData { .. },
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
                    Op::KvRows(_) => Role::KvRows,
                    Op::Concat(_) if state_of_concat[id.index()].is_some() => Role::StateConcat {
                        state: state_of_concat[id.index()].unwrap_or(0),
                    },
                    Op::ScatterRows(_) => match state_of_concat[id.index()] {
                        Some(state) => Role::StateScatter { state },
                        None => {
                            return Err(RunError::BadState {
                                past: String::new(),
                                present: node.label.clone(),
                                reason: "scatter_rows runs only as the present of a state \
                                         (in place on its past)"
                                    .into(),
                            })
                        }
                    },
                    _ if layouts.view[id.index()] => Role::StateView {
                        state: layouts.state[id.index()].unwrap_or(0),
                    },
                    // A strided input cannot be copied as bytes: the kernel copies it.
                    _ if node
                        .inputs
                        .iter()
                        .any(|i| layouts.state[i.index()].is_some()) =>
                    {
                        Role::Kernel
                    }
                    Op::Concat(ops::Concat { axis: 0 }) => Role::ConcatCopy,
                    _ if node.op.def().is_view() => Role::Copy,
                    Op::ShapeOf(_) | Op::SizeOf(_) => Role::HostValue,
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
        // Only nodes that take memory from the pool read restrictions, and only against other
        // such nodes (the pool's users): inputs and outputs are placeholders, constants,
        // states and host values own theirs. A sweep over those nodes in processing order
        // (a lifetime starts at its node's position) pairs each with the live ones before
        // it: time linear in the nodes and the pairs, where comparing every pair of nodes is
        // quadratic, and so would be counting graph inputs as pooled (the processing order
        // puts them first, so each overlaps every other); a hostile graph of one `Sum` over
        // many inputs is the case (docs/benchmarks/2026-11-26-hostile-input.md).
        let pooled = |k: usize| {
            matches!(roles[k], Role::Kernel | Role::Copy | Role::ConcatCopy) && !dag.is_output[k]
        };
        let mut live: Vec<usize> = Vec::new();
        for (k, l) in lifetimes.iter().enumerate() {
            if !pooled(k) {
                continue;
            }
            live.retain(|&j| lifetimes[j].last >= l.first);
            for &j in &live {
                restrictions[j].insert(Position(k as u32));
                restrictions[k].insert(Position(j as u32));
            }
            live.push(k);
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
                kv_states: None,
            })
            .collect();
        // Each fused projection with a KV split writes the states whose presents read its
        // rows; rows read by anything else have nowhere to go.
        for (si, st) in states.iter().enumerate() {
            let Some(producer) = st.written_by else {
                continue;
            };
            let rows = graph.node(st.present).inputs[1];
            let Op::KvRows(kr) = graph.node(rows).op else {
                continue;
            };
            let slots = &mut nodes[pos_of[producer.index()].index()].kv_states;
            let pair = slots.get_or_insert([usize::MAX; 2]);
            pair[usize::from(kr.values)] = si;
        }
        let users = graph.users();
        for &id in &order {
            let node = graph.node(id);
            let Op::KvRows(_) = node.op else {
                continue;
            };
            let written = users[id.index()].len() == 1
                && states.iter().any(|s| {
                    graph.node(s.present).inputs.get(1) == Some(&id) && s.written_by.is_some()
                });
            let pair = nodes[pos_of[node.inputs[0].index()].index()].kv_states;
            if !written || pair.is_none_or(|p| p.contains(&usize::MAX)) {
                return Err(RunError::BadState {
                    past: String::new(),
                    present: node.label.clone(),
                    reason: "the keys and values of a fused projection must both be the new \
                             rows of a state's present, and nothing else's"
                        .into(),
                });
            }
        }

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
