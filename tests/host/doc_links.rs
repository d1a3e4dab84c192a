//! The documentation's references hold. Every relative link in README.md and docs/**/*.md
//! names a file that exists (and a heading of it, when the link has an anchor); every
//! `docs/...` path a source file cites exists; and every path in backticks in README.md,
//! docs/*.md and docs/benchmarks/README.md names something that exists: a repository file
//! (`src/llm/batch/mod.rs`) or a Rust item of dynrt (`crate::llm::Session`,
//! `llm::batch::pages::tests::x`). Moving or renaming a file or an item fails here, not in a
//! reader.
//!
//! The dated reports in `docs/benchmarks/` are records of a run: their links are checked, the
//! names in their backticks are not (they name the code as it was that day).
//!
//! How a Rust path resolves (no compiler, so a documented approximation): after a leading
//! `crate::` or `dynrt::`, the longest prefix of segments that are module files under `src/`
//! (`src/a.rs` or `src/a/mod.rs`, then `src/a/b.rs` or `src/a/b/mod.rs`, ...) picks a file, and
//! every remaining segment must appear in that file as a whole identifier (an item, a
//! re-export, an inline `mod tests`, a method). A path whose first segment is a type
//! (`Shape::size_bytes`: upper case) cannot be placed by file and is skipped; a lower-case first
//! segment must be a module of dynrt or a root of [`EXTERNAL_ROOTS`], so that a typo or a
//! removed module is not mistaken for an external crate. The log targets of [`LOG_TARGETS`]
//! look like paths and are not checked; a file path with a placeholder of [`PLACEHOLDERS`]
//! (`src/llm/arch/NAME.rs`) neither.

use std::path::{Path, PathBuf};

/// Path roots the backtick check does not resolve: other crates, the primitive types
/// (`f32::MIN`), and `self`/`super`.
const EXTERNAL_ROOTS: &[&str] = &[
    "f32",
    "f64",
    "i8",
    "i16",
    "i32",
    "i64",
    "u8",
    "u16",
    "u32",
    "u64",
    "usize",
    "isize",
    "bool",
    "char",
    "str",
    "std",
    "core",
    "alloc",
    "wgpu",
    "wgpu_types",
    "wgpu_core",
    "wgpu_hal",
    "naga",
    "serde",
    "serde_json",
    "tokio",
    "axum",
    "clap",
    "anyhow",
    "thiserror",
    "tracing",
    "tracing_subscriber",
    "wasm_bindgen",
    "web_sys",
    "js_sys",
    "web_time",
    "proptest",
    "criterion",
    "bytemuck",
    "memmap2",
    "sha2",
    "half",
    "pollster",
    "futures",
    "tokenizers",
    "onnxruntime",
    "ort",
    "candle",
    "cubecl",
    "burn",
    "tract",
    "self",
    "super",
];

/// Log targets (`RUST_LOG=dynrt::access=info`): paths in form, not items.
const LOG_TARGETS: &[&str] = &["dynrt::access", "dynrt::request"];

/// Names the docs write in a file path for any file of a kind (`src/llm/arch/NAME.rs`).
const PLACEHOLDERS: &[&str] = &["NAME"];

