//! No import cycles between files (docs/modules.md): the files under `src/` import each other
//! along a graph without cycles, except within one kernel family (`src/gpu/kernels/<family>`,
//! its `.rs` file and its folder) or one op family (`src/graph/ops/<family>`,
//! `src/onnx/import/<family>`), and for the few edges of [`ALLOWED`], each with its reason.
//!
//! An import is a path in code (comments and literals are skipped by the lexer of
//! `wgpu_door`) that starts at `crate`, `super`, `self` or a child module the file declares:
//! in a `use` tree or inline (`crate::gpu::pipeline::with_prelude!`). A path names the file of
//! the longest module prefix that has one; when the next name is one that file re-exports
//! (`pub use engine::Engine` in `gpu/mod.rs`), the edge goes to the file the re-export names,
//! so a re-export is a door, not a dependency, and `pub use` adds no edge of its own. Inline
//! modules stay in their file. Test code (inline `mod tests`, `tests.rs` files) is left out:
//! a test may check one module against another, as a kernel against the CPU reference. The library and the two
//! binaries (`dynrt`: `main.rs`, `cli/`; `dynrt-bench`: `bench/`) are three crates, so
//! `crate::` means what it means in each.

use crate::wgpu_door::{code_tokens, rust_files};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Edges (importer, imported, relative to `src/`; an imported path ending in `*` stands for
/// every file under that folder) left out of the graph: each is the back edge of a cycle that
/// is still there, for the reason given. Each is work to do, not a rule: remove an entry by
/// moving what both sides share into a file of its own, and the test says when an entry no
/// longer matches any import.
const ALLOWED: &[(&str, &str, &str)] = &[
    // Registries: the folder's `mod.rs` names every member in one list, and the members import
    // the trait and types the registry file also defines. The fix is the same for each: the
    // shared trait and types in a file of their own (`gpu/kernels/kernel.rs`,
    // `graph/ops/def.rs`, `onnx/import/ctx.rs` already holds `Ctx`, `formats/format.rs`).
    ("gpu/kernels/mod.rs", "gpu/kernels/*", "FAMILIES and kernel_of name every family; the families import Kernel, Family, Operand, KernelError from mod.rs"),
    ("graph/ops/mod.rs", "graph/ops/*", "the Op registry list names every op; the ops import OpDef and the shared rules from mod.rs"),
    ("onnx/import/mod.rs", "onnx/import/*", "CONVERTERS names every converter family; they import the converter type and helpers from mod.rs"),
    ("formats/mod.rs", "formats/*", "FORMATS names every format; the plain-float rows import Format from mod.rs"),
    // A module's file calls into its own submodule, which uses types the module's file
    // defines: the types belong in a file of their own beside the submodule.
    ("gpu/mod.rs", "gpu/embed.rs", "Gpu holds embed's Slicer; embed builds Gpu from an application's device"),
    ("gpu/mod.rs", "gpu/kernels/mod.rs", "Gpu keeps a GL device's pipelines keyed by kernels::PipelineKey; kernels compile through Gpu"),
    ("graph/ir/mod.rs", "graph/ir/validate.rs", "Graph calls check_node and processing_order, which use GraphError and Node"),
    ("llm/batch/mod.rs", "llm/batch/*", "BatchEngine holds Pages and Offloaded; pages.rs and offload.rs take BatchEngine and Seq"),
    ("memory/planner/mod.rs", "memory/planner/*", "the planner calls gmem, greedy and search, which take its Problem and align_up"),
    ("memory/predictor/mod.rs", "memory/predictor/*", "ShapePredictor calls the openvino and adaptive policies, which use its options, errors and step helpers"),
    ("npy/mod.rs", "npy/header.rs", "reading calls parse_header, which uses npy's NpyError and helpers"),
    ("onnx/file/mod.rs", "onnx/file/decode.rs", "loading calls decode::main_graph, which uses the types of onnx/file/mod.rs"),
    ("runtime/request/mod.rs", "runtime/request/index_checks.rs", "InferRequest holds IndexChecks, which take InferRequest and alloc_err"),
    ("tokenizer/mod.rs", "tokenizer/spm.rs", "the tokenizer holds spm::Spm, which uses the types of tokenizer/mod.rs"),
    // Siblings that use each other.
    ("gpu/kernels/encoder.rs", "gpu/kernels/cache.rs", "Encoder records through Kernels; Kernels' bind-group cache is keyed by encoder's BindKey"),
    ("gpu/kernels/movement.rs", "gpu/kernels/encoder.rs", "movement records through Encoder; Encoder copies an aliased operand with movement_copy and its CopyParams"),
    ("graph/ops/elementwise.rs", "graph/ir/builder.rs", "elementwise.rs adds GraphBuilder's add/mul/... methods; the builder names the ops"),
    ("graph/reference.rs", "graph/ir/mod.rs", "the CPU reference evaluates a Graph; GraphError carries the reference's RefError"),
    ("graph/reference.rs", "graph/ops/mod.rs", "the CPU reference runs each Op; the ops' reference code uses its RefTensor and Values"),
    ("graph/shape_data.rs", "graph/*", "the shape-data evaluator uses the ops' gather and slice index code and the reference's wrap; the ops and the reference call it"),
    ("llm/graph.rs", "llm/arch/config.rs", "the blocks take arch's RopeScaling; ModelConfig checks the tensors the blocks read (tensors_read)"),
    ("onnx/inspect.rs", "onnx/import/mod.rs", "inspect asks the importer why a node is refused; the importer returns inspect's UnsupportedNode"),
    ("onnx/ops.rs", "onnx/import/mod.rs", "the op table asks whether a converter exists; the importer reads op_version from it"),
    ("bench/linear.rs", "bench/kernels.rs", "the linear benchmark times with kernels' helpers; the kernels report holds the LinearReport"),
    ("cli/serve_guard.rs", "cli/serve_api.rs", "the guard answers with serve_api's ApiError; serve_api uses the guard's truncated"),
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Crate {
    Lib,
    Dynrt,
    Bench,
}

fn crate_of(rel: &str) -> Crate {
    if rel == "main.rs" || rel.starts_with("cli/") {
        Crate::Dynrt
    } else if rel.starts_with("bench/") {
        Crate::Bench
    } else {
        Crate::Lib
    }
}

/// The module path of a file within its crate (`gpu/kernels/mod.rs`: `gpu::kernels`).
fn module_path(rel: &str) -> Vec<String> {
    let stem = rel.trim_end_matches(".rs");
    let stem = match crate_of(rel) {
        Crate::Bench => stem
            .trim_start_matches("bench/")
            .trim_start_matches("bench"),
        _ => stem,
    };
    let mut segs: Vec<String> = stem
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if segs.last().is_some_and(|s| s == "mod") {
        segs.pop();
    }
    if segs == ["lib"] || segs == ["main"] {
        segs.clear();
    }
    segs
}

/// One crate's files, by module path.
struct Files {
    all: BTreeSet<String>,
}

impl Files {
    /// The file of module `segs` of `krate`, if the module is a file.
    fn module_file(&self, krate: Crate, segs: &[String]) -> Option<String> {
        let (base, segs) = match krate {
            Crate::Bench if segs.first().is_some_and(|s| s == "shared") => {
                ("cli/shared", &segs[1..])
            }
            Crate::Bench => ("bench", segs),
            _ => ("", segs),
        };
        if segs.is_empty() {
            let root = match (krate, base) {
                (Crate::Lib, _) => "lib.rs".to_string(),
                (Crate::Dynrt, _) => "main.rs".to_string(),
                (Crate::Bench, "bench") => "bench/main.rs".to_string(),
                (Crate::Bench, b) => format!("{b}/mod.rs"),
            };
            return Some(root);
        }
        let joined = segs.join("/");
        let dir = if base.is_empty() {
            joined
        } else {
            format!("{base}/{joined}")
        };
        [format!("{dir}.rs"), format!("{dir}/mod.rs")]
            .into_iter()
            .find(|f| self.all.contains(f))
    }

    /// The file of the longest module prefix of `segs`, and the names after it.
    fn resolve<'s>(&self, krate: Crate, segs: &'s [String]) -> (String, &'s [String]) {
        for k in (0..=segs.len()).rev() {
            if let Some(f) = self.module_file(krate, &segs[..k]) {
                return (f, &segs[k..]);
            }
        }
        unreachable!("the crate root is a file")
    }
}

/// A path found in one file: absolute within its crate, whether a `pub use` re-exports it
/// (and under which name), and its line.
struct Found {
    segs: Vec<String>,
    reexport: Option<String>,
    line: usize,
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// Every path of `text` (the file `rel`) that starts at `crate`, `super`, `self` or a child
/// module the file declares, made absolute.
fn paths_of(rel: &str, text: &str) -> Vec<Found> {
    let toks = code_tokens(text);
    let t = |i: usize| toks.get(i).map_or("", |(_, s)| s.as_str());
    let file_path = module_path(rel);
    let children: BTreeSet<&str> = (0..toks.len())
        .filter(|&i| t(i) == "mod" && is_ident(t(i + 1)) && t(i + 2) == ";")
        .map(|i| t(i + 1))
        .collect();
    let mut out = Vec::new();
    // Inline modules open at a brace depth: their names extend the file's module path.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match t(i) {
            "{" => {
                if t(i.wrapping_sub(2)) == "mod" && i >= 2 && is_ident(t(i - 1)) {
                    inline.push((t(i - 1).to_string(), depth + 1));
                }
                depth += 1;
                i += 1;
                continue;
            }
            "}" => {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
                i += 1;
                continue;
            }
            _ => {}
        }
        if inline.iter().any(|(n, _)| n == "tests") {
            i += 1;
            continue;
        }
        let mut here = file_path.clone();
        here.extend(inline.iter().map(|(n, _)| n.clone()));
        let line = toks[i].0;
        if t(i) == "use" {
            let mut back = i;
            let mut public = false;
            while back > 0 && i - back < 6 && !matches!(t(back - 1), ";" | "{" | "}") {
                back -= 1;
                public |= t(back) == "pub";
            }
            let mut leaves = Vec::new();
            i = use_tree(&toks, i + 1, Vec::new(), &mut leaves);
            for (segs, alias) in leaves {
                if let Some(abs) = absolute(&segs, &here, inline.is_empty(), &children) {
                    let name = alias.or_else(|| segs.last().cloned());
                    out.push(Found {
                        segs: abs,
                        reexport: if public { name } else { None },
                        line,
                    });
                }
            }
            continue;
        }
        let starts = matches!(t(i), "crate" | "super" | "self")
            || (inline.is_empty() && children.contains(t(i)));
        if starts && t(i + 1) == "::" && t(i.wrapping_sub(1)) != "::" {
            let mut segs = vec![t(i).to_string()];
            let mut j = i + 1;
            while t(j) == "::" && is_ident(t(j + 1)) {
                segs.push(t(j + 1).to_string());
                j += 2;
            }
            if let Some(abs) = absolute(&segs, &here, inline.is_empty(), &children) {
                out.push(Found {
                    segs: abs,
                    reexport: None,
                    line,
                });
            }
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// Reads the use tree at `toks[i..]` with `prefix`, pushing each leaf path and its alias;
/// returns the index after the tree (after the `;` at the top).
fn use_tree(
    toks: &[(usize, String)],
    mut i: usize,
    mut prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let t = |i: usize| toks.get(i).map_or("", |(_, s)| s.as_str());
    if t(i) == "::" {
        i += 1;
    }
    loop {
        match t(i) {
            "{" => {
                i += 1;
                while !matches!(t(i), "}" | "") {
                    i = use_tree(toks, i, prefix.clone(), leaves);
                    if t(i) == "," {
                        i += 1;
                    }
                }
                return i + 1;
            }
            "*" => {
                leaves.push((prefix, None));
                return i + 1;
            }
            "self" if !prefix.is_empty() => {
                i += 1;
                let alias = (t(i) == "as").then(|| t(i + 1).to_string());
                if alias.is_some() {
                    i += 2;
                }
                leaves.push((prefix, alias));
                return i;
            }
            s if is_ident(s) => {
                prefix.push(s.to_string());
                i += 1;
                if t(i) == "::" {
                    i += 1;
                    continue;
                }
                let alias = (t(i) == "as").then(|| t(i + 1).to_string());
                if alias.is_some() {
                    i += 2;
                }
                leaves.push((prefix, alias));
                if t(i) == ";" {
                    i += 1;
                }
                return i;
            }
            _ => return i + 1,
        }
    }
}

/// `segs` made absolute from module `here`; `None` for paths into other crates.
fn absolute(
    segs: &[String],
    here: &[String],
    top: bool,
    children: &BTreeSet<&str>,
) -> Option<Vec<String>> {
    let first = segs.first()?.as_str();
    let mut abs: Vec<String> = match first {
        "crate" => Vec::new(),
        "self" | "super" => here.to_vec(),
        c if top && children.contains(c) => here.to_vec(),
        _ => return None,
    };
    let mut rest = if first == "crate" || first == "self" {
        &segs[1..]
    } else {
        segs
    };
    while rest.first().is_some_and(|s| s == "super") {
        abs.pop();
        rest = &rest[1..];
    }
    abs.extend(rest.iter().cloned());
    Some(abs)
}

/// A kernel family or an op family (`gpu/kernels/quant` for `gpu/kernels/quant.rs`), whose
/// files may import each other.
fn family(rel: &str) -> Option<String> {
    ["gpu/kernels/", "graph/ops/", "onnx/import/"]
        .iter()
        .find_map(|prefix| {
            let rest = rel.strip_prefix(prefix)?;
            let stem = rest.split('/').next()?.trim_end_matches(".rs");
            (stem != "mod" && rest != "mod.rs").then(|| format!("{prefix}{stem}"))
        })
}

/// The import graph of `src/`: importer → imported → the first line that imports it.
fn import_graph() -> BTreeMap<String, BTreeMap<String, usize>> {
    let src = crate::common::repo().join("src");
    let files: Vec<String> = rust_files(&src)
        .iter()
        .map(|p| {
            p.strip_prefix(&src)
                .unwrap()
                .display()
                .to_string()
                .replace('\\', "/")
        })
        // Test code may check one module against another (a kernel against the CPU
        // reference): `tests.rs` files, like inline `mod tests`, import what they like.
        .filter(|rel| !rel.ends_with("tests.rs"))
        .collect();
    let index = Files {
        all: files.iter().cloned().collect(),
    };
    let found: BTreeMap<&String, Vec<Found>> = files
        .iter()
        .map(|rel| {
            let text = std::fs::read_to_string(src.join(rel)).unwrap();
            (rel, paths_of(rel, &text))
        })
        .collect();
    // What each file re-exports: name → absolute path.
    let mut reexports: BTreeMap<&str, BTreeMap<&str, &[String]>> = BTreeMap::new();
    for (rel, paths) in &found {
        for f in paths {
            if let Some(name) = &f.reexport {
                reexports
                    .entry(rel.as_str())
                    .or_default()
                    .insert(name.as_str(), &f.segs);
            }
        }
    }
    let mut graph: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for (rel, paths) in &found {
        let krate = crate_of(rel);
        for f in paths.iter().filter(|f| f.reexport.is_none()) {
            let mut segs = f.segs.clone();
            let mut target = index.resolve(krate, &segs).0;
            for _ in 0..8 {
                let (file, rest) = index.resolve(krate, &segs);
                target = file.clone();
                let Some(next) = rest
                    .first()
                    .and_then(|n| reexports.get(file.as_str())?.get(n.as_str()))
                else {
                    break;
                };
                let mut followed = next.to_vec();
                followed.extend(rest[1..].iter().cloned());
                segs = followed;
            }
            if target != **rel {
                graph
                    .entry(rel.to_string())
                    .or_default()
                    .entry(target)
                    .or_insert(f.line);
            }
        }
    }
    graph
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeMap<String, usize>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeMap<String, usize>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flat_map(|e| e.keys()) {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let lw = s.low[w.as_str()];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w.as_str()) {
                let iw = s.index[w.as_str()];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// One shortest cycle through `from` within `scc`, written `a.rs:line -> b.rs:line -> a.rs`.
fn show_cycle(graph: &BTreeMap<String, BTreeMap<String, usize>>, scc: &[String]) -> String {
    let from = &scc[0];
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([from.as_str()]);
    'search: while let Some(v) = queue.pop_front() {
        for w in graph.get(v).into_iter().flat_map(|e| e.keys()) {
            if !scc.contains(w) || prev.contains_key(w.as_str()) {
                continue;
            }
            prev.insert(w, v);
            if w == from {
                break 'search;
            }
            queue.push_back(w);
        }
    }
    let mut path = vec![from.as_str()];
    let mut at = prev[from.as_str()];
    while at != from {
        path.push(at);
        at = prev[at];
    }
    path.push(from);
    path.reverse();
    let steps: Vec<String> = path
        .windows(2)
        .map(|p| format!("src/{}:{}", p[0], graph[p[0]][p[1]]))
        .collect();
    format!("{} -> src/{from}", steps.join(" -> "))
}

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let mut graph = import_graph();
    // The walk saw the tree and the paths in it.
    let edges: usize = graph.values().map(BTreeMap::len).sum();
    assert!(graph.len() >= 150, "{} files import others", graph.len());
    assert!(edges >= 500, "{edges} imports");
    for (from, to) in [
        // Through the re-export of `gpu/mod.rs` to the file that defines `Engine`.
        ("gpu/kernels/uniforms.rs", "gpu/engine.rs"),
        // An inline path to a macro.
        ("gpu/kernels/reduce.rs", "gpu/pipeline.rs"),
        // A child module named without `self::`.
        ("gpu/mod.rs", "gpu/serial.rs"),
    ] {
        assert!(
            graph.get(from).is_some_and(|e| e.contains_key(to)),
            "src/{from} -> src/{to} not found: {:?}",
            graph.get(from)
        );
    }
    for (from, to, why) in ALLOWED {
        let edges = graph.get_mut(*from);
        let matching: Vec<String> = edges
            .iter()
            .flat_map(|e| e.keys())
            .filter(|t| match to.strip_suffix('*') {
                Some(folder) => t.starts_with(folder),
                None => t == to,
            })
            .cloned()
            .collect();
        assert!(
            !matching.is_empty(),
            "allowed edge src/{from} -> src/{to} ({why}) is gone: drop it from ALLOWED"
        );
        let edges = graph.get_mut(*from).unwrap();
        for t in matching {
            edges.remove(&t);
        }
    }
    let within_family: Vec<(String, String)> = graph
        .iter()
        .flat_map(|(from, e)| e.keys().map(move |to| (from.clone(), to.clone())))
        .filter(|(from, to)| family(from).is_some() && family(from) == family(to))
        .collect();
    for (from, to) in &within_family {
        graph.get_mut(from).unwrap().remove(to);
    }
    let found = cycles(&graph);
    let shown: Vec<String> = found
        .iter()
        .map(|scc| {
            format!(
                "{} (all {} files: {})",
                show_cycle(&graph, scc),
                scc.len(),
                scc.join(", ")
            )
        })
        .collect();
    assert!(
        found.is_empty(),
        "{} import cycles between files (docs/modules.md: move what both sides share into a \
         file both import):\n{}",
        found.len(),
        shown.join("\n")
    );
}

#[test]
fn families_group_a_kernel_or_op_family_and_nothing_else() {
    assert_eq!(
        family("gpu/kernels/movement.rs").as_deref(),
        Some("gpu/kernels/movement")
    );
    assert_eq!(
        family("gpu/kernels/movement/gather.rs").as_deref(),
        Some("gpu/kernels/movement")
    );
    assert_eq!(
        family("graph/ops/linear.rs").as_deref(),
        Some("graph/ops/linear")
    );
    assert_eq!(family("gpu/kernels/mod.rs"), None);
    assert_eq!(family("gpu/engine.rs"), None);
}

#[test]
fn use_trees_give_every_leaf() {
    let text = "pub use engine::{Engine, frame::Frame as F, self};\nuse crate::a::{b::*, c};\nmod engine;\nmod inner { use super::*; fn f() { crate::x::y!(); } }\nmod tests { use crate::z::w; }";
    let found = paths_of("gpu/mod.rs", text);
    let got: Vec<(String, Option<String>)> = found
        .iter()
        .map(|f| (f.segs.join("::"), f.reexport.clone()))
        .collect();
    let s = |x: &str| x.to_string();
    assert_eq!(
        got,
        vec![
            (s("gpu::engine::Engine"), Some(s("Engine"))),
            (s("gpu::engine::frame::Frame"), Some(s("F"))),
            (s("gpu::engine"), Some(s("engine"))),
            (s("a::b"), None),
            (s("a::c"), None),
            (s("gpu"), None),
            (s("x::y"), None),
        ]
    );
}

/// `cargo test --test host imports::print -- --ignored --nocapture`: every import edge, for
/// looking into a cycle the test above reports.
#[test]
#[ignore = "prints the graph"]
fn print_import_graph() {
    for (from, edges) in import_graph() {
        for (to, line) in edges {
            println!("src/{from}:{line} -> src/{to}");
        }
    }
}
