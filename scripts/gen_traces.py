#!/usr/bin/env python3
"""Generate the shape traces in fixtures/traces/ (CSV: id,dtype,shape) that
`dynrt-bench predict` replays.

Deterministic: random choices come from SplitMix64 (the same generator as dynrt::rng), so
re-running this script reproduces the committed files byte for byte. Standard library only.

    python3 scripts/gen_traces.py            # writes fixtures/traces/*.csv
    python3 scripts/gen_traces.py --check    # fails if the committed files differ

The model is GPT-2 small shaped (12 heads of 64, hidden 768), f32. To keep the files small
(< 2 MB in all) the LLM traces carry 2 transformer layers: every layer repeats the same
shapes, so more layers would scale every count by the same factor and change no ratio.
"""

import argparse
import pathlib
import sys

MASK = (1 << 64) - 1
HEADS, HEAD_DIM, HIDDEN = 12, 64, 768
LAYERS = 2
MAX_CONTEXT = 2048


class SplitMix64:
    """Port of dynrt::rng::SplitMix64 (same stream for the same seed)."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def range(self, lo, hi):
        """Integer uniform in [lo, hi), as SplitMix64::range."""
        return lo + self.next_u64() % (hi - lo)


def shape(*dims):
    return "x".join(str(d) for d in dims)


class Writer:
    def __init__(self, description):
        self.lines = ["# " + line for line in description.strip().splitlines()]
        self.lines.append("id,dtype,shape")

    def row(self, ident, dims, dtype="f32"):
        self.lines.append(f"{ident},{dtype},{shape(*dims)}")

    def text(self):
        return "\n".join(self.lines) + "\n"


def llm_step(w, seq, past):
    """One forward pass over `seq` new tokens with `past` tokens already cached."""
    total = past + seq
    w.row("hidden", (1, seq, HIDDEN))
    for layer in range(LAYERS):
        w.row(f"layer{layer}.k_cache", (1, HEADS, total, HEAD_DIM))
        w.row(f"layer{layer}.v_cache", (1, HEADS, total, HEAD_DIM))
        w.row(f"layer{layer}.attn_scores", (1, HEADS, seq, total))


def decode():
    w = Writer(
        f"""LLM decode: one token per step, t = 1..{MAX_CONTEXT}, {LAYERS} layers.
KV cache [1, {HEADS}, t, {HEAD_DIM}], attention scores [1, {HEADS}, 1, t], hidden [1, 1, {HIDDEN}]."""
    )
    for t in range(1, MAX_CONTEXT + 1):
        llm_step(w, 1, t - 1)
    return w.text()


def chat(seed=3):
    rng = SplitMix64(seed)
    w = Writer(
        f"""LLM chat: turns of a user prompt (prefill of 30-300 tokens in one step) and an
assistant reply (20-400 decode steps of one token) until the context reaches {MAX_CONTEXT};
{LAYERS} layers, SplitMix64 seed {seed}."""
    )
    past = 0
    while past < MAX_CONTEXT:
        prompt = min(rng.range(30, 301), MAX_CONTEXT - past)
        llm_step(w, prompt, past)
        past += prompt
        reply = min(rng.range(20, 401), MAX_CONTEXT - past)
        for _ in range(reply):
            llm_step(w, 1, past)
            past += 1
    return w.text()


def prefill_chunks():
    w = Writer(
        f"""LLM chunked prefill: a 1920-token prompt in chunks of 128, then 128 decode steps;
{LAYERS} layers. Steps of 128 are above the OpenVINO rule's per-dimension limit of 2."""
    )
    past = 0
    while past < 1920:
        llm_step(w, 128, past)
        past += 128
    while past < MAX_CONTEXT:
        llm_step(w, 1, past)
        past += 1
    return w.text()


def images(seed=7, batches=400):
    rng = SplitMix64(seed)
    w = Writer(
        f"""Image batches of random size: N in 1..8, H and W multiples of 32 in 224..640;
a small CNN's tensors; {batches} batches, SplitMix64 seed {seed}."""
    )
    for _ in range(batches):
        n = rng.range(1, 9)
        h = 32 * rng.range(7, 21)
        wd = 32 * rng.range(7, 21)
        w.row("input", (n, 3, h, wd))
        w.row("conv1", (n, 64, h // 2, wd // 2))
        w.row("conv2", (n, 128, h // 4, wd // 4))
        w.row("pool", (n, 128))
        w.row("logits", (n, 1000))
    return w.text()


def shrink_grow():
    w = Writer(
        f"""Shrinking then growing: a context cut from 1024 to 64 tokens in steps of 4, then
grown again to 1536 in steps of 2; KV cache [1, {HEADS}, t, {HEAD_DIM}] and an activation
[1, t, {HIDDEN}], {LAYERS} layers."""
    )
    lengths = list(range(1024, 63, -4)) + list(range(66, 1537, 2))
    for t in lengths:
        w.row("activation", (1, t, HIDDEN))
        for layer in range(LAYERS):
            w.row(f"layer{layer}.k_cache", (1, HEADS, t, HEAD_DIM))
            w.row(f"layer{layer}.v_cache", (1, HEADS, t, HEAD_DIM))
    return w.text()


TRACES = {
    "decode.csv": decode,
    "chat.csv": chat,
    "prefill_chunks.csv": prefill_chunks,
    "images.csv": images,
    "shrink_grow.csv": shrink_grow,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="output folder (default fixtures/traces)")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    root = pathlib.Path(__file__).resolve().parent.parent
    out = pathlib.Path(args.out) if args.out else root / "fixtures" / "traces"
    out.mkdir(parents=True, exist_ok=True)
    stale = []
    total = 0
    for name, make in TRACES.items():
        text = make()
        total += len(text)
        path = out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"{path}: {text.count(chr(10)) - 1} lines, {len(text)} bytes")
    print(f"{total} bytes in all")
    if stale:
        print("stale traces (run scripts/gen_traces.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
