#!/usr/bin/env python3
"""train.py: trains the shipped default model, a small Qwen3 with one MTP
module, on the King James Bible, and exports it as a Hugging Face snapshot
that `run` loads unchanged (models/qwen3-kjv-mtp).

Run from the repo root with Debian's PyTorch (CPU):
    apt-get install -y python3-torch libopenblas0-pthread python3-numpy
    make train          # = tools/prepare_data.py, then this script with its defaults

    /usr/bin/python3 tools/train.py                     # train (resumes build/kjv/ckpt.pt if present)
    /usr/bin/python3 tools/train.py --steps 20 --export /tmp/smoke   # a quick smoke run
    /usr/bin/python3 tools/train.py --export-only       # re-export the last checkpoint
    /usr/bin/python3 tools/train.py --eval models/qwen3-kjv-mtp      # held-out ppl + MTP accuracy
                                                        # of an exported (bf16) model, run's windows

The model is exactly what run's model/model.c computes:
  x = E[t]; per layer: h = RMSNorm(x); q,k,v = Wq h, Wk h, Wv h; per-head RMSNorm of q and
  k (one [head_dim] weight) BEFORE NeoX RoPE (rotate_half, theta from config); GQA (query head
  j uses kv head j // (nH/nKV)); causal softmax(q.k/sqrt(hd)); x += Wo att; x += Wdown(silu(Wgate
  RMSNorm(x)) * Wup RMSNorm(x)); final RMSNorm; tied lm_head (logits = E . h).
  RMSNorm: y = w * x / sqrt(mean(x^2) + eps) with plain weights (Qwen3 dense convention).

MTP module (Qwen3.5/Next tensor layout, mtp.*), trained with the next-next-token loss:
  row p (p = 0..T-2) consumes h_p, the main model's hidden state at position p AFTER
  model.norm, and the token t_{p+1}:
    u  = mtp.fc(concat(pre_fc_norm_embedding(E[t_{p+1}]), pre_fc_norm_hidden(h_p)))   embedding half first
    u  = mtp.layers.0(u) at RoPE position p, causal self-attention over the MTP rows (its own K/V)
    logits = E . mtp.norm(u)        -> predicts t_{p+2}
  This is vLLM's proposer convention (MTP input ids shifted left by one, positions and hidden
  states unshifted). The MTP norms use plain weights y = x^ * w like the rest of this model;
  Qwen3.5/Next checkpoints store zero-centred norms, y = x^ * (1 + w): this one does NOT.
  h_p is NOT detached: the MTP loss also trains the main model (as in DeepSeek-V3).

Loss = CE(main, t_{p+1}) + MTP_WEIGHT * CE(mtp, t_{p+2}), MTP_WEIGHT = 0.7 (high in the 0.3-1 range: the
MTP head's held-out accuracy is a requirement, the main model's perplexity only a measurement).

Precision: f32 master weights and AdamW state; matmuls under torch.autocast("cpu", bfloat16)
(oneDNN's AVX512-BF16 path: 2.4x the f32 throughput per CPU second here); norms, softmax, RoPE
and the losses in f32. Evaluation and export use f32 (the export rounds weights to bf16).

Data: build/kjv/{train,heldout}.ids from tools/prepare_data.py. Training samples windows of
seq_len + 1 tokens: each epoch cuts the token stream into consecutive windows from a random
shift and visits them in a random order, all drawn from one numpy generator seeded by --seed
(and torch.manual_seed(--seed) for the initial weights), so a rerun repeats the same batches.
Every window starts at position 0 from an empty context, as run's ppl windows do.

Recipe of the shipped model (the defaults): hidden 256, 6 layers, 4 q / 2 kv heads x 128, ffn 768,
vocab 4160, tied, rope_theta 1e4, context 512 (max_position_embeddings 512: it never saw a later
position) + the MTP layer = 8,083,712 parameters (16.2 MB in bf16). 640 steps x 4 windows x 512
tokens = 1.31 M tokens (0.97 epochs of the 1.35 M training tokens); AdamW (0.9, 0.95), lr 2e-3,
30 warmup steps, cosine to 2e-4, weight decay 0.1 on matrices, gradient clip 1.0, seed 1234.
It writes build/kjv/ckpt.pt every 20 steps and resumes from it when started again without --fresh
(`make train` passes --fresh); a resumed run repeats the same batches, so the result is the same.

Held-out evaluation mirrors run.c's run_ppl: non-overlapping windows of ctx tokens, each from
an empty cache, every token after the window's first scored; MTP accuracy counts, in the same
windows, rows p whose MTP argmax equals t_{p+2}.

Export: bf16 model.safetensors (own writer, names exactly as Qwen3 + mtp.*), config.json,
generation_config.json, and the reduced Qwen3 tokenizer copied from tests/data/fixtures/tiny.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys
import time

# Measured on the shared 2-core machine: with OpenMP's default (spinning) wait policy, two threads
# under CPU contention run 5x slower per CPU second than one; passive waiting removes that.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- the architecture (written to config.json) ----
ARCH = dict(
    vocab_size=4160,
    hidden_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=128,
    intermediate_size=768,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
)
MTP_WEIGHT = 0.7
TOKDIR = "tests/data/fixtures/tiny"  # tokenizer.json + tokenizer_config.json are copied from here
BOS_ID, EOS_ID, IM_END_ID = 4096, 4096, 4098  # <|endoftext|>, <|endoftext|>, <|im_end|>


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        x = x.float()  # statistics in f32 also under bf16 autocast
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(n, hd, theta):
    """cos, sin [n, hd/2] for positions 0..n-1 (angles in float64, as run does)."""
    inv = theta ** (-2.0 * torch.arange(hd // 2, dtype=torch.float64) / hd)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(x, cos, sin):
    """NeoX RoPE (rotate_half) on x [B, heads, T, hd]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, a):
        super().__init__()
        H, hd = a["hidden_size"], a["head_dim"]
        self.nh, self.nkv, self.hd = a["num_attention_heads"], a["num_key_value_heads"], hd
        self.q_proj = nn.Linear(H, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, a["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, a["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        grp = self.nh // self.nkv
        k = k.repeat_interleave(grp, dim=1)  # query head j -> kv head j // grp
        v = v.repeat_interleave(grp, dim=1)
        s = torch.baddbmm(mask, q.reshape(B * self.nh, T, self.hd), k.reshape(B * self.nh, T, self.hd).transpose(1, 2),
                          alpha=1.0 / math.sqrt(self.hd))  # mask: 0 on and below the diagonal, -inf above
        o = torch.softmax(s.float(), dim=-1).view(B, self.nh, T, T) @ v
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, a):
        super().__init__()
        H, I = a["hidden_size"], a["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.input_layernorm = RMSNorm(a["hidden_size"], a["rms_norm_eps"])
        self.self_attn = Attention(a)
        self.post_attention_layernorm = RMSNorm(a["hidden_size"], a["rms_norm_eps"])
        self.mlp = MLP(a)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    """model.*: embeddings, decoder layers, final norm."""

    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a["vocab_size"], a["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(a) for _ in range(a["num_hidden_layers"]))
        self.norm = RMSNorm(a["hidden_size"], a["rms_norm_eps"])


class MTP(nn.Module):
    """mtp.*: Qwen3.5/Next multi-token-prediction module (one layer)."""

    def __init__(self, a):
        super().__init__()
        H = a["hidden_size"]
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(H, a["rms_norm_eps"])
        self.pre_fc_norm_hidden = RMSNorm(H, a["rms_norm_eps"])
        self.layers = nn.ModuleList([DecoderLayer(a)])
        self.norm = RMSNorm(H, a["rms_norm_eps"])


class Qwen3MTP(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.model = Body(a)
        self.mtp = MTP(a)
        cos, sin = rope_tables(a["max_position_embeddings"], a["head_dim"], a["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.init_weights()

    def init_weights(self):
        """GPT-2 style: N(0, 0.02) matrices, residual outputs scaled by 1/sqrt(2 * layers)."""
        std, out_std = 0.02, 0.02 / math.sqrt(2 * (self.a["num_hidden_layers"] + 1))
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids, mtp=True):
        """ids [B, T] at positions 0..T-1. Returns main logits [B, T, V] (for t_{p+1}) and, with
        mtp, MTP logits [B, T-1, V] whose row p predicts t_{p+2} from (h_p, t_{p+1})."""
        B, T = ids.shape
        E = self.model.embed_tokens.weight
        cos, sin = self.cos[:T], self.sin[:T]
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        h = self.model.norm(x)  # post-final-norm hidden: the MTP input
        logits = h @ E.t()
        if not mtp or T < 2:
            return logits, None
        m = self.mtp
        e = m.pre_fc_norm_embedding(self.model.embed_tokens(ids[:, 1:]))  # E[t_{p+1}]
        u = m.fc(torch.cat((e, m.pre_fc_norm_hidden(h[:, :-1])), dim=-1))  # embedding half first
        u = m.layers[0](u, cos[: T - 1], sin[: T - 1], mask[: T - 1, : T - 1])  # positions p
        return logits, m.norm(u) @ E.t()


# ---- data ----

def read_ids(path):
    with open(path) as f:
        return np.array(f.read().split(), dtype=np.int64)


def batch_starts(n_tokens, win, steps, batch, seed):
    """[steps, batch] start offsets of windows of win tokens: per epoch a random shift, then the
    consecutive windows from it in a random order. Deterministic in seed."""
    rng = np.random.default_rng(seed)
    out, need = [], steps * batch
    while sum(len(o) for o in out) < need:
        shift = int(rng.integers(win))
        starts = shift + win * np.arange((n_tokens - shift) // win)
        out.append(starts[rng.permutation(len(starts))])
    return np.concatenate(out)[:need].reshape(steps, batch)


# ---- evaluation (run.c's run_ppl windows) ----

@torch.no_grad()
def evaluate(model, ids, ctx, max_windows=None):
    """Returns (ppl, n_scored, mtp_acc, n_mtp, main_acc)."""
    model.eval()
    nll, count, mtp_hit, mtp_n, hit = 0.0, 0, 0, 0, 0
    n = len(ids)
    for w, start in enumerate(range(0, n - 1, ctx)):
        if max_windows is not None and w >= max_windows:
            break
        win = torch.from_numpy(ids[start: start + ctx])[None]
        L = win.shape[1]
        logits, mlog = model(win, mtp=True)
        lp = logits[0, : L - 1].double().log_softmax(-1)
        tgt = win[0, 1:]
        nll -= lp.gather(1, tgt[:, None]).sum().item()
        count += L - 1
        hit += (logits[0, : L - 1].argmax(-1) == tgt).sum().item()
        if mlog is not None and L >= 3:
            mtp_hit += (mlog[0, : L - 2].argmax(-1) == win[0, 2:]).sum().item()
            mtp_n += L - 2
    model.train()
    return math.exp(nll / count), count, mtp_hit / max(mtp_n, 1), mtp_n, hit / count


# ---- safetensors (bf16) ----

def bf16_bytes(t):
    return t.detach().to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()


def write_safetensors(path, tensors, f32=()):
    """tensors: name -> float tensor; stored as BF16 (round to nearest even), or F32 for names in f32."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        b = t.float().numpy().astype("<f4").tobytes() if name in f32 else bf16_bytes(t)
        header[name] = {"dtype": "F32" if name in f32 else "BF16", "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    """name -> float32 numpy array (BF16/F16/F32)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[b:e]
        if info["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            a = np.frombuffer(raw, dtype="<f4").copy()
        out[name] = a.reshape(info["shape"])
    return out


def export(model, out_dir, meta):
    os.makedirs(out_dir, exist_ok=True)
    a = model.a
    tensors = {k: v for k, v in model.state_dict().items()}
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "head_dim": a["head_dim"],
        "hidden_act": "silu",
        "hidden_size": a["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": a["intermediate_size"],
        "max_position_embeddings": a["max_position_embeddings"],
        "max_window_layers": a["num_hidden_layers"],
        "model_type": "qwen3",
        "num_attention_heads": a["num_attention_heads"],
        "num_hidden_layers": a["num_hidden_layers"],
        "num_key_value_heads": a["num_key_value_heads"],
        "rms_norm_eps": a["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": a["rope_theta"],
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": a["vocab_size"],
        "num_nextn_predict_layers": 1,
        "mtp_num_hidden_layers": 1,
        "_comment": ("qwen3-kjv-mtp: trained by tools/train.py on the King James Bible. The mtp.* norms use "
                     "plain weights y = x^ * w (Qwen3 dense convention), NOT the zero-centred y = x^ * (1 + w) "
                     "of Qwen3.5/Next checkpoints. MTP row p consumes (h_p after model.norm, t_{p+1}) at RoPE "
                     "position p and predicts t_{p+2}."),
        "_training": meta,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    gen = {
        "bos_token_id": BOS_ID,
        "do_sample": True,
        "eos_token_id": [EOS_ID, IM_END_ID],
        "pad_token_id": BOS_ID,
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "transformers_version": "4.51.0",
    }
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(TOKDIR, fn), os.path.join(out_dir, fn))


def load_exported(model_dir):
    """A Qwen3MTP holding the exported (bf16-rounded) weights, as f32."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    a = {k: cfg[k] for k in ARCH}
    model = Qwen3MTP(a)
    w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in w.items()}
    model.load_state_dict(sd, strict=True)
    return model


# ---- training ----

def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def save_ckpt(path, model, opt, step, log):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": log}, tmp)
    os.replace(tmp, path)


def train(args, model_cls=None, arch=None, ckpt_name="ckpt.pt", export_fn=None):
    """Trains model_cls(arch) (default: this file's Qwen3MTP and ARCH) with the recipe above,
    checkpointing to DATA/ckpt_name, and exports it with export_fn(model, dir, meta)."""
    model_cls, arch, export_fn = model_cls or Qwen3MTP, arch or ARCH, export_fn or export
    torch.manual_seed(args.seed)
    train_ids = read_ids(os.path.join(args.data, "train.ids"))
    held_ids = read_ids(os.path.join(args.data, "heldout.ids"))
    a = dict(arch)
    model = model_cls(a)
    n_main = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model."))
    n_mtp = sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp."))
    print(f"params: main {n_main:,} (embedding {a['vocab_size'] * a['hidden_size']:,}), mtp {n_mtp:,}, "
          f"total {n_main + n_mtp:,}; train tokens {len(train_ids):,}, held-out {len(held_ids):,}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() != 2]  # norms, biases, conv taps
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    win = args.seq + 1
    starts = batch_starts(len(train_ids), win, args.steps, args.batch, args.seed)
    ckpt = os.path.join(args.data, ckpt_name)
    step0, log = 0, []
    if os.path.exists(ckpt) and not args.fresh:
        st = torch.load(ckpt)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step0, log = st["step"], st["log"]
        print(f"resumed {ckpt} at step {step0}", flush=True)
    t_start, seen = time.time(), 0
    stopped_early = False
    step = step0
    for step in range(step0, args.steps):
        if args.max_minutes > 0 and (time.time() - t_start) / 60 > args.max_minutes:
            print(f"time budget of {args.max_minutes} min reached at step {step}: stopping", flush=True)
            stopped_early = True
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        batch = torch.from_numpy(np.stack([train_ids[s: s + win] for s in starts[step]]))
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits, mlog = model(x)
        V = a["vocab_size"]
        loss_main = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
        loss_mtp = F.cross_entropy(mlog.float().reshape(-1, V), y[:, 1:].reshape(-1))
        loss = loss_main + MTP_WEIGHT * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
        opt.step()
        seen += x.numel()
        el = time.time() - t_start
        rec = {"step": step + 1, "loss": loss_main.item(), "mtp_loss": loss_mtp.item(), "lr": lr_at(step, args),
               "gnorm": gnorm, "min": el / 60}
        if (step + 1) % args.log_every == 0 or step == step0:
            print(f"step {step + 1}/{args.steps} loss {rec['loss']:.4f} mtp {rec['mtp_loss']:.4f} lr {rec['lr']:.2e} "
                  f"gnorm {gnorm:.2f} {seen / el:.0f} tok/s {el / 60:.1f} min", flush=True)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            ppl, _, macc, _, acc = evaluate(model, held_ids, args.seq, max_windows=8)
            rec.update(heldout_ppl=ppl, heldout_mtp_acc=macc)
            print(f"  held-out (first 8 windows, f32): loss {math.log(ppl):.4f} ppl {ppl:.3f} top1 {acc:.3f} "
                  f"mtp top1 {macc:.3f}", flush=True)
        log.append(rec)
        if (step + 1) % args.ckpt_every == 0:
            save_ckpt(ckpt, model, opt, step + 1, log)
    done = step + 1 if not stopped_early else step
    save_ckpt(ckpt, model, opt, done, log)
    wall = time.time() - t_start
    print(f"trained {done - step0} steps in {wall / 60:.1f} min ({seen / max(wall, 1e-9):.0f} tok/s)", flush=True)
    last = [r for r in log[-50:]]
    meta = {"steps": done, "batch": args.batch, "seq_len": args.seq, "lr": args.lr, "seed": args.seed,
            "mtp_loss_weight": MTP_WEIGHT, "train_loss_last50": sum(r["loss"] for r in last) / max(1, len(last)),
            "mtp_loss_last50": sum(r["mtp_loss"] for r in last) / max(1, len(last))}
    export_fn(model, args.export, meta)
    print(f"exported to {args.export}", flush=True)
    with open(os.path.join(args.data, ckpt_name.replace("ckpt", "train_log").replace(".pt", ".json")), "w") as f:
        json.dump(log, f)


def export_only(args):
    st = torch.load(os.path.join(args.data, "ckpt.pt"))
    model = Qwen3MTP(dict(ARCH))
    model.load_state_dict(st["model"])
    last = st["log"][-50:]
    meta = {"steps": st["step"], "batch": args.batch, "seq_len": args.seq, "lr": args.lr, "seed": args.seed,
            "mtp_loss_weight": MTP_WEIGHT, "train_loss_last50": sum(r["loss"] for r in last) / max(1, len(last)),
            "mtp_loss_last50": sum(r["mtp_loss"] for r in last) / max(1, len(last))}
    export(model, args.export, meta)
    print(f"exported step {st['step']} to {args.export}")


def add_train_args(ap, export):
    """The training, schedule and evaluation options, shared with tools/train_hybrid.py."""
    ap.add_argument("--data", default="build/kjv", help="prepare_data.py output (and checkpoint) directory")
    ap.add_argument("--export", default=export)
    ap.add_argument("--steps", type=int, default=640)
    ap.add_argument("--batch", type=int, default=4, help="windows per step")
    ap.add_argument("--seq", type=int, default=512, help="tokens per window (context)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="stop (and export, un-annealed) after this many minutes; 0 = no limit. A stop before "
                         "--steps gives a different model from the shipped one")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=160)
    ap.add_argument("--ckpt-every", type=int, default=20)
    ap.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in f32 (2.4x slower)")
    ap.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    ap.add_argument("--eval", metavar="MODEL_DIR", help="evaluate an exported model on --eval-ids and exit")
    ap.add_argument("--eval-ids", default=None, help="token ids file (default DATA/heldout.ids)")
    ap.add_argument("--ctx", type=int, default=512, help="--eval window (run -m ppl -c)")


def eval_exported(args, load):
    """--eval: held-out ppl and MTP accuracy of load(MODEL_DIR), in run's ppl windows."""
    model = load(args.eval)
    ids = read_ids(args.eval_ids or os.path.join(args.data, "heldout.ids"))
    ppl, n, macc, nm, acc = evaluate(model, ids, args.ctx)
    print(f"ppl {ppl:.4f} tokens {n} (loss {math.log(ppl):.4f}, top1 {acc:.4f}); "
          f"mtp top1 {macc:.4f} over {nm} rows")


def main():
    ap = argparse.ArgumentParser(description="train / export / evaluate the qwen3-kjv-mtp model")
    add_train_args(ap, "models/qwen3-kjv-mtp")
    ap.add_argument("--export-only", action="store_true", help="export build/kjv/ckpt.pt and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.eval:
        eval_exported(args, load_exported)
        return
    if args.export_only:
        export_only(args)
        return
    if args.seq > ARCH["max_position_embeddings"]:
        sys.exit("--seq exceeds max_position_embeddings")
    train(args)


if __name__ == "__main__":
    main()
