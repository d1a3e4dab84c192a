#!/usr/bin/env python3
"""Independent reference for dynrt's sentence embeddings (src/sentence/, src/tokenizer/wordpiece.rs),
on numpy, the `safetensors` package (its numpy loader), the `tokenizers` package and
onnxruntime. Run it with the python of scripts/pyenv.sh.

sentence-transformers itself needs PyTorch (hundreds of MB), so this script reproduces its
pipeline for BERT models instead, step by step as the library and `transformers` compute it:

  1. tokenize with the folder's tokenizer.json (`tokenizers`), truncated to
     sentence_bert_config.json's max_seq_length (sentence-transformers overrides the length in
     tokenizer.json with it), user text never matched as special tokens
     (`encode_special_tokens`: dynrt's rule; the library would match `[SEP]` typed in a
     sentence);
  2. BertModel: word + position + token-type-0 embeddings, LayerNorm, then per layer
     self-attention (q k^T / sqrt(head_dim), softmax, @ v), dense + residual + LayerNorm,
     intermediate dense + GELU (erf) + dense + residual + LayerNorm;
  3. Pooling (1_Pooling/config.json: cls, mean, max) and Normalize (x / max(|x|, 1e-12)) as
     modules.json lists them.

Each sentence runs alone, unpadded, in float64: the padding mask of dynrt's batches is checked
by comparing against sentences that have none.

  tokenize  --tokenizer FILE [--max-length N] --input IN.json --out OUT.json
            ids of {"texts": [...]} (and the normalizer's output) as {"ids": [[...]], "normalized": [...]}
  embed     --model DIR --input IN.json --out OUT.json
            {"embeddings": [[...]], "tokens": [...]} of the sentence-transformers folder DIR
  onnx      --model FILE --tokenizer FILE --pooling mean|cls|max [--normalize] [--max-length N]
            --input IN.json --out OUT.json
            the same from an ONNX encoder run by onnxruntime (its rank-3 f32 output pooled)
"""

import argparse
import json
import math
import os

import numpy as np


def load_tokenizer(path, max_length):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.no_padding()
    if max_length:
        tok.enable_truncation(max_length=max_length)
    else:
        tok.no_truncation()
    tok.encode_special_tokens = True
    return tok


def read_texts(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)["texts"]


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f)


def cmd_tokenize(args):
    tok = load_tokenizer(args.tokenizer, args.max_length)
    texts = read_texts(args.input)
    ids = [e.ids for e in tok.encode_batch(texts)]
    normalized = [tok.normalizer.normalize_str(t) for t in texts]
    write_json(args.out, {"ids": ids, "normalized": normalized})


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


_ERF = np.frompyfunc(math.erf, 1, 1)


def gelu_erf(x):
    return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)).astype(np.float64))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def pool(h, mode, normalize):
    """h: (tokens, width) of one unpadded sentence."""
    if mode == "cls":
        v = h[0]
    elif mode == "mean":
        v = h.sum(0) / max(h.shape[0], 1e-9)
    elif mode == "max":
        v = h.max(0)
    else:
        raise SystemExit(f"unknown pooling {mode}")
    if normalize:
        v = v / max(np.linalg.norm(v), 1e-12)
    return v


def folder_pipeline(folder):
    with open(os.path.join(folder, "modules.json")) as f:
        modules = json.load(f)
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    pooling_dir = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
    with open(os.path.join(folder, pooling_dir, "config.json")) as f:
        p = json.load(f)
    modes = [m for k, m in [("pooling_mode_cls_token", "cls"), ("pooling_mode_mean_tokens", "mean"),
                            ("pooling_mode_max_tokens", "max")] if p.get(k)]
    assert len(modes) == 1, p
    return modes[0], kinds[-1] == "Normalize"


def cmd_embed(args):
    from safetensors.numpy import load_file

    folder = args.model
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    max_len = cfg["max_position_embeddings"]
    sbert = os.path.join(folder, "sentence_bert_config.json")
    if os.path.exists(sbert):
        with open(sbert) as f:
            max_len = min(max_len, json.load(f).get("max_seq_length", max_len))
    mode, normalize = folder_pipeline(folder)
    tok = load_tokenizer(os.path.join(folder, "tokenizer.json"), max_len)
    w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(folder, "model.safetensors")).items()
         if v.dtype == np.float32}
    pre = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""
    W = lambda name: w[pre + name]
    H, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    dh = H // heads
    eps = cfg.get("layer_norm_eps", 1e-12)
    act = gelu_erf if cfg["hidden_act"] == "gelu" else gelu_tanh
    texts = read_texts(args.input)
    out, tokens = [], []
    for enc in tok.encode_batch(texts):
        ids = np.array(enc.ids)
        s = len(ids)
        x = W("embeddings.word_embeddings.weight")[ids] + W("embeddings.position_embeddings.weight")[:s] \
            + W("embeddings.token_type_embeddings.weight")[0]
        x = layer_norm(x, W("embeddings.LayerNorm.weight"), W("embeddings.LayerNorm.bias"), eps)
        for l in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{l}."
            lin = lambda t, n: t @ W(p + n + ".weight").T + W(p + n + ".bias")
            q = lin(x, "attention.self.query").reshape(s, heads, dh).transpose(1, 0, 2)
            k = lin(x, "attention.self.key").reshape(s, heads, dh).transpose(1, 0, 2)
            v = lin(x, "attention.self.value").reshape(s, heads, dh).transpose(1, 0, 2)
            sc = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            ctx = (sc @ v).transpose(1, 0, 2).reshape(s, H)
            x = layer_norm(lin(ctx, "attention.output.dense") + x, W(p + "attention.output.LayerNorm.weight"),
                           W(p + "attention.output.LayerNorm.bias"), eps)
            i = act(lin(x, "intermediate.dense"))
            x = layer_norm(lin(i, "output.dense") + x, W(p + "output.LayerNorm.weight"),
                           W(p + "output.LayerNorm.bias"), eps)
        out.append(pool(x, mode, normalize).tolist())
        tokens.append(s)
    write_json(args.out, {"embeddings": out, "tokens": tokens})


def cmd_onnx(args):
    import onnxruntime as ort

    tok = load_tokenizer(args.tokenizer, args.max_length)
    sess = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    names = {i.name: i for i in sess.get_inputs()}
    hidden = next(o.name for o in sess.get_outputs() if len(o.shape) == 3)
    texts = read_texts(args.input)
    out = []
    for enc in tok.encode_batch(texts):
        ids = np.array([enc.ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        h = sess.run([hidden], {k: v for k, v in feeds.items() if k in names})[0][0].astype(np.float64)
        out.append(pool(h, args.pooling, args.normalize).tolist())
    write_json(args.out, {"embeddings": out})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenize")
    t.add_argument("--tokenizer", required=True)
    t.add_argument("--max-length", type=int, default=0)
    e = sub.add_parser("embed")
    e.add_argument("--model", required=True)
    o = sub.add_parser("onnx")
    o.add_argument("--model", required=True)
    o.add_argument("--tokenizer", required=True)
    o.add_argument("--pooling", default="mean")
    o.add_argument("--normalize", action="store_true")
    o.add_argument("--max-length", type=int, default=0)
    for p in (t, e, o):
        p.add_argument("--input", required=True)
        p.add_argument("--out", required=True)
    args = ap.parse_args()
    {"tokenize": cmd_tokenize, "embed": cmd_embed, "onnx": cmd_onnx}[args.cmd](args)


if __name__ == "__main__":
    main()
