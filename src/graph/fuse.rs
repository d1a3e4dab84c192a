//! Graph rewrites that make fewer, fuller dispatches: the neighbours of a `linear` node are
//! folded into one [`FusedLinear`] node, whose kernel does their work in its prologue and
//! epilogue (`src/gpu/kernels/quant.rs`). The runtime runs [`fuse_with_states`] on every
//! graph it compiles (`NetworkOptions::fuse`, on by default), with the graph's KV-cache
//! states, so a decoder built by [`crate::llm`] and an imported graph get the same rewrites.
//! In this order:
//!
//! 1. **gated projections**: `silu_mul(linear(x, wg), linear(x, wu))` and `mul(gelu(linear(x,
//!    wg)), linear(x, wu))` (either operand order) become one `fused_linear` with a gate,
//!    when both weights are constants of one format and shape, read by nothing else: their
//!    bytes are joined into one constant (gate rows, then up rows; the two constants leave
//!    the graph, so the device holds the same bytes). Where the up weight follows the gate
//!    weight in the model file (SmolLM2) the joined constant is one range of it; elsewhere
//!    (Gemma 3 stores the feed-forward norm between them) a copy on the host.
//! 2. **bias**: `add(linear(..), b)` (either order) with `b` a constant vector of the
//!    projection's width read by nothing else (Qwen2's Q/K/V biases).
//! 3. **head norms**: `reshape_to(rms_norm(reshape(linear(..), [-1, d])), shape_of(linear))`,
//!    an RMSNorm of each head of a projection (Gemma's and Qwen3's Q/K norms).
//! 4. **RoPE in the epilogue**: `rope(linear(..), positions, table)` becomes the linear with
//!    a rotation, when the linear has no gate and no other reader.
//! 5. **Q/K/V and the KV cache**: three projections of one x whose keys and values are the
//!    new rows of two KV-cache states (`concat(past, k)` of a `[rows, width]` cache, or
//!    `scatter_rows(pool, k, slots)` of a paged pool) become one `fused_linear` with a
//!    [`KvSplit`]: its three weights read side by side (the runtime places them together:
//!    the device holds the same bytes), its output the queries, its keys and values the
//!    [`KvRows`] the states' presents read, which its kernel writes straight into the cache
//!    (no append copy). A pool's slots follow the positions in one integer input (a
//!    `concat`, made once per step and shared by the layers). The queries and keys must
//!    share their norm, bias, head norms and RoPE; the values have neither head norms nor
//!    RoPE.
//! 6. **RMSNorm folded into its readers**: an `rms_norm` on the last axis whose every reader
//!    is a linear taking it as x (the Q/K/V projection of a layer, its gated feed-forward,
//!    the head) disappears; each reader normalises x itself.
//! 7. **post-norm and residual**: `add(r, rms_norm(linear(..)))` (Gemma's post-norms), and
//! 8. **residual in the epilogue**: `add(r, linear(..))` (either order), become the linear
//!    with a residual (and the norm of its row), when `r` has the output's shape (checked by
//!    inferring the graph's shapes under two bindings of its symbols; a graph whose shapes
//!    do not infer without data gets neither rewrite).
//!
//! A node read by anything else, or marked as an output, is never folded away; the node that
//! takes over keeps the label (and so the place among the outputs) of the last op it
//! replaces. Nodes folded away (the gate and up weights among them) leave the graph. The
//! vectors a projection folds in (the norm's gamma, the bias, the head norms' and the
//! post-norm's weights) are its one parameters input: the vector itself when there is one,
//! else the constants joined on the host (kilobytes; the originals leave the graph).

use super::ops::fused_linear::PLAIN;
use super::ops::{
    BinaryOp, Concat, FusedLinear, GateAct, HeadNorm, KvRows, KvSplit, Op, Reshape, UnaryOp,
};
use super::{Bindings, Dim, Graph, GraphError, Node, NodeId};
use crate::graph::ops::source::Constant;
use crate::shape::{DType, Shape};
use crate::tensor::ConstData;

/// How many nodes of each kind [`fuse`] made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuseReport {
    /// Gated projections (two linears and their activation made one).
    pub gated: usize,
    /// Biases folded into a projection.
    pub biases: usize,
    /// Head norms folded into a projection.
    pub head_norms: usize,
    /// RoPE nodes folded into the projection they rotate.
    pub ropes: usize,
    /// Query, key and value projections made one, their keys and values written to a cache.
    pub kv_splits: usize,
    /// RMSNorm nodes folded into their readers.
    pub norms: usize,
    /// Post-norms folded into a projection.
    pub post_norms: usize,
    /// Residual additions folded into a projection.
    pub residuals: usize,
}

impl FuseReport {
    /// Whether nothing was rewritten.
    pub fn is_empty(&self) -> bool {
        *self == FuseReport::default()
    }
}

/// [`fuse_with_states`] without KV-cache states (no Q/K/V rewrite).
///
/// # Errors
/// As [`fuse_with_states`].
pub fn fuse(graph: &Graph) -> Result<(Graph, FuseReport), GraphError> {
    fuse_with_states(graph, &[])
}

/// Applies the rewrites of the module docs to `graph`, whose KV-cache states are `states`
/// (`(past, present)` labels, as the runtime binds them): the rewritten graph and what was
/// made, or the graph itself when nothing applies.
///
/// # Errors
/// [`GraphError`] if the rewritten graph does not validate (a bug in a rewrite).
pub fn fuse_with_states(
    graph: &Graph,
    states: &[(String, String)],
) -> Result<(Graph, FuseReport), GraphError> {
    let mut r = Rewriter {
        nodes: graph.nodes().to_vec(),
        dead: vec![false; graph.len()],
        is_output: vec![false; graph.len()],
        parts: vec![None; graph.len()],
        report: FuseReport::default(),
    };
    for o in graph.outputs() {
        r.is_output[o.index()] = true;
    }
    // Fused nodes of an earlier pass are read as they are.
    for i in 0..r.nodes.len() {
        if let Op::FusedLinear(f) = r.nodes[i].op {
            r.parts[i] = Parts::of_compact(&f, &r.nodes[i].inputs);
        }
    }
    let same = same_shapes(graph);
    r.gated();
    r.biases(&same);
    r.head_norms();
    r.ropes();
    let states: Vec<(NodeId, NodeId)> = states
        .iter()
        .filter_map(|(past, present)| Some((graph.find(past)?, graph.find(present)?)))
        .collect();
    r.kv_splits(&states, &same);
    r.norms();
    if let Some(same) = &same {
        r.post_norms(same);
        r.residuals(same);
    }
    if r.report.is_empty() {
        return Ok((graph.clone(), r.report));
    }
    let report = r.report;
    Ok((r.finish(graph)?, report))
}

