#!/usr/bin/env python3
"""An external node: protocol step 1 ("ops") computed with PyTorch on the CPU,
written as a kvasir-equiv capture (protocols/CAPTURE.md).

  scripts/torch_node.py --protocol protocols/ci.json -o torch.safetensors

The seeded inputs, the reference's routing plan of the MoE block and the
capture writer are numpy_node.py's (scripts/kvasir_rng.py draws the inputs bit
for bit as kvasir does); every op itself runs in torch as a PyTorch user writes
it: torch.matmul, torch.softmax, torch.sigmoid, F.silu, the Hugging Face
RMSNorm and rotary recipes, torch.topk routing with DeepSeek-V3's grouped
selection, the HF expert loop with index_add_, and Gated DeltaNet as
transformers' Qwen3.5 torch fallbacks compute it (a depthwise F.conv1d over the
conv state and the input, the recurrent gated delta rule token by token).

Needs numpy and torch (a CPU build is enough); safetensors is optional.
"""

import platform
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy_node  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch_node.py: PyTorch is not installed (pip install torch; a CPU build is enough)", file=sys.stderr)
    sys.exit(2)


def torch_blas():
    try:
        cfg = torch.__config__.show()
        m = re.search(r"BLAS_INFO=([^,\s]+)", cfg)
        blas = m.group(1) if m else "?"
        return f"BLAS {blas}, oneDNN {'on' if torch.backends.mkldnn.is_available() else 'off'}"
    except Exception:
        return "BLAS unknown"


