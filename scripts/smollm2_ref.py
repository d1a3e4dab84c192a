#!/usr/bin/env python3
"""Independent reference for dynrt's GGUF, tokenizer and decoder code, on numpy, the `gguf`
package (its reader and `dequantize`), the `tokenizers` package (GPT-2 style vocabularies),
scripts/gguf_spm.py (SentencePiece ones: Gemma) and `jinja2`. Run it with the python of
scripts/pyenv.sh.

  generate        tokenise a prompt (raw, in the model's chat template, or given as --ids),
                  run the forward pass in float64 (or float32), greedy-decode N tokens; write
                  JSON (prompt ids, generated ids, text, per-step top logits) and the full
                  logit rows as a float32 .npy (steps x vocab)
  tokenize        encode strings with special tokens matched and as plain text; decode
  dequant         sha256 and first values of every tensor dequantized to float32
  dequant-blocks  decode raw blocks of ggml types with gguf.quants.dequantize: DIR/TYPE.bin
                  (whole blocks) to DIR/TYPE.f32 (little-endian float32)
  write-test-gguf write a small GGUF with every metadata type and F32/F16/Q8_0/Q4_1
                  tensors, and a JSON of what it holds (values as the package dequantizes)

The forward pass mirrors llama.cpp's llama, qwen2, qwen3 and gemma3 graphs: RMSNorm; Q/K/V
projections (with biases for qwen2, per-head Q/K norms for qwen3 and gemma3); RoPE with the
base from the metadata on *adjacent* pairs (x[2i], x[2i+1]) for llama, because GGUF's llama
Q/K rows are permuted from the Hugging Face layout, and on halves (x[i], x[i + d/2]) for
qwen2, qwen3 and gemma3, whose rows are not;
grouped-query attention with a causal mask; SwiGLU; the head is token_embd when there is no
output.weight (tied). gemma3 (class Llama's docstring) adds the embedding scale,
post-attention and post-FFN norms, GELU, and sliding-window layers; its constants that the
file need not hold are in GEMMA3.
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def tensor_array(t, dtype=np.float32):
    """A tensor dequantized, shaped (rows..., row_len): numpy order, the reverse of ggml's dims."""
    shape = tuple(int(d) for d in reversed(t.shape))
    return np.asarray(dequantize(t.data, t.tensor_type), dtype=dtype).reshape(shape)


# --- tokenizer -------------------------------------------------------------------------------


