#!/usr/bin/env python3
"""One workload of scripts/bench_peer.sh on ONNX Runtime's native WebGPU EP (the plugin
`onnxruntime-ep-webgpu`, Dawn inside), run under scripts/peer/ort-native.sh.

    ort_native.py MODELS_DIR WORKLOAD [--steps N] [--provider webgpu|cpu]

MODELS_DIR is what scripts/peer_models.py wrote (workloads.json, model files, feeds/*.npy).
Prints one JSON object on stdout, the document `dynrt-bench onnx` prints too (see
scripts/bench_peer.sh for the whole interface):

    {"runtime": "ort", "provider": ..., "load_ms": ...,
     "steps": [{"ms": ..., "cpu_ms": ..., "counts": {...}}, ...], "peak_bytes": ..., "tokens": [...]}

A step is one run of the model and ends when its results are complete on the device (and,
for a decode step, when the logits have been read back for the argmax). The Python API has no
wait for the device without a read-back (`synchronize_outputs` returns before the GPU is done),
so an op step ends with a fence: a one-element Neg session on the same device, whose output is
read back after the queue has run everything submitted before it (0.2-0.3 ms on an idle queue);
the counts are taken before the fence. `cpu_ms` is the process's CPU time (all threads) over
the step: on a software adapter the device's work runs on this process's threads, so it is the
step's whole cost, and far less disturbed by other processes on the machine than `ms`. IO binding keeps every
tensor on the device between steps: op workloads bind their inputs once as device values and
their output to a device value made once; decode workloads bind the presents of step k as the
pasts of step k + 1 without a host round trip, and the logits to host memory. `counts` are
the deltas of the Vulkan counting layer's counters over the step when PEER_COUNT_SHM names its
shared counter file (scripts/peer/vulkan-count-layer), else empty; `peak_bytes` is the layer's
peak of live device memory over the whole process (model load included), else null.
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np
import onnxruntime as ort

# The order of the counters in the layer's shared file (cname[] in peer_count_layer.c).
COUNTERS = ["create_buffer", "create_buffer_bytes", "destroy_buffer", "allocate_memory", "allocate_memory_bytes",
            "free_memory", "queue_submit", "cmd_dispatch", "compute_pipelines", "map_memory",
            "memory_live_bytes", "memory_peak_bytes"]


def read_counters():
    path = os.environ.get("PEER_COUNT_SHM")
    if not path or not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        raw = f.read(8 * len(COUNTERS))
    if len(raw) != 8 * len(COUNTERS):
        return None
    return dict(zip(COUNTERS, struct.unpack(f"<{len(COUNTERS)}Q", raw)))


REGISTERED = False


def delta(before, after):
    if before is None or after is None:
        return {}
    return {k: after[k] - before[k] for k in COUNTERS if not k.startswith("memory_")}


def fence_model(path):
    """A one-element Neg: run after a step, its read-back waits for the queue (see above)."""
    from onnx import TensorProto, helper, save

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    m = helper.make_model(helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "fence", vi[:1], vi[1:]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    save(m, path)
    return path


def session(model_path, provider):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if provider == "cpu":
        return ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"]), None, "cpu"
    import onnxruntime_ep_webgpu as webgpu_ep

    global REGISTERED
    if not REGISTERED:
        ort.register_execution_provider_library("webgpu", webgpu_ep.get_library_path())
        REGISTERED = True
    dev = next((d for d in ort.get_ep_devices() if d.ep_name == webgpu_ep.get_ep_name()), None)
    if dev is None:
        sys.exit("no WebGPU EP device: run under scripts/peer/ort-native.sh (fake /sys/class/drm entry, Vulkan ICD)")
    opts.add_provider_for_devices([dev], {})
    sess = ort.InferenceSession(model_path, opts)
    if sess.get_providers()[0] != "WebGpuExecutionProvider":
        sys.exit(f"the session did not take the WebGPU EP: {sess.get_providers()}")
    return sess, dev, "webgpu"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models_dir")
    ap.add_argument("workload")
    ap.add_argument("--steps", type=int, help="steps to run (default: the manifest's)")
    ap.add_argument("--provider", choices=["webgpu", "cpu"], default="webgpu")
    args = ap.parse_args()
    ort.set_default_logger_severity(3)

    with open(os.path.join(args.models_dir, "workloads.json")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    w = next((r for r in rows if r["workload"] == args.workload), None)
    if w is None:
        sys.exit(f"no workload {args.workload} in {args.models_dir}/workloads.json")
    steps = args.steps or w["steps"]
    feeds_dir = os.path.join(args.models_dir, w["feeds"])
    feeds = {n: np.load(os.path.join(feeds_dir, n + ".npy")) for n in w["inputs"]}

    t0 = time.perf_counter()
    sess, _dev, device = session(os.path.join(args.models_dir, w["model"]), args.provider)
    load_ms = (time.perf_counter() - t0) * 1e3
    io = sess.io_binding()
    records, tokens = [], []

    if w["kind"] == "op":
        fence, _, _ = session(fence_model(os.path.join(args.models_dir, "fence.onnx")), args.provider)
        one = {"x": np.ones(1, dtype=np.float32)}
        for n in w["inputs"]:
            io.bind_ortvalue_input(n, ort.OrtValue.ortvalue_from_numpy(feeds[n], device, 0))
        # The output value, made once on the device from the first run's result shape.
        first = sess.run(w["outputs"], feeds)
        outs = {n: ort.OrtValue.ortvalue_from_shape_and_type(list(v.shape), v.dtype.type, device, 0) for n, v in zip(w["outputs"], first)}
        for n, v in outs.items():
            io.bind_ortvalue_output(n, v)
        for _ in range(steps):
            c0 = read_counters()
            t, cpu = time.perf_counter(), time.process_time()
            sess.run_with_iobinding(io)
            counts = delta(c0, read_counters())
            fence.run(None, one)
            records.append({"ms": (time.perf_counter() - t) * 1e3, "cpu_ms": (time.process_time() - cpu) * 1e3, "counts": counts})
        # The result, checked once against numpy after timing.
        got = outs[w["outputs"][0]].numpy()
        a, b = feeds[w["inputs"][0]], feeds[w["inputs"][1]]
        ref = {"Add": lambda: a + b, "Mul": lambda: a * b, "MatMul": lambda: a @ b}[w["op"]]()
        err = float(np.max(np.abs(got - ref)))
        tol = 1e-6 if w["figure"] == "GB/s" else 1e-4 * a.shape[-1] ** 0.5
        if not err <= tol:
            sys.exit(f"{args.workload}: the result differs from numpy by {err} (tolerance {tol})")
    else:
        cur = dict(feeds)
        state_in = {o: i for o, i in w["states"]}
        past = int(feeds[w["states"][0][1]].shape[2])
        for _ in range(steps):
            c0 = read_counters()
            t, cpu = time.perf_counter(), time.process_time()
            io.clear_binding_inputs()
            io.clear_binding_outputs()
            for n, v in cur.items():
                if isinstance(v, np.ndarray):
                    io.bind_cpu_input(n, v)
                else:
                    io.bind_ortvalue_input(n, v)
            io.bind_output(w["logits"], "cpu")
            for o in state_in:
                io.bind_output(o, device)
            sess.run_with_iobinding(io)
            # get_outputs() lists the outputs in the order they were bound.
            outs = dict(zip([w["logits"], *state_in], io.get_outputs()))
            logits = outs[w["logits"]].numpy()
            token = int(np.argmax(logits[0, -1]))
            ms = (time.perf_counter() - t) * 1e3
            records.append({"ms": ms, "cpu_ms": (time.process_time() - cpu) * 1e3, "counts": delta(c0, read_counters())})
            tokens.append(token)
            past += int(cur[w["token_input"]].shape[1])
            cur = {w["token_input"]: np.array([[token]], dtype=np.int64)}
            if w.get("position_input"):
                cur[w["position_input"]] = np.array([[past]], dtype=np.int64)
            for o, i in state_in.items():
                cur[i] = outs[o]

    end = read_counters()
    doc = {
        "runtime": "ort",
        "provider": f"onnxruntime {ort.__version__} {sess.get_providers()[0]}",
        "load_ms": load_ms,
        "steps": records,
        "peak_bytes": end["memory_peak_bytes"] if end else None,
        "tokens": tokens,
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