class TorchOps:
    backend = "torch"

    def __init__(self, dtype):
        self.dt = {"float32": torch.float32, "float64": torch.float64}[str(np.dtype(dtype))]
        torch.use_deterministic_algorithms(True)

    def runtime(self):
        return f"torch {torch.__version__} / python {platform.python_version()} / {torch_blas()}"

    def threads(self):
        return torch.get_num_threads()

    def fma(self):
        # ATen's vectorised CPU kernels and the BLAS use FMA where the CPU has it.
        return numpy_node.cpu_has_fma()

    def tensor(self, a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.dt)

    def numpy(self, t):
        return t.detach().cpu().numpy()

    def matmul(self, x, w):
        return torch.matmul(x, w.T)

    def swiglu(self, gate, up):
        return F.silu(gate) * up

    def softmax(self, x):
        return torch.softmax(x, dim=-1)

    def sigmoid(self, x):
        return torch.sigmoid(x)

    def rmsnorm(self, x, w, eps):
        # transformers' LlamaRMSNorm / Qwen3MoeRMSNorm
        variance = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(variance + eps))

    def rope(self, x, positions, theta, layout, inv_freq=None):
        T, nh, d = x.shape
        if inv_freq is None:  # transformers' default rope init: inv_freq in f32 from int64 arange
            inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(self.dt) / d))
        else:  # a frequency table (rope_yarn: computed in f64), rounded to the working dtype
            inv_freq = torch.from_numpy(np.asarray(inv_freq, dtype=np.float64)).to(self.dt)
        freqs = torch.from_numpy(positions).to(self.dt)[:, None] * inv_freq[None, :]  # [T, d/2]
        if layout == "neox":
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
            x1, x2 = x[..., : d // 2], x[..., d // 2:]
            rotated = torch.cat((-x2, x1), dim=-1)  # rotate_half
            return x * cos + rotated * sin
        # GPT-J / interleaved pairs (2i, 2i+1)
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).reshape(T, nh, d)

    def router(self, logits, k, scoring, bias=None, n_group=1, topk_group=1):
        if scoring == "softmax":
            scores = torch.softmax(logits, dim=-1)
            return scores, torch.topk(scores, k, dim=-1).indices.to(torch.int32)
        # DeepSeek-V3 MoEGate (noaux_tc): sigmoid, +bias for the choice, grouped top-k.
        scores = torch.sigmoid(logits)
        T, E = scores.shape
        choice = scores + bias[None, :]
        if n_group > 1:
            group_scores = choice.view(T, n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
            group_idx = torch.topk(group_scores, k=topk_group, dim=-1)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            score_mask = group_mask.unsqueeze(-1).expand(T, n_group, E // n_group).reshape(T, -1)
            choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
        return scores, torch.topk(choice, k, dim=-1).indices.to(torch.int32)

    def moe_block(self, x, experts, ids, weights, expert_filter=None):
        # The transformers expert loop: gather the expert's tokens, run it,
        # scale by the routing weight, index_add_ into the output.
        ids_t = torch.from_numpy(np.ascontiguousarray(ids)).long()
        w_t = torch.from_numpy(np.ascontiguousarray(weights)).to(self.dt)
        out = torch.zeros_like(x)
        for e, (g, u, d) in enumerate(experts):
            if expert_filter is not None and not expert_filter[e]:
                continue
            tok, slot = torch.where(ids_t == e)
            if tok.numel() == 0:
                continue
            cur = x[tok]
            y = torch.matmul(F.silu(torch.matmul(cur, g.T)) * torch.matmul(cur, u.T), d.T)
            out.index_add_(0, tok, y * w_t[tok, slot, None])
        return out

    def add(self, a, b):
        return a + b

    def clamped_swiglu(self, gate, up, alpha, limit):
        # transformers' GptOssExperts._apply_gate on de-interleaved gate / up.
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))

    def attention(self, q, keys, values, scale, window=0, sinks=None):
        # transformers' eager_attention_forward (repeat_kv, the additive mask of masking_utils: 0 visible,
        # finfo.min masked) and, with sinks, gpt-oss's: the sink column, max-subtracted softmax, column dropped.
        T, nh, D = q.shape
        S = keys[0].shape[0]
        rep = nh // len(keys)
        k = torch.stack(keys).repeat_interleave(rep, dim=0)  # [nh, S, D]
        v = torch.stack(values).repeat_interleave(rep, dim=0)
        w = torch.matmul(q.transpose(0, 1), k.transpose(1, 2)) * scale  # [nh, T, S]
        p = torch.arange(S - T, S)[:, None]
        j = torch.arange(S)[None, :]
        visible = (j <= p) & ((j > p - window) if window > 0 else torch.ones_like(j, dtype=torch.bool))
        # (the two values as tensors of the working dtype: python scalars make a float32 tensor,
        # which float64's finfo.min overflows)
        w = w + torch.where(visible, torch.tensor(0.0, dtype=self.dt), torch.tensor(torch.finfo(self.dt).min, dtype=self.dt))
        if sinks is not None:
            c = torch.cat([w, sinks.reshape(-1, 1, 1).expand(-1, T, 1)], dim=-1)
            c = c - c.max(dim=-1, keepdim=True).values
            probs = torch.softmax(c, dim=-1)[..., :-1]
        else:
            probs = torch.softmax(w, dim=-1)
        return torch.matmul(probs, v).transpose(0, 1).reshape(T, nh * D)

    def causal_conv1d_silu(self, x, w, history):
        # transformers' torch_causal_conv1d_update: the conv state (history)
        # and the new tokens, channels first, one group per channel.
        T, C = x.shape
        seq = torch.cat((history, x), dim=0).T.unsqueeze(0)  # [1, C, K-1+T]
        y = F.conv1d(seq, w.unsqueeze(1), groups=C)  # [1, C, T]
        return F.silu(y[0, :, -T:]).T

    def gated_delta(self, q, k, v, a, b, a_log, dt_bias, state):
        # Qwen3_5MoeGatedDeltaNet.forward's g and beta, then
        # torch_recurrent_gated_delta_rule(use_qk_l2norm_in_kernel=True).
        T, nk, dk = q.shape
        rep = v.shape[1] // nk

        def l2norm(x, eps=1e-6):
            return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)

        q = l2norm(q).repeat_interleave(rep, dim=1) * (1.0 / dk ** 0.5)  # [T, nv, dk]
        k = l2norm(k).repeat_interleave(rep, dim=1)
        g = -a_log.exp() * F.softplus(a + dt_bias)  # [T, nv]
        beta = b.sigmoid()
        s = state.clone()  # [nv, dk, dv]
        out = torch.empty_like(v)
        for t in range(T):
            s = s * g[t].exp()[:, None, None]
            kv_mem = (s * k[t].unsqueeze(-1)).sum(dim=-2)
            delta = (v[t] - kv_mem) * beta[t].unsqueeze(-1)
            s = s + k[t].unsqueeze(-1) * delta.unsqueeze(-2)
            out[t] = (s * q[t].unsqueeze(-1)).sum(dim=-2)
        return out


def main(argv=None):
    with torch.inference_mode():
        return numpy_node.node_main(sys.argv[1:] if argv is None else argv, TorchOps, "torch", "scripts/torch_node.py")


if __name__ == "__main__":
    sys.exit(main())
