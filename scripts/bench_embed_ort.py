#!/usr/bin/env python3
"""ONNX Runtime's side of `dynrt-bench embed`: sentences/s of an ONNX sentence encoder on
the same sentences (`dynrt-bench embed --texts-out FILE.json` writes them), batched the same way
(sorted by length, longest first, padded to each batch's longest), tokenized by the
`tokenizers` package, mean-pooled (and normalized with --normalize) in numpy. One JSON line
per batch size. Run it with the python of scripts/pyenv.sh.

  bench_embed_ort.py --model FILE.onnx --tokenizer tokenizer.json --input FILE.json
                     [--batches 1,8,64] [--repeat R] [--threads N] [--max-length N] [--normalize]
                     [--provider cpu|webgpu]
"""

import argparse
import json
import os
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ONNX Runtime's default)")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--normalize", action="store_true")
    ap.add_argument("--provider", default="cpu")
    args = ap.parse_args()

    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(args.tokenizer)
    tok.no_padding()
    tok.enable_truncation(max_length=args.max_length)
    tok.encode_special_tokens = True
    with open(args.input, encoding="utf-8") as f:
        texts = json.load(f)["texts"]
    opts = ort.SessionOptions()
    if args.threads:
        opts.intra_op_num_threads = args.threads
    providers = ["CPUExecutionProvider"]
    if args.provider == "webgpu":
        # The plugin EP of scripts/requirements.txt, as scripts/peer/ort_native.py opens it
        # (run under scripts/peer/ort-native.sh, which gives Dawn a Vulkan adapter here).
        import onnxruntime_ep_webgpu as ep

        ort.register_execution_provider_library("webgpu", ep.get_library_path())
        dev = next((d for d in ort.get_ep_devices() if d.ep_name == ep.get_ep_name()), None)
        if dev is None:
            raise SystemExit("no WebGPU EP device: run under scripts/peer/ort-native.sh")
        opts.add_provider_for_devices([dev], {})
        providers = None
    sess = ort.InferenceSession(args.model, sess_options=opts, providers=providers)
    names = {i.name for i in sess.get_inputs()}
    hidden = next(o.name for o in sess.get_outputs() if len(o.shape) == 3)

    def embed(batch):
        encs = tok.encode_batch(texts)
        order = sorted(range(len(encs)), key=lambda i: (-len(encs[i].ids), i))
        out = [None] * len(encs)
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            seq = len(encs[idx[0]].ids)
            ids = np.zeros((len(idx), seq), dtype=np.int64)
            mask = np.zeros((len(idx), seq), dtype=np.int64)
            for r, i in enumerate(idx):
                n = len(encs[i].ids)
                ids[r, :n] = encs[i].ids
                mask[r, :n] = 1
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            h = sess.run([hidden], {k: v for k, v in feeds.items() if k in names})[0]
            m = mask[:, :, None].astype(np.float32)
            v = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            if args.normalize:
                v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
            for r, i in enumerate(idx):
                out[i] = v[r]
        return out, sum(len(e.ids) for e in encs)

    for batch in [int(b) for b in args.batches.split(",")]:
        _, tokens = embed(batch)  # warm-up
        t = time.perf_counter()
        for _ in range(max(args.repeat, 1)):
            embed(batch)
        secs = (time.perf_counter() - t) / max(args.repeat, 1)
        print(json.dumps({
            "runtime": "onnxruntime",
            "provider": f"onnxruntime {ort.__version__} {args.provider}",
            "model": os.path.basename(args.model),
            "threads": args.threads or "default",
            "batch": batch,
            "sentences": len(texts),
            "tokens": tokens,
            "seconds": secs,
            "sentences_per_s": len(texts) / secs,
            "tokens_per_s": tokens / secs,
        }), flush=True)


if __name__ == "__main__":
    main()
