//! Graph rewrites that make fewer, fuller dispatches: the neighbours of a `linear` node are
//! folded into one [`FusedLinear`] node, whose kernel does their work in its prologue and
//! epilogue (`src/gpu/kernels/quant.rs`). The runtime runs [`fuse`] on every graph it
//! compiles (`NetworkOptions::fuse`, on by default), so a decoder built by
//! [`crate::llm`] and an imported graph get the same rewrites. Three rewrites, in this order:
//!
//! 1. **gated projections**: `silu_mul(linear(x, wg), linear(x, wu))` and `mul(gelu(linear(x,
//!    wg)), linear(x, wu))` (either operand order) become one `fused_linear` with a gate,
//!    when both weights are constants of one format and shape, read by nothing else: their
//!    bytes are joined into one constant (gate rows, then up rows; the two constants leave
//!    the graph, so the device holds the same bytes). Where the up weight follows the gate
//!    weight in the model file (SmolLM2) the joined constant is one range of it; elsewhere
//!    (Gemma 3 stores the feed-forward norm between them) a copy on the host.
//! 2. **RMSNorm folded into its readers**: an `rms_norm` on the last axis whose every reader
//!    is a linear taking it as x (the Q/K/V projections of a layer, its gated feed-forward,
//!    the head) disappears; each reader normalises x itself.
//! 3. **RoPE in the epilogue**: `rope(linear(..), positions, table)` becomes the linear with
//!    a rotation, when the linear has no gate and no other reader (the Q and K projections
//!    of a llama or qwen2 layer without Q/K norms or biases).
//! 4. **residual in the epilogue**: `add(r, linear(..))` (either order) becomes the linear
//!    with a residual, when the linear has no other reader and `r` has its shape (checked by
//!    inferring the graph's shapes under two bindings of its symbols; a graph whose shapes do
//!    not infer without data gets no residual rewrite).
//!
//! A node read by anything else, or marked as an output, is never folded away; the node that
//! takes over keeps the label (and so the place among the outputs) of the last op it
//! replaces. Nodes folded away (the gate and up weights among them) leave the graph.

use super::ops::{BinaryOp, FusedLinear, GateAct, Op, UnaryOp};
use super::{Bindings, Dim, Graph, GraphError, Node, NodeId};
use crate::graph::ops::source::Constant;
use crate::shape::Shape;

/// How many nodes of each kind [`fuse`] made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuseReport {
    /// Gated projections (two linears and their activation made one).
    pub gated: usize,
    /// RMSNorm nodes folded into their readers.
    pub norms: usize,
    /// RoPE nodes folded into the projection they rotate.
    pub ropes: usize,
    /// Residual additions folded into a projection.
    pub residuals: usize,
}

impl FuseReport {
    /// Whether nothing was rewritten.
    pub fn is_empty(&self) -> bool {
        *self == FuseReport::default()
    }
}

/// The plain linear as a fused one (nothing folded in).
const PLAIN: FusedLinear = FusedLinear {
    norm: None,
    gate: None,
    residual: false,
    rope: None,
};

/// Applies the rewrites of the module docs to `graph`: the rewritten graph and what was
/// made, or the graph itself when nothing applies.
///
/// # Errors
/// [`GraphError`] if the rewritten graph does not validate (a bug in a rewrite).
pub fn fuse(graph: &Graph) -> Result<(Graph, FuseReport), GraphError> {
    let mut r = Rewriter {
        nodes: graph.nodes().to_vec(),
        dead: vec![false; graph.len()],
        is_output: vec![false; graph.len()],
        report: FuseReport::default(),
    };
    for o in graph.outputs() {
        r.is_output[o.index()] = true;
    }
    r.gated();
    r.norms();
    r.ropes();
    if let Some(same) = same_shapes(graph) {
        r.residuals(&same);
    }
    if r.report.is_empty() {
        return Ok((graph.clone(), r.report));
    }
    let report = r.report;
    Ok((r.finish(graph)?, report))
}

/// Which nodes have equal shapes: a function of two ids, from the shapes inferred with every
/// symbol bound to 2 and then to 5 (`None` when either inference fails).
fn same_shapes(graph: &Graph) -> Option<impl Fn(NodeId, NodeId) -> bool> {
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
    let infer = |v: u64| {
        let b: Bindings = symbols.keys().map(|k| (k.clone(), v)).collect();
        graph.infer_shapes(&b).ok().map(|s| s.shapes)
    };
    let (a, b) = (infer(2)?, infer(5)?);
    Some(move |x: NodeId, y: NodeId| a[x.index()] == a[y.index()] && b[x.index()] == b[y.index()])
}

