//! ONNX models written byte by byte (the protobuf wire format of the few `onnx.proto` fields
//! they use): the hostile models of `tests/hostile/onnx.rs`, also seeds of
//! `tests/host/fuzz_onnx.rs` (which includes this file).

#![allow(dead_code)] // each test crate that includes this file uses a part of it

/// ONNX `TensorProto.DataType` codes.
pub const FLOAT: i64 = 1;
/// ONNX `UINT8`.
pub const UINT8: i64 = 2;
/// ONNX `INT64`.
pub const INT64: i64 = 7;

/// A dimension of a declared type.
#[derive(Clone, Copy)]
pub enum Dim {
    /// `dim_value`.
    Fixed(u64),
    /// `dim_param`.
    Sym(&'static str),
}

/// A node: op type (of `domain`, `""` the default one), inputs, outputs, integer attributes;
/// named `name`.
pub struct Node {
    pub name: String,
    pub op: &'static str,
    pub domain: &'static str,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub ints: Vec<(&'static str, i64)>,
}

impl Node {
    pub fn new(name: &str, op: &'static str, inputs: &[&str], outputs: &[&str]) -> Node {
        Node {
            name: name.to_string(),
            op,
            domain: "",
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            ints: Vec::new(),
        }
    }

    pub fn int(mut self, name: &'static str, v: i64) -> Node {
        self.ints.push((name, v));
        self
    }

    pub fn in_domain(mut self, domain: &'static str) -> Node {
        self.domain = domain;
        self
    }
}

