//! Only `src/gpu/` touches wgpu (docs/modules.md): no Rust file elsewhere under `src/` (the
//! library's other modules, `src/web/`, both binaries' command lines) names the identifier
//! `wgpu` in its code, whether as `wgpu::...`, `use wgpu` or the re-export `gpu::wgpu`.
//! Comments and string literals may say the word; they are skipped by a small lexer of Rust's
//! comments, strings and character literals, itself tested below.

use std::path::{Path, PathBuf};

/// The identifiers of Rust source `src` outside comments, string, byte-string, raw-string
/// and character literals, each with its line (1-based). Number literals are skipped too.
fn code_identifiers(src: &str) -> Vec<(usize, String)> {
    code_tokens(src)
        .into_iter()
        .filter(|(_, w)| w.starts_with(|c: char| c.is_alphabetic() || c == '_'))
        .collect()
}

/// The tokens of Rust source `src` that spell paths, outside comments and literals: its
/// identifiers (as [`code_identifiers`]) and the punctuation of `use` trees and paths
/// (`::`, `{`, `}`, `,`, `;`, `*`), each with its line. Other punctuation is skipped.
pub(crate) fn code_tokens(src: &str) -> Vec<(usize, String)> {
    let b: Vec<char> = src.chars().collect();
    let (mut i, mut line) = (0usize, 1usize);
    let mut out = Vec::new();
    // Skips a quoted literal whose opening quote is at b[at - 1], with backslash escapes;
    // returns the index after its closing quote.
    let quoted = |mut at: usize, quote: char, line: &mut usize| -> usize {
        while at < b.len() && b[at] != quote {
            if b[at] == '\\' {
                at += 1;
            }
            if b.get(at) == Some(&'\n') {
                *line += 1;
            }
            at += 1;
        }
        at + 1
    };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 1;
            i += 2;
            while i < b.len() && depth > 0 {
                match (b[i], b.get(i + 1).copied()) {
                    ('/', Some('*')) => (depth, i) = (depth + 1, i + 2),
                    ('*', Some('/')) => (depth, i) = (depth - 1, i + 2),
                    ('\n', _) => (line, i) = (line + 1, i + 1),
                    _ => i += 1,
                }
            }
        } else if c == '"' {
            i = quoted(i + 1, '"', &mut line);
        } else if c == '\'' {
            if next == Some('\\') {
                // An escaped character: '\n', '\'', '\u{1F600}'.
                i = quoted(i + 3, '\'', &mut line);
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                // A lifetime or a label: its name is an identifier, read next.
                i += 1;
            }
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            let at = b.get(i).copied();
            match (word.as_str(), at) {
                ("r" | "br" | "cr", Some('#' | '"')) => {
                    let hashes = b[i..].iter().take_while(|&&h| h == '#').count();
                    if b.get(i + hashes) != Some(&'"') {
                        // A raw identifier (`r#type`): the name follows the `#`.
                        i += hashes;
                        continue;
                    }
                    i += hashes + 1;
                    loop {
                        if i >= b.len() {
                            break;
                        }
                        if b[i] == '"' && b[i + 1..].iter().take(hashes).all(|&h| h == '#') {
                            i += 1 + hashes;
                            break;
                        }
                        if b[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                }
                ("b" | "c", Some('"')) => i = quoted(i + 1, '"', &mut line),
                ("b", Some('\'')) => i = quoted(i + 1, '\'', &mut line),
                _ => out.push((line, word)),
            }
        } else if c == ':' && next == Some(':') {
            out.push((line, "::".to_string()));
            i += 2;
        } else {
            if matches!(c, '{' | '}' | ',' | ';' | '*') {
                out.push((line, c.to_string()));
            }
            i += 1;
        }
    }
    out
}

/// Every `.rs` file under `dir`, sorted.
pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

fn names_wgpu(path: &Path) -> Vec<usize> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    code_identifiers(&text)
        .into_iter()
        .filter(|(_, w)| w == "wgpu")
        .map(|(line, _)| line)
        .collect()
}

#[test]
fn only_the_gpu_module_names_wgpu() {
    let src = crate::common::repo().join("src");
    let gpu = src.join("gpu");
    let files = rust_files(&src);
    let (inside, outside): (Vec<_>, Vec<_>) = files.iter().partition(|p| p.starts_with(&gpu));
    // The walk saw the tree: the device door, the library's other modules and both binaries.
    assert!(inside.len() >= 20, "{} files under src/gpu", inside.len());
    assert!(
        outside.len() >= 100,
        "{} files outside src/gpu",
        outside.len()
    );
    for must in [
        "main.rs",
        "cli/mod.rs",
        "bench/main.rs",
        "web/mod.rs",
        "lib.rs",
    ] {
        assert!(
            outside.iter().any(|p| p.ends_with(must)),
            "src/{must} not found"
        );
    }
    // The door itself names wgpu, so the lexer does find it in code.
    let door = names_wgpu(&gpu.join("mod.rs"));
    assert!(!door.is_empty(), "src/gpu/mod.rs: wgpu not found in code");
    let offenders: Vec<String> = outside
        .iter()
        .flat_map(|p| {
            let rel = p.strip_prefix(&src).unwrap().display().to_string();
            names_wgpu(p)
                .into_iter()
                .map(move |line| format!("src/{rel}:{line}"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "wgpu named outside src/gpu (reach the device through dynrt::gpu's types and \
         functions instead): {offenders:?}"
    );
}

#[test]
fn the_lexer_skips_comments_strings_and_literals_but_not_code() {
    let src = r####"
// wgpu in a line comment
/* wgpu in a block /* nested wgpu */ still wgpu */
/// wgpu in a doc comment
fn f<'a>(x: &'a str) -> char {
    let _ = "wgpu in a string \" still wgpu";
    let _ = b"wgpu"; let _ = c"wgpu";
    let _ = r#"wgpu in a raw string "with quotes" wgpu"#;
    let _ = br##"wgpu "# wgpu"##;
    let _ = ('"', '\'', '\u{1F600}', b'x', 1e5f32, 0x1F_u8);
    'outer: loop { break 'outer; }
    let r#type = 1;
    use_it(wgpu::Buffer, dynrt::gpu::wgpu, r#wgpu)
}
"####;
    let ids = code_identifiers(src);
    let wgpu: Vec<usize> = ids
        .iter()
        .filter(|(_, w)| w == "wgpu")
        .map(|(l, _)| *l)
        .collect();
    assert_eq!(wgpu, vec![13, 13, 13], "{ids:?}");
    let words: Vec<&str> = ids.iter().map(|(_, w)| w.as_str()).collect();
    for must in [
        "fn", "f", "a", "x", "str", "char", "outer", "type", "use_it", "Buffer",
    ] {
        assert!(words.contains(&must), "{must} missing: {words:?}");
    }
    for never in ["still", "with", "quotes", "nested", "e5f32", "x1F_u8"] {
        assert!(!words.contains(&never), "{never} read as code: {words:?}");
    }
}
