#!/usr/bin/env python3
"""Independent reference for dynrt's SentencePiece tokenizer (GGUF `tokenizer.ggml.model` =
"llama"): rebuilds a `sentencepiece` model from a GGUF's tokenizer metadata and encodes with
the `sentencepiece` package. Run it with the python of scripts/pyenv.sh.

  encode TEXT     print the ids of TEXT as a JSON list (BOS first when the file says
                  tokenizer.ggml.add_bos_token)
  tokenize        for the tests: the strings of a JSON file ({"texts": [...]}) encoded as
                  plain text and with control tokens matched, and decoded; written as JSON

As a module: `load(path)` gives a SentencePieceProcessor, `encode(path_or_proc, text,
add_bos)` a list of ids.

The model is what the GGUF was converted from: a BPE model with byte fallback, pieces with
their scores and types (GGUF 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
map to SentencePiece's types of the same names; the `tokenizer.ggml.unknown_token_id` piece is
UNKNOWN even where the GGUF marks it control, as Gemma's does, since SentencePiece needs one),
and no normalization: the identity normalizer with spaces escaped as U+2581, a dummy prefix
only where `tokenizer.ggml.add_space_prefix` says so (absent means true, as llama.cpp reads
it), extra whitespace kept. The GGUF stores user-defined pieces with plain spaces (Gemma's
runs of spaces), where the model had U+2581: they get it back, so that they match escaped
text. `split_digits` is a training option only (encoding a BPE model never reads it); it is
set when no normal piece has two ASCII digits, as in Gemma's vocabulary.
"""

import argparse
import json
import os
import sys

from gguf import GGUFReader

SPACE = "\u2581"


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def model_proto(path):
    """The serialized SentencePiece ModelProto of the GGUF at `path`, and its metadata."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    r = GGUFReader(path)
    kind = field(r, "tokenizer.ggml.model")
    if kind != "llama":
        raise SystemExit(f"{path}: tokenizer.ggml.model is {kind!r}, not 'llama' (SentencePiece)")
    tokens = field(r, "tokenizer.ggml.tokens")
    scores = field(r, "tokenizer.ggml.scores", [0.0] * len(tokens))
    types = field(r, "tokenizer.ggml.token_type", [1] * len(tokens))
    unk = field(r, "tokenizer.ggml.unknown_token_id")
    meta = {
        "bos": field(r, "tokenizer.ggml.bos_token_id"),
        "eos": field(r, "tokenizer.ggml.eos_token_id"),
        "unk": unk,
        "add_bos": bool(field(r, "tokenizer.ggml.add_bos_token", True)),
        "add_space_prefix": bool(field(r, "tokenizer.ggml.add_space_prefix", True)),
        "control": [t for t, ty in zip(tokens, types) if ty == 3],
        "user_defined": [t for t, ty in zip(tokens, types) if ty == 4],
    }
    kinds = {
        1: pb.ModelProto.SentencePiece.NORMAL,
        2: pb.ModelProto.SentencePiece.UNKNOWN,
        3: pb.ModelProto.SentencePiece.CONTROL,
        4: pb.ModelProto.SentencePiece.USER_DEFINED,
        5: pb.ModelProto.SentencePiece.UNUSED,
        6: pb.ModelProto.SentencePiece.BYTE,
    }
    m = pb.ModelProto()
    for i, (text, score, ty) in enumerate(zip(tokens, scores, types)):
        p = m.pieces.add()
        p.piece = text.replace(" ", SPACE) if ty == 4 else text
        p.score = float(score)
        p.type = pb.ModelProto.SentencePiece.UNKNOWN if i == unk else kinds[int(ty)]
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(tokens)
    ts.byte_fallback = True
    ts.split_digits = not any(
        ty == 1 and sum(c in "0123456789" for c in t) >= 2 for t, ty in zip(tokens, types)
    )
    for name, key in (("unk_id", "unk"), ("bos_id", "bos"), ("eos_id", "eos")):
        setattr(ts, name, -1 if meta[key] is None else int(meta[key]))
    pad = field(r, "tokenizer.ggml.padding_token_id")
    ts.pad_id = -1 if pad is None else int(pad)
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = meta["add_space_prefix"]
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    return m.SerializeToString(), meta


def load(path):
    """A SentencePieceProcessor for the GGUF at `path` (its metadata as `.gguf_meta`)."""
    import sentencepiece as spm

    proto, meta = model_proto(path)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    sp.gguf_meta = meta
    return sp


def encode(path_or_proc, text, add_bos):
    """The ids of `text` as plain text (control tokens' texts are text), BOS first if
    `add_bos` and the model has one."""
    sp = load(os.fspath(path_or_proc)) if isinstance(path_or_proc, (str, os.PathLike)) else path_or_proc
    ids = list(sp.encode(text))
    bos = sp.gguf_meta["bos"]
    return ([int(bos)] if add_bos and bos is not None else []) + ids


def encode_special(sp, text):
    """The ids of `text` with control tokens matched as tokens (leftmost, longest first),
    the text between them encoded as plain text."""
    controls = sorted(sp.gguf_meta["control"], key=len, reverse=True)
    out, start, i = [], 0, 0
    while i < len(text):
        hit = next((c for c in controls if c and text.startswith(c, i)), None)
        if hit is None:
            i += 1
            continue
        out += sp.encode(text[start:i]) if i > start else []
        out.append(sp.piece_to_id(hit))
        i += len(hit)
        start = i
    out += sp.encode(text[start:]) if len(text) > start else []
    return out


def cmd_encode(a):
    sp = load(a.model)
    print(json.dumps(encode(sp, a.text, sp.gguf_meta["add_bos"])))


def cmd_tokenize(a):
    sp = load(a.model)
    with open(a.input, encoding="utf-8") as f:
        texts = json.load(f)["texts"]
    plain = [list(sp.encode(t)) for t in texts]
    allow = [encode_special(sp, t) for t in texts]
    out = {
        "plain": plain,
        "allow": allow,
        "decoded_plain": [sp.decode(ids) for ids in plain],
        "add_bos": sp.gguf_meta["add_bos"],
        "bos": sp.gguf_meta["bos"],
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a GGUF whose tokenizer.ggml.model is 'llama'")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode")
    e.add_argument("text")
    t = sub.add_parser("tokenize")
    t.add_argument("--input", required=True)
    t.add_argument("--out", required=True)
    a = p.parse_args()
    {"encode": cmd_encode, "tokenize": cmd_tokenize}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
