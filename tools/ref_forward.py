#!/usr/bin/env python3
"""ref_forward.py: an independent numpy (float64) forward pass of an exported
Qwen3 + MTP checkpoint, for golden logits and for checking `run`.

It reads config.json and model.safetensors directly (its own safetensors and bf16
reader; nothing shared with tools/train.py) and follows shared/specs/qwen3.md:
RMSNorm y = w * x / sqrt(mean(x^2) + eps); per-head q/k RMSNorm before NeoX RoPE;
GQA; SwiGLU; final norm; tied or untied lm_head. MTP (mtp.*, Qwen3.5/Next layout,
plain-weight norms as this repo's model is trained): row p consumes h_p (main hidden
AFTER model.norm at position p) and t_{p+1}:
    u = fc(concat(RMSNorm(E[t_{p+1}]; pre_fc_norm_embedding), RMSNorm(h_p; pre_fc_norm_hidden)))
    u = decoder layer mtp.layers.0 at RoPE position p, causal over the MTP rows
    mtp_logits[p] = lm_head(RMSNorm(u; mtp.norm))          predicts t_{p+2}
so for n tokens there are n-1 MTP rows.

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


def load_safetensors(model_dir):
    """All tensors of the directory (one file or an index), as float64 arrays."""
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
            if name == "__metadata__":
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


class Ref:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.V, self.H = c["vocab_size"], c["hidden_size"]
        self.nl, self.nh = c["num_hidden_layers"], c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads", self.nh)
        self.hd = c.get("head_dim", self.H // self.nh)
        self.eps = c.get("rms_norm_eps", 1e-6)
        theta = c.get("rope_theta") or c["rope_parameters"]["rope_theta"]
        if c.get("rope_scaling") not in (None, {}):
            sys.exit("ref_forward: rope scaling not supported")
        self.inv_freq = theta ** (-2.0 * np.arange(self.hd // 2) / self.hd)
        self.w = load_safetensors(model_dir)
        self.E = self.w["model.embed_tokens.weight"]
        self.lm = self.E if c.get("tie_word_embeddings") else self.w["lm_head.weight"]
        self.has_mtp = "mtp.fc.weight" in self.w

    def norm(self, x, w):
        return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps))

    def rope(self, x, pos):
        """x [T, heads, hd], NeoX rotate_half at positions pos [T]."""
        ang = pos[:, None] * self.inv_freq[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        h = self.hd // 2
        x1, x2 = x[..., :h], x[..., h:]
        return np.concatenate((x1 * c - x2 * s, x2 * c + x1 * s), axis=-1)

    def layer(self, x, p):
        """One decoder layer (prefix p) on x [T, H] at positions 0..T-1, causal."""
        w, T, hd = self.w, x.shape[0], self.hd
        h = self.norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, self.nh, hd)
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
        x = x + att.reshape(T, self.nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = self.norm(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        return x + ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T

    def forward(self, ids):
        """ids [n] at positions 0..n-1 -> (logits [n, V], mtp_logits [n-1, V] or None)."""
        ids = np.asarray(ids)
        x = self.E[ids]
        for l in range(self.nl):
            x = self.layer(x, f"model.layers.{l}.")
        h = self.norm(x, self.w["model.norm.weight"])
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
