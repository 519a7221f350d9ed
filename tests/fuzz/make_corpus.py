#!/usr/bin/env python3
"""make_corpus.py: writes the seed corpora of the fuzz harnesses,
tests/fuzz/corpus/<harness>/seed-*, from the shipped model, the test
fixtures and small hand-made inputs.

Data flow: files in models/ and tests/data/ -> small seeds in git -> the
libFuzzer runs of tests/fuzz/run.sh, which mutate copies of them. The real
files are too big to be seeds (a 16 MB checkpoint, a 262 KB tokenizer.json),
so this writes small valid stand-ins: safetensors files with the shipped
tensor names but tiny shapes, a tokenizer.json with the 256 byte tokens and
the first merges. Deterministic; run from anywhere, stdlib only. Inputs a
harness found a bug with live beside the seeds as regress-* and are not
touched here. Rerun after changing it, then check the total stays small.
"""
import json
import os
import struct
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
MODEL = os.path.join(ROOT, "models", "qwen3-kjv-mtp")
FIXTURES = os.path.join(ROOT, "tests", "data", "fixtures")
TOKDATA = os.path.join(ROOT, "tests", "data", "tokenizer")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def write_seeds(harness, seeds):
    """Replaces the harness's seed-* files with seeds (name -> bytes)."""
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    for old in os.listdir(d):
        if old.startswith("seed-"):
            os.remove(os.path.join(d, old))
    for name, data in seeds.items():
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(data)


# ---------------------------------------------------------------- safetensors

DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
          "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors(tensors, metadata=None, pad_to=None):
    """A file from (name, dtype, shape) triples, data laid out in order.
    pad_to: header length modulo 8 to aim for (spaces pad the JSON), which
    decides whether the data section is aligned."""
    header, at, data = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for i, (name, dt, shape) in enumerate(tensors):
        n = DTYPES[dt]
        for s in shape:
            n *= s
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + n]}
        data += bytes((i * 37 + k) & 0xFF for k in range(n))
        at += n
    h = compact(header)
    if pad_to is not None:
        h += b" " * ((pad_to - len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def shipped_shapes():
    """The shipped checkpoint's (name, dtype) with shapes shrunk to a few elements."""
    with open(os.path.join(MODEL, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    out = []
    for name, e in h.items():
        if name == "__metadata__":
            continue
        out.append((name, e["dtype"], [min(s, 2) for s in e["shape"]]))
    return out


def safetensors_seeds():
    shipped = shipped_shapes()
    seeds = {
        "shipped-names": safetensors(shipped, {"format": "pt"}, pad_to=0),
        "one-f32": safetensors([("w", "F32", [2, 3])]),
        "unaligned-bf16": safetensors([("a", "U8", [3]), ("b", "BF16", [2, 2]), ("c", "F32", [3])], pad_to=7),
        "empty-and-scalar": safetensors([("x", "F16", [0]), ("y", "F64", []), ("z", "I8", [0, 4]),
                                         ("w", "I32", [1, 1, 1, 1, 1, 1, 1, 2])], {"k": "v"}),
        "all-dtypes": safetensors([(dt.lower(), dt, [3]) for dt in sorted(DTYPES)], pad_to=3),
        "no-tensors": safetensors([], {"format": "pt"}),
    }
    # what the loader must refuse: overlap, a gap, a header past the end
    overlap = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
               "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}
    h = compact(overlap)
    seeds["bad-overlap"] = struct.pack("<Q", len(h)) + h + b"\0" * 4
    gap = {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}
    h = compact(gap)
    seeds["bad-gap"] = struct.pack("<Q", len(h)) + h + b"\0" * 4
    seeds["bad-header-length"] = struct.pack("<Q", 1 << 40) + b"{}"
    # metadata as st_write and st_metadata see it: a key twice, a NUL in a
    # key, "format" given by the file, a value that is not UTF-8
    for name, meta in (("metadata", b'{"format":"np","a":"1","a":"2","k\\u0000":"v","e":"\xc3\xa9\\n"}'),
                       ("metadata-not-utf8", b'{"a":"\xff\xc3"}')):
        h = b'{"__metadata__":' + meta + b',"t":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}}'
        seeds[name] = struct.pack("<Q", len(h)) + h + b"\x01\x02\x03\x04"
    return seeds


# ------------------------------------------------------------------ tokenizer

def reduced_tokenizer(n_merges):
    """tokenizer.json with the shipped pipeline and added tokens, the 256
    byte tokens and the first n_merges merges with the tokens they make."""
    tok = json.loads(read(os.path.join(MODEL, "tokenizer.json")))
    vocab, merges = tok["model"]["vocab"], tok["model"]["merges"][:n_merges]
    keep = {k for k in vocab if len(k) == 1}
    for m in merges:
        left, right = m.split(" ") if isinstance(m, str) else m
        keep |= {left, right, left + right}
    tok["model"]["vocab"] = {k: v for k, v in vocab.items() if k in keep}
    tok["model"]["merges"] = merges
    return tok


def tokenizer_load_seeds():
    tok = reduced_tokenizer(64)
    cfg = compact({"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}})
    seeds = {"reduced": compact(tok) + b"\xff" + cfg, "reduced-no-config": compact(tok)}
    small = json.loads(json.dumps(tok))
    small["added_tokens"] = small["added_tokens"][:3]
    seeds["shipped-config"] = compact(small) + b"\xff" + read(os.path.join(MODEL, "tokenizer_config.json"))
    t = json.loads(json.dumps(small))
    t["normalizer"] = None
    t["model"]["ignore_merges"] = True
    # the shipped file lists merges as pairs; the older spelling is "left right"
    t["model"]["merges"] = [" ".join(m) for m in t["model"]["merges"]]
    seeds["no-nfc-string-merges-ignore-merges"] = compact(t) + b"\xff" + compact({"eos_token": None})
    t = json.loads(json.dumps(small))
    t["pre_tokenizer"] = t["pre_tokenizer"]["pretokenizers"][0]
    t["added_tokens"].append({"id": 5000, "content": "\u00e9", "special": False})
    t["added_tokens"].append({"id": 5001, "content": "ab", "special": False})
    seeds["split-only-short-added"] = compact(t)
    return seeds


def tokenizer_encode_seeds():
    seeds = {}
    for name in sorted(os.listdir(os.path.join(TOKDATA, "prompts"))):
        if name.endswith(".txt") and not name.endswith(".tokens.txt"):
            seeds["prompt-" + name[:-4]] = read(os.path.join(TOKDATA, "prompts", name))
    for case in json.loads(read(os.path.join(TOKDATA, "cases_reduced4096.json")))["cases"]:
        seeds["case-" + case["name"]] = case["text"].encode()
    extra = {
        "nfd-hangul-jamo": "\u1100\u1161\u11a8 e\u0301 A\u030a\u0323 \u212b \u0958",
        "combining-order": "a\u0301\u0323\u0308 q\u0307\u0323 \u0345\u0300",
        "invalid-utf8": b"ok \xff\xfe \xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf end",
        "contractions-long-s": "\u017f 's 'S 'LL 're 'Ve 'd' '",
        "whitespace": " \t\r\n\r\n  \u00a0\u2028\u3000 x  \n\n\t y \u200b",
        "chat": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "added-overlap": "<|im_end|<|im_end|><|endoftext|><|im_start|><|<think></think>",
    }
    for k, v in extra.items():
        seeds[k] = v if isinstance(v, bytes) else v.encode()
    return seeds


# ------------------------------------------------------------- json / config

def config_seeds():
    seeds = {
        "shipped": read(os.path.join(MODEL, "config.json")),
        "shipped-generation": read(os.path.join(MODEL, "generation_config.json")),
        "small": read(os.path.join(FIXTURES, "small", "config.json")),
        "tiny": read(os.path.join(FIXTURES, "tiny", "config.json")),
        "qwen35": read(os.path.join(FIXTURES, "qwen35", "config.json")),
    }
    # a text-only Qwen3.5 save: the text keys at the top level
    q35 = json.loads(seeds["qwen35"])
    flat = dict(q35["text_config"], architectures=["Qwen3_5ForCausalLM"])
    seeds["qwen35-flat"] = json.dumps(flat, indent=1).encode()
    base = json.loads(seeds["small"])
    variants = {
        "yarn": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                                  "beta_fast": 32, "beta_slow": 1, "truncate": False, "mscale": 1,
                                  "mscale_all_dim": 0.5, "attention_factor": None}},
        "linear": {"rope_scaling": {"type": "linear", "factor": 2}},
        "rope-parameters": {"rope_theta": None, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}},
        "model-type-only": {"architectures": None, "eos_token_id": [1, 2, 3, 4, 5, 6, 7, 8, 9],
                            "head_dim": None, "num_key_value_heads": None},
        "generation-all": {"do_sample": False, "temperature": 0.6, "top_p": 0.95, "min_p": 0.0, "top_k": 20},
    }
    for name, change in variants.items():
        c = dict(base)
        c.update(change)
        seeds[name] = json.dumps(c, indent=1).encode()
    return seeds


def json_seeds():
    with open(os.path.join(MODEL, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        st_header = f.read(n)
    return {
        "config": read(os.path.join(MODEL, "config.json")),
        "generation-config": read(os.path.join(MODEL, "generation_config.json")),
        "tokenizer-config": read(os.path.join(MODEL, "tokenizer_config.json")),
        "index": read(os.path.join(FIXTURES, "small", "model.safetensors.index.json")),
        "safetensors-header": st_header[:4096],
        "escapes": b'"a\\"b\\\\c\\/\\b\\f\\n\\r\\t\\u0000\\u00e9\\ud83d\\ude00\\uFFFF"',
        "numbers": b"[0,-0,1e308,-2.2250738585072014e-308,4.9e-324,0.1,123456789012345678,1E+2,1e-7,-12.5e3]",
        "nested": b'[[[[{"a":[{"b":{}}]}]]],[],{},"",true,false,null]',
        "raw-bytes": b'{"caf\xc3\xa9":"\xe6\x97\xa5\xff\x80","a":1,"a":2}',
        "whitespace": b' \t\r\n{ "k" : [ 1 , 2 ] }\n ',
    }


def request_seeds():
    """Request bodies as OpenAI clients send them: a chat with every field
    and a think block in an earlier reply, a completion, nulls for defaults."""
    return {
        "chat": compact({
            "model": "x",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"},
                         {"role": "user", "content": [{"type": "text", "text": "And"},
                                                      {"type": "text", "text": " you?"}]}],
            "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 42,
            "stop": ["\n\n", "END"], "stream": True, "kv": "tbq4",
            "chat_template_kwargs": {"enable_thinking": False}}),
        "completion": compact({
            "prompt": ["In the beginning"], "max_completion_tokens": 8, "frequency_penalty": 0.5,
            "presence_penalty": 0.1, "repetition_penalty": 1.1, "n": 1, "stop": "x", "kv": "q8/q4"}),
        "nulls": compact({"prompt": "x", "temperature": None, "stop": None, "kv": None, "stream": False,
                          "max_tokens": 0}),
        "off-values": compact({"prompt": "x", "logprobs": None, "tools": [], "tool_choice": "none",
                               "response_format": {"type": "text"}, "echo": False, "best_of": 1,
                               "logit_bias": {}, "suffix": ""}),
    }


def main():
    write_seeds("fuzz_json", json_seeds())
    write_seeds("fuzz_request", request_seeds())
    write_seeds("fuzz_config", config_seeds())
    write_seeds("fuzz_safetensors", safetensors_seeds())
    write_seeds("fuzz_tokenizer_load", tokenizer_load_seeds())
    write_seeds("fuzz_tokenizer_encode", tokenizer_encode_seeds())
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(CORPUS) for f in fs)
    print(f"{CORPUS}: {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