/// Shapes under two bindings of every symbol, to tell which nodes have equal shapes.
struct Shapes {
    a: Vec<Shape>,
    b: Vec<Shape>,
}

impl Shapes {
    /// Whether `x` and `y` have equal shapes.
    fn same(&self, x: NodeId, y: NodeId) -> bool {
        self.a[x.index()] == self.a[y.index()] && self.b[x.index()] == self.b[y.index()]
    }

    /// `x`'s shape under the first binding.
    fn of(&self, x: NodeId) -> &Shape {
        &self.a[x.index()]
    }
}

/// The shapes inferred with every symbol bound to 2 and then to 5 (`None` when either
/// inference fails).
fn same_shapes(graph: &Graph) -> Option<Shapes> {
    let mut symbols = Bindings::new();
    for id in graph.inputs() {
        if let Op::Input(i) = &graph.node(id).op {
            for d in &i.dims {
                if let Dim::Sym(s) = d {
                    symbols.insert(s.clone(), 0);
                }
            }
        }
    }
    // Values every op takes: a paged attention's pool holds whole pages, so both are
    // multiples of every page size in the graph.
    let unit = graph
        .nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::PagedAttention(p) => Some(u64::from(p.page_size.max(1))),
            _ => None,
        })
        .fold(1u64, |a, b| a / gcd(a, b) * b);
    let infer = |v: u64| {
        let b: Bindings = symbols.keys().map(|k| (k.clone(), v)).collect();
        graph.infer_shapes(&b).ok().map(|s| s.shapes)
    };
    Some(Shapes {
        a: infer(2 * unit)?,
        b: infer(5 * unit)?,
    })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The inputs of a fused node while the rewrites run, each part apart; [`Parts::compact`]
/// makes the node's inputs in the order of [`FusedLinear`].
#[derive(Debug, Clone, PartialEq)]
struct Parts {
    x: NodeId,
    weights: Vec<NodeId>,
    gamma: Option<NodeId>,
    /// The bias, one vector per weight.
    bias: Vec<NodeId>,
    /// The head norms' weights (the queries', then the keys').
    heads: Vec<NodeId>,
    post: Option<NodeId>,
    residual: Option<NodeId>,
    ints: Option<NodeId>,
    table: Option<NodeId>,
    /// A parameters input made by an earlier pass (already joined).
    params: Option<NodeId>,
}

impl Parts {
    fn plain(x: NodeId, w: NodeId) -> Parts {
        Parts {
            x,
            weights: vec![w],
            gamma: None,
            bias: Vec::new(),
            heads: Vec::new(),
            post: None,
            residual: None,
            ints: None,
            table: None,
            params: None,
        }
    }

    /// The parts of a fused node of the input graph (its parameters as one input).
    fn of_compact(f: &FusedLinear, inputs: &[NodeId]) -> Option<Parts> {
        let mut p = Parts::plain(*inputs.first()?, *inputs.get(1)?);
        p.weights = inputs.get(1..1 + f.weights())?.to_vec();
        p.params = f.params_input().and_then(|i| inputs.get(i).copied());
        p.residual = f.residual_input().and_then(|i| inputs.get(i).copied());
        p.ints = f.ints_input().and_then(|i| inputs.get(i).copied());
        p.table = f.table_input().and_then(|i| inputs.get(i).copied());
        Some(p)
    }

    /// The vectors of the parameters, in their order.
    fn vectors(&self) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self.gamma.into_iter().collect();
        v.extend(&self.bias);
        v.extend(&self.heads);
        v.extend(self.post);
        v
    }

    /// Every input, each part apart (what the rewrites see read).
    fn expanded(&self) -> Vec<NodeId> {
        let mut v = vec![self.x];
        v.extend(&self.weights);
        v.extend(self.params);
        v.extend(self.vectors());
        v.extend(self.residual);
        v.extend(self.ints);
        v.extend(self.table);
        v
    }

    /// The node's inputs, the parameters as `params`.
    fn compact(&self, params: Option<NodeId>) -> Vec<NodeId> {
        let mut v = vec![self.x];
        v.extend(&self.weights);
        v.extend(params.or(self.params));
        v.extend(self.residual);
        v.extend(self.ints);
        v.extend(self.table);
        v
    }
}

struct Rewriter {
    nodes: Vec<Node>,
    dead: Vec<bool>,
    is_output: Vec<bool>,
    /// The parts of each fused node.
    parts: Vec<Option<Parts>>,
    report: FuseReport,
}

