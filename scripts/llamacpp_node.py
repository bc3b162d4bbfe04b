#!/usr/bin/env python3
"""A llama.cpp deployment as a kvasir-equiv node: steps 3-6 of a protocol
(logits, decide, generate, perplexity), determinism and invariance, computed by llama.cpp
on a GGUF model and written as a capture (protocols/CAPTURE.md) for
`kvasir-equiv compare`.

  scripts/llamacpp_node.py -p protocols/default.json -m model.gguf -o llamacpp.safetensors
  scripts/llamacpp_node.py -p P -m M -o f32kv.safetensors --kv-type f32 --flash-attn off
  kvasir-equiv capture -p P -m M -b cpu-ref -o cpu-ref.safetensors
  kvasir-equiv compare -p P cpu-ref.safetensors llamacpp.safetensors f32kv.safetensors

Runs wherever llama.cpp runs (a GPU box, a phone under Termux): it needs
python3, numpy and the llama-cpp-python package from PyPI (which builds
llama.cpp from source: `pip install llama-cpp-python`; CMAKE_ARGS selects
CUDA, Vulkan, Metal, OpenCL ...). The settings that change llama.cpp's
arithmetic are options and are recorded in the capture's capabilities with
the llama-cpp-python version and llama.cpp's system info.

The node is FREE-RUNNING (capability "authority": "none"): llama.cpp runs its
own router and its own greedy decoding; nothing is pinned to the oracle. Its
logits are compared as they are (on an MoE model they include llama.cpp's
routing flips), top-1 agreement free-running; routing agreement is not
measurable (llama.cpp does not expose its expert choices) and teacher-forced
divergences only with --reference-capture (the oracle's capture, whose
greedy tokens are fed to llama.cpp). Steps llama.cpp cannot provide (single
ops, hidden states between layers) are declared "not_captured" with the
reason: compare lists them as not judged for this node, never as passed. The
invariance step is llama.cpp's: the request among seeded batchmates decoded
together in one unified KV cache, one prefill vs its token-by-token path,
repeated greedy requests (single ops not measurable).

Token ids come from the protocol's token files exactly as kvasir reads them
(path relative to the protocol, sha256 checked, offset and count); no BOS is
added, nothing is tokenised. Exit codes: 0 written, 2 bad usage or input,
3 llama.cpp failed.
"""

import argparse
import ctypes
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import capture_format  # noqa: E402
import kvasir_rng  # noqa: E402

TOOL = "scripts/llamacpp_node.py"
STEPS = ["ops", "drift", "logits", "decide", "generate", "perplexity", "determinism", "invariance"]
NOT_CAPTURED = {
    "ops": "llama.cpp runs whole graphs: its API exposes no single op",
    "drift": "llama.cpp's API exposes no hidden state between layers",
}
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
FLASH = {"auto": -1, "off": 0, "on": 1}


class UsageError(Exception):
    pass


# --- the protocol -------------------------------------------------------------------
def stream_ids(doc, protocol_path, spec, where):
    """A protocol token stream {path, sha256, offset, count} as kvasir reads it (audit_plan.cpp stream_tokens)."""
    path = (Path(protocol_path).resolve().parent / spec["path"])
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"{where}: {path}: {e.strerror}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec["sha256"]:
        raise UsageError(f"{where}: {path} has sha256 {digest}, the protocol says {spec['sha256']}")
    try:
        ids = [int(t) for t in data.decode("ascii").split()]
    except (UnicodeDecodeError, ValueError):
        raise UsageError(f"{where}: {path} is not whitespace-separated decimal token ids")
    off, n = int(spec["offset"]), int(spec["count"])
    if off + n > len(ids):
        raise UsageError(f"{where}: offset {off} + count {n} is past the {len(ids)} ids of {path}")
    return ids[off:off + n]


def perplexity_windows(n, context):
    """steps/perplexity.hpp: consecutive non-overlapping windows of `context`; a tail of >= 2 tokens is kept."""
    out, b = [], 0
    while b < n:
        e = min(n, b + context)
        if e - b >= 2:
            out.append((b, e))
        b = e
    return out


