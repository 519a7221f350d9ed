#!/usr/bin/env python3
"""ref_forward.py: an independent numpy (float64) forward pass of an exported
Qwen3 + MTP or Qwen3.5 (hybrid Gated DeltaNet) + MTP checkpoint, for golden logits
and for checking `run`.

It reads config.json and the safetensors file(s) directly (its own safetensors and
bf16 reader; nothing shared with tools/train*.py or the C engine).

Qwen3 (shared/specs/qwen3.md): RMSNorm y = w * x / sqrt(mean(x^2) + eps); per-head q/k
RMSNorm before NeoX RoPE; GQA; SwiGLU; final norm; tied or untied lm_head. MTP (mtp.*,
Qwen3.5/Next layout, plain-weight norms as this repo's model is trained): row p consumes
h_p (main hidden AFTER model.norm at position p) and t_{p+1}:
    u = fc(concat(RMSNorm(E[t_{p+1}]; pre_fc_norm_embedding), RMSNorm(h_p; pre_fc_norm_hidden)))
    u = decoder layer mtp.layers.0 at RoPE position p, causal over the MTP rows
    mtp_logits[p] = lm_head(RMSNorm(u; mtp.norm))          predicts t_{p+2}
so for n tokens there are n-1 MTP rows.

Qwen3.5 (shared/specs/qwen35.md; model_type qwen3_5 with a nested text_config and
tensor prefix model.language_model., or flat qwen3_5_text with prefix model.):
  * every RMSNorm is zero-centred, y = x^ * (1 + w) (folded into the weights at load),
    except linear_attn.norm, which is a plain w;
  * layer_types[i] picks the token mixer, then the usual SwiGLU MLP follows;
  * full_attention: q_proj gives per head [q (hd) | gate (hd)]; q/k norm; partial NeoX
    RoPE on the first rd = hd * partial_rotary_factor dims (pairs i, i + rd/2);
    causal GQA softmax; o = attn * sigmoid(gate), then o_proj;
  * linear_attention (Gated DeltaNet, Hk key heads, Hv value heads, r = Hv/Hk):
        m = W_qkv x; z = W_z x; b = W_b x; a = W_a x
        c_t = silu(sum_j conv[:, j] * m_{t-K+1+j})          causal depthwise conv, zeros before t=0
        q, k, v = split(c) -> [Hk, dk], [Hk, dk], [Hv, dv]
        q <- q / sqrt(sum q^2 + 1e-6) * dk^-0.5;  k <- k / sqrt(sum k^2 + 1e-6)
        beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias); alpha = exp(g)
        value head j uses q/k head j // r; per head, token by token (S is dk x dv, 0 at t=0):
            S <- alpha S;  u = S^T k;  delta = beta (v - u);  S <- S + k delta^T;  o = S^T q
        y_j = w * o_j / sqrt(mean(o_j^2) + eps) * silu(z_j);  out_proj(y)
  * MTP: as above with zero-centred norms and the gated full-attention layer mtp.layers.0.

Usage (repo root, /usr/bin/python3 with numpy):
  # golden files: logits.f32 [n, V] and mtp_logits.f32 [n-1, V], float32 little-endian
  tools/ref_forward.py MODEL_DIR --tokens T.txt --out DIR
  # compare with run's logits (./run MODEL_DIR -m logits -f F -o run.f32 -kv f32)
  tools/ref_forward.py MODEL_DIR --tokens T.txt --compare run.f32
  # held-out perplexity and MTP top-1 accuracy over run.c's ppl windows
  tools/ref_forward.py MODEL_DIR --ppl IDS.txt --ctx 512
T.txt / IDS.txt: token ids separated by white space (./run DIR -m tokenize -f FILE).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np


def load_safetensors(model_dir, skip=("model.visual.",)):
    """All tensors of the directory (one file or an index), as float64 arrays.
    Tensors whose name starts with one of `skip` (the vision tower) are not read."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        with open(os.path.join(model_dir, fn), "rb") as f:
            buf = f.read()
        n = struct.unpack_from("<Q", buf, 0)[0]
        header = json.loads(buf[8: 8 + n])
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__" or name.startswith(skip):
                continue
            b, e = info["data_offsets"]
            raw = buf[base + b: base + e]
            if info["dtype"] == "BF16":
                a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view("<f4")
            elif info["dtype"] == "F16":
                a = np.frombuffer(raw, dtype="<f2")
            elif info["dtype"] == "F32":
                a = np.frombuffer(raw, dtype="<f4")
            else:
                sys.exit(f"{fn}: {name}: dtype {info['dtype']} not supported")
            out[name] = a.astype(np.float64).reshape(info["shape"])
    return out


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    """torch.nn.functional.softplus (beta 1, threshold 20): x itself above 20."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


class Ref:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            top = json.load(f)
        c = top.get("text_config") or top  # Qwen3.5 multimodal saves nest the text keys
        mt = c.get("model_type", top.get("model_type", ""))
        self.qwen35 = mt.startswith("qwen3_5") or "linear_attention" in (c.get("layer_types") or [])
        self.V, self.H = c["vocab_size"], c["hidden_size"]
        self.nl, self.nh = c["num_hidden_layers"], c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads", self.nh)
        self.hd = c.get("head_dim", self.H // self.nh)
        self.eps = c.get("rms_norm_eps", 1e-6)
        rp = c.get("rope_parameters") or {}
        theta = c.get("rope_theta") or rp["rope_theta"]
        if self.qwen35:
            if c.get("num_experts") or mt.endswith("moe"):
                sys.exit("ref_forward: Qwen3.5 MoE not supported")
            if c.get("mtp_use_dedicated_embeddings"):
                sys.exit("ref_forward: mtp_use_dedicated_embeddings not supported")
            rs = c.get("rope_scaling") or {}
            if rs.get("rope_type", rs.get("type", "default")) not in ("default", "mrope"):
                sys.exit("ref_forward: rope scaling not supported")
            # text only: mRoPE's three position streams are equal, i.e. plain 1-D RoPE
            prf = rp.get("partial_rotary_factor",
                         c.get("partial_rotary_factor", rs.get("partial_rotary_factor", 0.25)))
            self.rd = int(self.hd * prf)
            self.kinds = c.get("layer_types") or [
                "full_attention" if (i + 1) % c.get("full_attention_interval", 4) == 0
                else "linear_attention" for i in range(self.nl)]
            self.Hk, self.Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            self.dk, self.dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
            self.K = c["linear_conv_kernel_dim"]
            if self.Hv % self.Hk:
                sys.exit("ref_forward: linear_num_value_heads must be a multiple of linear_num_key_heads")
            self.gated = c.get("attn_output_gate", True)
        else:
            if c.get("rope_scaling") not in (None, {}):
                sys.exit("ref_forward: rope scaling not supported")
            self.rd = self.hd
            self.kinds = ["full_attention"] * self.nl
            self.gated = False
        self.inv_freq = theta ** (-2.0 * np.arange(self.rd // 2) / self.rd)
        self.w = load_safetensors(model_dir)
        self.P = next((p for p in ("model.language_model.", "model.")
                       if p + "embed_tokens.weight" in self.w), None)
        if self.P is None:
            sys.exit("ref_forward: no embed_tokens.weight under model.language_model. or model.")
        if self.qwen35:  # zero-centred norms: fold 1 + w (linear_attn.norm stays plain w)
            for name in self.w:  # *layernorm, q/k_norm, norm, mtp.pre_fc_norm_{embedding,hidden}
                if ("norm" in name.split(".")[-2] and name.endswith(".weight")
                        and not name.endswith("linear_attn.norm.weight")):
                    self.w[name] = 1.0 + self.w[name]
        self.E = self.w[self.P + "embed_tokens.weight"]
        tie = c.get("tie_word_embeddings", top.get("tie_word_embeddings"))
        self.lm = self.E if tie else self.w["lm_head.weight"]
        self.has_mtp = "mtp.fc.weight" in self.w

    def norm(self, x, w):
        return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps))

    def rope(self, x, pos):
        """x [T, heads, hd], NeoX rotate_half over the first rd dims at positions pos [T]."""
        ang = pos[:, None] * self.inv_freq[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        h = self.rd // 2
        x1, x2 = x[..., :h], x[..., h:self.rd]
        return np.concatenate((x1 * c - x2 * s, x2 * c + x1 * s, x[..., self.rd:]), axis=-1)

    def attention(self, h, p):
        """Causal (gated for Qwen3.5) GQA self-attention of normed h [T, H], prefix p."""
        w, T, hd = self.w, h.shape[0], self.hd
        q = h @ w[p + "self_attn.q_proj.weight"].T
        if self.gated:  # per head [q | gate]
            q = q.reshape(T, self.nh, 2 * hd)
            q, gate = q[..., :hd], q[..., hd:].reshape(T, self.nh * hd)
        else:
            q = q.reshape(T, self.nh, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, self.nkv, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, self.nkv, hd)
        q = self.norm(q, w[p + "self_attn.q_norm.weight"])
        k = self.norm(k, w[p + "self_attn.k_norm.weight"])
        pos = np.arange(T, dtype=np.float64)
        q, k = self.rope(q, pos), self.rope(k, pos)
        grp = self.nh // self.nkv
        mask = np.triu(np.ones((T, T), dtype=bool), 1)
        att = np.empty((T, self.nh, hd))
        for j in range(self.nh):
            s = q[:, j, :] @ k[:, j // grp, :].T / math.sqrt(hd)
            s[mask] = -np.inf
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            att[:, j, :] = s @ v[:, j // grp, :]
        o = att.reshape(T, self.nh * hd)
        if self.gated:
            o = o * sigmoid(gate)
        return o @ w[p + "self_attn.o_proj.weight"].T

    def gated_deltanet(self, h, p):
        """Gated DeltaNet token mixer of normed h [T, H], prefix p; token-by-token recurrence
        from a zero conv state and a zero S."""
        w, T = self.w, h.shape[0]
        Hk, Hv, dk, dv, K = self.Hk, self.Hv, self.dk, self.dv, self.K
        la = p + "linear_attn."
        m = h @ w[la + "in_proj_qkv.weight"].T                       # [T, conv_dim]
        z = (h @ w[la + "in_proj_z.weight"].T).reshape(T, Hv, dv)
        b = h @ w[la + "in_proj_b.weight"].T                         # [T, Hv]
        a = h @ w[la + "in_proj_a.weight"].T
        cw = w[la + "conv1d.weight"].reshape(m.shape[1], K)          # [C, 1, K] or [C, K, 1]
        mp = np.concatenate((np.zeros((K - 1, m.shape[1])), m))     # K-1 zero rows before t=0
        c = silu(sum(mp[j: j + T] * cw[:, j] for j in range(K)))     # tap K-1 = current token
        nk = Hk * dk
        q = c[:, :nk].reshape(T, Hk, dk)
        k = c[:, nk: 2 * nk].reshape(T, Hk, dk)
        v = c[:, 2 * nk:].reshape(T, Hv, dv)
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6) * dk ** -0.5
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
        r = Hv // Hk  # value head j reads key head j // r
        q, k = np.repeat(q, r, axis=1), np.repeat(k, r, axis=1)    # [T, Hv, dk]
        beta = sigmoid(b)
        alpha = np.exp(-np.exp(w[la + "A_log"]) * softplus(a + w[la + "dt_bias"]))
        S = np.zeros((Hv, dk, dv))
        o = np.empty((T, Hv, dv))
        for t in range(T):
            S *= alpha[t][:, None, None]
            kt = k[t][:, None, :]                                     # [Hv, 1, dk]
            u = (kt @ S)[:, 0, :]                                     # S^T k   [Hv, dv]
            delta = beta[t][:, None] * (v[t] - u)
            S += k[t][:, :, None] * delta[:, None, :]                 # k delta^T
            o[t] = (q[t][:, None, :] @ S)[:, 0, :]                    # S^T q
        y = self.norm(o, w[la + "norm.weight"]) * silu(z)             # gated RMSNorm per value head
        return y.reshape(T, Hv * dv) @ w[la + "out_proj.weight"].T

    def layer(self, x, p, kind="full_attention"):
        """One decoder layer (prefix p) on x [T, H] at positions 0..T-1, causal."""
        w = self.w
        h = self.norm(x, w[p + "input_layernorm.weight"])
        x = x + (self.gated_deltanet(h, p) if kind == "linear_attention" else self.attention(h, p))
        h = self.norm(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        return x + ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T

    def forward(self, ids):
        """ids [n] at positions 0..n-1 -> (logits [n, V], mtp_logits [n-1, V] or None)."""
        ids = np.asarray(ids)
        x = self.E[ids]
        for l in range(self.nl):
            x = self.layer(x, f"{self.P}layers.{l}.", self.kinds[l])
        h = self.norm(x, self.w[self.P + "norm.weight"])
        logits = h @ self.lm.T
        if not self.has_mtp or len(ids) < 2:
            return logits, None
        w = self.w
        e = self.norm(self.E[ids[1:]], w["mtp.pre_fc_norm_embedding.weight"])
        hh = self.norm(h[:-1], w["mtp.pre_fc_norm_hidden.weight"])
        u = np.concatenate((e, hh), axis=1) @ w["mtp.fc.weight"].T  # embedding half first
        u = self.layer(u, "mtp.layers.0.")
        return logits, self.norm(u, w["mtp.norm.weight"]) @ self.lm.T


def read_ids(path):
    with open(path) as f:
        return [int(t) for t in f.read().split()]


def main():
    ap = argparse.ArgumentParser(description="numpy float64 reference forward (main + MTP logits)")
    ap.add_argument("model_dir")
    ap.add_argument("--tokens", help="token ids file for --out / --compare")
    ap.add_argument("--out", help="directory to write logits.f32 and mtp_logits.f32 into")
    ap.add_argument("--compare", help="run's logits.f32 [n, V] to compare the main logits with")
    ap.add_argument("--compare-mtp", help="an mtp_logits.f32 [n-1, V] to compare the MTP logits with")
    ap.add_argument("--ppl", metavar="IDS", help="perplexity + MTP accuracy over run's ppl windows")
    ap.add_argument("--ctx", type=int, default=512)
    args = ap.parse_args()
    ref = Ref(args.model_dir)
    if args.tokens:
        ids = read_ids(args.tokens)
        logits, mtp = ref.forward(ids)
        print(f"{len(ids)} tokens: logits [{logits.shape[0]}, {logits.shape[1]}], "
              f"|logits| max {np.abs(logits).max():.3f}; mtp {'none' if mtp is None else list(mtp.shape)}")
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            logits.astype("<f4").tofile(os.path.join(args.out, "logits.f32"))
            if mtp is not None:
                mtp.astype("<f4").tofile(os.path.join(args.out, "mtp_logits.f32"))
            print(f"wrote {args.out}/logits.f32" + ("" if mtp is None else " and mtp_logits.f32"))
        for path, want, name in ((args.compare, logits, "main"), (args.compare_mtp, mtp, "mtp")):
            if not path:
                continue
            got = np.fromfile(path, dtype="<f4").astype(np.float64)
            if got.size != want.size:
                sys.exit(f"{path}: {got.size} floats, expected {want.size}")
            d = np.abs(got.reshape(want.shape) - want)
            pos = np.unravel_index(d.argmax(), d.shape)[0]
            agree = (got.reshape(want.shape).argmax(1) == want.argmax(1)).mean()
            print(f"{name}: max-abs {d.max():.3e} at position {pos}, mean-abs {d.mean():.3e}, argmax agree {agree:.4f}")
    if args.ppl:
        ids = np.array(read_ids(args.ppl))
        nll, count, mhit, mn, hit = 0.0, 0, 0, 0, 0
        for start in range(0, len(ids) - 1, args.ctx):
            win = ids[start: start + args.ctx]
            logits, mtp = ref.forward(win)
            lg = logits[:-1]
            mx = lg.max(axis=1, keepdims=True)
            lse = np.log(np.exp(lg - mx).sum(axis=1)) + mx[:, 0]
            nll += float((lse - lg[np.arange(len(win) - 1), win[1:]]).sum())
            count += len(win) - 1
            hit += int((lg.argmax(1) == win[1:]).sum())
            if mtp is not None and len(win) >= 3:
                mhit += int((mtp[:-1].argmax(1) == win[2:]).sum())
                mn += len(win) - 2
        print(f"ppl {math.exp(nll / count):.4f} tokens {count} (loss {nll / count:.4f}, top1 {hit / count:.4f})"
              + (f"; mtp top1 {mhit / mn:.4f} over {mn} rows" if mn else ""))


if __name__ == "__main__":
    main()
