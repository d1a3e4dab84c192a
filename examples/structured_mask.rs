//! What structured output costs on the host: builds a model's vocabulary trie and times the
//! token masks of a JSON-schema constraint in the states a generation passes through (the
//! start, inside a string, after a key, inside a number), the whole mask and the check of a
//! single token, with the memo of masks per state off (a fresh constraint each time).
//!
//! ```sh
//! cargo run --release --example structured_mask -- [PATH.gguf]
//! ```
//! (default: the cached SmolLM2; `dynrt fetch` downloads it.)

use dynrt::gguf::MappedGguf;
use dynrt::structured::{Constraint, Grammar, Json, TokenTrie};
use dynrt::tokenizer::{Special, Tokenizer};
use std::sync::Arc;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let path = match std::env::args().nth(1) {
        Some(p) => std::path::PathBuf::from(p),
        None => dynrt::fetch::resolve_model(None)?,
    };
    let m = MappedGguf::open(&path)?;
    let tok = Tokenizer::from_gguf(m.gguf())?;
    let stop: Vec<u32> = tok.eos_id().into_iter().collect();
    let t = Instant::now();
    let trie = Arc::new(TokenTrie::new(&tok, &stop));
    println!(
        "{}: {} tokens, trie built in {:.0} ms, {:.1} MB",
        path.display(),
        tok.vocab_size(),
        t.elapsed().as_secs_f64() * 1e3,
        trie.size_bytes() as f64 / 1e6
    );
    let schema: Json = serde_json::from_str(
        r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
            "tags":{"type":"array","items":{"enum":["a","b","c"]}}},"required":["name","age"]}"#,
    )?;
    let grammar = Arc::new(Grammar::json_schema(&schema)?);
    let states = [
        ("start", ""),
        ("inside a string", "{\"name\": \"Ann"),
        ("after a key", "{\"name\""),
        ("inside a number", "{\"name\": \"Ann\", \"age\": 4"),
    ];
    println!("| state | allowed tokens | whole mask (ms) | one token (us) |");
    println!("|---|---:|---:|---:|");
    for (what, text) in states {
        let ids = tok.encode(text, Special::Plain);
        let reps = 5;
        let mut mask_s = 0.0;
        let mut allowed = 0;
        let mut check_s = 0.0;
        for _ in 0..reps {
            let mut c = Constraint::new(grammar.clone(), trie.clone());
            for &id in &ids {
                c.accept(id)?;
            }
            let t = Instant::now();
            let mask = c.mask();
            mask_s += t.elapsed().as_secs_f64();
            allowed = mask.iter().map(|w| w.count_ones()).sum::<u32>();
            let t = Instant::now();
            let n = 1000u32;
            for id in 0..n {
                std::hint::black_box(c.allows(id * 37 % tok.vocab_size() as u32));
            }
            check_s += t.elapsed().as_secs_f64() / f64::from(n);
        }
        println!(
            "| {what} | {allowed} | {:.2} | {:.2} |",
            mask_s / f64::from(reps) * 1e3,
            check_s / f64::from(reps) * 1e6
        );
    }
    Ok(())
}