/// A graph: declared inputs and outputs (name, element type, dims), initializers (name,
/// element type, dims, little-endian bytes) and nodes.
#[derive(Default)]
pub struct Graph {
    pub inputs: Vec<(String, i64, Vec<Dim>)>,
    pub outputs: Vec<(String, i64, Vec<Dim>)>,
    pub initializers: Vec<(String, i64, Vec<u64>, Vec<u8>)>,
    pub nodes: Vec<Node>,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn int(out: &mut Vec<u8>, field: u64, v: i64) {
    varint(out, field << 3);
    varint(out, v as u64);
}

fn bytes(out: &mut Vec<u8>, field: u64, b: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn message(out: &mut Vec<u8>, field: u64, f: impl FnOnce(&mut Vec<u8>)) {
    let mut m = Vec::new();
    f(&mut m);
    bytes(out, field, &m);
}

fn value_info(out: &mut Vec<u8>, field: u64, (name, elem, dims): &(String, i64, Vec<Dim>)) {
    message(out, field, |v| {
        bytes(v, 1, name.as_bytes());
        message(v, 2, |ty| {
            message(ty, 1, |t| {
                int(t, 1, *elem);
                message(t, 2, |shape| {
                    for d in dims {
                        message(shape, 1, |dim| match d {
                            Dim::Fixed(n) => int(dim, 1, *n as i64),
                            Dim::Sym(s) => bytes(dim, 2, s.as_bytes()),
                        });
                    }
                });
            });
        });
    });
}

/// The `ModelProto` bytes of `g` (IR version 8, default-domain opset `opset`, and version 1
/// of every other domain its nodes use).
pub fn model(g: &Graph, opset: i64) -> Vec<u8> {
    let mut m = Vec::new();
    int(&mut m, 1, 8);
    message(&mut m, 8, |o| {
        bytes(o, 1, b"");
        int(o, 2, opset);
    });
    let mut domains: Vec<&str> = g
        .nodes
        .iter()
        .map(|n| n.domain)
        .filter(|d| !d.is_empty())
        .collect();
    domains.sort_unstable();
    domains.dedup();
    for d in domains {
        message(&mut m, 8, |o| {
            bytes(o, 1, d.as_bytes());
            int(o, 2, 1);
        });
    }
    message(&mut m, 7, |gr| {
        for n in &g.nodes {
            message(gr, 1, |nb| {
                for i in &n.inputs {
                    bytes(nb, 1, i.as_bytes());
                }
                for o in &n.outputs {
                    bytes(nb, 2, o.as_bytes());
                }
                bytes(nb, 3, n.name.as_bytes());
                bytes(nb, 4, n.op.as_bytes());
                if !n.domain.is_empty() {
                    bytes(nb, 7, n.domain.as_bytes());
                }
                for (name, v) in &n.ints {
                    message(nb, 5, |a| {
                        bytes(a, 1, name.as_bytes());
                        int(a, 3, *v);
                        int(a, 20, 2);
                    });
                }
            });
        }
        bytes(gr, 2, b"hostile");
        for (name, elem, dims, raw) in &g.initializers {
            message(gr, 5, |t| {
                for &d in dims {
                    int(t, 1, d as i64);
                }
                int(t, 2, *elem);
                bytes(t, 8, name.as_bytes());
                bytes(t, 9, raw);
            });
        }
        for i in &g.inputs {
            value_info(gr, 11, i);
        }
        for o in &g.outputs {
            value_info(gr, 12, o);
        }
    });
    m
}

/// `y = Sum(x0, ..., x{n-1})`, each input its own graph input of shape `[4]`.
pub fn sum_of_inputs(n: usize) -> Vec<u8> {
    let names: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let g = Graph {
        inputs: names
            .iter()
            .map(|x| (x.clone(), FLOAT, vec![Dim::Fixed(4)]))
            .collect(),
        outputs: vec![("y".into(), FLOAT, vec![Dim::Fixed(4)])],
        nodes: vec![Node::new("sum", "Sum", &refs, &["y"])],
        ..Graph::default()
    };
    model(&g, 13)
}

/// `y = Sum(x, x, ..., x)`, `n` times the one input `x` of shape `[n_x]`: the smallest file
/// per input of the node (three bytes each).
pub fn sum_of_one_input(n: usize) -> Vec<u8> {
    let g = Graph {
        inputs: vec![("x".into(), FLOAT, vec![Dim::Sym("n_x")])],
        outputs: vec![("y".into(), FLOAT, vec![Dim::Sym("n_x")])],
        nodes: vec![Node::new("sum", "Sum", &vec!["x"; n], &["y"])],
        ..Graph::default()
    };
    model(&g, 13)
}

/// Rows of the table the gather models pick from.
pub const ROWS: u64 = 5;
/// Columns of that table.
pub const COLS: u64 = 3;

/// The table: `ROWS x COLS` f32, row `r` holding `10 r + c`.
pub fn table() -> Vec<f32> {
    (0..ROWS * COLS)
        .map(|i| (10 * (i / COLS) + i % COLS) as f32)
        .collect()
}

/// How the gather models make their indices.
#[derive(Clone, Copy, Debug)]
pub enum Indices {
    /// `ids`, an i64 `[2]` graph input, as they are: the host sees them.
    Fed,
    /// `Add(ids, one)`: a kernel computes them from the fed `ids`.
    Added,
    /// `Cast(at, INT64)` of an f32 `[2]` input `at`: a kernel computes them.
    Cast,
}

/// `picked = Gather(table, indices)` on axis 0 (the node named `pick`), indices as `how`.
pub fn gather(how: Indices) -> Vec<u8> {
    let raw: Vec<u8> = table().iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut g = Graph {
        outputs: vec![(
            "picked".into(),
            FLOAT,
            vec![Dim::Fixed(2), Dim::Fixed(COLS)],
        )],
        initializers: vec![("table".into(), FLOAT, vec![ROWS, COLS], raw)],
        ..Graph::default()
    };
    let ids = match how {
        Indices::Fed => {
            g.inputs.push(("ids".into(), INT64, vec![Dim::Fixed(2)]));
            "ids"
        }
        Indices::Added => {
            g.inputs.push(("ids".into(), INT64, vec![Dim::Fixed(2)]));
            g.initializers
                .push(("one".into(), INT64, vec![], 1i64.to_le_bytes().to_vec()));
            g.nodes
                .push(Node::new("add", "Add", &["ids", "one"], &["ids_plus_one"]));
            "ids_plus_one"
        }
        Indices::Cast => {
            g.inputs.push(("at".into(), FLOAT, vec![Dim::Fixed(2)]));
            g.nodes
                .push(Node::new("cast", "Cast", &["at"], &["at_int"]).int("to", INT64));
            "at_int"
        }
    };
    g.nodes
        .push(Node::new("pick", "Gather", &["table", ids], &["picked"]).int("axis", 0));
    model(&g, 13)
}

/// A gather in a shape subgraph, which the host evaluates: `y = Reshape(x, Concat(
/// Gather(Shape(x), ids), [-1]))` for `x` f32 `[n, 4]` and `ids` an i64 `[1]` input (the
/// gather node named `pick_dim`, its output `dim`).
pub fn gather_in_shape_chain() -> Vec<u8> {
    let g = Graph {
        inputs: vec![
            ("x".into(), FLOAT, vec![Dim::Sym("n"), Dim::Fixed(4)]),
            ("ids".into(), INT64, vec![Dim::Fixed(1)]),
        ],
        outputs: vec![("y".into(), FLOAT, vec![Dim::Sym("a"), Dim::Sym("b")])],
        initializers: vec![(
            "rest".into(),
            INT64,
            vec![1],
            (-1i64).to_le_bytes().to_vec(),
        )],
        nodes: vec![
            Node::new("shape", "Shape", &["x"], &["x_shape"]),
            Node::new("pick_dim", "Gather", &["x_shape", "ids"], &["dim"]).int("axis", 0),
            Node::new("target", "Concat", &["dim", "rest"], &["target"]).int("axis", 0),
            Node::new("reshape", "Reshape", &["x", "target"], &["y"]),
        ],
    };
    model(&g, 13)
}

/// What a hostile `MatMulNBits` model holds (`y = MatMulNBits(x, b, scales[, zp])`, the node
/// named `mnb`, x f32 `[1, x_k]`): its attributes and its constants' element counts, each free
/// to contradict the others.
pub struct NBits {
    pub k: i64,
    pub n: i64,
    pub bits: i64,
    pub block_size: i64,
    /// Declared K of x.
    pub x_k: u64,
    /// B's element type and dims (its bytes are zeros, as many as the dims say).
    pub b: (i64, Vec<u64>),
    /// Elements of `scales` (f32).
    pub scales: u64,
    /// `zero_points`: element type and count, absent when `None`.
    pub zero_points: Option<(i64, u64)>,
    /// A `g_idx` input (i32 `[k]`).
    pub g_idx: bool,
    /// B a graph input instead of an initializer.
    pub b_fed: bool,
}

impl NBits {
    /// A well-formed node: K 64, N 8, 4 bits, blocks of 32, uint8 zero points.
    pub fn valid() -> NBits {
        NBits {
            k: 64,
            n: 8,
            bits: 4,
            block_size: 32,
            x_k: 64,
            b: (UINT8, vec![8, 2, 16]),
            scales: 16,
            zero_points: Some((UINT8, 8)),
            g_idx: false,
            b_fed: false,
        }
    }
}

fn elem_bytes(elem: i64) -> u64 {
    match elem {
        UINT8 => 1,
        INT64 => 8,
        _ => 4,
    }
}

/// The `ModelProto` bytes of the [`NBits`] model.
pub fn matmul_nbits(m: &NBits) -> Vec<u8> {
    let f32s = |n: u64| vec![0u8; n as usize * 4];
    let mut g = Graph {
        inputs: vec![("x".into(), FLOAT, vec![Dim::Fixed(1), Dim::Fixed(m.x_k)])],
        outputs: vec![("y".into(), FLOAT, vec![Dim::Sym("a"), Dim::Sym("b")])],
        initializers: vec![("scales".into(), FLOAT, vec![m.scales], f32s(m.scales))],
        ..Graph::default()
    };
    let (b_elem, b_dims) = &m.b;
    if m.b_fed {
        let dims = b_dims.iter().map(|&d| Dim::Fixed(d)).collect();
        g.inputs.push(("b".into(), *b_elem, dims));
    } else {
        let n: u64 = b_dims.iter().product();
        g.initializers.push((
            "b".into(),
            *b_elem,
            b_dims.clone(),
            vec![0u8; (n * elem_bytes(*b_elem)) as usize],
        ));
    }
    let mut inputs = vec!["x", "b", "scales", ""];
    if let Some((elem, count)) = m.zero_points {
        g.initializers.push((
            "zp".into(),
            elem,
            vec![count],
            vec![0u8; (count * elem_bytes(elem)) as usize],
        ));
        inputs[3] = "zp";
    }
    if m.g_idx {
        g.initializers.push((
            "g_idx".into(),
            6,
            vec![m.k.max(0) as u64],
            vec![0u8; m.k.max(0) as usize * 4],
        ));
        inputs.push("g_idx");
    }
    g.nodes.push(
        Node::new("mnb", "MatMulNBits", &inputs, &["y"])
            .in_domain("com.microsoft")
            .int("K", m.k)
            .int("N", m.n)
            .int("bits", m.bits)
            .int("block_size", m.block_size),
    );
    model(&g, 17)
}