/// Top-level folders whose files a backticked path may name.
const FILE_ROOTS: &[&str] = &[
    "src", "tests", "docs", "scripts", "shaders", "examples", "web", "fixtures", ".ci",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Files under `dir` (recursively) whose name ends with one of `exts`, skipping build outputs
/// and installed packages.
fn walk(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | "node_modules" | "pkg" | ".git") {
                walk(&path, exts, out);
            }
        } else if exts.iter().any(|e| name.ends_with(e)) {
            out.push(path);
        }
    }
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(markdown: &str) -> Vec<String> {
    prose_lines(markdown)
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// The lines outside fenced code blocks.
fn prose_lines(markdown: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    markdown.lines().filter(move |l| {
        if l.trim_start().starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// The targets of the `[text](target)` links of a Markdown text, inline code removed.
fn link_targets(markdown: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(markdown) {
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            targets.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    targets
}

/// The broken relative links of one Markdown file, as `file: target (why)`.
fn broken_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut broken = Vec::new();
    for target in link_targets(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else {
            file.parent().unwrap().join(path)
        };
        let why = if !resolved.exists() {
            Some("no such file")
        } else if let Some(anchor) = anchor {
            let body = std::fs::read_to_string(&resolved).unwrap_or_default();
            (!anchors(&body).iter().any(|a| a == anchor)).then_some("no such heading")
        } else {
            None
        };
        if let Some(why) = why {
            broken.push(format!("{}: {target} ({why})", file.display()));
        }
    }
    broken
}

/// The `docs/...` paths cited in a source file.
fn cited_docs(text: &str) -> Vec<String> {
    let mut cited = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("docs/") {
        let start = from + i;
        from = start + 5;
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-')) {
            continue;
        }
        let path: String = text[start..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
            .collect();
        cited.push(path.trim_end_matches('.').to_string());
    }
    cited
}

/// What a backticked span names, when it is a path this test checks.
#[derive(Debug, PartialEq)]
enum Reference {
    /// A repository file or folder, relative to the root.
    File(String),
    /// A Rust path of dynrt, its segments without `crate::`/`dynrt::`.
    Item(Vec<String>),
}

/// The paths among the inline code spans of a Markdown text (outside fenced blocks).
fn backticked_paths(markdown: &str) -> Vec<Reference> {
    let mut refs = Vec::new();
    for line in prose_lines(markdown) {
        for span in line.split('`').skip(1).step_by(2) {
            if let Some(r) = reference(span) {
                refs.push(r);
            }
        }
    }
    refs
}

/// A code span as a [`Reference`]: a file path under one of [`FILE_ROOTS`] made of plain path
/// characters (no globs, no placeholders), or a `::` path of identifiers (a trailing `()` or
/// `!` dropped) whose first segment is lower case and not one of [`EXTERNAL_ROOTS`].
fn reference(span: &str) -> Option<Reference> {
    let span = span.trim();
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-');
    if let Some((first, _)) = span.split_once('/') {
        let path = span.split_once(':').map_or(span, |(p, _)| p);
        let placeholder = path
            .split(['/', '.'])
            .any(|part| PLACEHOLDERS.contains(&part));
        return (FILE_ROOTS.contains(&first) && path.chars().all(plain) && !placeholder)
            .then(|| Reference::File(path.trim_end_matches('/').to_string()));
    }
    if LOG_TARGETS.contains(&span) {
        return None;
    }
    let span = span.trim_end_matches("()").trim_end_matches('!');
    let segments: Vec<&str> = span.split("::").collect();
    let ident = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if segments.len() < 2 || !segments.iter().all(|s| ident(s)) {
        return None;
    }
    let segments = match segments[0] {
        "crate" | "dynrt" => &segments[1..],
        _ => &segments[..],
    };
    let first = segments.first()?;
    if first.starts_with(|c: char| c.is_ascii_uppercase()) || EXTERNAL_ROOTS.contains(first) {
        return None;
    }
    Some(Reference::Item(
        segments.iter().map(|s| s.to_string()).collect(),
    ))
}

/// Whether `word` occurs in `text` as a whole identifier.
fn has_identifier(text: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// Why a reference does not resolve, or `None` when it does.
fn unresolved(root: &Path, reference: &Reference) -> Option<String> {
    match reference {
        Reference::File(path) => (!root.join(path).exists()).then(|| "no such file".into()),
        Reference::Item(segments) => {
            let mut dir = root.join("src");
            let mut file = dir.join("lib.rs");
            let mut rest = &segments[..];
            while let Some((seg, tail)) = rest.split_first() {
                let flat = dir.join(format!("{seg}.rs"));
                let nested = dir.join(seg).join("mod.rs");
                file = if flat.exists() {
                    flat
                } else if nested.exists() {
                    nested
                } else {
                    break;
                };
                dir = dir.join(seg);
                rest = tail;
            }
            if rest.len() == segments.len() {
                return Some(format!("`{}` is no module of dynrt", segments[0]));
            }
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            rest.iter()
                .find(|s| !has_identifier(&text, s))
                .map(|s| format!("no `{s}` in {}", file.strip_prefix(root).unwrap().display()))
        }
    }
}

/// The Markdown files whose backticked paths are checked: README.md, docs/*.md and the
/// benchmarks' README.md (not the dated reports).
fn current_docs(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![
        root.join("README.md"),
        root.join("docs/benchmarks/README.md"),
    ];
    for entry in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files.sort();
    files
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = root();
    let mut files = vec![root.join("README.md")];
    walk(&root.join("docs"), &[".md"], &mut files);
    assert!(
        files.len() >= 10,
        "found only {} Markdown files",
        files.len()
    );
    let links: usize = files
        .iter()
        .map(|f| link_targets(&std::fs::read_to_string(f).unwrap()).len())
        .sum();
    assert!(
        links >= 50,
        "found only {links} links: is the parser still reading them?"
    );
    let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_backticked_path_in_the_docs_exists() {
    let root = root();
    let files = current_docs(&root);
    assert!(files.len() >= 10, "found only {} docs", files.len());
    let (mut items, mut paths) = (0, 0);
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for reference in backticked_paths(&text) {
            match &reference {
                Reference::File(_) => paths += 1,
                Reference::Item(_) => items += 1,
            }
            if let Some(why) = unresolved(&root, &reference) {
                let name = file.strip_prefix(&root).unwrap().display();
                broken.push(format!("{name}: {reference:?} ({why})"));
            }
        }
    }
    assert!(
        items >= 50 && paths >= 50,
        "found only {items} Rust paths and {paths} file paths: is the parser still reading them?"
    );
    assert!(
        broken.is_empty(),
        "{} backticked paths name nothing:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn every_docs_path_cited_in_the_code_exists() {
    let root = root();
    let mut files = Vec::new();
    for dir in [
        "src", "tests", "examples", "scripts", "shaders", "web", ".ci",
    ] {
        walk(
            &root.join(dir),
            &[".rs", ".wgsl", ".sh", ".py", ".js", ".mjs", ".html", "run"],
            &mut files,
        );
    }
    files.push(root.join("Cargo.toml"));
    let mut cited = 0;
    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for path in cited_docs(&text) {
            cited += 1;
            if !root.join(&path).exists() {
                missing.push(format!("{}: {path}", file.display()));
            }
        }
    }
    assert!(
        cited >= 30,
        "found only {cited} docs/ citations in {} files",
        files.len()
    );
    assert!(
        missing.is_empty(),
        "cited but missing:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_link_parser_reads_links_anchors_and_citations() {
    let md = "# A `b` c\n[x](docs/cli.md#a-b-c) `[no](code)` [y](#z)\n```\n[no](block)\n```\n";
    assert_eq!(link_targets(md), ["docs/cli.md#a-b-c", "#z"]);
    assert_eq!(anchors(md), ["a-b-c"]);
    assert_eq!(
        cited_docs("see docs/cli.md. and https://docs.rs/x"),
        ["docs/cli.md"]
    );
}

#[test]
fn the_backtick_parser_tells_files_items_and_others_apart() {
    let md = "`src/llm/mod.rs` `crate::llm::Session` `dynrt::fetch::MODELS()` `wgpu::Device` \
              `Shape::size_bytes` `docs/*.md` `--model` `a b` `f32::MIN` `dynrt::access` \
              `src/llm/arch/NAME.rs`\n```\n`src/no.rs`\n```\n";
    let item = |s: &[&str]| Reference::Item(s.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        backticked_paths(md),
        [
            Reference::File("src/llm/mod.rs".into()),
            item(&["llm", "Session"]),
            item(&["fetch", "MODELS"]),
        ]
    );
    let root = root();
    assert_eq!(unresolved(&root, &item(&["llm", "Session"])), None);
    assert_eq!(unresolved(&root, &item(&["llm", "batch"])), None);
    assert!(unresolved(&root, &item(&["llm", "NoSuchItem"])).is_some());
    assert!(unresolved(&root, &item(&["no_such_module", "x"])).is_some());
    assert!(unresolved(&root, &Reference::File("src/no_such.rs".into())).is_some());
    assert!(has_identifier("pub mod tests {", "tests"));
    assert!(!has_identifier("pub fn tests_all()", "tests"));
}
