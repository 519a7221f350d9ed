/* model.h: a Qwen3 checkpoint in memory and its forward pass.
 *
 * Data flow: run.c loads a model directory here (config -> tensors, checked
 * by name and shape, used in place from the mmap), then calls model_forward
 * with n tokens at positions [p, p+n) where p is the cache length. Prefill,
 * decode and speculative verification are all that one call: matmuls run on
 * the whole batch, attention walks the batch one position at a time through
 * attn/ and the kv/ scheme, so batching never changes a result.
 * model_forward_batch runs several sequences, each over its own cache, in
 * one such forward: their rows share the matmuls, and each gets the bits it
 * would get alone.
 *
 *   tokens [n] -> x [n, H] -> layers -> RMSNorm -> hidden [n, H] -> logits [n, V]
 *
 * The MTP module (mtp.* tensors, Qwen3.5/Next layout) is loaded and its
 * shapes checked when the config announces it; model_mtp_forward runs it
 * (shared/specs/qwen3.md, "MTP"):
 *   row i: u = Wfc [RMSNorm(E[t_i]); RMSNorm(h_i)] -> decoder layer at
 *          position p+i over the MTP cache -> RMSNorm -> hm_i -> logits
 * where h_i is the main model's post-norm hidden state at position p+i and
 * t_i the token at position p+i+1; the logits draft the token at p+i+2.
 */
#ifndef MODEL_H
#define MODEL_H

#include "kernels/matmul.h"
#include "kv/kv.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/source.h"
#include "sample/sampler.h"

/* One decoder layer: attention (Qwen3, and Qwen3.5's full layers) or
 * Gated DeltaNet (Qwen3.5's linear layers), then the MLP. Norm vectors are
 * owned f32 copies, zero-centred ones with their 1 + w folded in. */
typedef struct {
    int gdn;                      /* 1: Gated DeltaNet, 0: attention */
    float *in_norm, *post_norm;   /* [H] */
    /* attention */
    float *q_norm, *k_norm;       /* [head_dim], shared by all heads */
    Weight wq, wk, wv, wo;        /* [nH*hd, H] ([nH*2hd, H] gated: per head [query | gate]),
                                     [nKV*hd, H] x2, [H, nH*hd] */
    /* Gated DeltaNet, conv_dim = 2 Hk dk + Hv dv */
    Weight w_qkv, w_z, w_b, w_a;  /* [conv_dim, H], [Hv*dv, H], [Hv, H] x2: one input, one matmul_multi */
    Weight w_out;                 /* [H, Hv*dv] */
    float *conv;                  /* [conv_dim, K] depthwise taps; tap K-1 multiplies the current token */
    float *dt_bias, *a_neg;       /* [Hv]: dt_bias, and -exp(A_log) */
    float *gnorm;                 /* [dv] the gated RMSNorm's plain weight */
    Weight wg, wu, wd;            /* [I, H] x2, [H, I] */
} Layer;


/* Scratch for one forward call of up to cap tokens. */
typedef struct {
    int cap;
    float *x, *xb;        /* [cap, H] residual stream, normed copy */
    float *q, *k, *v;     /* [cap, nH*hd], [cap, nKV*hd] x2 */
    float *qg, *gate;     /* gated attention: [cap, nH*2hd] q_proj's rows, [cap, nH*hd] its gates */
    float *att;           /* [cap, nH*hd] attention output */
    float *mix, *z, *gb, *ga, *y; /* Gated DeltaNet: [cap, conv_dim], [cap, Hv*dv], [cap, Hv] x2, [cap, Hv*dv] */
    float *hb, *hb2;      /* [cap, I] MLP gate and up */
    float *rope_cs, *rope_sn; /* [cap, rot_dim/2] cos and sin per position */
    float *attn_scratch;  /* [threads, attn_scratch_floats(group, hd)] */
    float *cat;           /* [cap, 2H] MTP input, when the model has an MTP head */
    int threads;
    int wide;             /* the widest input of any matmul (matmul_reserve) */
} Scratch;

