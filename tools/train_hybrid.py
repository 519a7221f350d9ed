#!/usr/bin/env python3
"""train_hybrid.py: trains the shipped hybrid model, a small Qwen3.5 (Gated DeltaNet + gated
attention) with its MTP module, on the King James Bible, and exports it as a text-only
Hugging Face snapshot that `run` loads unchanged (models/qwen35-kjv-mtp).

Run from the repo root with Debian's PyTorch (CPU), after tools/prepare_data.py:
    make train-hybrid                                   # = prepare_data.py, then this script, seed 1234
    /usr/bin/python3 tools/train_hybrid.py --steps 20 --export /tmp/smoke   # a quick smoke run
    /usr/bin/python3 tools/train_hybrid.py --eval models/qwen35-kjv-mtp     # held-out ppl + MTP accuracy

The data, batches, schedule, optimiser, bf16 autocast, checkpointing, training loop, options and
evaluation windows are tools/train.py's (imported from it); what differs is the architecture,
shared/specs/qwen35.md:
  layers [GDN, GDN, full, GDN, GDN, full]; every norm zero-centred, y = x^ * (1 + w), except the
  GDN output norm (plain w); every layer ends with the SwiGLU MLP.
  full (gated attention): q_proj emits per head [q | gate]; q/k norms; partial NeoX RoPE on the
    first head_dim * 0.25 dims; causal softmax attention (GQA); o * sigmoid(gate) before o_proj.
  GDN: m = W_qkv x -> causal depthwise conv (width 4, tap 3 = current token) -> SiLU -> q, k, v;
    q, k L2-normed (sum + 1e-6), q * dk^-1/2; beta = sigmoid(W_b x); g = -exp(A_log) *
    softplus(W_a x + dt_bias); value head j reads key head j // (Hv/Hk); the gated delta rule
    S <- e^g S; S <- S + k (beta (v - S^T k))^T; o = S^T q; y = RMSNorm(o; w) * silu(W_z x); out_proj.
  MTP: as tools/train.py's (row p: h_p after the final norm with t_{p+1} at RoPE position p,
    predicting t_{p+2}), with zero-centred norms and a gated full-attention layer.
Training computes the delta rule in its chunked form (chunks of 64, exact up to rounding: the
WY/UT form of shared/specs/qwen35.md), which costs a few batched matmuls per chunk instead of a
Python step per token; `run` computes the same function with the token-by-token recurrence.

Recipe of the shipped model (the defaults): hidden 256; GDN layers Hk 2 / Hv 4 heads x 64
(conv_dim 512); full layers 2 q / 1 kv heads x 256, rotary dim 64, theta 1e4; ffn 768; vocab 4160,
tied; context 512; the MTP layer; 640 steps x 4 windows x 512 tokens, AdamW (0.9, 0.95), lr 2e-3,
30 warmup steps, cosine to 2e-4, weight decay 0.1 on matrices, clip 1.0, seed 1234.
It writes build/kjv/ckpt-hybrid.pt every 20 steps and resumes from it unless --fresh.

Export: model.safetensors (BF16, but linear_attn.A_log and linear_attn.norm.weight in F32 as in the
published Qwen3.5 files), config.json in the text-only form (Qwen3_5ForCausalLM, model_type
qwen3_5_text, flat keys, tensors under model.), generation_config.json, and the reduced Qwen3
tokenizer of tests/data/fixtures/tiny.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train as base  # noqa: E402  (sets OMP_WAIT_POLICY before torch loads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

LIN, FULL = "linear_attention", "full_attention"
ARCH = dict(
    vocab_size=4160,
    hidden_size=256,
    num_hidden_layers=6,
    layer_types=[LIN, LIN, FULL, LIN, LIN, FULL],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=256,
    partial_rotary_factor=0.25,
    intermediate_size=768,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
)
CHUNK = 64
F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")


class ZCNorm(nn.Module):
    """Zero-centred RMSNorm: y = x^ * (1 + w), w stored (and initialised) near 0."""

    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        x = x.float()
        return (1.0 + self.weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def partial_rope(x, cos, sin):
    """NeoX RoPE on the first 2 * cos.shape[-1] dims of x [B, heads, T, hd]; the rest unchanged."""
    rd = 2 * cos.shape[-1]
    return torch.cat((base.rope(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, a):
        super().__init__()
        H, hd = a["hidden_size"], a["head_dim"]
        self.nh, self.nkv, self.hd = a["num_attention_heads"], a["num_key_value_heads"], hd
        self.q_proj = nn.Linear(H, 2 * self.nh * hd, bias=False)  # per head [q | gate]
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.q_norm = ZCNorm(hd, a["rms_norm_eps"])
        self.k_norm = ZCNorm(hd, a["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        qg = self.q_proj(x).view(B, T, self.nh, 2 * self.hd)
        q = self.q_norm(qg[..., : self.hd]).transpose(1, 2)
        gate = qg[..., self.hd:].reshape(B, T, self.nh * self.hd)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = partial_rope(q, cos, sin), partial_rope(k, cos, sin)
        grp = self.nh // self.nkv
        k = k.repeat_interleave(grp, dim=1)
        v = v.repeat_interleave(grp, dim=1)
        s = torch.baddbmm(mask, q.reshape(B * self.nh, T, self.hd), k.reshape(B * self.nh, T, self.hd).transpose(1, 2),
                          alpha=1.0 / math.sqrt(self.hd))
        o = torch.softmax(s.float(), dim=-1).view(B, self.nh, T, T) @ v.float()
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd) * torch.sigmoid(gate.float())
        return self.o_proj(o)


def delta_rule_chunked(q, k, v, g, beta, C=CHUNK):
    """Gated delta rule over a whole sequence from a zero state, in chunks of C.
    q, k [B, Hv, T, dk], v [B, Hv, T, dv], g (log decay <= 0) and beta [B, Hv, T], all f32.
    Returns o [B, Hv, T, dv] with o_t = S_t^T q_t of the recurrence
    S_t = e^{g_t} S_{t-1} + k_t (beta_t (v_t - e^{g_t} S_{t-1}^T k_t))^T, S_0 = 0."""
    B, Hv, T, dk = k.shape
    pad = (-T) % C  # zero steps (g = beta = 0, k = 0) leave S unchanged
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    N = (T + pad) // C
    q, k, v = (t.reshape(B, Hv, N, C, -1) for t in (q, k, v))
    g, beta = g.reshape(B, Hv, N, C), beta.reshape(B, Hv, N, C)
    gam = g.cumsum(-1)  # gamma_i = sum of g up to row i within the chunk
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    # Gamma_ij = e^{gamma_i - gamma_j} for i >= j, else 0 (masked before exp: no overflow)
    Gam = torch.exp((gam[..., :, None] - gam[..., None, :]).masked_fill(~lower, float("-inf")))
    kb = k * beta[..., None]
    A = torch.eye(C) + ((kb @ k.transpose(-1, -2)) * Gam).tril(-1)  # unit lower triangular
    U = torch.linalg.solve_triangular(A, v * beta[..., None], upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(A, kb * gam.exp()[..., None], upper=False, unitriangular=True)
    P = (q @ k.transpose(-1, -2)) * Gam  # causal scores within the chunk, decayed
    S = q.new_zeros(B, Hv, dk, v.shape[-1])
    outs = []
    for n in range(N):
        vn = U[:, :, n] - W[:, :, n] @ S  # the chunk's delta vectors given the incoming state
        outs.append((q[:, :, n] * gam[:, :, n, :, None].exp()) @ S + P[:, :, n] @ vn)
        last = gam[:, :, n, -1]
        S = S * last.exp()[..., None, None] + \
            (k[:, :, n] * (last[..., None] - gam[:, :, n]).exp()[..., None]).transpose(-1, -2) @ vn
    return torch.stack(outs, 2).reshape(B, Hv, N * C, -1)[:, :, :T]


class GatedDeltaNet(nn.Module):
    def __init__(self, a):
        super().__init__()
        H = a["hidden_size"]
        self.hk, self.hv = a["linear_num_key_heads"], a["linear_num_value_heads"]
        self.dk, self.dv, self.K = a["linear_key_head_dim"], a["linear_value_head_dim"], a["linear_conv_kernel_dim"]
        self.conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        self.eps = a["rms_norm_eps"]
        self.in_proj_qkv = nn.Linear(H, self.conv_dim, bias=False)  # rows q | k | v
        self.in_proj_z = nn.Linear(H, self.hv * self.dv, bias=False)
        self.in_proj_b = nn.Linear(H, self.hv, bias=False)
        self.in_proj_a = nn.Linear(H, self.hv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.K, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(self.dv))  # plain weight, not zero-centred
        self.out_proj = nn.Linear(self.hv * self.dv, H, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        m, z = self.in_proj_qkv(x), self.in_proj_z(x)
        b, a = self.in_proj_b(x), self.in_proj_a(x)
        with torch.autocast("cpu", enabled=False):  # conv, norms and the recurrence in f32
            y = self.mix(m.float().transpose(1, 2), z.float(), b.float(), a.float())
        return self.out_proj(y)

    def mix(self, m, z, b, a):
        """m [B, conv_dim, T] (pre-conv), z [B, T, Hv*dv], b, a [B, T, Hv] -> [B, T, Hv*dv]."""
        B, T = z.shape[0], z.shape[1]
        c = F.silu(F.conv1d(F.pad(m, (self.K - 1, 0)), self.conv1d.weight.float(), groups=self.conv_dim))
        c = c.transpose(1, 2)
        nq = self.hk * self.dk
        q = c[..., :nq].reshape(B, T, self.hk, self.dk)
        k = c[..., nq: 2 * nq].reshape(B, T, self.hk, self.dk)
        v = c[..., 2 * nq:].reshape(B, T, self.hv, self.dv)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(self.dk)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        r = self.hv // self.hk  # value head j reads key head j // r
        q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
        beta = torch.sigmoid(b)
        g = -self.A_log.float().exp() * F.softplus(a + self.dt_bias.float())
        o = delta_rule_chunked(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                               g.transpose(1, 2), beta.transpose(1, 2)).transpose(1, 2)  # [B, T, Hv, dv]
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm.weight
        return (o * F.silu(z.view(B, T, self.hv, self.dv))).reshape(B, T, self.hv * self.dv)


class HybridLayer(nn.Module):
    def __init__(self, a, kind):
        super().__init__()
        self.kind = kind
        self.input_layernorm = ZCNorm(a["hidden_size"], a["rms_norm_eps"])
        if kind == FULL:
            self.self_attn = GatedAttention(a)
        else:
            self.linear_attn = GatedDeltaNet(a)
        self.post_attention_layernorm = ZCNorm(a["hidden_size"], a["rms_norm_eps"])
        self.mlp = base.MLP(a)

    def forward(self, x, cos, sin, mask):
        h = self.input_layernorm(x)
        x = x + (self.self_attn(h, cos, sin, mask) if self.kind == FULL else self.linear_attn(h))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a["vocab_size"], a["hidden_size"])
        self.layers = nn.ModuleList(HybridLayer(a, kind) for kind in a["layer_types"])
        self.norm = ZCNorm(a["hidden_size"], a["rms_norm_eps"])


class MTP(nn.Module):
    def __init__(self, a):
        super().__init__()
        H = a["hidden_size"]
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = ZCNorm(H, a["rms_norm_eps"])
        self.pre_fc_norm_hidden = ZCNorm(H, a["rms_norm_eps"])
        self.layers = nn.ModuleList([HybridLayer(a, FULL)])
        self.norm = ZCNorm(H, a["rms_norm_eps"])


class Qwen35MTP(base.Qwen3MTP):
    """The hybrid body and MTP module; forward() is tools/train.py's (it only calls layers)."""

    def __init__(self, a):
        nn.Module.__init__(self)
        self.a = a
        self.model = Body(a)
        self.mtp = MTP(a)
        rd = int(a["head_dim"] * a["partial_rotary_factor"])
        cos, sin = base.rope_tables(a["max_position_embeddings"], rd, a["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.init_weights()

    def init_weights(self):
        """Matrices N(0, 0.02), residual outputs scaled by 1/sqrt(2 * layers); zero-centred norms 0,
        the GDN norm 1; conv taps U(-1/sqrt(K), 1/sqrt(K)) (PyTorch's Conv1d default); A = e^A_log
        uniform in [1, 16] and dt = softplus(dt_bias) log-uniform in [1e-3, 0.1] (HF's initialiser)."""
        a = self.a
        std, out_std = 0.02, 0.02 / math.sqrt(2 * (a["num_hidden_layers"] + 1))
        for name, p in self.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("A_log"):
                with torch.no_grad():
                    p.copy_(torch.empty_like(p).uniform_(1, 16).log())
            elif name.endswith("dt_bias"):
                with torch.no_grad():
                    dt = torch.exp(torch.empty_like(p).uniform_(math.log(1e-3), math.log(0.1)))
                    p.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            elif name.endswith("conv1d.weight"):
                bound = 1.0 / math.sqrt(a["linear_conv_kernel_dim"])
                nn.init.uniform_(p, -bound, bound)
            elif p.dim() == 1:
                nn.init.zeros_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)


def export(model, out_dir, meta):
    os.makedirs(out_dir, exist_ok=True)
    a = model.a
    tensors = dict(model.state_dict())  # names as run reads a text-only Qwen3.5: model.*, mtp.*
    f32 = {k for k in tensors if k.endswith(F32_SUFFIXES)}
    base.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, f32=f32)
    config = {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": None,
        "eos_token_id": base.EOS_ID,
        "full_attention_interval": 3,
        "head_dim": a["head_dim"],
        "hidden_act": "silu",
        "hidden_size": a["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": a["intermediate_size"],
        "layer_types": a["layer_types"],
        "linear_conv_kernel_dim": a["linear_conv_kernel_dim"],
        "linear_key_head_dim": a["linear_key_head_dim"],
        "linear_num_key_heads": a["linear_num_key_heads"],
        "linear_num_value_heads": a["linear_num_value_heads"],
        "linear_value_head_dim": a["linear_value_head_dim"],
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": a["max_position_embeddings"],
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": a["num_attention_heads"],
        "num_hidden_layers": a["num_hidden_layers"],
        "num_key_value_heads": a["num_key_value_heads"],
        "rms_norm_eps": a["rms_norm_eps"],
        "rope_parameters": {"rope_type": "default", "rope_theta": a["rope_theta"],
                            "partial_rotary_factor": a["partial_rotary_factor"]},
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.0",
        "use_cache": True,
        "vocab_size": a["vocab_size"],
        "_comment": ("qwen35-kjv-mtp: trained by tools/train_hybrid.py on the King James Bible. Qwen3.5 "
                     "conventions throughout: zero-centred norms (y = x^ * (1 + w)) except linear_attn.norm."),
        "_training": meta,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    gen = {"do_sample": True, "eos_token_id": [base.EOS_ID, base.IM_END_ID], "pad_token_id": base.EOS_ID,
           "temperature": 0.7, "top_k": 40, "top_p": 0.9, "transformers_version": "4.57.0"}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(base.TOKDIR, fn), "rb") as src, open(os.path.join(out_dir, fn), "wb") as dst:
            dst.write(src.read())


def load_exported(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    a = {k: cfg[k] for k in ARCH if k in cfg}
    a["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    a["partial_rotary_factor"] = cfg["rope_parameters"]["partial_rotary_factor"]
    model = Qwen35MTP(a)
    w = base.read_safetensors(os.path.join(model_dir, "model.safetensors"))
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in w.items()}, strict=True)
    return model


def main():
    ap = argparse.ArgumentParser(description="train / evaluate the qwen35-kjv-mtp hybrid model")
    base.add_train_args(ap, "models/qwen35-kjv-mtp")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.eval:
        base.eval_exported(args, load_exported)
        return
    if args.seq > ARCH["max_position_embeddings"]:
        sys.exit("--seq exceeds max_position_embeddings")
    base.train(args, Qwen35MTP, ARCH, "ckpt-hybrid.pt", export)


if __name__ == "__main__":
    main()