def build_tokenizer(reader):
    """The Hugging Face tokenizer of a GPT-2 style GGUF vocabulary.

    SmolLM2's own tokenizer.json is Sequence[Digits(individual_digits=True),
    ByteLevel(add_prefix_space=False, use_regex=True)], no normalizer, a BPE model, the
    ByteLevel decoder, and its 17 special tokens as added tokens; llama.cpp's `smollm`
    pre-tokenizer is the same split (the regex \\p{N} first, then GPT-2's).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    model = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if model != "gpt2":
        sys.exit(f"tokenizer.ggml.model is {model!r}: only gpt2 is handled")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ")) for m in field(reader, "tokenizer.ggml.merges")]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = Tokenizer(models.BPE(vocab, merges, dropout=None, unk_token=None, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt2", "default"):
        tok.pre_tokenizer = byte_level
    elif pre in ("qwen2", "llama-bpe", "llama3", "llama-v3"):
        # The Hugging Face tokenizer.json of Qwen2.5 and Llama 3: a Split on the pattern
        # (isolated), then ByteLevel without its own regex. (Qwen2's file also has an NFC
        # normalizer, which llama.cpp does not apply; neither does dynrt nor this reference.)
        digits = r"\p{N}" if pre == "qwen2" else r"\p{N}{1,3}"
        pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|" + digits
                   + r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
        from tokenizers import Regex
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        sys.exit(f"tokenizer.ggml.pre {pre!r} is not handled")
    tok.decoder = decoders.ByteLevel()
    # Control tokens (type 3) are special; user-defined ones (type 4) are added tokens that
    # are always matched.
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, ty in enumerate(types) if ty == 3])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i, ty in enumerate(types) if ty == 4])
    return tok


def encode(tok, text, allow_special=True):
    tok.encode_special_tokens = not allow_special
    try:
        return tok.encode(text, add_special_tokens=False).ids
    finally:
        tok.encode_special_tokens = False


class Tokens:
    """Encodes and decodes with a GGUF's vocabulary: GPT-2 style BPE (tokenizer.ggml.model
    gpt2) with the `tokenizers` package as build_tokenizer sets it up, SentencePiece (llama)
    with scripts/gguf_spm.py. Encoding prepends BOS where tokenizer.ggml.add_bos_token says so
    and the text did not already start with it."""

    def __init__(self, encode, decode, bos):
        self._encode, self.decode, self.bos = encode, decode, bos

    @staticmethod
    def load(path, reader, required=True):
        """The model's tokenizer; None where it is not handled and not `required`."""
        model = field(reader, "tokenizer.ggml.model")
        bos = field(reader, "tokenizer.ggml.bos_token_id") if field(reader, "tokenizer.ggml.add_bos_token", False) else None
        if model == "gpt2":
            tok = build_tokenizer(reader)
            return Tokens(lambda text, allow: encode(tok, text, allow),
                          lambda ids: tok.decode(ids, skip_special_tokens=False), bos)
        if model == "llama":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import gguf_spm

            try:
                sp = gguf_spm.load(path)
            except RuntimeError as e:
                # sentencepiece refuses some vocabularies (a tiny test model's without the 256
                # byte pieces); --ids runs without a tokenizer then (no decoded text).
                if required:
                    sys.exit(f"sentencepiece cannot load this vocabulary: {e}")
                return None
            return Tokens(lambda text, allow: gguf_spm.encode_special(sp, text) if allow else list(sp.encode(text)),
                          lambda ids: sp.decode(ids), bos)
        if required:
            sys.exit(f"tokenizer.ggml.model is {model!r}: only gpt2 and llama are handled")
        return None

    def encode(self, text, allow_special=True):
        ids = self._encode(text, allow_special)
        if self.bos is not None and ids[:1] != [self.bos]:
            ids = [self.bos] + ids
        return ids