typedef struct GpuModel GpuModel;

typedef struct Model {
    Config cfg;
    TensorStore ts;
    char prefix[32];       /* of the decoder's tensors: "model." or Qwen3.5's "model.language_model." */
    int *kv_slot;          /* [n_layers] a full layer's layer in the KV cache, -1 for Gated DeltaNet */
    size_t state_floats;   /* f32 per sequence of the Gated DeltaNet layers' state (KVCache.state) */
    Weight embed;          /* [V, H] */
    Weight lm_head;        /* [V, H]: embed when tied */
    float *final_norm;     /* [H] */
    Layer *layers;         /* [n_layers] */
    double *inv_freq;      /* [rot_dim/2] RoPE frequencies after scaling */
    float rope_mscale;     /* YaRN attention factor applied to cos/sin */
    /* MTP module, when present */
    int has_mtp;
    int mtp_absent;        /* config.json announces one, the checkpoint has no mtp.* tensors */
    int layers_stored;     /* layers the checkpoint's tensors number (more than n_layers: the rest unread) */
    Weight mtp_fc;         /* [H, 2H] */
    float *mtp_norm_emb, *mtp_norm_hid, *mtp_norm; /* [H] each */
    Layer mtp_layer;
    Weight mtp_head;       /* [V, H] the lm_head drafts use: lm_head, or its q8 copy */
    Scratch s;
    /* Optional probe for -m kvstats (set by model_trace_q): when set, each
     * layer copies its roped queries [n, nH*hd] to trace_q + layer * s.cap
     * * nH*hd. */
    float *trace_q;
    /* Optional journal for model_state_replay (speculative verification):
     * when set, model_forward of n <= journal_cap tokens records each Gated
     * DeltaNet layer's inputs to its recurrence and conv in the
     * model_journal_floats(m, journal_cap) floats here. */
    float *journal;
    int journal_cap;
    /* Set by model_to_gpu: the forward runs there (model/gpu.h). */
    GpuModel *gpu;
} Model;

/* Loads the model at path (a folder, a .safetensors file in one, or a
 * single-file model: model/source.h; config.json + safetensors). The weights are read into memory
 * in huge pages (st_to_memory: faster decode, a copy of the files) unless
 * flags has MODEL_MAPPED, which reads them where the files are mapped (no
 * copy: for weights about to be converted, or a second load of the same
 * files). MODEL_ACT_BF16 relays every matmul matrix as DT_BF16D, so that
 * matmuls round their inputs to bf16 for vdpbf16ps (-act bf16; a bf16
 * checkpoint in memory and AVX-512 BF16 needed, else an error).
 * 0 ok, -1 with one line in err. */
enum { MODEL_MAPPED = 1, MODEL_ACT_BF16 = 2 };
int model_load(Model *m, const char *path, int flags, char *err, size_t errlen);
/* The same from an opened source (model/source.h). */
int model_load_source(Model *m, const ModelSource *src, int flags, char *err, size_t errlen);
/* Converts matmul weights to q8 blocks (DT_Q8, kernels/matmul.h) after
 * model_load: MODEL_MAIN the decoder layers' projections and lm_head (a tied
 * model keeps its embedding for lookups and gets a q8 lm_head beside it),
 * MODEL_DRAFT the MTP module and mtp_head, so drafts read about half the
 * bytes (verification keeps the output exact whatever drafts are made
 * from). Matrices whose width is not a multiple of 32 stay as stored.
 * 0 ok; -1 (out of memory) with one line in err naming the tensor. */
enum { MODEL_MAIN, MODEL_DRAFT };
int model_quantize(Model *m, int part, char *err, size_t errlen);
/* Bytes of the weight matrices as the forward reads them on the CPU (the
 * embedding, lm_head where it is not the embedding, the layers', the MTP
 * module's; q8 blocks with their scales): what the stats line reports. */