impl Rewriter {
    /// Every live reader of each node, once per input position that reads it.
    fn uses(&self) -> Vec<Vec<(NodeId, usize)>> {
        let mut uses = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            if self.dead.get(i).copied().unwrap_or(false) {
                continue;
            }
            for (pos, &input) in n.inputs.iter().enumerate() {
                uses[input.index()].push((NodeId(i as u32), pos));
            }
        }
        uses
    }

    /// Whether `id` may be folded into its one reader: read once, and not an output.
    fn only_read_by(&self, uses: &[Vec<(NodeId, usize)>], id: NodeId, reader: NodeId) -> bool {
        !self.is_output[id.index()]
            && matches!(uses[id.index()].as_slice(), [(u, _)] if *u == reader)
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// The fused form of a linear-like node (`linear` or `fused_linear`) and its parts;
    /// `None` for anything else, and for a fused node of an earlier pass whose parameters
    /// were joined (nothing more is folded into it).
    fn linear_of(&self, id: NodeId) -> Option<(FusedLinear, Parts)> {
        let n = self.node(id);
        match &n.op {
            Op::Linear(_) => Some((PLAIN, Parts::plain(n.inputs[0], n.inputs[1]))),
            Op::FusedLinear(f) => {
                let parts = self.parts[id.index()].clone()?;
                parts.params.is_none().then_some((*f, parts))
            }
            _ => None,
        }
    }

    /// Makes node `i` the fused `op` of `parts`.
    fn set(&mut self, i: usize, op: FusedLinear, parts: Parts) {
        self.nodes[i].op = Op::FusedLinear(op);
        self.nodes[i].inputs = parts.expanded();
        self.parts[i] = Some(parts);
    }

    /// Whether `v` may join other vectors in one parameters input: an f32 constant.
    fn is_vector(&self, v: NodeId) -> bool {
        matches!(&self.node(v).op, Op::Constant(c) if c.dtype == DType::F32 && c.shape.rank() == 1)
    }

    /// Whether the parameters of `parts` with `more` added can be one input: one vector, or
    /// constants only.
    fn can_hold(&self, parts: &Parts, more: &[NodeId]) -> bool {
        let mut all = parts.vectors();
        all.extend(more);
        parts.params.is_none() && (all.len() <= 1 || all.iter().all(|&v| self.is_vector(v)))
    }

    /// Rewrite 1: gated projections.
    fn gated(&mut self) {
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            let uses = self.uses();
            let Some((act, gate, up, gelu)) = self.gated_pattern(&uses, id) else {
                continue;
            };
            let (g, u) = (self.node(gate).clone(), self.node(up).clone());
            let (wg, wu) = (g.inputs[1], u.inputs[1]);
            if g.inputs[0] != u.inputs[0]
                || wg == wu
                || !self.only_read_by(&uses, wg, gate)
                || !self.only_read_by(&uses, wu, up)
            {
                continue;
            }
            let (Op::Constant(cg), Op::Constant(cu)) = (&self.node(wg).op, &self.node(wu).op)
            else {
                continue;
            };
            if cg.dtype != cu.dtype || cg.shape != cu.shape || cg.shape.rank() != 2 {
                continue;
            }
            let dims = cg.shape.dims();
            let joined = Constant {
                shape: Shape::new(vec![dims[0] * 2, dims[1]]),
                dtype: cg.dtype,
                data: cg.data.joined(&cu.data),
            };
            let label = format!("{}+{}", self.node(wg).label, self.node(wu).label);
            let dtype = cg.dtype;
            let w = self.push(label, Op::Constant(joined), Vec::new(), dtype);
            let fused = FusedLinear {
                gate: Some(act),
                ..PLAIN
            };
            self.set(i, fused, Parts::plain(g.inputs[0], w));
            for d in [Some(gate), Some(up), gelu, Some(wg), Some(wu)]
                .into_iter()
                .flatten()
            {
                self.dead[d.index()] = true;
            }
            self.report.gated += 1;
        }
    }

    /// `(activation, gate linear, up linear, gelu node)` when `id` ends a gated projection
    /// whose linears (and gelu) only it reads.
    fn gated_pattern(
        &self,
        uses: &[Vec<(NodeId, usize)>],
        id: NodeId,
    ) -> Option<(GateAct, NodeId, NodeId, Option<NodeId>)> {
        let n = self.node(id);
        if self.dead[id.index()] || n.inputs.len() != 2 {
            return None;
        }
        let (a, b) = (n.inputs[0], n.inputs[1]);
        let plain = |x: NodeId| matches!(self.node(x).op, Op::Linear(_));
        let found = match n.op {
            Op::Binary(BinaryOp::SiluMul) => (GateAct::Silu, a, b, None),
            Op::Binary(BinaryOp::Mul) => {
                let gelu_of = |x: NodeId| {
                    let gn = self.node(x);
                    (gn.op == Op::Unary(UnaryOp::Gelu) && self.only_read_by(uses, x, id))
                        .then(|| gn.inputs[0])
                };
                match (gelu_of(a), gelu_of(b)) {
                    (Some(g), _) => (GateAct::GeluTanh, g, b, Some(a)),
                    (None, Some(g)) => (GateAct::GeluTanh, g, a, Some(b)),
                    (None, None) => return None,
                }
            }
            _ => return None,
        };
        let (act, gate, up, gelu) = found;
        let gate_reader = gelu.unwrap_or(id);
        let ok = gate != up
            && plain(gate)
            && plain(up)
            && self.only_read_by(uses, gate, gate_reader)
            && self.only_read_by(uses, up, id);
        ok.then_some((act, gate, up, gelu))
    }

    /// Whether a projection's product is still what it computes (nothing folded in after
    /// it, no gate): the node a bias, head norms or RoPE may follow.
    fn bare_product(f: &FusedLinear) -> bool {
        f.gate.is_none()
            && f.rope.is_none()
            && !f.residual
            && f.head_norm.is_none()
            && f.post_norm.is_none()
            && f.kv.is_none()
    }

    /// Rewrite 2: biases.
    fn biases(&mut self, same: &Option<Shapes>) {
        let Some(shapes) = same else {
            return;
        };
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            if self.dead[i] || self.node(id).op != Op::Binary(BinaryOp::Add) {
                continue;
            }
            let uses = self.uses();
            let [a, b] = [self.node(id).inputs[0], self.node(id).inputs[1]];
            for (lin, bias) in [(a, b), (b, a)] {
                let Some((f, mut parts)) = self.linear_of(lin) else {
                    continue;
                };
                let width = shapes.of(lin).dims().last().copied();
                let fits = matches!(&self.node(bias).op, Op::Constant(c)
                    if c.dtype == DType::F32 && Some(c.shape.dims()) == width.as_ref().map(std::slice::from_ref));
                if f.bias
                    || !Self::bare_product(&f)
                    || !fits
                    || !shapes.same(lin, id)
                    || !self.only_read_by(&uses, lin, id)
                    || !self.only_read_by(&uses, bias, id)
                    || !self.can_hold(&parts, &[bias])
                {
                    continue;
                }
                parts.bias = vec![bias];
                self.set(i, FusedLinear { bias: true, ..f }, parts);
                self.dead[lin.index()] = true;
                self.report.biases += 1;
                break;
            }
        }
    }

    /// Rewrite 3: head norms (`reshape_to(rms_norm(reshape(y, [-1, d])), shape_of(y))`).
    fn head_norms(&mut self) {
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            if self.dead[i] || !matches!(self.node(id).op, Op::ReshapeTo(_)) {
                continue;
            }
            let uses = self.uses();
            let [normed, width] = self.node(id).inputs[..] else {
                continue;
            };
            let Op::RmsNorm(rms) = self.node(normed).op else {
                continue;
            };
            let [heads, gamma] = self.node(normed).inputs[..] else {
                continue;
            };
            let Op::Reshape(Reshape { target }) = &self.node(heads).op else {
                continue;
            };
            let d = match target[..] {
                [-1, d] if d > 0 && rms.axis == -1 => d as u32,
                _ => continue,
            };
            let y = self.node(heads).inputs[0];
            let shape_of_y =
                matches!(self.node(width).op, Op::ShapeOf(_)) && self.node(width).inputs == [y];
            let gamma_fits = matches!(&self.node(gamma).op, Op::Constant(c)
                if c.dtype == DType::F32 && c.shape.dims() == [u64::from(d)]);
            let Some((f, mut parts)) = self.linear_of(y) else {
                continue;
            };
            let y_readers = uses[y.index()]
                .iter()
                .all(|&(u, _)| u == heads || u == width);
            if !shape_of_y
                || !gamma_fits
                || f.gate.is_some()
                || f.rope.is_some()
                || f.residual
                || f.head_norm.is_some()
                || f.post_norm.is_some()
                || f.kv.is_some()
                || self.is_output[y.index()]
                || !y_readers
                || !self.only_read_by(&uses, heads, normed)
                || !self.only_read_by(&uses, normed, id)
                || !self.only_read_by(&uses, width, id)
                || !self.can_hold(&parts, &[gamma])
            {
                continue;
            }
            parts.heads = vec![gamma];
            let op = FusedLinear {
                head_norm: Some(HeadNorm {
                    head_dim: d,
                    eps: rms.eps,
                }),
                ..f
            };
            self.set(i, op, parts);
            for dead in [y, heads, normed, width] {
                self.dead[dead.index()] = true;
            }
            self.report.head_norms += 1;
        }
    }

    /// Rewrite 4: RoPE folded into the projection it rotates.
    fn ropes(&mut self) {
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            let Op::Rope(rope) = self.node(id).op else {
                continue;
            };
            let uses = self.uses();
            let y = self.node(id).inputs[0];
            let Some((f, mut parts)) = self.linear_of(y) else {
                continue;
            };
            let heads_fit = f.head_norm.is_none_or(|h| h.head_dim == rope.head_dim);
            if self.dead[i]
                || f.gate.is_some()
                || f.rope.is_some()
                || f.residual
                || f.post_norm.is_some()
                || f.kv.is_some()
                || !heads_fit
                || !self.only_read_by(&uses, y, id)
            {
                continue;
            }
            parts.ints = Some(self.node(id).inputs[1]);
            parts.table = Some(self.node(id).inputs[2]);
            self.set(
                i,
                FusedLinear {
                    rope: Some(rope),
                    ..f
                },
                parts,
            );
            self.dead[y.index()] = true;
            self.report.ropes += 1;
        }
    }

    /// The new rows of state `(past, present)` when the present is a `concat(past, rows)` of
    /// a `[rows, width]` cache along its rows, or a `scatter_rows(past, rows, slots)`:
    /// `(rows, slots)`.
    fn state_rows(&self, past: NodeId, present: NodeId) -> Option<(NodeId, Option<NodeId>)> {
        let n = self.node(present);
        let rank2 = matches!(&self.node(past).op, Op::Input(i) if i.dims.len() == 2);
        match (&n.op, &n.inputs[..]) {
            (Op::Concat(Concat { axis: 0 }), &[p, rows]) if p == past && rank2 => {
                Some((rows, None))
            }
            (Op::ScatterRows(_), &[p, rows, slots]) if p == past => Some((rows, Some(slots))),
            _ => None,
        }
    }

    /// Rewrite 5: the query, key and value projections of one x, whose keys and values are
    /// the new rows of two consecutive states, made one projection writing the cache.
    fn kv_splits(&mut self, states: &[(NodeId, NodeId)], same: &Option<Shapes>) {
        let Some(shapes) = same else {
            return;
        };
        let mut joined_ints: Vec<((NodeId, NodeId), NodeId)> = Vec::new();
        for pair in states.windows(2) {
            let [(pk, sk), (pv, sv)] = [pair[0], pair[1]];
            let (Some((k, slots_k)), Some((v, slots_v))) =
                (self.state_rows(pk, sk), self.state_rows(pv, sv))
            else {
                continue;
            };
            let uses = self.uses();
            let (Some((fk, parts_k)), Some((fv, parts_v))) = (self.linear_of(k), self.linear_of(v))
            else {
                continue;
            };
            // The queries: the one other projection of the same x.
            let x = parts_k.x;
            let others: Vec<NodeId> = uses[x.index()]
                .iter()
                .map(|&(u, _)| u)
                .filter(|&u| u != k && u != v && self.linear_of(u).is_some_and(|(_, p)| p.x == x))
                .collect();
            let [q] = others[..] else {
                continue;
            };
            let Some((fq, parts_q)) = self.linear_of(q) else {
                continue;
            };
            let kv_rows = shapes.of(k).dims().last().copied().unwrap_or(0);
            // Constants read by their projection only: the runtime places the three side by
            // side.
            let weight_ok = |w: &[NodeId], reader: NodeId| {
                matches!(w, [w] if matches!(self.node(*w).op, Op::Constant(_))
                    && self.only_read_by(&uses, *w, reader))
            };
            let simple = |f: &FusedLinear| f.gate.is_none() && !f.residual && f.post_norm.is_none();
            let ok = slots_k == slots_v
                && shapes.same(k, v)
                && parts_v.x == x
                && simple(&fq)
                && simple(&fk)
                && simple(&fv)
                && fq.kv.is_none()
                && fq.norm == fk.norm
                && fq.norm == fv.norm
                && parts_q.gamma == parts_k.gamma
                && parts_q.gamma == parts_v.gamma
                && fq.bias == fk.bias
                && fq.bias == fv.bias
                && fq.rope == fk.rope
                && parts_q.ints == parts_k.ints
                && parts_q.table == parts_k.table
                && fv.rope.is_none()
                && fq.head_norm == fk.head_norm
                && fv.head_norm.is_none()
                && weight_ok(&parts_q.weights, q)
                && weight_ok(&parts_k.weights, k)
                && weight_ok(&parts_v.weights, v)
                && self.only_read_by(&uses, k, sk)
                && self.only_read_by(&uses, v, sv)
                && u32::try_from(kv_rows).is_ok_and(|r| r > 0);
            if !ok {
                continue;
            }
            let mut parts = parts_q.clone();
            parts.weights.extend(&parts_k.weights);
            parts.weights.extend(&parts_v.weights);
            if fq.bias {
                parts.bias = [&parts_q, &parts_k, &parts_v]
                    .iter()
                    .flat_map(|p| p.bias.clone())
                    .collect();
            }
            parts.heads.extend(parts_k.heads.clone());
            if !self.can_hold(&parts, &[]) {
                continue;
            }
            // The integers: the positions, then a pool's slots (joined once per step).
            if let Some(slots) = slots_k {
                parts.ints = match parts.ints {
                    None => Some(slots),
                    Some(pos) => Some(match joined_ints.iter().find(|(k, _)| *k == (pos, slots)) {
                        Some(&(_, j)) => j,
                        None => {
                            let label =
                                format!("{}+{}", self.node(pos).label, self.node(slots).label);
                            let j = self.push(
                                label,
                                Op::Concat(Concat { axis: 0 }),
                                vec![pos, slots],
                                DType::I32,
                            );
                            joined_ints.push(((pos, slots), j));
                            j
                        }
                    }),
                };
            }
            let op = FusedLinear {
                kv: Some(KvSplit {
                    kv_rows: kv_rows as u32,
                    slots: slots_k.is_some(),
                }),
                ..fq
            };
            self.set(q.index(), op, parts);
            for (node, values) in [(k, false), (v, true)] {
                let n = &mut self.nodes[node.index()];
                n.op = Op::KvRows(KvRows {
                    values,
                    rows: kv_rows as u32,
                });
                n.inputs = vec![q];
                self.parts[node.index()] = None;
            }
            self.report.kv_splits += 1;
        }
    }

    /// Rewrite 6: RMSNorm folded into linears that read it as x.
    fn norms(&mut self) {
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            let Op::RmsNorm(rms) = self.node(id).op else {
                continue;
            };
            let readers = self.uses().swap_remove(i);
            let (x, gamma) = (self.node(id).inputs[0], self.node(id).inputs[1]);
            let foldable = !self.dead[i]
                && rms.axis == -1
                && !self.is_output[i]
                && !readers.is_empty()
                && readers.iter().all(|&(u, pos)| {
                    pos == 0
                        && self.linear_of(u).is_some_and(|(f, p)| {
                            f.norm.is_none() && p.x == id && self.can_hold(&p, &[gamma])
                        })
                });
            if !foldable {
                continue;
            }
            for (u, _) in readers {
                let Some((f, mut parts)) = self.linear_of(u) else {
                    continue;
                };
                parts.x = x;
                parts.gamma = Some(gamma);
                self.set(
                    u.index(),
                    FusedLinear {
                        norm: Some(rms.eps),
                        ..f
                    },
                    parts,
                );
            }
            self.dead[i] = true;
            self.report.norms += 1;
        }
    }

    /// Rewrite 7: `add(r, rms_norm(linear(..)))`, a post-norm and the residual.
    fn post_norms(&mut self, same: &Shapes) {
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            if self.dead[i] || self.node(id).op != Op::Binary(BinaryOp::Add) {
                continue;
            }
            let uses = self.uses();
            let [a, b] = [self.node(id).inputs[0], self.node(id).inputs[1]];
            for (normed, r) in [(b, a), (a, b)] {
                let Op::RmsNorm(rms) = self.node(normed).op else {
                    continue;
                };
                let [lin, gamma] = self.node(normed).inputs[..] else {
                    continue;
                };
                let Some((f, mut parts)) = self.linear_of(lin) else {
                    continue;
                };
                if rms.axis != -1
                    || f.gate.is_some()
                    || f.rope.is_some()
                    || f.kv.is_some()
                    || f.residual
                    || f.post_norm.is_some()
                    || f.head_norm.is_some()
                    || lin == r
                    || normed == r
                    || !self.only_read_by(&uses, lin, normed)
                    || !self.only_read_by(&uses, normed, id)
                    || !same.same(lin, r)
                    || !same.same(lin, id)
                    || !self.can_hold(&parts, &[gamma])
                {
                    continue;
                }
                parts.post = Some(gamma);
                parts.residual = Some(r);
                let op = FusedLinear {
                    post_norm: Some(rms.eps),
                    residual: true,
                    ..f
                };
                self.set(i, op, parts);
                self.dead[lin.index()] = true;
                self.dead[normed.index()] = true;
                self.report.post_norms += 1;
                self.report.residuals += 1;
                break;
            }
        }
    }

    /// Rewrite 8: residual additions folded into the linear they add to.
    fn residuals(&mut self, same: &Shapes) {
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            if self.dead[i] || self.node(id).op != Op::Binary(BinaryOp::Add) {
                continue;
            }
            let uses = self.uses();
            let [a, b] = [self.node(id).inputs[0], self.node(id).inputs[1]];
            for (lin, r) in [(b, a), (a, b)] {
                let Some((f, mut parts)) = self.linear_of(lin) else {
                    continue;
                };
                if f.residual
                    || f.kv.is_some()
                    || lin == r
                    || !self.only_read_by(&uses, lin, id)
                    || !same.same(lin, r)
                    || !same.same(lin, id)
                {
                    continue;
                }
                parts.residual = Some(r);
                self.set(
                    i,
                    FusedLinear {
                        residual: true,
                        ..f
                    },
                    parts,
                );
                self.dead[lin.index()] = true;
                self.report.residuals += 1;
                break;
            }
        }
    }

    fn push(&mut self, label: String, op: Op, inputs: Vec<NodeId>, dtype: DType) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            label,
            op,
            inputs,
            dtype,
        });
        self.dead.push(false);
        self.is_output.push(false);
        self.parts.push(None);
        id
    }

    /// Each fused node's parameters made one input: its one vector, or the vectors (f32
    /// constants) joined into a new constant; the vectors read by nothing else then leave.
    fn join_params(&mut self) {
        for i in 0..self.nodes.len() {
            let Some(parts) = self.parts[i].clone().filter(|_| !self.dead[i]) else {
                continue;
            };
            let vectors = parts.vectors();
            let params = match vectors[..] {
                [] => None,
                [one] => Some(one),
                _ => {
                    let mut bytes = Vec::new();
                    let mut len = 0;
                    for &v in &vectors {
                        if let Op::Constant(c) = &self.node(v).op {
                            bytes.extend_from_slice(c.data.bytes());
                            len += c.shape.dims().first().copied().unwrap_or(0);
                        }
                    }
                    let label = format!("{}.params", self.nodes[i].label);
                    let joined = Constant {
                        shape: Shape::new(vec![len]),
                        dtype: DType::F32,
                        data: ConstData::from_vec(bytes),
                    };
                    Some(self.push(label, Op::Constant(joined), Vec::new(), DType::F32))
                }
            };
            self.nodes[i].inputs = parts.compact(params);
        }
        let uses = self.uses();
        for (i, users) in uses.iter().enumerate() {
            let unread = users.is_empty() && !self.is_output[i];
            if unread && matches!(self.nodes[i].op, Op::Constant(_)) {
                self.dead[i] = true;
            }
        }
    }

    /// The graph without the nodes folded away, ids renumbered in order.
    fn finish(mut self, graph: &Graph) -> Result<Graph, GraphError> {
        // Constants unread in the input graph stay (only those the rewrites left go).
        let was_read: Vec<bool> = {
            let users = graph.users();
            (0..self.nodes.len())
                .map(|i| {
                    i >= graph.len()
                        || !users[i].is_empty()
                        || graph.outputs().contains(&NodeId(i as u32))
                })
                .collect()
        };
        self.join_params();
        for (i, read) in was_read.into_iter().enumerate() {
            if !read {
                self.dead[i] = false;
            }
        }
        let mut map = vec![None; self.nodes.len()];
        let mut nodes = Vec::new();
        for (i, n) in self.nodes.into_iter().enumerate() {
            if self.dead[i] {
                continue;
            }
            map[i] = Some(NodeId(nodes.len() as u32));
            nodes.push(n);
        }
        for n in &mut nodes {
            for input in &mut n.inputs {
                // A live node reading a dead one would be a bug of a rewrite: the dangling id
                // is refused by validation below.
                *input = map[input.index()].unwrap_or(NodeId(u32::MAX));
            }
        }
        let outputs = graph
            .outputs()
            .iter()
            .map(|o| map[o.index()].unwrap_or(NodeId(u32::MAX)))
            .collect();
        Graph::from_nodes(nodes, outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::reference::evaluate;
    use crate::graph::{GraphBuilder, Op};
    use crate::rng::SplitMix64;
    use crate::shape::DType;
    use crate::tensor::ConstData;

    const D: u64 = 32;

    fn shape(d: &[u64]) -> Shape {
        Shape::new(d.to_vec())
    }

    fn random(rng: &mut SplitMix64, n: u64) -> Vec<f32> {
        (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
    }

    /// `[n, D]` f32 weight.
    fn w(b: &mut GraphBuilder, rng: &mut SplitMix64, label: &str, n: u64) -> NodeId {
        let v = random(rng, n * D);
        b.constant(label, shape(&[n, D]), v)
    }

    /// A pre-norm block with every pattern: Q/V projections of one norm, the output
    /// projection and its residual, a SwiGLU feed-forward and its residual, then a GeGLU
    /// with the gelu on the right operand of the mul.
    fn block() -> Graph {
        let mut rng = SplitMix64::new(3);
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(D)], DType::F32);
        let mut gamma = |b: &mut GraphBuilder, l: &str| {
            let v = random(&mut rng, D);
            b.constant(l, shape(&[D]), v)
        };
        let (g1, g2, g3) = (
            gamma(&mut b, "g1"),
            gamma(&mut b, "g2"),
            gamma(&mut b, "g3"),
        );
        let mut rng = SplitMix64::new(4);
        let h = b.rms_norm("h", x, g1, 1e-5);
        let wq = w(&mut b, &mut rng, "wq", D);
        let wv = w(&mut b, &mut rng, "wv", D);
        let q = b.linear("q", h, wq);
        let v = b.linear("v", h, wv);
        let t = b.mul("t", q, v);
        let wo = w(&mut b, &mut rng, "wo", D);
        let o = b.linear("o", t, wo);
        let x2 = b.add("x2", x, o);
        let h2 = b.rms_norm("h2", x2, g2, 1e-5);
        let (wg, wu) = (w(&mut b, &mut rng, "wg", 48), w(&mut b, &mut rng, "wu", 48));
        let gate = b.linear("gate", h2, wg);
        let up = b.linear("up", h2, wu);
        let act = b.binary("act", BinaryOp::SiluMul, gate, up);
        let wd = b.constant("wd", shape(&[D, 48]), random(&mut rng, D * 48));
        let down = b.linear("down", act, wd);
        let x3 = b.add("x3", down, x2);
        let h3 = b.rms_norm("h3", x3, g3, 1e-5);
        let (wg2, wu2) = (
            w(&mut b, &mut rng, "wg2", 16),
            w(&mut b, &mut rng, "wu2", 16),
        );
        let gate2 = b.linear("gate2", h3, wg2);
        let gelu = b.unary("gelu", UnaryOp::Gelu, gate2);
        let up2 = b.linear("up2", h3, wu2);
        let y = b.mul("y", up2, gelu);
        b.output(y);
        b.output(x3);
        b.build().unwrap()
    }

    fn run(g: &Graph, seq: u64) -> Vec<Vec<f32>> {
        let x = random(&mut SplitMix64::new(seq), seq * D);
        evaluate(g, &[("x", shape(&[seq, D]), x)])
            .unwrap()
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    #[test]
    fn a_block_folds_into_fused_projections_with_the_same_values() {
        let g = block();
        let (f, report) = fuse(&g).unwrap();
        assert_eq!(
            report,
            FuseReport {
                gated: 2,
                norms: 3,
                residuals: 2,
                ..FuseReport::default()
            }
        );
        let fused: Vec<&str> = f
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::FusedLinear(_)))
            .map(|n| n.label.as_str())
            .collect();
        // q and v carry the norm, x2 and x3 the residual, act and y the gates.
        assert_eq!(fused, ["q", "v", "x2", "act", "x3", "y"]);
        for gone in [
            "h", "h2", "h3", "o", "down", "gate", "up", "wg", "wu", "gelu",
        ] {
            assert!(f.find(gone).is_none(), "{gone}");
        }
        assert!(f.find("wg+wu").is_some() && f.find("wg2+wu2").is_some());
        let op = |l: &str| f.node(f.find(l).unwrap()).op.clone();
        assert_eq!(
            op("act"),
            Op::FusedLinear(FusedLinear {
                norm: Some(1e-5),
                gate: Some(GateAct::Silu),
                ..PLAIN
            })
        );
        assert_eq!(
            op("y"),
            Op::FusedLinear(FusedLinear {
                norm: Some(1e-5),
                gate: Some(GateAct::GeluTanh),
                ..PLAIN
            })
        );
        // The outputs keep their labels and order; the values are the unfused graph's.
        let labels = |g: &Graph| -> Vec<String> {
            g.outputs()
                .iter()
                .map(|&o| g.node(o).label.clone())
                .collect()
        };
        assert_eq!(labels(&f), labels(&g));
        for seq in [1, 3] {
            let (want, got) = (run(&g, seq), run(&f, seq));
            for (a, b) in want.iter().flatten().zip(got.iter().flatten()) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                    "seq {seq}: {a} vs {b}"
                );
            }
        }
        // Nothing is left to fold: a second pass returns the graph as it is.
        let (again, report) = fuse(&f).unwrap();
        assert!(report.is_empty());
        assert_eq!(again.len(), f.len());
    }

    #[test]
    fn a_rotated_projection_folds_its_norm_and_rope() {
        use crate::graph::ops::{rope_block, rope_table, rope_table_rows, Rope};
        let mut rng = SplitMix64::new(5);
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(D)], DType::F32);
        let pos = b.input("pos", &[Dim::sym("seq")], DType::I32);
        let rows = u64::from(rope_table_rows(16));
        let table = b.constant("table", shape(&[rows, 8]), rope_table(1e4, 8, 16));
        let g = b.constant("g", shape(&[D]), random(&mut rng, D));
        let h = b.rms_norm("h", x, g, 1e-5);
        let wq = w(&mut b, &mut rng, "wq", D);
        let q = b.linear("q", h, wq);
        let rope = Rope {
            head_dim: 16,
            block: rope_block(16),
            interleaved: false,
        };
        let r = b.rope("q.rope", q, pos, table, rope);
        let y = b.add("y", r, x);
        b.output(y);
        let g = b.build().unwrap();
        let (f, report) = fuse(&g).unwrap();
        assert_eq!((report.norms, report.ropes, report.residuals), (1, 1, 1));
        assert_eq!(f.len(), g.len() - 3);
        let x = random(&mut rng, 3 * D);
        let inputs = [
            ("x", shape(&[3, D]), x),
            ("pos", shape(&[3]), vec![0.0, 5.0, 15.0]),
        ];
        let (want, got) = (
            evaluate(&g, &inputs).unwrap(),
            evaluate(&f, &inputs).unwrap(),
        );
        for (a, b) in want[0].1.iter().zip(&got[0].1) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
        }
    }

    #[test]
    fn nothing_is_folded_that_another_reader_or_a_broadcast_needs() {
        let mut rng = SplitMix64::new(9);
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(D)], DType::F32);
        let g1 = b.constant("g1", shape(&[D]), random(&mut rng, D));
        // A norm also read by an add stays; so does the add of a linear that is an output.
        let h = b.rms_norm("h", x, g1, 1e-5);
        let wq = w(&mut b, &mut rng, "wq", D);
        let q = b.linear("q", h, wq);
        let hq = b.add("hq", h, q);
        // A residual that broadcasts ([1, D] onto [seq, D]) is not folded.
        let row = b.constant("row", shape(&[1, D]), random(&mut rng, D));
        let wk = w(&mut b, &mut rng, "wk", D);
        let k = b.linear("k", hq, wk);
        let kb = b.add("kb", row, k);
        // Gate and up weights of different formats stay two projections.
        let wg = w(&mut b, &mut rng, "wg", D);
        let halves: Vec<u8> = random(&mut rng, D * D)
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let wu = b.constant_bytes(
            "wu",
            shape(&[D, D]),
            DType::F16,
            ConstData::from_vec(halves),
        );
        let gate = b.linear("gate", kb, wg);
        let up = b.linear("up", kb, wu);
        let act = b.binary("act", BinaryOp::SiluMul, gate, up);
        b.output(act);
        b.output(q);
        let g = b.build().unwrap();
        let (f, report) = fuse(&g).unwrap();
        assert!(report.is_empty(), "{report:?}");
        assert_eq!(f.len(), g.len());
    }

    /// Options of [`layer`]: the parts of a decoder layer that vary by architecture.
    #[derive(Clone, Copy)]
    struct Layer {
        bias: bool,
        head_norm: bool,
        post_norm: bool,
        paged: bool,
        halves: bool,
    }

    const HEAD: u64 = 16;
    const KV: u64 = 16;
    const POOL: u64 = 12;

    /// One decoder layer as the llm blocks write it, width D, two query heads and one KV
    /// head of 16, over a contiguous cache or a pool (12 rows in the inputs); f32 weights. Outputs: the
    /// layer's output, then the presents (keys, values), whose states are returned too.
    fn layer(o: Layer) -> (Graph, Vec<(String, String)>) {
        use crate::graph::ops::{
            rope_block, rope_table, rope_table_rows, Attention, PagedAttention, Rope,
        };
        let mut rng = SplitMix64::new(11);
        let mut b = GraphBuilder::new();
        let seq = Dim::sym("seq");
        let x = b.input("x", &[seq.clone(), Dim::Fixed(D)], DType::F32);
        let pos = b.input("pos", std::slice::from_ref(&seq), DType::I32);
        // The pool's rows a symbol, as the models' are: the rewrites' shape checks bind it to
        // whole pages.
        let rows = if o.paged {
            Dim::sym("pool_rows")
        } else {
            Dim::sym("past")
        };
        let past_k = b.input("past_k", &[rows.clone(), Dim::Fixed(KV)], DType::F32);
        let past_v = b.input("past_v", &[rows, Dim::Fixed(KV)], DType::F32);
        let vector = |b: &mut GraphBuilder, rng: &mut SplitMix64, l: &str, n: u64| {
            let v = random(rng, n);
            b.constant(l, shape(&[n]), v)
        };
        let g1 = vector(&mut b, &mut rng, "g1", D);
        let h = b.rms_norm("h", x, g1, 1e-5);
        let wq = w(&mut b, &mut rng, "wq", 2 * HEAD);
        let wk = w(&mut b, &mut rng, "wk", KV);
        let wv = w(&mut b, &mut rng, "wv", KV);
        let mut q = b.linear("q", h, wq);
        let mut k = b.linear("k", h, wk);
        let mut v = b.linear("v", h, wv);
        if o.bias {
            let (bq, bk, bv) = (
                vector(&mut b, &mut rng, "bq", 2 * HEAD),
                vector(&mut b, &mut rng, "bk", KV),
                vector(&mut b, &mut rng, "bv", KV),
            );
            q = b.add("q.bias", q, bq);
            k = b.add("k.bias", bk, k);
            v = b.add("v.bias", v, bv);
        }
        if o.head_norm {
            for (name, t) in [("q", &mut q), ("k", &mut k)] {
                let g = vector(&mut b, &mut rng, &format!("{name}n"), HEAD);
                let width = b.shape_of(format!("{name}_norm.width"), *t);
                let heads = b.reshape(format!("{name}_norm.heads"), *t, &[-1, HEAD as i64]);
                let normed = b.rms_norm(format!("{name}_norm"), heads, g, 1e-6);
                *t = b.reshape_to(format!("{name}_norm.rows"), normed, width);
            }
        }
        let table = b.constant(
            "table",
            shape(&[u64::from(rope_table_rows(40)), HEAD]),
            rope_table(1e4, HEAD as u32, 40),
        );
        let rope = Rope {
            head_dim: HEAD as u32,
            block: rope_block(40),
            interleaved: !o.halves,
        };
        let q = b.rope("q.rope", q, pos, table, rope);
        let k = b.rope("k.rope", k, pos, table, rope);
        let (pk, pv, attn) = if o.paged {
            let slots = b.input("slots", std::slice::from_ref(&seq), DType::I32);
            let rows_in = b.input("rows", &[seq.clone(), Dim::Fixed(2)], DType::I32);
            let pages = b.input("pages", &[Dim::Fixed(1), Dim::Fixed(3)], DType::I32);
            let pk = b.scatter_rows("present_k", past_k, k, slots);
            let pv = b.scatter_rows("present_v", past_v, v, slots);
            let a = b.paged_attention(
                "attn",
                [q, pk, pv, rows_in, pages],
                PagedAttention {
                    num_heads: 2,
                    num_kv_heads: 1,
                    window: 0,
                    page_size: 4,
                },
            );
            (pk, pv, a)
        } else {
            let pk = b.concat("present_k", &[past_k, k], 0);
            let pv = b.concat("present_v", &[past_v, v], 0);
            let a = b.attention(
                "attn",
                q,
                pk,
                pv,
                Attention {
                    num_heads: 2,
                    num_kv_heads: 1,
                    window: 0,
                },
            );
            (pk, pv, a)
        };
        let wo = w(&mut b, &mut rng, "wo", D);
        let mut out = b.linear("o", attn, wo);
        if o.post_norm {
            let g = vector(&mut b, &mut rng, "post1", D);
            out = b.rms_norm("o.post", out, g, 1e-6);
        }
        let x2 = b.add("x2", x, out);
        let g2 = vector(&mut b, &mut rng, "g2", D);
        let h2 = b.rms_norm("h2", x2, g2, 1e-5);
        let (wg, wu) = (w(&mut b, &mut rng, "wg", 48), w(&mut b, &mut rng, "wu", 48));
        let gate = b.linear("gate", h2, wg);
        let up = b.linear("up", h2, wu);
        let act = b.binary("act", BinaryOp::SiluMul, gate, up);
        let wd = b.constant("wd", shape(&[D, 48]), random(&mut rng, D * 48));
        let mut down = b.linear("down", act, wd);
        if o.post_norm {
            let g = vector(&mut b, &mut rng, "post2", D);
            down = b.rms_norm("down.post", down, g, 1e-6);
        }
        let x3 = b.add("x3", x2, down);
        b.output(x3);
        b.output(pk);
        b.output(pv);
        let states = vec![
            ("past_k".to_owned(), "present_k".to_owned()),
            ("past_v".to_owned(), "present_v".to_owned()),
        ];
        (b.build().unwrap(), states)
    }

    /// The inputs of [`layer`] for a step of `seq` rows after `past` (contiguous: the cache
    /// holds `past` rows; paged: a pool of 12 rows in 3 pages of 4, the step's rows at slots
    /// `past..`).
    fn layer_inputs(o: Layer, seq: u64, past: u64) -> Vec<(&'static str, Shape, Vec<f32>)> {
        let mut rng = SplitMix64::new(seq * 7 + past);
        let rows = if o.paged { POOL } else { past };
        let positions: Vec<f32> = (past..past + seq).map(|p| p as f32).collect();
        let mut v = vec![
            ("x", shape(&[seq, D]), random(&mut rng, seq * D)),
            ("pos", shape(&[seq]), positions.clone()),
            ("past_k", shape(&[rows, KV]), random(&mut rng, rows * KV)),
            ("past_v", shape(&[rows, KV]), random(&mut rng, rows * KV)),
        ];
        if o.paged {
            // Pages 2, 0, 1: position p at row pages[p / 4] * 4 + p % 4.
            let pages = [2.0, 0.0, 1.0];
            let slot = |p: u64| pages[(p / 4) as usize] * 4.0 + (p % 4) as f32;
            let rows_in: Vec<f32> = (past..past + seq).flat_map(|p| [0.0, p as f32]).collect();
            v.push((
                "slots",
                shape(&[seq]),
                (past..past + seq).map(slot).collect(),
            ));
            v.push(("rows", shape(&[seq, 2]), rows_in));
            v.push(("pages", shape(&[1, 3]), pages.to_vec()));
        }
        v
    }

    #[test]
    fn a_decoder_layer_folds_into_four_projections_with_the_same_values() {
        let mut variants = Vec::new();
        for paged in [false, true] {
            // llama, qwen2 (biases), gemma3 (head norms, post-norms), qwen3 (head norms).
            for (bias, head_norm, post_norm, halves) in [
                (false, false, false, false),
                (true, false, false, true),
                (false, true, true, true),
                (false, true, false, true),
            ] {
                variants.push(Layer {
                    bias,
                    head_norm,
                    post_norm,
                    paged,
                    halves,
                });
            }
        }
        for o in variants {
            let (g, states) = layer(o);
            let (f, report) = fuse_with_states(&g, &states).unwrap();
            let two = |on: bool| if on { 2 } else { 0 };
            assert_eq!(
                report,
                FuseReport {
                    gated: 1,
                    biases: if o.bias { 3 } else { 0 },
                    head_norms: two(o.head_norm),
                    ropes: 2,
                    kv_splits: 1,
                    norms: 2,
                    post_norms: two(o.post_norm),
                    residuals: 2,
                },
                "{}",
                o.paged
            );
            // The layer's dispatches: Q/K/V, attention, O, gate/up, down.
            let kernels: Vec<&str> = f
                .nodes()
                .iter()
                .filter(|n| {
                    matches!(
                        n.op,
                        Op::FusedLinear(_) | Op::Attention(_) | Op::PagedAttention(_)
                    )
                })
                .map(|n| n.label.as_str())
                .collect();
            assert_eq!(kernels, ["q.rope", "attn", "x2", "act", "x3"]);
            let Op::FusedLinear(qkv) = f.node(f.find("q.rope").unwrap()).op else {
                unreachable!()
            };
            assert_eq!(
                qkv.kv,
                Some(KvSplit {
                    kv_rows: KV as u32,
                    slots: o.paged
                })
            );
            for (seq, past) in [(1, 3), (3, 5)] {
                let inputs = layer_inputs(o, seq, past);
                let (want, got) = (
                    evaluate(&g, &inputs).unwrap(),
                    evaluate(&f, &inputs).unwrap(),
                );
                assert_eq!(want.len(), 3);
                for ((ws, wv), (gs, gv)) in want.iter().zip(&got) {
                    assert_eq!(ws, gs);
                    for (a, b) in wv.iter().zip(gv) {
                        assert!(
                            (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                            "paged {} seq {seq}: {a} vs {b}",
                            o.paged
                        );
                    }
                }
            }
            // Without the states, no split: the keys and values stay separate projections.
            let (_, report) = fuse(&g).unwrap();
            assert_eq!(report.kv_splits, 0);
        }
    }
}