def render_chat(reader, messages, add_generation_prompt=True, tools=None):
    """The chat template rendered as Hugging Face transformers renders it (its `tojson`
    filter included: json.dumps without ASCII or HTML escaping)."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    source = field(reader, "tokenizer.chat_template")
    if source is None:
        sys.exit("the model has no tokenizer.chat_template")
    tokens = field(reader, "tokenizer.ggml.tokens")

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = tojson
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    extra = {} if not tools else {"tools": tools}
    return env.from_string(source).render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=tokens[bos] if bos is not None else "",
        eos_token=tokens[eos] if eos is not None else "",
        **extra,
    )


# --- the model -------------------------------------------------------------------------------

# Gemma 3 facts that its GGUF files need not carry; llama.cpp sets them for the gemma3
# architecture and this reference takes them from here only.
GEMMA3 = {
    # Layer il attends globally when il % pattern == pattern - 1, within the sliding window
    # otherwise (used when the file has no `gemma3.attention.sliding_window_pattern`).
    "swa_pattern": 6,
    # The RoPE base of the sliding-window layers (when the file has no
    # `gemma3.rope.freq_base_swa`); the global layers use `gemma3.rope.freq_base`.
    "rope_base_swa": 10000.0,
    # The one size whose attention scale is 1/sqrt(embedding_length / head_count) instead of
    # 1/sqrt(key_length): Gemma 3 27B, told apart by its block count.
    "block_count_27b": 62,
}


class Llama:
    """llama, qwen2, qwen3 and gemma3 decoders.

    qwen2 adds Q/K/V biases and rotates halves of each head (NEOX) where llama's GGUF rows are
    permuted for adjacent pairs. qwen3 is qwen2 without the biases and with each head of Q and
    K RMS-normalised (attn_q_norm, attn_k_norm) before RoPE. gemma3 scales the embedding by sqrt(embedding_length),
    RMS-normalises each head of Q and K (attn_q_norm, attn_k_norm) before RoPE on halves,
    normalises the attention and FFN outputs again before their residual adds
    (post_attention_norm, post_ffw_norm), uses GELU (tanh approximation) for the gate, and
    interleaves sliding-window layers (their own RoPE base, no frequency scaling) with global
    ones. Gemma's norm weights are used as stored (its converter already added the 1).
    """

    def __init__(self, reader, dtype):
        self.dtype = dtype
        arch = field(reader, "general.architecture")
        if arch not in ("llama", "qwen2", "qwen3", "gemma3"):
            sys.exit(f"general.architecture is {arch!r}, not llama, qwen2, qwen3 or gemma3")
        self.arch = arch

        def key(k, default=None):
            return field(reader, f"{arch}.{k}", default)

        def required(k):
            v = key(k)
            if v is None:
                sys.exit(f"{arch}.{k} is missing")
            return v

        self.n_layers = int(required("block_count"))
        self.width = int(required("embedding_length"))
        self.n_heads = int(required("attention.head_count"))
        self.n_kv = int(key("attention.head_count_kv", self.n_heads))
        self.head_dim = int(key("attention.key_length", self.width // self.n_heads))
        self.v_dim = int(key("attention.value_length", self.head_dim))
        self.rope_dim = int(key("rope.dimension_count", self.head_dim))
        self.eps = float(required("attention.layer_norm_rms_epsilon"))
        self.rope_base = float(key("rope.freq_base", 10000.0))
        self.context = int(required("context_length"))
        scaling = key("rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            sys.exit(f"rope.scaling.type {scaling!r} is not handled")
        self.rope_scale = 1.0 / float(key("rope.scaling.factor")) if scaling == "linear" else 1.0
        self.scale = 1.0 / np.sqrt(self.head_dim)
        # Per layer: None (causal over every earlier position) or the sliding window W (a query
        # at position p sees keys j with p - W < j <= p).
        self.window = [None] * self.n_layers
        self.rope_base_swa = self.rope_base
        self.embd_scale = 1.0
        if arch == "gemma3":
            self.gemma3_config(key, required)
        tensors = {t.name: t for t in reader.tensors}

        def w(name):
            if name not in tensors:
                sys.exit(f"tensor {name} is missing")
            return tensor_array(tensors[name], dtype)

        self.embd = w("token_embd.weight")
        self.vocab = self.embd.shape[0]
        self.tied = "output.weight" not in tensors
        self.head = self.embd if self.tied else w("output.weight")
        self.out_norm = w("output_norm.weight")
        names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
        if arch in ("gemma3", "qwen3"):
            names += ["attn_q_norm", "attn_k_norm"]
        if arch == "gemma3":
            names += ["post_attention_norm", "post_ffw_norm"]
        self.layers = []
        for i in range(self.n_layers):
            p = f"blk.{i}."
            layer = {n: w(p + n + ".weight") for n in names}
            for n in ("attn_q", "attn_k", "attn_v"):
                if arch == "qwen2":
                    layer[n + ".bias"] = w(p + n + ".bias")
            self.layers.append(layer)
        i = np.arange(self.rope_dim // 2, dtype=np.float64)
        exponent = -2.0 * i / self.rope_dim
        self.inv_freq = self.rope_base ** exponent * self.rope_scale
        if "rope_freqs.weight" in tensors:
            self.inv_freq = self.inv_freq / tensor_array(tensors["rope_freqs.weight"], np.float64)
        # llama.cpp's sliding-window layers: their own base, frequency scale 1.
        self.inv_freq_swa = self.rope_base_swa ** exponent

    def gemma3_config(self, key, required):
        window = int(required("attention.sliding_window"))
        if window <= 0:
            sys.exit("gemma3.attention.sliding_window must be positive: a gemma3 without one is not handled")
        pattern = key("attention.sliding_window_pattern", GEMMA3["swa_pattern"])
        if isinstance(pattern, list):
            if len(pattern) != self.n_layers:
                sys.exit(f"gemma3.attention.sliding_window_pattern has {len(pattern)} entries for {self.n_layers} layers")
            local = [bool(x) for x in pattern]
        else:
            period = int(pattern)
            if period <= 0:
                sys.exit("gemma3.attention.sliding_window_pattern must be positive")
            local = [il % period < period - 1 for il in range(self.n_layers)]
        self.window = [window if is_local else None for is_local in local]
        self.rope_base_swa = float(key("rope.freq_base_swa", GEMMA3["rope_base_swa"]))
        self.embd_scale = np.sqrt(self.width)
        if self.n_layers == GEMMA3["block_count_27b"]:
            self.scale = 1.0 / np.sqrt(self.width // self.n_heads)

    def config(self):
        c = {
            "layers": self.n_layers, "embedding": self.width, "heads": self.n_heads, "kv_heads": self.n_kv,
            "head_dim": self.head_dim, "rope_dim": self.rope_dim, "rms_eps": self.eps, "rope_base": self.rope_base,
            "context": self.context, "vocab": self.vocab, "tied_output": self.tied,
        }
        if self.arch == "gemma3":
            c.update({
                "value_dim": self.v_dim, "sliding_window": self.window, "rope_base_swa": self.rope_base_swa,
                "attention_scale": float(self.scale), "embedding_scale": float(self.embd_scale),
            })
        return c

    def rms_norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, positions, inv_freq):
        """x: (T, heads, head_dim); rotates the first rope_dim elements: adjacent pairs
        (llama) or the two halves (qwen2, qwen3, gemma3)."""
        angles = positions[:, None].astype(np.float64) * inv_freq[None, :]  # (T, rope_dim/2)
        cos = np.cos(angles).astype(self.dtype)[:, None, :]
        sin = np.sin(angles).astype(self.dtype)[:, None, :]
        out = x.copy()
        r, half = self.rope_dim, self.rope_dim // 2
        if self.arch == "llama":
            a, b = np.s_[..., 0:r:2], np.s_[..., 1:r:2]
        else:
            a, b = np.s_[..., 0:half], np.s_[..., half:r]
        x0, x1 = x[a], x[b]
        out[a] = x0 * cos - x1 * sin
        out[b] = x0 * sin + x1 * cos
        return out

    def project(self, h, L, name):
        y = h @ L[name].T
        return y + L[name + ".bias"] if name + ".bias" in L else y

    def ffn(self, h, L):
        g = h @ L["ffn_gate"].T
        if self.arch == "gemma3":
            # GELU, tanh approximation.
            act = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g * g * g)))
        else:
            act = g / (1.0 + np.exp(-g))
        return (act * (h @ L["ffn_up"].T)) @ L["ffn_down"].T

    def forward(self, ids, cache):
        """Runs the new tokens `ids` after the `cache` (a list of per-layer (K, V)); returns
        the logits of the last position."""
        t = len(ids)
        past = 0 if cache[0] is None else cache[0][0].shape[0]
        positions = np.arange(past, past + t)
        x = self.embd[np.asarray(ids)] * self.dtype(self.embd_scale)
        group = self.n_heads // self.n_kv
        gemma = self.arch == "gemma3"
        # Query i (absolute position past + i) sees keys 0..=past + i, and on a sliding-window
        # layer only those less than the window behind it.
        distance = positions[:, None] - np.arange(past + t)[None, :]
        for li, L in enumerate(self.layers):
            window = self.window[li]
            mask = distance < 0 if window is None else (distance < 0) | (distance >= window)
            inv_freq = self.inv_freq if window is None else self.inv_freq_swa
            h = self.rms_norm(x, L["attn_norm"])
            q = self.project(h, L, "attn_q").reshape(t, self.n_heads, self.head_dim)
            k = self.project(h, L, "attn_k").reshape(t, self.n_kv, self.head_dim)
            v = self.project(h, L, "attn_v").reshape(t, self.n_kv, self.v_dim)
            if "attn_q_norm" in L:
                q = self.rms_norm(q, L["attn_q_norm"])
                k = self.rms_norm(k, L["attn_k_norm"])
            q = self.rope(q, positions, inv_freq)
            k = self.rope(k, positions, inv_freq)
            if cache[li] is not None:
                k = np.concatenate([cache[li][0], k])
                v = np.concatenate([cache[li][1], v])
            cache[li] = (k, v)
            out = np.empty((t, self.n_heads, self.v_dim), dtype=self.dtype)
            for hd in range(self.n_heads):
                kv = hd // group
                s = (q[:, hd, :] @ k[:, kv, :].T) * self.scale
                s = np.where(mask, -np.inf, s)
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                out[:, hd, :] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, kv, :]
            a = out.reshape(t, -1) @ L["attn_output"].T
            if gemma:
                a = self.rms_norm(a, L["post_attention_norm"])
            x = x + a
            f = self.ffn(self.rms_norm(x, L["ffn_norm"]), L)
            if gemma:
                f = self.rms_norm(f, L["post_ffw_norm"])
            x = x + f
        last = self.rms_norm(x[-1], self.out_norm)
        return last @ self.head.T


def prompt_tokens(a, reader):
    """The prompt's text (None for --ids), its ids and the tokenizer (None for --ids on a
    model whose tokenizer this reference does not build)."""
    if a.ids is not None:
        ids = [int(x) for x in a.ids.replace(",", " ").split()]
        return None, ids, Tokens.load(a.model, reader, required=False)
    tok = Tokens.load(a.model, reader)
    if a.chat is not None:
        text = render_chat(reader, [{"role": "user", "content": a.chat}])
    else:
        text = a.prompt
    return text, tok.encode(text, allow_special=a.special == "allow"), tok


def cmd_generate(a):
    reader = GGUFReader(a.model)
    text, prompt_ids, tok = prompt_tokens(a, reader)
    dtype = np.float64 if a.dtype == "float64" else np.float32
    model = Llama(reader, dtype)
    if len(prompt_ids) + a.max_tokens > model.context:
        sys.exit(f"{len(prompt_ids)} prompt tokens + {a.max_tokens} exceed the context of {model.context}")
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    cache = [None] * model.n_layers
    logits = model.forward(prompt_ids, cache)
    generated, rows, top = [], [], []
    for _ in range(a.max_tokens):
        rows.append(logits.astype(np.float32))
        order = np.argsort(-logits, kind="stable")[:5]
        top.append([[int(i), float(logits[i])] for i in order])
        nxt = int(np.argmax(logits))
        generated.append(nxt)
        if nxt == eos and not a.ignore_eos:
            break
        if len(generated) < a.max_tokens:
            logits = model.forward([nxt], cache)
    shown = [i for i in generated if i != eos]
    out = {
        "model": os.path.basename(a.model) if a.fixture else a.model,
        "dtype": a.dtype,
        "chat": a.chat is not None,
        "input": a.chat if a.chat is not None else a.prompt if a.prompt is not None else a.ids,
        "rendered": text,
        "prompt_ids": prompt_ids,
        "generated_ids": generated,
        "text": tok.decode(shown) if tok is not None else None,
        "eos_id": eos,
        "config": model.config(),
        "top5": top,
        "logits_npy": a.logits,
        "logits_shape": [len(rows), model.vocab],
    }
    if a.fixture:
        # A file kept in the repository: no machine's paths.
        del out["logits_npy"]
    if a.logits:
        np.save(a.logits, np.stack(rows))
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print(out["text"])


def cmd_tokenize(a):
    reader = GGUFReader(a.model)
    tok = build_tokenizer(reader)
    with open(a.input, encoding="utf-8") as f:
        texts = json.load(f)["texts"]
    allow = [encode(tok, t, True) for t in texts]
    plain = [encode(tok, t, False) for t in texts]
    out = {
        "allow": allow,
        "plain": plain,
        "decoded_allow": [tok.decode(ids, skip_special_tokens=False) for ids in allow],
        "chat": render_chat(reader, [{"role": "user", "content": "What is the capital of France?"}]),
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


def cmd_render(a):
    """Chats rendered with the model's template: {"chats": [{"messages", "tools"}]} in,
    {"texts": [...]} out."""
    reader = GGUFReader(a.model)
    with open(a.input, encoding="utf-8") as f:
        chats = json.load(f)["chats"]
    texts = [render_chat(reader, c["messages"], True, c.get("tools")) for c in chats]
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"texts": texts}, f, ensure_ascii=False)


def cmd_dequant(a):
    reader = GGUFReader(a.model)
    out = []
    for t in reader.tensors:
        v = tensor_array(t)
        out.append({
            "name": t.name,
            "type": int(t.tensor_type),
            "dims": [int(d) for d in t.shape],
            "sha256": hashlib.sha256(np.ascontiguousarray(v, dtype="<f4").tobytes()).hexdigest(),
            "first": [float(x) for x in v.reshape(-1)[:16]],
        })
    with open(a.out, "w") as f:
        json.dump({"tensors": out}, f)


def cmd_dequant_blocks(a):
    for name in a.types:
        qtype = GGMLQuantizationType[name]
        _, type_size = GGML_QUANT_SIZES[qtype]
        raw = np.fromfile(f"{a.dir}/{name}.bin", dtype=np.uint8).reshape(-1, type_size)
        values = np.asarray(dequantize(raw, qtype), dtype=np.float32)
        values.astype("<f4").tofile(f"{a.dir}/{name}.f32")


def cmd_write_test_gguf(a):
    V = GGUFValueType
    w = GGUFWriter(a.out, arch="llama")
    w.add_custom_alignment(64)
    scalars = [
        ("t.u8", 200, V.UINT8), ("t.i8", -100, V.INT8), ("t.u16", 60000, V.UINT16), ("t.i16", -30000, V.INT16),
        ("t.u32", 4000000000, V.UINT32), ("t.i32", -2000000000, V.INT32), ("t.f32", 1.0e-5, V.FLOAT32),
        ("t.bool", True, V.BOOL), ("t.str", "héllo <|im_start|> 😀", V.STRING),
        ("t.u64", 2**63 + 5, V.UINT64), ("t.i64", -2**62, V.INT64), ("t.f64", 3.141592653589793, V.FLOAT64),
    ]
    for k, v, ty in scalars:
        w.add_key_value(k, v, ty)
    arrays = [
        ("a.u8", [1, 2, 255], V.UINT8), ("a.i8", [-1, 2], V.INT8), ("a.u16", [7, 65535], V.UINT16),
        ("a.i16", [-7], V.INT16), ("a.u32", [1, 2, 3], V.UINT32), ("a.i32", [-5, 6], V.INT32),
        ("a.f32", [0.5, -2.25], V.FLOAT32), ("a.bool", [True, False, True], V.BOOL),
        ("a.str", ["a", "", "ü b"], V.STRING), ("a.u64", [2**64 - 1], V.UINT64),
        ("a.i64", [-(2**63)], V.INT64), ("a.f64", [1e300, -0.0], V.FLOAT64),
    ]
    for k, v, ty in arrays:
        w.add_key_value(k, v, V.ARRAY, sub_type=ty)
    # Nested arrays: the writer infers inner element types (int -> i32, str -> string).
    nested = {"a.nested": [[1, 2], [3]], "a.nested_str": [["x", "y"], ["z"]], "a.deep": [[[4, 5], [6]]]}
    for k, v in nested.items():
        w.add_key_value(k, v, V.ARRAY, sub_type=V.ARRAY)

    rng = np.random.default_rng(12)
    tensors = []
    for name, qtype, shape in [
        ("f32", GGMLQuantizationType.F32, (3, 5)),
        ("f16", GGMLQuantizationType.F16, (4, 6)),
        ("q8_0", GGMLQuantizationType.Q8_0, (3, 64)),
        ("q4_1", GGMLQuantizationType.Q4_1, (5, 96)),
        ("q4_1_3d", GGMLQuantizationType.Q4_1, (2, 3, 32)),
    ]:
        data = rng.standard_normal(shape).astype(np.float32) * 3
        raw = quantize(data, qtype)
        w.add_tensor(name, raw, raw_dtype=qtype)
        values = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(-1)
        tensors.append({"name": name, "type": int(qtype), "dims": list(reversed(shape)),
                        "values": [float(x) for x in values]})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    def stored(v, ty):
        """The value as the file holds it (an f32 key holds the float rounded to f32)."""
        return float(np.float32(v)) if ty == V.FLOAT32 else v

    expect = {
        "scalars": [{"key": k, "type": ty.name, "value": stored(v, ty)} for k, v, ty in scalars],
        "arrays": [{"key": k, "type": ty.name, "value": v} for k, v, ty in arrays],
        "nested": nested,
        "alignment": 64,
        "tensors": tensors,
        "quant_sizes": {t.name: [int(t), bs, ts] for t, (bs, ts) in GGML_QUANT_SIZES.items()},
    }
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump(expect, f, ensure_ascii=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw text")
    src.add_argument("--chat", help="a user message, rendered with the model's chat template")
    src.add_argument("--ids", help="the prompt as token ids (comma- or space-separated), used as they are: no BOS added")
    g.add_argument("--special", choices=["allow", "plain"], default="allow",
                   help="match control tokens written in the text (default) or encode them as text")
    g.add_argument("--max-tokens", type=int, default=16)
    g.add_argument("--ignore-eos", action="store_true", help="keep generating after the end-of-sequence token")
    g.add_argument("--fixture", action="store_true", help="write the model's file name only (a fixture kept in the repository)")
    g.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    g.add_argument("--out", required=True, help="JSON result")
    g.add_argument("--logits", help="float32 .npy of the logit rows (steps x vocab)")
    g.set_defaults(fn=cmd_generate)
    t = sub.add_parser("tokenize")
    t.add_argument("--model", required=True)
    t.add_argument("--input", required=True, help='JSON {"texts": [...]}')
    t.add_argument("--out", required=True)
    t.set_defaults(fn=cmd_tokenize)
    r = sub.add_parser("render")
    r.add_argument("--model", required=True)
    r.add_argument("--input", required=True, help='JSON {"chats": [{"messages": [...], "tools": [...]}]}')
    r.add_argument("--out", required=True)
    r.set_defaults(fn=cmd_render)
    d = sub.add_parser("dequant")
    d.add_argument("--model", required=True)
    d.add_argument("--out", required=True)
    d.set_defaults(fn=cmd_dequant)
    db = sub.add_parser("dequant-blocks")
    db.add_argument("--dir", required=True)
    db.add_argument("types", nargs="+", help="ggml type names (Q4_K, BF16, ...)")
    db.set_defaults(fn=cmd_dequant_blocks)
    wt = sub.add_parser("write-test-gguf")
    wt.add_argument("--out", required=True)
    wt.add_argument("--json", required=True)
    wt.set_defaults(fn=cmd_write_test_gguf)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