size_t model_weight_bytes(const Model *m);
void model_free(Model *m);
/* Moves the forward to the CUDA GPU (model/gpu.h): uploads the weights
 * once, or reads them where they are mapped (wmem: GPU_WMEM_*), after
 * which model_forward, model_mtp_forward and model_kv_init run there. The
 * model must be loaded with MODEL_MAPPED (weights in their stored layout),
 * its matrices as stored or made q8 by model_quantize's MODEL_MAIN. 0 ok, -1 with one line in err (no device, a model or a
 * build it cannot run on, or out of GPU memory). */
int model_to_gpu(Model *m, int wmem, char *err, size_t errlen);
/* Whether model_sample can draw this model's tokens where its logits are
 * (on the GPU, a vocabulary of at most 2^18); else the caller asks
 * model_forward for the logits and calls sampler_sample. */
int model_samples_on_device(const Model *m);
/* On the GPU: the next token from the last row of the last model_forward's
 * logits (computed and kept there even when the call asked for none),
 * drawn there (sample/sampler.cu), so that only its id crosses the bus;
 * s's generator and penalty window advance as sampler_sample's would.
 * 0 ok; -1 with one line in err (not on the GPU, or no logits there: an
 * MTP forward with logits came in between). */
int model_sample(Model *m, Sampler *s, int *token, char *err, size_t errlen);
/* Takes the forward back to the CPU (frees what model_to_gpu made; caches
 * opened on the GPU must be freed first). */
void model_drop_gpu(Model *m);

/* The bytes a cache of ctx positions in spec takes (the schemes' bits per
 * value): the full-attention layers' K and V, which grow with the
 * context, and a hybrid's recurrent state, which does not. */
double model_cache_bytes(const Model *m, const KVSpec *spec, int ctx);
/* Opens a KV cache shaped for this model: its full-attention layers (1 for
 * MTP), and for a hybrid model the Gated DeltaNet state beside them. */
int model_kv_init(const Model *m, KVCache *kv, const KVSpec *spec, int ctx, int mtp, char *err, size_t errlen);
/* -m kvstats' probe, on the CPU or the GPU: from the next model_forward on,
 * each cache layer's roped queries of a forward's tokens go to host
 * [cache layers][s.cap][nH*hd] (a forward takes at most s.cap tokens
 * then); NULL stops it. 0, or -1 with err. */
int model_trace_q(Model *m, float *host, char *err, size_t errlen);
/* Positions [t0, t0 + n) of an f32 cache's stream (cache layer, kv head),
 * on the CPU or the GPU, into k and v [n, head_dim]. 0, or -1 with err. */
int model_kv_read(const KVCache *kv, int layer, int head, int t0, int n, float *k, float *v, char *err, size_t errlen);

/* Runs tokens[0..n) at positions [p, p+n), p = kv_cache_len(kv), appending
 * their K/V. logits: NULL, or [n, V] when all_logits, else [V] of the last
 * token. hidden: NULL or [n, H] post-final-norm states (the MTP input).
 * 0 ok; -1 with err on a bad token id or a full context. */
int model_forward(Model *m, KVCache *kv, const int *tokens, int n, float *logits, int all_logits,
                  float *hidden, char *err, size_t errlen);

/* One sequence's part of a batched forward (model_forward_batch). */
typedef struct {
    KVCache *kv;        /* its own cache (model_kv_init); its tokens go at positions kv_cache_len(kv).. */
    const int *tokens;  /* [n] */
    int n;              /* >= 1 */
    float *logits;      /* NULL, or [V]: the logits of its last token */
    int failed;         /* out: 1 when its outputs were not finite (the call returns -1; the
                         * sequences without it got their results all the same) */
} ModelSeq;
/* Readies a thread other than model_load's to run this model's forwards
 * (a server's engine): its matmul buffers grown as model_load grew the
 * loader's, so that no forward allocates. 0 ok, -1 out of memory. */
