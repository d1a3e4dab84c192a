//! Pre-tokenizers: how text is cut into words before BPE merges inside each word.

use regex::Regex;
use std::sync::OnceLock;

/// How text is split into words before byte-level BPE, named after llama.cpp's
/// `tokenizer.ggml.pre` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreTokenizer {
    /// GPT-2's split (`gpt2`, `default`): the contractions `'s 't 're 've 'm 'll 'd`, an
    /// optional space and letters, an optional space and digits, an optional space and other
    /// symbols, and whitespace runs that leave their last character to the next word.
    Gpt2,
    /// Every digit alone first, then GPT-2's split on the text between digits (`smollm`,
    /// also `starcoder`, `refact`, `codeshell`). This is llama.cpp's definition (the regexes
    /// `\p{N}` then GPT-2's) and the Hugging Face tokenizer of SmolLM2
    /// (`Sequence[Digits(individual_digits=true), ByteLevel(add_prefix_space=false,
    /// use_regex=true)]`): a space before a digit stays a word of its own, and `2024` is four
    /// tokens.
    DigitsThenGpt2,
    /// Llama 3's split (`llama-bpe`, `llama3`, `llama-v3`): case-insensitive contractions,
    /// one non-letter non-digit (not a newline) before letters, digits in groups of up to 3,
    /// punctuation with its trailing newlines, whitespace up to the last newline of a run,
    /// and whitespace runs that leave their last character to the next word.
    Llama3,
    /// Qwen2's split (`qwen2`): [`PreTokenizer::Llama3`]'s with every digit alone.
    Qwen2,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp names `name` (`tokenizer.ggml.pre`), if dynrt has it.
    pub fn from_gguf_name(name: &str) -> Option<PreTokenizer> {
        match name {
            "gpt2" | "default" => Some(PreTokenizer::Gpt2),
            "smollm" | "starcoder" | "refact" | "codeshell" => Some(PreTokenizer::DigitsThenGpt2),
            "llama-bpe" | "llama3" | "llama-v3" => Some(PreTokenizer::Llama3),
            "qwen2" => Some(PreTokenizer::Qwen2),
            _ => None,
        }
    }

    /// Cuts `text` into words, in order; the words concatenate back to `text`.
    pub fn split<'t>(&self, text: &'t str, out: &mut Vec<&'t str>) {
        match self {
            PreTokenizer::Gpt2 => split_gpt2(text, out),
            PreTokenizer::Llama3 => split_runs(llama3_regex(), true, text, out),
            PreTokenizer::Qwen2 => split_runs(qwen2_regex(), true, text, out),
            PreTokenizer::DigitsThenGpt2 => {
                // `char::is_numeric` is the test of the Python `tokenizers` package's Digits.
                let mut start = 0;
                for (i, c) in text.char_indices() {
                    if c.is_numeric() {
                        split_gpt2(&text[start..i], out);
                        let end = i + c.len_utf8();
                        out.push(&text[i..end]);
                        start = end;
                    }
                }
                split_gpt2(&text[start..], out);
            }
        }
    }
}

/// GPT-2's pattern without its final `\s+(?!\S)` lookahead, which the `regex` crate does not
/// have; [`split_gpt2`] gives the same result by shortening whitespace runs.
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// `pattern` compiled once into `cell`. The patterns are constants that the unit tests
/// compile (every pre-tokenizer is exercised there), so the panic cannot come from input.
fn compiled(cell: &'static OnceLock<Regex>, pattern: &'static str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}")))
}

fn gpt2_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    compiled(&RE, GPT2_PATTERN)
}

/// Llama 3's pattern (llama.cpp's `llama-bpe`) without its `\s+(?!\S)` lookahead
/// alternative, which [`split_runs`] restores. The contractions are spelled with classes
/// (`'[sS]`) rather than `(?i:...)`, as llama.cpp spells them: the same set, without the
/// `regex` crate's Unicode case tables.
const LLAMA3_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

/// Qwen2's pattern: [`LLAMA3_PATTERN`] with single digits.
const QWEN2_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

fn llama3_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    compiled(&RE, LLAMA3_PATTERN)
}

fn qwen2_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    compiled(&RE, QWEN2_PATTERN)
}

/// GPT-2's split, `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn split_gpt2<'t>(text: &'t str, out: &mut Vec<&'t str>) {
    split_runs(gpt2_regex(), false, text, out)
}