def self_delta(ref, cand):
    """step.cpp self_delta: (guarded max_rel, max|Δ|) of a node against itself — 0 for the same bits; max_rel as
    metrics.hpp CompareStats: max|Δ| / max(|ref_i|, max(1e-3·RMS(ref), DBL_MIN)) over the positions finite on both
    sides; NaN when the non-finite patterns differ."""
    r, c = np.asarray(ref, np.float64).ravel(), np.asarray(cand, np.float64).ravel()
    if np.array_equal(np.asarray(ref).view(np.uint8), np.asarray(cand).view(np.uint8)):
        return 0.0, 0.0
    fr, fc = np.isfinite(r), np.isfinite(c)
    if not np.array_equal(fr, fc) or not np.array_equal(r[~fr], c[~fc]):
        return float("nan"), float("nan")
    r, c = r[fr], c[fc]
    if r.size == 0:
        return 0.0, 0.0
    guard = max(1e-3 * float(np.sqrt(np.mean(r * r))), sys.float_info.min)
    d = np.abs(c - r)
    return float(np.max(d / np.maximum(np.abs(r), guard))), float(np.max(d))


def guarded_max_rel(ref, cand):
    return self_delta(ref, cand)[0]


# --- llama.cpp --------------------------------------------------------------------------
class LlamaCpp:
    """One llama.cpp model + context through llama-cpp-python's C API bindings: token ids in, every position's
    logits out (float32, as llama.cpp returns them)."""

    def __init__(self, model_path, args, n_ctx, n_seq=1):
        try:
            import llama_cpp
        except (ImportError, OSError) as e:  # OSError / FileNotFoundError: the package without its libllama
            raise UsageError(f"the llama-cpp-python package is not usable here ({e}): pip install llama-cpp-python")
        self.lc = lc = llama_cpp
        self.version = getattr(llama_cpp, "__version__", "unknown")
        if not args.verbose:  # llama.cpp logs every tensor it loads; keep only errors
            self._log = lc.llama_log_callback(lambda level, text, _: (
                sys.stderr.write(text.decode("utf-8", "replace")) if level == 4 else None))  # GGML_LOG_LEVEL_ERROR
            lc.llama_log_set(self._log, ctypes.c_void_p(0))
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = args.gpu_layers
        mp.use_extra_bufts = not args.no_repack  # llama.cpp's -nr/--no-repack: weights as stored, no CPU repacking
        self.model = lc.llama_model_load_from_file(str(model_path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = args.batch
        cp.n_ubatch = min(args.ubatch, args.batch)
        cp.n_seq_max = n_seq
        cp.kv_unified = True  # batched sequences share one cache of n_ctx cells (the invariance step's batches)
        cp.n_threads = cp.n_threads_batch = args.threads
        cp.flash_attn_type = FLASH[args.flash_attn]
        cp.type_k = cp.type_v = KV_TYPES[args.kv_type]
        cp.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context with these settings "
                               f"(flash attention {args.flash_attn}, KV cache {args.kv_type})")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.n_batch = args.batch
        self.token_by_token = args.token_by_token
        self.batch = lc.llama_batch_init(self.n_batch, 0, n_seq)
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self.model, buf, len(buf))
        self.desc = buf.value.decode("utf-8", "replace")
        self.system_info = lc.llama_print_system_info().decode("utf-8", "replace").strip()

    def close(self):
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)

    def clear(self):
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)

    def decode(self, items):
        """items: (token, position, sequence, want logits) in order, decoded in llama_decode calls of n_batch;
        returns the logits rows [V] of the items that want them, in order."""
        rows = []
        for b in range(0, len(items), self.n_batch):
            chunk = items[b:b + self.n_batch]
            bt = self.batch
            bt.n_tokens = len(chunk)
            for j, (t, pos, seq, want) in enumerate(chunk):
                if not 0 <= t < self.n_vocab:
                    raise UsageError(f"token id {t} is outside the model's vocabulary of {self.n_vocab}")
                bt.token[j] = t
                bt.pos[j] = pos
                bt.n_seq_id[j] = 1
                bt.seq_id[j][0] = seq
                bt.logits[j] = 1 if want else 0
            rc = self.lc.llama_decode(self.ctx, bt)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} at positions {chunk[0][1]}..{chunk[-1][1]}")
            for j, item in enumerate(chunk):
                if item[3]:
                    rows.append(np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, j),
                                                      shape=(self.n_vocab,)).copy())
        return rows

    def eval(self, ids, pos0):
        """Decode ids at positions pos0.. of sequence 0; their logits [len, V] (float32). The KV cache keeps them."""
        return np.stack(self.decode([(t, pos0 + i, 0, True) for i, t in enumerate(ids)]))

    def forward_batch(self, seqs, slot):
        """The sequences decoded together (sequence j = seq id j, one cache); the logits [len, V] of seqs[slot]."""
        self.clear()
        items = [(t, i, j, j == slot) for j, seq in enumerate(seqs) for i, t in enumerate(seq)]
        return np.stack(self.decode(items))

    def forward(self, ids, token_by_token=None):
        self.clear()
        if self.token_by_token if token_by_token is None else token_by_token:
            # llama.cpp's decode path: one token per llama_decode through the KV cache
            return np.stack([self.eval([t], i)[0] for i, t in enumerate(ids)])
        return self.eval(ids, 0)