struct Rewriter {
    nodes: Vec<Node>,
    dead: Vec<bool>,
    is_output: Vec<bool>,
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

    /// The fused form of a linear-like node (`linear` or `fused_linear`).
    fn linear_of(&self, id: NodeId) -> Option<FusedLinear> {
        match self.node(id).op {
            Op::Linear(_) => Some(PLAIN),
            Op::FusedLinear(f) => Some(f),
            _ => None,
        }
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
            let w = self.push(label, Op::Constant(joined), Vec::new(), cg.dtype);
            let fused = FusedLinear {
                gate: Some(act),
                ..PLAIN
            };
            self.nodes[i].op = Op::FusedLinear(fused);
            self.nodes[i].inputs = vec![g.inputs[0], w];
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

    /// Rewrite 2: RMSNorm folded into linears that read it as x.
    fn norms(&mut self) {
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            let Op::RmsNorm(rms) = self.node(id).op else {
                continue;
            };
            let readers = self.uses().swap_remove(i);
            let foldable = !self.dead[i]
                && rms.axis == -1
                && !self.is_output[i]
                && !readers.is_empty()
                && readers.iter().all(|&(u, pos)| {
                    pos == 0 && self.linear_of(u).is_some_and(|f| f.norm.is_none())
                });
            if !foldable {
                continue;
            }
            let (x, gamma) = (self.node(id).inputs[0], self.node(id).inputs[1]);
            for (u, _) in readers {
                let Some(f) = self.linear_of(u) else { continue };
                let n = &mut self.nodes[u.index()];
                n.op = Op::FusedLinear(FusedLinear {
                    norm: Some(rms.eps),
                    ..f
                });
                n.inputs[0] = x;
                n.inputs.insert(2, gamma);
            }
            self.dead[i] = true;
            self.report.norms += 1;
        }
    }

    /// Rewrite 3: RoPE folded into the projection it rotates.
    fn ropes(&mut self) {
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            let Op::Rope(rope) = self.node(id).op else {
                continue;
            };
            let uses = self.uses();
            let y = self.node(id).inputs[0];
            let Some(f) = self.linear_of(y) else { continue };
            if self.dead[i]
                || f.gate.is_some()
                || f.rope.is_some()
                || !self.only_read_by(&uses, y, id)
            {
                continue;
            }
            let mut inputs = self.node(y).inputs.clone();
            inputs.extend_from_slice(&self.node(id).inputs[1..]);
            self.nodes[i].op = Op::FusedLinear(FusedLinear {
                rope: Some(rope),
                ..f
            });
            self.nodes[i].inputs = inputs;
            self.dead[y.index()] = true;
            self.report.ropes += 1;
        }
    }

    /// Rewrite 4: residual additions folded into the linear they add to.
    fn residuals(&mut self, same: &impl Fn(NodeId, NodeId) -> bool) {
        for i in 0..self.nodes.len() {
            let id = NodeId(i as u32);
            if self.dead[i] || self.node(id).op != Op::Binary(BinaryOp::Add) {
                continue;
            }
            let uses = self.uses();
            let [a, b] = [self.node(id).inputs[0], self.node(id).inputs[1]];
            for (lin, r) in [(b, a), (a, b)] {
                let Some(f) = self.linear_of(lin) else {
                    continue;
                };
                if f.residual
                    || lin == r
                    || !self.only_read_by(&uses, lin, id)
                    || !same(lin, r)
                    || !same(lin, id)
                {
                    continue;
                }
                let mut inputs = self.node(lin).inputs.clone();
                // Before the RoPE inputs, if any.
                inputs.insert(2 + usize::from(f.norm.is_some()), r);
                self.nodes[i].op = Op::FusedLinear(FusedLinear {
                    residual: true,
                    ..f
                });
                self.nodes[i].inputs = inputs;
                self.dead[lin.index()] = true;
                self.report.residuals += 1;
                break;
            }
        }
    }

    fn push(
        &mut self,
        label: String,
        op: Op,
        inputs: Vec<NodeId>,
        dtype: crate::shape::DType,
    ) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            label,
            op,
            inputs,
            dtype,
        });
        self.dead.push(false);
        self.is_output.push(false);
        id
    }

    /// The graph without the nodes folded away, ids renumbered in order.
    fn finish(self, graph: &Graph) -> Result<Graph, GraphError> {
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
                ropes: 0,
                residuals: 2,
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
                residual: false,
                rope: None,
            })
        );
        assert_eq!(
            op("y"),
            Op::FusedLinear(FusedLinear {
                norm: Some(1e-5),
                gate: Some(GateAct::GeluTanh),
                residual: false,
                rope: None,
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
}