/// Cuts `text` with `re`, a pattern whose last alternative is `\s+` standing for the pair
/// `\s+(?!\S)|\s+`: a whitespace run followed by more text matches `\s+(?!\S)` one
/// character short (the last one then starts the next word: `" world"`); at the end of the
/// text it matches whole. The `regex` crate has no lookahead, so the run is matched by
/// `\s+` and shortened here. With `newline_runs` (Llama 3's patterns, which have
/// `\s*[\r\n]+` before `\s+`), a run that ends in a newline came from that alternative and
/// is kept whole; GPT-2's has no such alternative.
fn split_runs<'t>(re: &Regex, newline_runs: bool, text: &'t str, out: &mut Vec<&'t str>) {
    let mut pos = 0;
    while pos < text.len() {
        let Some(m) = re.find_at(text, pos) else {
            out.push(&text[pos..]);
            return;
        };
        if m.start() > pos {
            // Unreachable with these patterns (every character matches some branch), but a
            // gap would be a word of its own, as in the Python package's Split.
            out.push(&text[pos..m.start()]);
        }
        let mut end = m.end();
        let piece = m.as_str();
        let newline = newline_runs && piece.ends_with(['\r', '\n']);
        if end < text.len() && !newline && piece.chars().all(char::is_whitespace) {
            // Greedy `\s+` stopped before a non-space: give its last character back when
            // the run has more than one.
            if let Some((last, _)) = piece.char_indices().next_back() {
                if last > 0 {
                    end = m.start() + last;
                }
            }
        }
        out.push(&text[m.start()..end]);
        pos = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(p: PreTokenizer, s: &str) -> Vec<String> {
        let mut out = Vec::new();
        p.split(s, &mut out);
        assert_eq!(out.concat(), s, "words must concatenate back");
        out.into_iter().map(str::to_owned).collect()
    }

    #[test]
    fn gpt2_split() {
        let g = PreTokenizer::Gpt2;
        assert_eq!(words(g, "Hello world"), ["Hello", " world"]);
        assert_eq!(words(g, "a   b"), ["a", "  ", " b"]);
        assert_eq!(words(g, "a \n\tb"), ["a", " \n", "\t", "b"]);
        assert_eq!(words(g, "trailing  "), ["trailing", "  "]);
        assert_eq!(words(g, "\n\nx"), ["\n", "\n", "x"]);
        assert_eq!(words(g, "I'm don't"), ["I", "'m", " don", "'t"]);
        assert_eq!(words(g, "x=1234;"), ["x", "=", "1234", ";"]);
        assert_eq!(words(g, "café 😀!"), ["café", " 😀!"]);
        assert_eq!(words(g, ""), Vec::<String>::new());
    }

    #[test]
    fn digits_split_first() {
        let s = PreTokenizer::DigitsThenGpt2;
        assert_eq!(words(s, "in 2024"), ["in", " ", "2", "0", "2", "4"]);
        assert_eq!(words(s, "a1b"), ["a", "1", "b"]);
        assert_eq!(words(s, "٣x"), ["٣", "x"]);
    }

    #[test]
    fn llama3_and_qwen2_split() {
        let (l, q) = (PreTokenizer::Llama3, PreTokenizer::Qwen2);
        assert_eq!(words(l, "Hello world"), ["Hello", " world"]);
        assert_eq!(words(l, "a   b"), ["a", "  ", " b"]);
        assert_eq!(words(l, "a \n\tb"), ["a", " \n", "\tb"]);
        assert_eq!(words(l, "x  \n\n  y"), ["x", "  \n\n", " ", " y"]);
        assert_eq!(words(l, "I'M don'T"), ["I", "'M", " don", "'T"]);
        assert_eq!(words(l, "x=1234567;"), ["x", "=", "123", "456", "7", ";"]);
        assert_eq!(words(q, "x=1234;"), ["x", "=", "1", "2", "3", "4", ";"]);
        assert_eq!(words(l, "fn(a) {\n"), ["fn", "(a", ")", " {\n"]);
        assert_eq!(words(l, "trailing  "), ["trailing", "  "]);
        assert_eq!(words(l, "\n\nx"), ["\n\n", "x"]);
        assert_eq!(words(q, ""), Vec::<String>::new());
    }

    #[test]
    fn names() {
        assert_eq!(
            PreTokenizer::from_gguf_name("smollm"),
            Some(PreTokenizer::DigitsThenGpt2)
        );
        assert_eq!(
            PreTokenizer::from_gguf_name("qwen2"),
            Some(PreTokenizer::Qwen2)
        );
        assert_eq!(PreTokenizer::from_gguf_name("tekken"), None);
    }
}