def margin(row):
    top = np.partition(row.astype(np.float64), -2)[-2:]
    return float(top[1] - top[0])


def log_softmax_nll(logits, target):
    z = logits.astype(np.float64)
    m = float(np.max(z))
    return float(m + np.log(np.sum(np.exp(z - m))) - z[target])


# --- the steps ------------------------------------------------------------------------------
def run_steps(doc, protocol_path, node, steps, reference, log):
    S = doc["steps"]
    out = {}
    if "logits" in steps:
        ids = stream_ids(doc, protocol_path, S["logits"]["tokens"], "steps.logits")
        out["logits.logits"] = node.forward(ids)
        log(f"  logits: {len(ids)} positions")
    if "decide" in steps:
        ids = stream_ids(doc, protocol_path, S["decide"]["tokens"], "steps.decide")
        out["decide.free.top1"] = np.argmax(node.forward(ids), axis=1).astype(np.int32)
        log(f"  decide: free top-1 of {len(ids)} positions")
    if "generate" in steps:
        g = S["generate"]
        prompt, n = stream_ids(doc, protocol_path, g["prompt"], "steps.generate.prompt"), int(g["n"])
        last = node.forward(prompt)[-1]
        toks, margins = [], []
        for s in range(n):  # llama.cpp's own greedy decoding: one token at a time through its KV cache
            t = int(np.argmax(last))
            toks.append(t)
            margins.append(margin(last))
            if s + 1 < n:
                last = node.eval([t], len(prompt) + s)[0]
        out["generate.tokens"] = np.asarray(toks, np.int32)
        out["generate.margins"] = np.asarray(margins, np.float64)
        if g.get("teacher_forcing") and reference is not None:
            forced = reference["generate.tokens"]
            last = node.forward(prompt)[-1]
            own = []
            for s in range(n):  # fed the reference's tokens: own argmax at every step
                own.append(int(np.argmax(last)))
                if s + 1 < n:
                    last = node.eval([int(forced[s])], len(prompt) + s)[0]
            out["generate.pinned_own"] = np.asarray(own, np.int32)
        log(f"  generate: {n} tokens after a {len(prompt)}-token prompt"
            + (", teacher-forced with the reference's tokens" if "generate.pinned_own" in out else ""))
    if "perplexity" in steps:
        # step_perplexity.cpp: windows from an empty cache; with "score": "second_half" only the predictions from
        # position C//2 of a window of C tokens on (llama-perplexity's rule); with "kl_divergence" the logits of
        # every scored prediction and its target too.
        p = S["perplexity"]
        ids = stream_ids(doc, protocol_path, p["tokens"], "steps.perplexity")
        second_half, kld = p.get("score") == "second_half", "kl_divergence" in p
        nll, rows, targets = [], [], []
        for b, e in perplexity_windows(len(ids), int(p["context"])):
            w = ids[b:e]
            lg = node.forward(w)
            for t in range((e - b) // 2 if second_half else 0, len(w) - 1):
                nll.append(log_softmax_nll(lg[t], w[t + 1]))
                if kld:
                    rows.append(lg[t])
                    targets.append(w[t + 1])
        out["perplexity.nll"] = np.asarray(nll, np.float64)
        if kld:
            out["perplexity.logits"] = np.asarray(rows, np.float32)
            out["perplexity.targets"] = np.asarray(targets, np.int32)
        log(f"  perplexity: {len(nll)} predictions{' (second half of each window)' if second_half else ''}, "
            f"ppl {float(np.exp(np.mean(nll))):.6g}")
    if "determinism" in steps:
        name = next((k for k in ("logits", "drift", "decide") if k in S), None)
        if name is None:
            raise UsageError("steps.determinism without a logits/drift/decide token stream (kvasir then draws seeded "
                             "tokens, which this node does not reproduce)")
        ids = stream_ids(doc, protocol_path, S[name]["tokens"], f"steps.{name}")
        first = node.forward(ids)
        worst = 0.0
        for _ in range(1, int(S["determinism"]["repeats"])):
            worst = max(worst, guarded_max_rel(first, node.forward(ids)))
        out["determinism.run_to_run_max_rel"] = np.asarray([worst], np.float64)
        log(f"  determinism: run-to-run max_rel {worst:.3g} on the logits")
    if "invariance" in steps:
        # step_invariance.cpp, its batch, prefill_decode and repeat parts (single ops are not llama.cpp's API).
        inv = S["invariance"]
        ids = stream_ids(doc, protocol_path, inv["tokens"], "steps.invariance")
        seed, T = int(doc["seed"]), len(ids)
        alone = node.forward(ids)
        sizes, rel, mx = [], [], []
        for b in inv["batch_sizes"]:
            slot, seqs, mate = b // 2, [], 0
            for j in range(b):
                if j == slot:
                    seqs.append(ids)
                    continue
                n = max(1, T + (mate % 5) - 2)  # batchmate(): lengths T−2 … T+2, ids uniform over the vocabulary
                u = kvasir_rng.seeded_uniform(seed, f"invariance/batch{b}/mate{mate}", (n,), 0.0, 1.0, np.float64)
                seqs.append([int(min(max(np.floor(x * node.n_vocab), 0), node.n_vocab - 1)) for x in u])
                mate += 1
            r, a = self_delta(alone, node.forward_batch(seqs, slot))
            sizes.append(float(b))
            rel.append(r)
            mx.append(a)
        out["invariance.batch_sizes"] = np.asarray(sizes, np.float64)
        out["invariance.batch_max_rel"] = np.asarray(rel, np.float64)
        out["invariance.batch_max_abs"] = np.asarray(mx, np.float64)
        prefill, decoded = node.forward(ids, token_by_token=False), node.forward(ids, token_by_token=True)
        diff = [t for t in range(T) if prefill[t].tobytes() != decoded[t].tobytes()]
        r, a = self_delta(prefill, decoded)
        out["invariance.prefill_decode"] = np.asarray([r, a, float(diff[0]) if diff else -1.0], np.float64)
        outputs, bits = set(), set()
        for _ in range(int(inv["repeats"])):
            last = node.forward(ids)[-1]
            toks, rows = [], []
            for step in range(int(inv["decode"])):
                t = int(np.argmax(last))
                toks.append(t)
                rows.append(last.tobytes())
                if step + 1 < int(inv["decode"]):
                    last = node.eval([t], T + step)[0]
            outputs.add(tuple(toks))
            bits.add(b"".join(rows))
        out["invariance.repeat"] = np.asarray([float(len(outputs)), float(len(bits))], np.float64)
        log(f"  invariance: batch max_rel {max(rel):.3g}, prefill vs decode {r:.3g} (first differing position "
            f"{int(out['invariance.prefill_decode'][2])}), {len(bits)} distinct outputs of {inv['repeats']}")
    return out


def model_fingerprint(args):
    if args.model_fingerprint:
        return args.model_fingerprint
    binary = args.kvasir or "kvasir-equiv"
    try:
        r = subprocess.run([binary, "inspect", str(args.model), "--json"], capture_output=True, text=True, timeout=600)
    except OSError as e:
        raise UsageError(f"the model fingerprint needs kvasir-equiv ({binary}: {e.strerror}): pass --kvasir BIN, or "
                         "--model-fingerprint HEX from `kvasir-equiv inspect MODEL --json` run elsewhere")
    if r.returncode != 0:
        raise UsageError(f"{binary} inspect {args.model}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return json.loads(r.stdout)["fingerprint"]


def main(argv=None):
    ap = argparse.ArgumentParser(description="A llama.cpp deployment as a kvasir-equiv node: steps 3-6 and determinism "
                                             "of a protocol on a GGUF model, written as a capture (protocols/CAPTURE.md)")
    ap.add_argument("-p", "--protocol", required=True, help="protocol file")
    ap.add_argument("-m", "--model", required=True, help="the GGUF model llama.cpp runs")
    ap.add_argument("-o", "--output", required=True, help="capture file to write (.safetensors)")
    ap.add_argument("--name", help="node name in the capture (default llama.cpp:fa=<flash-attn>,kv=<kv-type>)")
    ap.add_argument("--flash-attn", choices=sorted(FLASH), default="auto",
                    help="llama.cpp's flash attention (default auto: llama.cpp's default, on where supported)")
    ap.add_argument("--kv-type", choices=sorted(KV_TYPES), default="f16",
                    help="KV-cache type for K and V (default f16: llama.cpp's default)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (default: every core)")
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers offloaded to a GPU backend (default 0)")
    ap.add_argument("--batch", type=int, default=2048, help="logical batch n_batch (default 2048, llama.cpp's)")
    ap.add_argument("--ubatch", type=int, default=512, help="physical batch n_ubatch (default 512, llama.cpp's)")
    ap.add_argument("--ctx", type=int, default=0, help="context size (default: the longest sequence the protocol needs)")
    ap.add_argument("--token-by-token", action="store_true",
                    help="evaluate every sequence one token at a time (llama.cpp's decode path) instead of in batches")
    ap.add_argument("--no-repack", action="store_true",
                    help="keep the weights as stored (llama.cpp's --no-repack: no CPU repacking into interleaved blocks)")
    ap.add_argument("--steps", help="comma-separated subset of the protocol's logits,decide,generate,perplexity,determinism")
    ap.add_argument("--reference-capture", help="the oracle's capture (kvasir-equiv capture -b cpu-ref): its greedy "
                                                "tokens teacher-force generation (generate.pinned_own)")
    ap.add_argument("--kvasir", help="kvasir-equiv binary, for the model fingerprint (default: kvasir-equiv on PATH)")
    ap.add_argument("--model-fingerprint", help="the model's fingerprint (kvasir-equiv inspect MODEL --json) when no "
                                                "kvasir-equiv binary runs here")
    ap.add_argument("--writer", choices=["auto", "safetensors", "own"], default="auto",
                    help="safetensors container writer (default: the package when importable)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    ap.add_argument("-v", "--verbose", action="store_true", help="keep llama.cpp's own log (default: its errors only)")
    args = ap.parse_args(argv)
    log = (lambda *_: None) if args.quiet else (lambda m: print(m, file=sys.stderr))
    for flag, v in (("--threads", args.threads), ("--batch", args.batch), ("--ubatch", args.ubatch)):
        if v < 1:
            print(f"{TOOL}: {flag} must be >= 1, got {v}", file=sys.stderr)
            return 2
    if args.gpu_layers < 0 or args.ctx < 0:
        print(f"{TOOL}: --gpu-layers and --ctx must be >= 0", file=sys.stderr)
        return 2
    try:
        doc, phash = capture_format.load_protocol(args.protocol)
        S = doc.get("steps", {})
        wanted = [s for s in ("logits", "decide", "generate", "perplexity", "determinism", "invariance") if s in S]
        if args.steps:
            asked = [s.strip() for s in args.steps.split(",") if s.strip()]
            bad = [s for s in asked if s not in wanted]
            if bad:
                raise UsageError(f"--steps: {', '.join(bad)} not among the protocol's steps this node runs "
                                 f"({', '.join(wanted)})")
            wanted = [s for s in wanted if s in asked]
        if not wanted:
            raise UsageError("the protocol has none of the steps this node runs (logits, decide, generate, perplexity, "
                             "determinism)")
        if not Path(args.model).is_file():
            raise UsageError(f"{args.model}: no such file")
        fingerprint = model_fingerprint(args)
        reference = None
        if args.reference_capture:
            ref_meta, ref_tensors = capture_format.read_capture(args.reference_capture)
            # The tokens it feeds must be the oracle's for this very protocol and model.
            for key, want in (("protocol_hash", phash), ("model_fingerprint", fingerprint)):
                if ref_meta.get(key) != want:
                    raise UsageError(f"{args.reference_capture}: {key} {ref_meta.get(key)!r} differs from this run's "
                                     f"{want!r} (another protocol or model was captured)")
            reference = {k: np.asarray(v) for k, v in ref_tensors.items()}
            if "generate.tokens" not in reference:
                raise UsageError(f"{args.reference_capture}: no generate.tokens (capture the reference with the "
                                 "generate step)")
        need = 0
        for k in ("logits", "decide", "drift"):
            if k in S:
                need = max(need, int(S[k]["tokens"]["count"]))
        if "generate" in S:
            need = max(need, int(S["generate"]["prompt"]["count"]) + int(S["generate"]["n"]))
        if "perplexity" in S:
            need = max(need, int(S["perplexity"]["context"]))
        n_seq = 1
        if "invariance" in wanted:  # the largest batch: B sequences of up to T+2 tokens in one cache
            inv = S["invariance"]
            T = int(inv["tokens"]["count"])
            n_seq = max([1] + [int(b) for b in inv["batch_sizes"]])
            need = max(need, n_seq * (T + 2), T + int(inv["decode"]))
        n_ctx = args.ctx or ((need + 255) // 256) * 256
        if n_ctx < need:
            raise UsageError(f"--ctx {n_ctx} is shorter than the {need} positions the protocol needs")
    except (OSError, ValueError, KeyError, TypeError, UsageError, capture_format.CaptureError) as e:
        print(f"{TOOL}: {e}", file=sys.stderr)
        return 2

    name = args.name or f"llama.cpp:fa={args.flash_attn},kv={args.kv_type}"
    t0 = time.perf_counter()
    try:
        node = LlamaCpp(args.model, args, n_ctx, n_seq)
        try:
            log(f"{TOOL}: {doc.get('id')} v{doc.get('version')} on {args.model} ({node.desc}), llama-cpp-python "
                f"{node.version}, flash attention {args.flash_attn}, KV {args.kv_type}, {args.threads} threads, "
                f"n_ctx {n_ctx}")
            tensors = run_steps(doc, args.protocol, node, wanted, reference, log)
        finally:
            node.close()
    except UsageError as e:
        print(f"{TOOL}: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # llama.cpp itself failed
        print(f"{TOOL}: {e}", file=sys.stderr)
        return 3

    settings = {"flash_attn": args.flash_attn, "type_k": args.kv_type, "type_v": args.kv_type,
                "n_threads": args.threads, "n_gpu_layers": args.gpu_layers, "n_batch": args.batch,
                "n_ubatch": min(args.ubatch, args.batch), "n_ctx": n_ctx, "repack": not args.no_repack,
                "token_by_token": args.token_by_token}
    caps = {
        "node": name,
        "backend": "llama.cpp",
        "device": "cpu" if args.gpu_layers == 0 else f"llama.cpp GPU backend ({args.gpu_layers} layers offloaded)",
        "runtime": f"llama.cpp (llama-cpp-python {node.version})",
        "threads": int(args.threads),
        "authority": "none",
        "extra": {"llama_cpp_python": node.version, "system_info": node.system_info,
                  "settings": ", ".join(f"{k} {v}" for k, v in settings.items()), "model": node.desc,
                  "machine": f"{platform.system()} {platform.machine()}",
                  "routing": "its own router and its own greedy decoding (free-running)"},
    }
    not_captured = {s: NOT_CAPTURED[s] for s in STEPS if s in NOT_CAPTURED and s in S}
    not_captured.update({s: "not asked for (--steps)" for s in ("logits", "decide", "generate", "perplexity",
                                                                "determinism", "invariance")
                         if s in S and s not in wanted})
    meta = {
        "node": name,
        "capabilities": json.dumps(caps, ensure_ascii=False, separators=(",", ":")),
        "protocol_id": str(doc["id"]),
        "protocol_version": str(doc["version"]),
        "protocol_hash": phash,
        "seed": str(doc["seed"]),
        "model_fingerprint": fingerprint,
        "tool": json.dumps({"name": TOOL, "version": f"llama-cpp-python {node.version}", "git": "n/a"},
                           separators=(",", ":")),
        "steps": json.dumps([s for s in STEPS if s in wanted], separators=(",", ":")),
        "errors": "{}",
        "not_captured": json.dumps(not_captured, ensure_ascii=False, separators=(",", ":")),
        "llama_cpp_settings": json.dumps(settings, separators=(",", ":")),
    }
    h = capture_format.write_capture(args.output, meta, tensors, writer=args.writer)
    log(f"{TOOL}: wrote {args.output} (node {name}, {len(tensors)} tensors, {h[:19]}…) in "
        f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