int model_thread_init(const Model *m);
/* Frees the calling thread's forward buffers, before it exits. */
void model_thread_free(void);
/* What a saved cache must have been made by (kv/kvfile.h): a hash of the
 * config, every tensor's name, type, shape and bytes at 16 places in it,
 * the form each matmul reads its weights in (-wq, -act), the CPU kernels'
 * level and the version of the stored forms (KV_FORMAT), since each of
 * these can change a cached K or V in its last bit. */
uint64_t model_identity(const Model *m);
/* Rows a batched forward takes at most (all sequences' n together). */
int model_batch_rows(const Model *m);
/* Runs several sequences in one forward (a server's continuous batching):
 * the matmuls read the weights once for all rows, each row attends (or
 * runs its Gated DeltaNet recurrence) over its own sequence's cache/state.
 * Every sequence's logits and cache bytes are those
 * model_forward(m, seq.kv, seq.tokens, seq.n, seq.logits, 0, NULL, ...)
 * gives it alone, bit for bit. Everything is checked before anything
 * runs, so a refused batch changes no cache. 0 ok; -1 with one line in err
 * (naming the sequence index) on a bad token, a full context, too many
 * rows, the same cache twice, a journal kept (Model.journal) or a model on
 * the GPU with more than one sequence; or, after the forward, on
 * non-finite outputs, with failed set on the sequences that had them (the
 * others' logits and caches are as good as after a 0). */
int model_forward_batch(Model *m, ModelSeq *seqs, int nseq, char *err, size_t errlen);

/* Runs the MTP head on n rows at MTP positions [p, p+n), p = kv_cache_len(mkv)
 * (a one-layer cache from model_kv_init(..., mtp = 1)). hidden [n, H] and
 * tokens [n] as above; logits and hm ([n, H] MTP states after mtp.norm, the
 * next draft step's hidden input) as in model_forward. */
int model_mtp_forward(Model *m, KVCache *mkv, const float *hidden, const int *tokens, int n, float *logits,
                      int all_logits, float *hm, char *err, size_t errlen);

/* Checks a prompt's tokens [n] for what this text-only engine cannot
 * take: Qwen3.5's image and video placeholders, which stand for the vision
 * tower's embeddings. 0 ok, -1 with one line in err naming the token. */
int model_check_input(const Model *m, const int *tokens, int n, char *err, size_t errlen);

/* Floats of a journal (Model.journal) for forwards of up to n tokens. */
size_t model_journal_floats(const Model *m, int n);
/* Takes a hybrid model's recurrent state to where it was n tokens into the
 * forward that journal (kept with journal_cap = cap) recorded: the state
 * from before that forward (snapshot, [state_floats]), then the recorded
 * recurrence and conv inputs of its first n tokens replayed, with no
 * matmul. The bits are those a forward of just those n tokens leaves
 * (kernels/deltanet.h). The KV caches are the caller's to truncate. */
void model_state_replay(Model *m, KVCache *kv, const float *snapshot, const float *journal, int cap, int n);

/* The delta-rule recurrence of Gated DeltaNet layer L for n tokens, what a
 * forward runs between the layer's conv and out_proj (exposed for
 * tools/bench.c to time alone): mix [n, conv_dim] the conv's silu outputs
 * (q | k | v), gb and ga [n, Hv] the beta and decay inputs, z [n, Hv*dv]
 * the output gate; S [Hv, dk, dv] the layer's state, updated in place; y
 * [n, Hv*dv] gets the gated-normed output. Works in place on its inputs:
 * mix's q and k come back L2-normed, gb and ga as beta and alpha. */
void model_delta_rule(const Model *m, const Layer *L, float *S, float *mix, float *gb, float *ga, const float *z,
                      float *y, int n);

#endif
