/* gpu.c: the forward pass of model/model.c on a CUDA GPU (model/gpu.h).
 *
 * The weights go up once into one arena (each tensor 256-byte aligned) in
 * their stored dtype, or as the q8 blocks -wq q8 made of them at load
 * (kernels/cuda.h's CUDA_Q8: a matrix's codes, then its scales); norms as
 * the f32 vectors model_load made of them. Or, -wmem map (the default on
 * a GPU that shares the system's memory), the matrices stay where the
 * checkpoint's files are mapped and the kernels read them there, with the
 * same sums as from a copy (DevW, matmul_dev); only the norms, and a
 * matrix that cannot be read in place, go into the arena.
 * Scratch for GPU_BATCH tokens is allocated at open, so nothing is
 * allocated per step and a step can be captured as a graph. The order of
 * operations is model.c's, so that the CPU path is the reference for every
 * number here.
 *
 * A layer's q, k and v matrices sit one after the other, so that they are
 * one matmul; gate and up interleave row by row (gate i at 2i, up i at
 * 2i + 1), so that one matmul pass ends in the SwiGLU. Mapped, they are
 * the checkpoint's tensors: q, k and v are three launches into one
 * output, and gate and up two pointers of one launch. A decode step
 * (up to 8 tokens) also takes each RMSNorm into the matmul after it
 * (cuda_matvec): six launches a layer.
 *
 *   device scratch      shape
 *   x, xb               [GPU_BATCH, H]      residual stream, normed copy
 *   qkv                 [GPU_BATCH, nh*hd + 2*nkv*hd]  q | k | v per token
 *   att                 [GPU_BATCH, nh*hd]  attention output
 *   gu, hb              [GPU_BATCH, 2*ffn], [GPU_BATCH, ffn]  MLP gate, up interleaved; swiglu
 *   logits              [GPU_LOGIT_ROWS, V] the lm_head's output, a block of rows at a time
 *   cat                 [GPU_BATCH, 2H]     MTP input
 *   part                attention splits (attn/attn.cu)
 *   tokens, pos         [GPU_BATCH], [1]    what the host sends per step
 *   bad                 [1]                 the first row of hidden states not all finite
 *   cs, sn              [max_pos, rot/2]    RoPE tables, made once at open
 */
#include "model/gpu.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cuda.h"
#include "kv/polar4.h"
#include "model/model.h"

/* Tokens per forward call on the device: prefill runs in chunks of this. */
#define GPU_BATCH 512
/* Rows of logits made per lm_head pass (all_logits in prefill takes several). */
#define GPU_LOGIT_ROWS 64
/* Forwards of up to this many tokens replay a captured graph. */
#define GPU_GRAPH_MAX 8
/* Graphs per token count: one per power-of-two split count of attention
 * (1 .. 256), so that a short context is not cut into empty splits. */
#define GPU_SPLIT_KINDS 9

/* The schemes with a CUDA cache, in kernels/cuda.h's order of formats. */
static const char *const gpu_schemes[] = {"f32", "f16", "q8", "tbq2", "tbq3", "tbq4", "q4", "q4h", "lm3", "polar4"};

int gpu_kv_fmt(const char *name) {
    for (int i = 0; i < (int)(sizeof gpu_schemes / sizeof *gpu_schemes); i++)
        if (!strcmp(name, gpu_schemes[i])) return i;
    return -1;
}

int gpu_supports_kv(const KVSpec *spec, char *err, size_t errlen) {
    const char *names[2] = {spec->k->name, spec->v->name};
    for (int i = 0; i < 2; i++)
        if (gpu_kv_fmt(names[i]) < 0) {
            snprintf(err, errlen, "-dev cuda: KV scheme %s has no CUDA kernel yet (f32, f16, q8, q4, q4h, tbq4, tbq3, "
                     "tbq2, lm3 and polar4 do; use -dev cpu)", names[i]);
            return -1;
        }
    if (spec->k != spec->v) {
        snprintf(err, errlen, "-dev cuda: K and V in different schemes (%s/%s): the CUDA cache takes one", names[0],
                 names[1]);
        return -1;
    }
    return 0;
}

/* What gpu_supports_kv allows that a head dim rules out (kernels/cuda.h). */
static int gpu_supports_kv_dim(const KVSpec *spec, int head_dim, char *err, size_t errlen) {
    const int fmt = gpu_kv_fmt(spec->k->name);
    if (fmt >= CUDA_KV_Q4 && head_dim != 128) {
        snprintf(err, errlen, "-dev cuda: KV scheme %s takes head_dim 128 on the GPU (found %d; use -dev cpu)",
                 spec->k->name, head_dim);
        return -1;
    }
    return 0;
}

int gpu_supports(const Config *c, const KVSpec *spec, char *err, size_t errlen) {
    if (c->n_gdn) {
        snprintf(err, errlen, "-dev cuda: the Gated DeltaNet layers of Qwen3.5/3.6 have no CUDA kernels yet "
                              "(use -dev cpu)");
        return -1;
    }
    if (c->attn_gate) {
        snprintf(err, errlen, "-dev cuda: gated attention (Qwen3.5) has no CUDA kernel yet (use -dev cpu)");
        return -1;
    }
    if (c->head_dim != 128 && c->head_dim != 256) {
        snprintf(err, errlen, "-dev cuda: head_dim %d: the CUDA attention takes 128 or 256", c->head_dim);
        return -1;
    }
    const int most = c->head_dim == 128 ? 16 : 8;
    if (c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > most) {
        snprintf(err, errlen, "-dev cuda: %d query heads over %d kv heads: the CUDA attention takes up to %d per kv "
                 "head at head_dim %d", c->n_heads, c->n_kv_heads, most, c->head_dim);
        return -1;
    }
    if (c->hidden % 8 || c->ffn % 8) {
        snprintf(err, errlen, "-dev cuda: hidden %d, intermediate %d: the CUDA matmul takes widths that are "
                 "multiples of 8", c->hidden, c->ffn);
        return -1;
    }
    if (!spec) return 0;
    return gpu_supports_kv(spec, err, errlen) ? -1 : gpu_supports_kv_dim(spec, c->head_dim, err, errlen);
}

#ifdef USE_CUDA

/* A weight matrix [rows, cols] of dtype as the GPU reads it. Copied, one
 * block of rows in the arena (a layer's q, k and v stacked; gate and up
 * interleaved, gate i at row 2i). Mapped (-wmem map), rows read where the
 * checkpoint holds them: parts d[0..parts) of part_rows rows each,
 * stacked in that order (q, k, v); or, pair set, gate rows d[0] and up
 * rows d[1], rows / 2 each, standing for the interleaved copy. narrow:
 * some part is only 8-byte aligned (CudaMatmul). */
typedef struct {
    const void *d[3];
    int part_rows[3], parts, pair;
    int dtype, rows, cols, narrow;
} DevW;

static DevW dev_whole(const void *p, int dtype, int rows, int cols) {
    return (DevW){.d = {p}, .part_rows = {rows}, .parts = 1, .dtype = dtype, .rows = rows, .cols = cols};
}

typedef struct {
    float *in_norm, *post_norm, *q_norm, *k_norm;
    DevW wqkv, wo, wgu, wd; /* [nh*hd + 2*nkv*hd, H], [H, nh*hd], [2*ffn, H] interleaved, [H, ffn] */
} DevLayer;

struct GpuModel {
    Config cfg;
    CudaInfo info;
    char desc[400];
    char *arena; /* every weight and norm */
    size_t arena_bytes, used;
    DevW embed, lm_head;
    float *final_norm;
    DevLayer *layers;
    int has_mtp;
    DevW mtp_fc;
    float *mtp_norm_emb, *mtp_norm_hid, *mtp_norm;
    DevLayer mtp_layer;
    /* -wmem map: each checkpoint file's mapping as the GPU addresses it
     * ([n_files], NULL where a file is not mapped), the host mappings
     * cuda_host_map took, and the bytes of matrices read in place */
    const void **fdev, **fhost;
    size_t *fsize;
    int n_files;
    size_t mapped_bytes;
    void *host;       /* gpu_model_to_host's copy of the matrices, host_len bytes, */
    size_t host_len;  /* and whether cuda_host_map took it */
    int host_mapped;
    double *inv_freq;
    float rope_mscale;
    /* scratch (above) */
    float *x, *xb, *qkv, *att, *gu, *hb, *logits, *cat, *part;
    int *tokens, *pos, *bad, *count; /* count: the attention's split counters [GPU_BATCH * nkv] */
    float *prob;                     /* the sampler's scratch [V] */
    int *pick, *pen;                 /* the sampler's answer [2] and penalty tokens [2 V] */
    float *last;                     /* the last forward's last row of logits [V], or NULL */
    size_t part_floats;
    float *cs, *sn; /* RoPE tables [max_pos, rot/2]: captured graphs keep these pointers */
    int graphs; /* RUN_CUDA_GRAPHS is not 0 */
    /* gpu_trace_q: the queries [layers][trace_rows][qd] on the device, the
     * host copy they go to after each forward, and the row where the
     * current step's tokens start; trace NULL when off */
    float *trace, *trace_host;
    int trace_rows, trace_off;
};

/* The device side of a KVCache (kv->dev). */
typedef struct {
    GpuModel *g;
    int fmt, layers, cap; /* fmt: CUDA_KV_* (kernels/cuda.h) */
    char *k, *v;          /* [layers, nkv streams] each (kernels/cuda.h) */
    float *rot;           /* polar4: [layers][2][128][128], R and Rᵀ of each cache layer; else NULL */
    size_t layer_bytes;
    void *graph[GPU_GRAPH_MAX + 1][GPU_SPLIT_KINDS]; /* by token count and splits, captured on first use */
} GpuKV;

static int dtype_code(DType t) {
    return t == DT_F32 ? CUDA_F32 : t == DT_F16 ? CUDA_F16 : t == DT_Q8 ? CUDA_Q8 : CUDA_BF16;
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Where the GPU reads w's rows in place (-wmem map): its address in a
 * mapped checkpoint file; NULL where it must be copied (not mapping mode,
 * q8 blocks made at load, a tensor the loader copied for alignment or
 * made itself, or rows aligned to fewer than the 8 bytes the kernels'
 * narrowest loads take). */
static const void *mapped_at(const GpuModel *g, const Model *m, const Weight *w) {
    if (!g->fdev || (w->dtype != DT_F32 && w->dtype != DT_F16 && w->dtype != DT_BF16) || (uintptr_t)w->data % 8)
        return NULL;
    const uintptr_t p = (uintptr_t)w->data;
    const size_t bytes = (size_t)w->rows * w->cols * dtype_size(w->dtype);
    for (int i = 0; i < g->n_files; i++) {
        const STFile *f = &m->ts.files[i];
        const uintptr_t base = (uintptr_t)f->map;
        if (g->fdev[i] && p >= base && bytes <= f->size && p - base <= f->size - bytes)
            return (const char *)g->fdev[i] + (p - base);
    }
    return NULL;
}

/* Whether the matrices one matmul reads (q, k, v; gate, up) are all read
 * in place, of one dtype and width: else they are copied together. */
static int all_mapped(const GpuModel *g, const Model *m, const Weight *const *w, int count) {
    for (int i = 0; i < count; i++)
        if (!mapped_at(g, m, w[i]) || w[i]->dtype != w[0]->dtype || w[i]->cols != w[0]->cols) return 0;
    return 1;
}

/* The matrices w[0..count) read in place as the parts of one (pair: gate
 * and up, the same shape). */
static void map_parts(GpuModel *g, const Model *m, const Weight *const *w, int count, int pair, DevW *d) {
    *d = (DevW){.parts = count, .pair = pair, .dtype = dtype_code(w[0]->dtype), .cols = w[0]->cols};
    for (int i = 0; i < count; i++) {
        d->d[i] = mapped_at(g, m, w[i]);
        d->part_rows[i] = w[i]->rows;
        d->rows += w[i]->rows;
        d->narrow |= (uintptr_t)d->d[i] % 16 != 0;
        g->mapped_bytes += (size_t)w[i]->rows * w[i]->cols * dtype_size(w[i]->dtype);
    }
}

/* Bytes a weight takes in the arena; what cannot go up is refused in err. */
static int weight_fits(const Weight *w, const char *name, size_t *total, char *err, size_t errlen) {
    if (w->dtype != DT_F32 && w->dtype != DT_F16 && w->dtype != DT_BF16 && w->dtype != DT_Q8) {
        snprintf(err, errlen, "-dev cuda: %s is relaid for the CPU's kernels at load: the GPU takes f32, f16 and "
                              "bf16 weights as stored (load with MODEL_MAPPED) and q8 blocks (DT_Q8)",
                 name);
        return -1;
    }
    *total += align256(cuda_weight_bytes(dtype_code(w->dtype), w->rows, w->cols));
    return 0;
}

/* The next bytes of the arena; NULL past its end (the sizing above is an
 * upper bound, so that means a bug, reported as one). */
static void *arena_take(GpuModel *g, size_t bytes) {
    if (align256(bytes) > g->arena_bytes - g->used) return NULL;
    void *p = g->arena + g->used;
    g->used += align256(bytes);
    return p;
}

/* Matrices w[0..count) of one dtype and width, stacked as one [sum of
 * rows, cols] matrix in the arena (q8: the codes of all, then the scales
 * of all, as kernels/cuda.h lays out one matrix). */
static int up_stacked(GpuModel *g, const Model *m, const Weight *const *w, int count, DevW *d, const char *name,
                      char *err, size_t errlen) {
    if (all_mapped(g, m, w, count)) {
        map_parts(g, m, w, count, 0, d);
        return 0;
    }
    int rows = 0;
    for (int i = 0; i < count; i++) {
        if (w[i]->dtype != w[0]->dtype || w[i]->cols != w[0]->cols) {
            snprintf(err, errlen, "-dev cuda: %s: the matrices a matmul reads together differ in dtype or width", name);
            return -1;
        }
        rows += w[i]->rows;
    }
    const int dt = dtype_code(w[0]->dtype), cols = w[0]->cols;
    /* bytes of a row's codes (or values) and of its scales */
    const size_t rb = (size_t)cols * dtype_size(w[0]->dtype), sb = dt == CUDA_Q8 ? (size_t)cols / 32 * 4 : 0;
    char *p = arena_take(g, cuda_weight_bytes(dt, rows, cols));
    if (!p) { snprintf(err, errlen, "-dev cuda: %s: the weights outgrew the arena sized for them", name); return -1; }
    *d = dev_whole(p, dt, rows, cols);
    char *scales = p + rows * rb;
    for (int i = 0; i < count; i++) {
        if (cuda_upload(p, w[i]->data, w[i]->rows * rb, name, err, errlen) ||
            (sb && cuda_upload(scales, w[i]->scale, w[i]->rows * sb, name, err, errlen)))
            return -1;
        p += w[i]->rows * rb, scales += w[i]->rows * sb;
    }
    return 0;
}

static int up_weight(GpuModel *g, const Model *m, const Weight *w, DevW *d, const char *name, char *err,
                     size_t errlen) {
    return up_stacked(g, m, &w, 1, d, name, err, errlen);
}

/* Gate and up [I, H] each as one [2I, H] matrix, row 2i gate i, row
 * 2i + 1 up i, made on the host a layer at a time; or both read in
 * place as a pair. */
static int up_interleaved(GpuModel *g, const Model *m, const Weight *wg, const Weight *wu, DevW *d, const char *name,
                          char *err, size_t errlen) {
    if (wg->dtype != wu->dtype || wg->rows != wu->rows || wg->cols != wu->cols) {
        snprintf(err, errlen, "-dev cuda: %s: gate_proj and up_proj differ in dtype or shape", name);
        return -1;
    }
    if (all_mapped(g, m, (const Weight *[]){wg, wu}, 2)) {
        map_parts(g, m, (const Weight *[]){wg, wu}, 2, 1, d);
        return 0;
    }
    const int dt = dtype_code(wg->dtype);
    /* bytes of a row's codes (or values) and of its scales (q8) */
    const size_t row = (size_t)wg->cols * dtype_size(wg->dtype), sb = dt == CUDA_Q8 ? (size_t)wg->cols / 32 * 4 : 0;
    const size_t bytes = cuda_weight_bytes(dt, 2 * wg->rows, wg->cols);
    char *h = malloc(bytes);
    if (!h) { snprintf(err, errlen, "out of memory staging %s", name); return -1; }
    char *hs = h + 2 * row * wg->rows;
    for (int i = 0; i < wg->rows; i++) {
        memcpy(h + 2 * i * row, (const char *)wg->data + i * row, row);
        memcpy(h + (2 * i + 1) * row, (const char *)wu->data + i * row, row);
        if (sb) {
            memcpy(hs + 2 * i * sb, (const char *)wg->scale + i * sb, sb);
            memcpy(hs + (2 * i + 1) * sb, (const char *)wu->scale + i * sb, sb);
        }
    }
    void *p = arena_take(g, bytes);
    int rc = -1;
    if (!p) snprintf(err, errlen, "-dev cuda: %s: the weights outgrew the arena sized for them", name);
    else {
        *d = dev_whole(p, dt, 2 * wg->rows, wg->cols);
        rc = cuda_upload(p, h, bytes, name, err, errlen);
    }
    free(h);
    return rc;
}

static int up_vec(GpuModel *g, const float *v, int n, float **d, const char *name, char *err, size_t errlen) {
    *d = arena_take(g, (size_t)n * sizeof(float));
    if (!*d) { snprintf(err, errlen, "-dev cuda: %s: the weights outgrew the arena sized for them", name); return -1; }
    return cuda_upload(*d, v, (size_t)n * sizeof(float), name, err, errlen);
}

/* The arena bytes of layer L: what is not read in place (mapped_at). */
static int layer_bytes(const GpuModel *g, const Model *m, const Layer *L, const char *name, size_t *total, char *err,
                       size_t errlen) {
    const Config *c = &g->cfg;
    const Weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
    /* matrices read together are read in place together or not at all */
    const int qkv = all_mapped(g, m, w, 3), gu = all_mapped(g, m, w + 4, 2);
    for (int i = 0; i < 7; i++)
        if (!(i < 3 ? qkv : i == 4 || i == 5 ? gu : mapped_at(g, m, w[i]) != NULL) &&
            weight_fits(w[i], name, total, err, errlen))
            return -1;
    /* plus the alignment the stacks do not need: an upper bound */
    *total += 2 * align256((size_t)c->hidden * 4) + 2 * align256((size_t)c->head_dim * 4);
    return 0;
}

static int up_layer(GpuModel *g, const Model *m, const Layer *L, DevLayer *d, const char *name, char *err,
                    size_t errlen) {
    const Config *c = &g->cfg;
    return up_vec(g, L->in_norm, c->hidden, &d->in_norm, name, err, errlen) ||
           up_vec(g, L->post_norm, c->hidden, &d->post_norm, name, err, errlen) ||
           up_vec(g, L->q_norm, c->head_dim, &d->q_norm, name, err, errlen) ||
           up_vec(g, L->k_norm, c->head_dim, &d->k_norm, name, err, errlen) ||
           up_stacked(g, m, (const Weight *[]){&L->wq, &L->wk, &L->wv}, 3, &d->wqkv, name, err, errlen) ||
           up_weight(g, m, &L->wo, &d->wo, name, err, errlen) ||
           up_interleaved(g, m, &L->wg, &L->wu, &d->wgu, name, err, errlen) ||
           up_weight(g, m, &L->wd, &d->wd, name, err, errlen);
}

/* cos/sin for positions [0, max_pos), as model.c's rope_tables makes them,
 * once: the graphs captured later keep these pointers. */
static int rope_upload(GpuModel *g, char *err, size_t errlen) {
    const int half = g->cfg.rot_dim / 2, cap = g->cfg.max_pos;
    const size_t count = (size_t)cap * half;
    float *h = malloc(2 * count * sizeof(float));
    if (!h) {
        snprintf(err, errlen, "out of memory for the RoPE tables of %d positions (max_position_embeddings)", cap);
        return -1;
    }
    for (int p = 0; p < cap; p++)
        for (int j = 0; j < half; j++) {
            const double a = (double)p * g->inv_freq[j];
            h[(size_t)p * half + j] = (float)cos(a) * g->rope_mscale;
            h[count + (size_t)p * half + j] = (float)sin(a) * g->rope_mscale;
        }
    char what[96];
    snprintf(what, sizeof what, "the RoPE tables of %d positions (max_position_embeddings)", cap);
    float *d = cuda_alloc(2 * count * sizeof(float), what, err, errlen);
    int rc = !d || cuda_upload(d, h, 2 * count * sizeof(float), "the RoPE tables", err, errlen);
    free(h);
    if (rc) {
        cuda_free(d);
        return -1;
    }
    g->cs = d;
    g->sn = d + count;
    return 0;
}

/* The device, the scratch, the RoPE tables and the description; the
 * arena is the caller's. */
static int open_common(GpuModel *g, char *err, size_t errlen) {
    const Config *c = &g->cfg;
    if (cuda_open(&g->info, err, errlen)) return -1;
    const char *e = getenv("RUN_CUDA_GRAPHS");
    g->graphs = !(e && strcmp(e, "0") == 0);
    const size_t B = GPU_BATCH, H = c->hidden, qd = (size_t)c->n_heads * c->head_dim,
                 kvd = (size_t)c->n_kv_heads * c->head_dim;
    /* the most partial sums any token count asks for */
    for (int n = 1; n <= GPU_BATCH; n++) {
        const int s = cuda_attn_splits(n, c->n_heads, c->n_kv_heads, c->head_dim, 1 << 30, g->info.sm_count);
        const size_t f = cuda_attn_part_floats(n, c->n_heads, c->head_dim, s);
        if (f > g->part_floats) g->part_floats = f;
    }
    const size_t floats = 2 * B * H + B * (2 * qd + 2 * kvd) + 3 * B * c->ffn +
                          (size_t)GPU_LOGIT_ROWS * c->vocab_size + 2 * B * H + g->part_floats + c->vocab_size;
    const size_t ints = B + 2 + B * c->n_kv_heads + 2 + 2 * (size_t)c->vocab_size;
    float *s = cuda_alloc(floats * sizeof(float) + ints * sizeof(int), "the activations' scratch", err, errlen);
    if (!s) return -1;
    g->x = s, s += B * H;
    g->xb = s, s += B * H;
    g->qkv = s, s += B * (qd + 2 * kvd);
    g->att = s, s += B * qd;
    g->gu = s, s += 2 * B * c->ffn;
    g->hb = s, s += B * c->ffn;
    g->logits = s, s += (size_t)GPU_LOGIT_ROWS * c->vocab_size;
    g->cat = s, s += 2 * B * H;
    g->part = s, s += g->part_floats;
    g->prob = s, s += c->vocab_size;
    g->tokens = (int *)s;
    g->pos = g->tokens + B;
    g->bad = g->pos + 1;
    g->count = g->bad + 1;
    g->pick = g->count + B * c->n_kv_heads;
    g->pen = g->pick + 2;
    /* the attention's split counters start at zero (attn/attn.cu) */
    if (cuda_memset(g->count, 0, B * c->n_kv_heads * sizeof(int))) {
        snprintf(err, errlen, "CUDA: clearing the attention scratch failed");
        return -1;
    }
    snprintf(g->desc, sizeof g->desc,
             "%s (sm_%d%d, %d SMs, %.1f GB; integrated %d, pageable %d, host page tables %d, read-only register %d)",
             g->info.name, g->info.cc_major, g->info.cc_minor, g->info.sm_count, g->info.mem_total / 1e9,
             g->info.integrated, g->info.pageable, g->info.host_tables, g->info.ro_register);
    return rope_upload(g, err, errlen);
}

/* -wmem map: every checkpoint file's mapping where the GPU reads it
 * (cuda_host_map). A file the loader copied into memory (not the GPU
 * path's MODEL_MAPPED) stays unmapped: its tensors are copied. */
static int map_files(GpuModel *g, const Model *m, char *err, size_t errlen) {
    g->n_files = m->ts.n_files;
    g->fdev = calloc((size_t)g->n_files + 1, sizeof *g->fdev);
    g->fhost = calloc((size_t)g->n_files + 1, sizeof *g->fhost);
    g->fsize = calloc((size_t)g->n_files + 1, sizeof *g->fsize);
    if (!g->fdev || !g->fhost || !g->fsize) { snprintf(err, errlen, "out of memory"); return -1; }
    for (int i = 0; i < g->n_files; i++) {
        const STFile *f = &m->ts.files[i];
        if (f->region) continue;
        if (!(g->fdev[i] = cuda_host_map(f->map, f->size, err, errlen))) return -1;
        g->fhost[i] = f->map, g->fsize[i] = f->size;
    }
    return 0;
}

int gpu_model_open(GpuModel **out, const Model *m, int wmem, char *err, size_t errlen) {
    *out = NULL;
    if (gpu_supports(&m->cfg, NULL, err, errlen)) return -1;
    GpuModel *g = calloc(1, sizeof *g);
    const Config *c = &m->cfg;
    if (!g) { snprintf(err, errlen, "out of memory"); return -1; }
    g->cfg = *c;
    g->layers = calloc((size_t)c->n_layers, sizeof(DevLayer));
    g->inv_freq = malloc((size_t)(c->rot_dim / 2) * sizeof(double));
    if (!g->layers || !g->inv_freq) { snprintf(err, errlen, "out of memory"); goto fail; }
    memcpy(g->inv_freq, m->inv_freq, (size_t)(c->rot_dim / 2) * sizeof(double));
    g->rope_mscale = m->rope_mscale;
    if (open_common(g, err, errlen)) goto fail;
    if ((wmem == GPU_WMEM_MAP || (wmem == GPU_WMEM_AUTO && g->info.integrated && g->info.pageable)) &&
        map_files(g, m, err, errlen))
        goto fail;
    /* sizes first, so that a model too big is one line before any copy */
    size_t total = 0;
    const int tied = m->lm_head.data == m->embed.data;
    if ((!mapped_at(g, m, &m->embed) && weight_fits(&m->embed, "embed_tokens.weight", &total, err, errlen)) ||
        (!tied && !mapped_at(g, m, &m->lm_head) && weight_fits(&m->lm_head, "lm_head.weight", &total, err, errlen)))
        goto fail;
    total += align256((size_t)c->hidden * 4);
    for (int l = 0; l < c->n_layers; l++) {
        char what[64];
        snprintf(what, sizeof what, "a matrix of layer %d", l);
        if (layer_bytes(g, m, &m->layers[l], what, &total, err, errlen)) goto fail;
    }
    g->has_mtp = m->has_mtp;
    if (g->has_mtp && (layer_bytes(g, m, &m->mtp_layer, "the MTP layer", &total, err, errlen) ||
                       (!mapped_at(g, m, &m->mtp_fc) && weight_fits(&m->mtp_fc, "mtp.fc.weight", &total, err, errlen))))
        goto fail;
    total += 3 * align256((size_t)c->hidden * 4);
    if (!(g->arena = cuda_alloc(total, "the weights", err, errlen))) goto fail;
    g->arena_bytes = total;
    char name[96];
    if (up_weight(g, m, &m->embed, &g->embed, "embed_tokens.weight", err, errlen)) goto fail;
    if (tied) g->lm_head = g->embed;
    else if (up_weight(g, m, &m->lm_head, &g->lm_head, "lm_head.weight", err, errlen)) goto fail;
    if (up_vec(g, m->final_norm, c->hidden, &g->final_norm, "norm.weight", err, errlen)) goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        snprintf(name, sizeof name, "layer %d's weights", l);
        if (up_layer(g, m, &m->layers[l], &g->layers[l], name, err, errlen)) goto fail;
    }
    if (g->has_mtp && (up_layer(g, m, &m->mtp_layer, &g->mtp_layer, "the MTP layer", err, errlen) ||
                       up_weight(g, m, &m->mtp_fc, &g->mtp_fc, "mtp.fc.weight", err, errlen) ||
                       up_vec(g, m->mtp_norm_emb, c->hidden, &g->mtp_norm_emb, "mtp.pre_fc_norm_embedding", err,
                              errlen) ||
                       up_vec(g, m->mtp_norm_hid, c->hidden, &g->mtp_norm_hid, "mtp.pre_fc_norm_hidden", err,
                              errlen) ||
                       up_vec(g, m->mtp_norm, c->hidden, &g->mtp_norm, "mtp.norm", err, errlen)))
        goto fail;
    *out = g;
    return 0;
fail:
    gpu_model_free(g);
    return -1;
}

int gpu_model_random(GpuModel **out, const Config *c, int q8, unsigned long long seed, char *err, size_t errlen) {
    *out = NULL;
    if (gpu_supports(c, NULL, err, errlen)) return -1;
    GpuModel *g = calloc(1, sizeof *g);
    if (!g) { snprintf(err, errlen, "out of memory"); return -1; }
    g->cfg = *c;
    g->layers = calloc((size_t)c->n_layers, sizeof(DevLayer));
    g->inv_freq = malloc((size_t)(c->rot_dim / 2) * sizeof(double));
    if (!g->layers || !g->inv_freq) { snprintf(err, errlen, "out of memory"); goto fail; }
    for (int i = 0; i < c->rot_dim / 2; i++) g->inv_freq[i] = pow(c->rope_theta, -2.0 * i / c->rot_dim);
    g->rope_mscale = 1;
    if (open_common(g, err, errlen)) goto fail;
    const size_t H = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t V = c->vocab_size, I = c->ffn;
    /* matrices in bf16, or q8 but for the embedding */
    const int dt = q8 ? CUDA_Q8 : CUDA_BF16;
#define WB(r, cl) align256(cuda_weight_bytes(dt, (int)(r), (int)(cl)))
    const size_t per_layer = WB(qd + 2 * kvd, H) + WB(H, qd) + WB(2 * I, H) + WB(H, I) + 2 * align256(H * 4) +
                             2 * align256((size_t)c->head_dim * 4);
    const size_t total = align256(V * H * 2) + (c->tie_embeddings && !q8 ? 0 : WB(V, H)) + align256(H * 4) +
                         per_layer * c->n_layers;
#undef WB
    if (!(g->arena = cuda_alloc(total, "the weights", err, errlen))) goto fail;
    g->arena_bytes = total;
    /* weights uniform in +-1/sqrt(cols), so activations stay in range; norms 1 */
    unsigned long long s = seed;
#define RAND_W(dw, r, cl)                                                                                              \
    do {                                                                                                               \
        (dw) = dev_whole(arena_take(g, cuda_weight_bytes(dt, (int)(r), (int)(cl))), dt, (int)(r), (int)(cl));        \
        if (dt == CUDA_Q8) cuda_fill_random_q8((void *)(dw).d[0], (int)(r), (int)(cl), s++, 1.0f / sqrtf((float)(cl))); \
        else cuda_fill_random((void *)(dw).d[0], (size_t)(r) * (cl), s++, 1.0f / sqrtf((float)(cl)));                 \
    } while (0)
#define ONES(dv, count)                                                                                                \
    do {                                                                                                               \
        (dv) = arena_take(g, (size_t)(count) * 4);                                                                     \
        cuda_fill_ones((dv), (size_t)(count));                                                                         \
    } while (0)
    g->embed = dev_whole(arena_take(g, V * H * 2), CUDA_BF16, (int)V, (int)H);
    cuda_fill_random((void *)g->embed.d[0], V * H, s++, 1.0f / sqrtf((float)H));
    /* -wq q8 converts a tied lm_head to a matrix of its own */
    if (c->tie_embeddings && !q8) g->lm_head = g->embed;
    else RAND_W(g->lm_head, V, H);
    ONES(g->final_norm, H);
    for (int l = 0; l < c->n_layers; l++) {
        DevLayer *d = &g->layers[l];
        ONES(d->in_norm, H);
        ONES(d->post_norm, H);
        ONES(d->q_norm, c->head_dim);
        ONES(d->k_norm, c->head_dim);
        RAND_W(d->wqkv, qd + 2 * kvd, H);
        RAND_W(d->wo, H, qd);
        RAND_W(d->wgu, 2 * I, H);
        RAND_W(d->wd, H, I);
    }
#undef RAND_W
#undef ONES
    if (cuda_sync("making random weights", err, errlen)) goto fail;
    *out = g;
    return 0;
fail:
    gpu_model_free(g);
    return -1;
}

/* Rows [r0, r0 + rows) of d (bf16; with step 2 every other row from r0)
 * copied to host + *at, *at moved past them; the copy's address, or NULL
 * with err. */
static const void *rows_to_host(const DevW *d, int r0, int rows, int step, char *host, size_t *at, char *tmp,
                                char *err, size_t errlen) {
    const size_t row = (size_t)d->cols * 2;
    char *dst = host + *at;
    if (cuda_download(tmp, (const char *)d->d[0] + (size_t)r0 * row, (size_t)((rows - 1) * step + 1) * row,
                      "a matrix", err, errlen))
        return NULL;
    for (int i = 0; i < rows; i++) memcpy(dst + (size_t)i * row, tmp + (size_t)i * step * row, row);
    *at += (size_t)rows * row;
    return dst;
}

/* Where the device reads host address p of the copy at host, mapped at base. */
static const void *host_dev(const void *p, const char *host, const char *base) {
    return base + ((const char *)p - host);
}

int gpu_model_to_host(GpuModel *g, char *err, size_t errlen) {
    const Config *c = &g->cfg;
    const int H = c->hidden, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim, I = c->ffn;
    const int V = c->vocab_size;
    if (g->embed.dtype != CUDA_BF16 || g->layers[0].wqkv.dtype != CUDA_BF16 || g->layers[0].wqkv.parts != 1 ||
        g->host) {
        snprintf(err, errlen, "gpu_model_to_host: a random bf16 model with its matrices on the device expected");
        return -1;
    }
    const int tied = g->lm_head.d[0] == g->embed.d[0];
    const size_t per = (size_t)(qd + 2 * kvd) * H + (size_t)H * qd + (size_t)2 * I * H + (size_t)H * I;
    const size_t bytes = 2 * (per * c->n_layers + (size_t)V * H * (tied ? 1 : 2));
    /* the most rows a download takes: the embedding, gate|up or o */
    size_t most = (size_t)V > (size_t)2 * I ? (size_t)V : (size_t)2 * I;
    most = (most > (size_t)qd ? most : (size_t)qd) * H * 2;
    char *tmp = malloc(most);
    DevLayer *L = calloc((size_t)c->n_layers, sizeof *L);
    /* file-backed, as a checkpoint is: a GPU that reads pageable memory
     * through HMM may move anonymous pages into its own memory on a
     * fault, but not a file's */
    const int fd = memfd_create("run-weights", 0);
    void *host = fd < 0 || ftruncate(fd, (off_t)bytes)
                     ? MAP_FAILED
                     : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (!tmp || !L || host == MAP_FAILED) {
        free(tmp), free(L);
        if (host != MAP_FAILED) munmap(host, bytes);
        snprintf(err, errlen, "out of memory for %.2f GB of host weights", bytes / 1e9);
        return -1;
    }
    g->host = host, g->host_len = bytes; /* gpu_model_free unmaps it */
    /* the copy, its parts laid out as a checkpoint's tensors: q, k, v,
     * o, gate, up, down a layer, then the embedding and the lm_head */
    size_t at = 0;
    int rc = 0;
    const void *e = NULL, *h = NULL;
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const DevLayer *d = &g->layers[l];
        const void *p[7];
        p[0] = rows_to_host(&d->wqkv, 0, qd, 1, host, &at, tmp, err, errlen);
        p[1] = p[0] ? rows_to_host(&d->wqkv, qd, kvd, 1, host, &at, tmp, err, errlen) : NULL;
        p[2] = p[1] ? rows_to_host(&d->wqkv, qd + kvd, kvd, 1, host, &at, tmp, err, errlen) : NULL;
        p[3] = p[2] ? rows_to_host(&d->wo, 0, H, 1, host, &at, tmp, err, errlen) : NULL;
        p[4] = p[3] ? rows_to_host(&d->wgu, 0, I, 2, host, &at, tmp, err, errlen) : NULL;
        p[5] = p[4] ? rows_to_host(&d->wgu, 1, I, 2, host, &at, tmp, err, errlen) : NULL;
        p[6] = p[5] ? rows_to_host(&d->wd, 0, H, 1, host, &at, tmp, err, errlen) : NULL;
        rc = !p[6];
        L[l] = *d;
        L[l].wqkv = (DevW){.d = {p[0], p[1], p[2]}, .part_rows = {qd, kvd, kvd}, .parts = 3, .dtype = CUDA_BF16,
                           .rows = qd + 2 * kvd, .cols = H};
        L[l].wo = dev_whole(p[3], CUDA_BF16, H, qd);
        L[l].wgu = (DevW){.d = {p[4], p[5]}, .part_rows = {I, I}, .parts = 2, .pair = 1, .dtype = CUDA_BF16,
                          .rows = 2 * I, .cols = H};
        L[l].wd = dev_whole(p[6], CUDA_BF16, H, I);
    }
    if (!rc) {
        e = rows_to_host(&g->embed, 0, V, 1, host, &at, tmp, err, errlen);
        h = tied ? e : rows_to_host(&g->lm_head, 0, V, 1, host, &at, tmp, err, errlen);
        rc = !e || !h;
    }
    const char *base = rc ? NULL : cuda_host_map(host, bytes, err, errlen);
    if (base) {
        /* the host addresses become the device's */
        for (int l = 0; l < c->n_layers; l++) {
            DevW *w[] = {&L[l].wqkv, &L[l].wo, &L[l].wgu, &L[l].wd};
            for (int i = 0; i < 4; i++)
                for (int k = 0; k < w[i]->parts; k++) w[i]->d[k] = host_dev(w[i]->d[k], host, base);
        }
        memcpy(g->layers, L, (size_t)c->n_layers * sizeof *L);
        g->embed = dev_whole(host_dev(e, host, base), CUDA_BF16, V, H);
        g->lm_head = dev_whole(host_dev(h, host, base), CUDA_BF16, V, H);
        g->mapped_bytes = bytes, g->host_mapped = 1;
    }
    free(tmp), free(L);
    return base ? 0 : -1;
}

void gpu_model_free(GpuModel *g) {
    if (!g) return;
    /* nothing in flight may still read a mapping about to go */
    char err[256];
    if (g->fhost || g->host) cuda_sync("closing the model", err, sizeof err);
    for (int i = 0; g->fhost && i < g->n_files; i++) cuda_host_unmap(g->fhost[i], g->fsize[i]);
    if (g->host_mapped) cuda_host_unmap(g->host, g->host_len);
    if (g->host) munmap(g->host, g->host_len);
    free(g->fdev);
    free(g->fhost);
    free(g->fsize);
    cuda_free(g->arena);
    cuda_free(g->x);
    cuda_free(g->cs);
    cuda_free(g->trace);
    free(g->layers);
    free(g->inv_freq);
    free(g);
}

const char *gpu_model_device(const GpuModel *g) { return g->desc; }
size_t gpu_model_bytes(const GpuModel *g) { return g->arena_bytes; }
size_t gpu_model_mapped_bytes(const GpuModel *g) { return g->mapped_bytes; }
size_t gpu_model_mem(const GpuModel *g) { return g->info.mem_total; }

void gpu_model_set_graphs(GpuModel *g, int on) { g->graphs = on; }

static void kv_dev_free(void *p) {
    GpuKV *d = p;
    for (int i = 0; i <= GPU_GRAPH_MAX; i++)
        for (int k = 0; k < GPU_SPLIT_KINDS; k++) cuda_graph_free(d->graph[i][k]);
    cuda_free(d->k);
    cuda_free(d->rot);
    free(d);
}

/* polar4: each cache layer's R and Rᵀ (kv/polar4.h), the matrices the
 * CPU's streams of that layer use (the MTP cache's one layer is layer 0
 * there too). */
static int rot_upload(GpuKV *d, char *err, size_t errlen) {
    const size_t nn = 128 * 128;
    float *h = malloc(2 * nn * sizeof(float));
    if (!h || !(d->rot = cuda_alloc(2 * nn * sizeof(float) * d->layers, "polar4's rotations", err, errlen))) {
        if (!h) snprintf(err, errlen, "out of memory for polar4's rotations");
        free(h);
        return -1;
    }
    for (int l = 0; l < d->layers; l++) {
        if (polar4_rotation(128, l, h, h + nn)) {
            snprintf(err, errlen, "out of memory for polar4's rotations");
            free(h);
            return -1;
        }
        if (cuda_upload(d->rot + 2 * nn * l, h, 2 * nn * sizeof(float), "polar4's rotations", err, errlen)) {
            free(h);
            return -1;
        }
    }
    free(h);
    return 0;
}

/* The rotation of cache layer cl for the attention and the store. */
static const float *layer_rot(const GpuKV *d, int cl) { return d->rot ? d->rot + (size_t)cl * 2 * 128 * 128 : NULL; }

int gpu_kv_init(GpuModel *g, KVCache *kv, const KVSpec *spec, int ctx, int mtp, char *err, size_t errlen) {
    const Config *c = &g->cfg;
    memset(kv, 0, sizeof *kv);
    if (ctx < 1) { snprintf(err, errlen, "context of %d positions: expected at least 1", ctx); return -1; }
    if (gpu_supports(c, spec, err, errlen)) return -1;
    if (ctx > c->max_pos) {
        snprintf(err, errlen, "context of %d positions: the model has %d (max_position_embeddings)", ctx, c->max_pos);
        return -1;
    }
    GpuKV *d = calloc(1, sizeof *d);
    if (!d) { snprintf(err, errlen, "out of memory"); return -1; }
    d->g = g;
    d->fmt = gpu_kv_fmt(spec->k->name);
    d->layers = mtp ? 1 : c->n_layers;
    d->cap = ctx;
    d->layer_bytes = c->n_kv_heads * cuda_kv_stream_bytes(d->fmt, c->head_dim, ctx);
    const size_t bytes = 2 * d->layer_bytes * d->layers;
    char what[96];
    snprintf(what, sizeof what, "a KV cache of %d positions (-c)", ctx);
    if (!(d->k = cuda_alloc(bytes, what, err, errlen))) {
        free(d);
        return -1;
    }
    if (d->fmt == CUDA_KV_POLAR4 && rot_upload(d, err, errlen)) {
        cuda_free(d->k);
        cuda_free(d->rot);
        free(d);
        return -1;
    }
    d->v = d->k + d->layer_bytes * d->layers;
    kv->spec = *spec;
    kv->n_layers = d->layers;
    kv->n_kv = c->n_kv_heads;
    kv->d = c->head_dim;
    kv->cap = ctx;
    kv->dev = d;
    kv->dev_bytes = bytes;
    kv->dev_free = kv_dev_free;
    return 0;
}

int gpu_kv_fill_random(KVCache *kv, int n, unsigned long long seed, char *err, size_t errlen) {
    GpuKV *d = kv->dev;
    if (n < 0 || n > d->cap) { snprintf(err, errlen, "%d positions in a cache of %d", n, d->cap); return -1; }
    /* bf16 bit patterns of values in [-0.5, 0.5]: finite as f16 too, and as
     * the high halves of f32 */
    cuda_fill_random(d->k, 2 * d->layer_bytes * d->layers / 2, seed, 0.5f);
    kv->dev_len = n;
    return cuda_sync("filling the cache", err, errlen);
}

/* y (+)= x W^T over n rows of x, W as the GPU reads it: one launch for a
 * copy; where it is mapped a launch a part, q, k and v into their columns
 * of y, gate and up into alternate ones (where the interleaved copy puts
 * them), each part's sums the whole matrix's (CudaMatmul). Decode only
 * (n <= CUDA_MATVEC_MAX): nw RMSNorms each row of x first, and swiglu
 * makes y [n, rows / 2] = silu(gate) * up in the same pass. */
static void matmul_dev(float *y, const float *x, const DevW *w, int n, int add, const float *nw, float eps,
                       int swiglu) {
    CudaMatmul c = {.x = x, .dtype = w->dtype, .cols = w->cols, .n = n, .add = add, .narrow = w->narrow,
                    .shape_rows = w->rows, .xmode = nw != NULL, .nw = nw, .eps = eps};
    if (swiglu) {
        /* a copy's gate and up rows interleave; mapped, they are two tensors */
        c.y = y, c.pair = 1, c.rows = c.ldy = w->rows / 2, c.ys = 1, c.w = w->d[0];
        c.w2 = w->pair ? w->d[1] : (const char *)w->d[0] + (size_t)w->cols * cuda_dtype_bytes(w->dtype);
        c.ld = w->pair ? (size_t)w->cols : 2 * (size_t)w->cols;
        cuda_matmul_run(&c);
        return;
    }
    c.ld = (size_t)w->cols, c.ldy = w->rows, c.ys = w->pair ? 2 : 1;
    for (int p = 0, r0 = 0; p < w->parts; r0 += w->part_rows[p++]) {
        c.w = w->d[p], c.rows = w->part_rows[p];
        c.y = w->pair ? y + p : y + r0;
        cuda_matmul_run(&c);
    }
}

static void mm(float *y, const float *x, const DevW *w, int n, int add) { matmul_dev(y, x, w, n, add, NULL, 0, 0); }

/* The coded caches' store of n tokens' keys k (roped in place by
 * cuda_qk_rope_store, which stores the other formats itself) and values
 * k + nkv hd, rows ld floats apart, into cache layer cl (caches kc, vc);
 * polar4 also rotates the queries q [n, nh, hd] in place for the attention. */
static void kv_store(float *q, int nh, const float *k, int ld, char *kc, char *vc, const GpuKV *d, int cl, int n,
                     int nkv, int hd) {
    const int *pos = d->g->pos;
    if (d->fmt == CUDA_KV_POLAR4)
        cuda_polar4_store(q, nh, k, k + nkv * hd, ld, kc, vc, layer_rot(d, cl), pos, n, nkv, hd, d->cap);
    else if (d->fmt == CUDA_KV_LM3) cuda_lm3_store(k, k + nkv * hd, ld, kc, vc, pos, n, nkv, hd, d->cap);
    else if (d->fmt >= CUDA_KV_Q4) cuda_q4_store(k, k + nkv * hd, ld, kc, vc, d->fmt, pos, n, nkv, hd, d->cap);
    else if (d->fmt >= CUDA_KV_TBQ2) cuda_tbq_store(k, k + nkv * hd, ld, kc, vc, d->fmt, pos, n, nkv, hd, d->cap);
}

/* One decoder layer on n tokens of g->x, its K and V into cache layer cl. */
static void layer_run(GpuModel *g, const DevLayer *L, GpuKV *d, int cl, int n, int splits) {
    const Config *c = &g->cfg;
    const int H = c->hidden, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int qd = nh * hd, ld = qd + 2 * nkv * hd;
    const float eps = (float)c->eps;
    char *kc = d->k + d->layer_bytes * cl, *vc = d->v + d->layer_bytes * cl;
    /* decode: each RMSNorm and the SwiGLU inside a matmul's pass */
    const int fused = n <= CUDA_MATVEC_MAX;
    if (fused) matmul_dev(g->qkv, g->x, &L->wqkv, n, 0, L->in_norm, eps, 0);
    else {
        cuda_rmsnorm(g->xb, H, g->x, H, L->in_norm, n, H, eps);
        mm(g->qkv, g->xb, &L->wqkv, n, 0);
    }
    cuda_qk_rope_store(g->qkv, g->qkv + qd, g->qkv + qd + nkv * hd, ld, L->q_norm, L->k_norm, g->cs, g->sn, kc, vc,
                       d->fmt, g->pos, n, nh, nkv, hd, c->rot_dim, d->cap, eps);
    kv_store(g->qkv, nh, g->qkv + qd, ld, kc, vc, d, cl, n, nkv, hd);
    cuda_attention(g->att, g->qkv, ld, kc, vc, d->fmt, layer_rot(d, cl), g->pos, n, nh, nkv, hd, d->cap,
                   1.0f / sqrtf((float)hd), g->part, g->count, splits);
    mm(g->x, g->att, &L->wo, n, 1);
    if (fused) matmul_dev(g->hb, g->x, &L->wgu, n, 0, L->post_norm, eps, 1);
    else {
        cuda_rmsnorm(g->xb, H, g->x, H, L->post_norm, n, H, eps);
        mm(g->gu, g->xb, &L->wgu, n, 0);
        cuda_swiglu(g->hb, g->gu, n, c->ffn);
    }
    mm(g->x, g->hb, &L->wd, n, 1);
}

/* Attention's splits for n tokens after pos cached positions: what the
 * positions there will be need, rounded up to a power of two (a graph
 * each), within what the whole cache would take. *kind: its log2. */
static int splits_for(const GpuModel *g, const GpuKV *d, int n, int pos, int *kind) {
    const Config *c = &g->cfg;
    const int most = cuda_attn_splits(n, c->n_heads, c->n_kv_heads, c->head_dim, d->cap, g->info.sm_count);
    const int need = cuda_attn_splits(n, c->n_heads, c->n_kv_heads, c->head_dim, pos + n, g->info.sm_count);
    int s = 1, k = 0;
    while (s < need) s *= 2, k++;
    *kind = k;
    return s < most ? s : most;
}

/* The main model on n tokens already in g->tokens at g->pos: hidden states
 * in g->xb (the first row not all finite in g->bad), and logits of the
 * last lg_rows (<= GPU_LOGIT_ROWS) rows into g->logits. */
static void forward_dev(GpuModel *g, GpuKV *d, int n, int lg_rows, int splits) {
    const Config *c = &g->cfg;
    const int H = c->hidden;
    const size_t qd = (size_t)c->n_heads * c->head_dim, ld = qd + 2 * (size_t)c->n_kv_heads * c->head_dim;
    cuda_embed(g->x, g->embed.d[0], g->embed.dtype, g->tokens, n, H);
    for (int l = 0; l < c->n_layers; l++) {
        layer_run(g, &g->layers[l], d, l, n, splits);
        /* the queries stay in g->qkv until the next layer's projection */
        if (g->trace)
            cuda_copy_rows(g->trace + ((size_t)l * g->trace_rows + g->trace_off) * qd, qd * 4, g->qkv, ld * 4, qd * 4, n);
    }
    cuda_rmsnorm(g->xb, H, g->x, H, g->final_norm, n, H, (float)c->eps);
    cuda_find_nonfinite(g->bad, g->xb, n, H);
    if (lg_rows) mm(g->logits, g->xb + (size_t)(n - lg_rows) * H, &g->lm_head, lg_rows, 0);
}

/* Logits of hidden rows [row0, row0 + rows) of g->xb into dst [rows, V],
 * GPU_LOGIT_ROWS at a time. */
static int logits_down(GpuModel *g, int row0, int rows, float *dst, char *err, size_t errlen) {
    const int V = g->cfg.vocab_size, H = g->cfg.hidden;
    for (int r = 0; r < rows; r += GPU_LOGIT_ROWS) {
        const int k = rows - r < GPU_LOGIT_ROWS ? rows - r : GPU_LOGIT_ROWS;
        mm(g->logits, g->xb + (size_t)(row0 + r) * H, &g->lm_head, k, 0);
        if (cuda_download(dst + (size_t)r * V, g->logits, (size_t)k * V * 4, "the logits", err, errlen)) return -1;
    }
    return 0;
}

/* Whether a step of n tokens replays a captured graph: not past
 * GPU_GRAPH_MAX tokens, nor while the queries are traced (the copies'
 * rows move from step to step). */
static int graphed(const GpuModel *g, int n) { return g->graphs && n <= GPU_GRAPH_MAX && !g->trace; }

/* Tokens and position up; the graph of n tokens (captured on first use),
 * or the kernels one by one. */
static int step(GpuModel *g, GpuKV *d, const int *tokens, int n, int pos, char *err, size_t errlen) {
    if (cuda_upload(g->tokens, tokens, (size_t)n * sizeof(int), "token ids", err, errlen) ||
        cuda_upload(g->pos, &pos, sizeof(int), "the position", err, errlen))
        return -1;
    int kind;
    const int splits = splits_for(g, d, n, pos, &kind);
    if (!graphed(g, n)) {
        forward_dev(g, d, n, 0, splits);
        return 0;
    }
    /* a captured step always makes every row's logits: at up to 8 rows the
     * lm_head's weights are read once either way */
    void **graph = &d->graph[n][kind];
    if (!*graph) {
        if (cuda_graph_begin(err, errlen)) return -1;
        forward_dev(g, d, n, n, splits);
        if (cuda_graph_end(graph, err, errlen)) return -1;
    }
    return cuda_graph_launch(*graph, err, errlen);
}

int gpu_profile(GpuModel *g, KVCache *kv, int reps, FILE *out, char *err, size_t errlen) {
    GpuKV *d = kv->dev;
    const Config *c = &g->cfg;
    const DevLayer *L = &g->layers[0];
    const int H = c->hidden, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, qd = nh * hd;
    const int ld = qd + 2 * nkv * hd, pos = kv->dev_len, tok = 1;
    const float eps = (float)c->eps;
    if (pos >= d->cap) { snprintf(err, errlen, "profiling: the cache is full (%d positions)", d->cap); return -1; }
    g->last = NULL; /* its lm_head overwrites the logits gpu_sample would read */
    int kind;
    const int splits = splits_for(g, d, 1, pos, &kind);
    if (cuda_upload(g->tokens, &tok, sizeof tok, "token ids", err, errlen) ||
        cuda_upload(g->pos, &pos, sizeof pos, "the position", err, errlen))
        return -1;
    cuda_embed(g->x, g->embed.d[0], g->embed.dtype, g->tokens, 1, H);
    /* each op alone, reps times back to back, on layer 0's weights */
    for (int op = 0; op < 8; op++) {
        static const char *const names[] = {"rmsnorm + matmul q|k|v", "q/k norm + rope + store", "attention",
                                            "matmul o + residual", "rmsnorm + matmul gate|up + swiglu",
                                            "matmul down + residual", "matmul lm_head", "whole step (graph)"};
        cuda_timer_start();
        for (int r = 0; r < reps; r++) {
            switch (op) {
            case 0: matmul_dev(g->qkv, g->x, &L->wqkv, 1, 0, L->in_norm, eps, 0); break;
            case 1: /* (over polar4 each repetition rotates the queries again: the times are the same) */
                cuda_qk_rope_store(g->qkv, g->qkv + qd, g->qkv + qd + nkv * hd, ld, L->q_norm, L->k_norm, g->cs, g->sn,
                                   d->k, d->v, d->fmt, g->pos, 1, nh, nkv, hd, c->rot_dim, d->cap, eps);
                kv_store(g->qkv, nh, g->qkv + qd, ld, d->k, d->v, d, 0, 1, nkv, hd);
                break;
            case 2:
                cuda_attention(g->att, g->qkv, ld, d->k, d->v, d->fmt, layer_rot(d, 0), g->pos, 1, nh, nkv, hd, d->cap,
                               1.0f / sqrtf((float)hd), g->part, g->count, splits);
                break;
            case 3: mm(g->x, g->att, &L->wo, 1, 1); break;
            case 4: matmul_dev(g->hb, g->x, &L->wgu, 1, 0, L->post_norm, eps, 1); break;
            case 5: mm(g->x, g->hb, &L->wd, 1, 1); break;
            case 6: mm(g->logits, g->xb, &g->lm_head, 1, 0); break;
            default:
                if (step(g, d, &tok, 1, pos, err, errlen)) return -1;
            }
        }
        const double us = cuda_timer_stop() / reps * 1e6;
        if (cuda_sync("profiling", err, errlen)) return -1;
        fprintf(out, "| %s | %.2f |\n", names[op], us);
    }
    return 0;
}

int gpu_forward(GpuModel *g, KVCache *kv, const int *tokens, int n, float *logits, int all_logits, float *hidden,
                int *bad, char *err, size_t errlen) {
    GpuKV *d = kv->dev;
    const int V = g->cfg.vocab_size, H = g->cfg.hidden, pos = kv->dev_len;
    *bad = -1;
    /* a cache's stores read its own model's position (kv_store), and its
     * graphs were captured with that model's buffers */
    if (!d || d->g != g) { snprintf(err, errlen, "a KV cache this GPU model did not make (gpu_kv_init)"); return -1; }
    g->last = NULL;
    if (g->trace && n > g->trace_rows) {
        snprintf(err, errlen, "a forward of %d tokens with the queries traced for %d", n, g->trace_rows);
        return -1;
    }
    float *last_row = NULL; /* g->last once the whole forward has gone through */
    for (int off = 0; off < n; off += GPU_BATCH) {
        const int nb = n - off < GPU_BATCH ? n - off : GPU_BATCH, last = off + nb == n;
        const int lg_rows = !logits ? 0 : all_logits ? nb : last ? 1 : 0;
        int first = INT_MAX;
        g->trace_off = off;
        if (step(g, d, tokens + off, nb, pos + off, err, errlen) ||
            cuda_download(&first, g->bad, sizeof first, "the finiteness check", err, errlen))
            return -1;
        float *dst = all_logits ? logits + (size_t)off * V : logits;
        /* a graph made every row's logits (at up to 8 rows the lm_head is
         * read once either way); else they are made here */
        if (graphed(g, nb)) {
            if (lg_rows && cuda_download(dst, g->logits + (size_t)(nb - lg_rows) * V, (size_t)lg_rows * V * 4,
                                         "the logits", err, errlen))
                return -1;
            last_row = g->logits + (size_t)(nb - 1) * V;
        } else if (lg_rows) {
            if (logits_down(g, nb - lg_rows, lg_rows, dst, err, errlen)) return -1;
            last_row = g->logits + (size_t)((lg_rows - 1) % GPU_LOGIT_ROWS) * V;
        } else if (last) {
            /* the last row's logits stay on the device for gpu_sample */
            mm(g->logits, g->xb + (size_t)(nb - 1) * H, &g->lm_head, 1, 0);
            last_row = g->logits;
        }
        if (hidden && cuda_download(hidden + (size_t)off * H, g->xb, (size_t)nb * H * 4, "the hidden states", err,
                                    errlen))
            return -1;
        if (cuda_sync("the forward pass", err, errlen)) return -1;
        kv->dev_len = pos + off + nb;
        if (first != INT_MAX) {
            *bad = off + first;
            return 0;
        }
    }
    g->last = last_row;
    /* the n traced rows of each layer */
    const size_t qd = (size_t)g->cfg.n_heads * g->cfg.head_dim;
    for (int l = 0; g->trace && l < g->cfg.n_layers; l++)
        if (cuda_download(g->trace_host + (size_t)l * g->trace_rows * qd, g->trace + (size_t)l * g->trace_rows * qd,
                          (size_t)n * qd * 4, "the traced queries", err, errlen))
            return -1;
    return 0;
}

int gpu_trace_q(GpuModel *g, float *host, int rows, char *err, size_t errlen) {
    cuda_free(g->trace);
    g->trace = g->trace_host = NULL;
    if (!host) return 0;
    const size_t bytes = (size_t)g->cfg.n_layers * rows * g->cfg.n_heads * g->cfg.head_dim * 4;
    if (!(g->trace = cuda_alloc(bytes, "the traced queries", err, errlen))) return -1;
    g->trace_host = host, g->trace_rows = rows;
    return 0;
}

int gpu_kv_read_f32(const KVCache *kv, int layer, int head, int t0, int n, float *k, float *v, char *err,
                    size_t errlen) {
    const GpuKV *d = kv->dev;
    const int hd = kv->d;
    if (d->fmt != CUDA_KV_F32 || layer < 0 || layer >= d->layers || head < 0 || head >= kv->n_kv || t0 < 0 ||
        n < 0 || t0 + n > kv->dev_len) {
        snprintf(err, errlen, "gpu_kv_read_f32: positions [%d, %d) of layer %d, head %d: not in this f32 cache of %d",
                 t0, t0 + n, layer, head, kv->dev_len);
        return -1;
    }
    /* stream (layer, head) of rows [cap, hd] (kernels/cuda.h) */
    const size_t at = d->layer_bytes * layer + (size_t)head * cuda_kv_stream_bytes(d->fmt, hd, d->cap) +
                      (size_t)t0 * hd * 4;
    return cuda_download(k, d->k + at, (size_t)n * hd * 4, "the cache's keys", err, errlen) ||
                   cuda_download(v, d->v + at, (size_t)n * hd * 4, "the cache's values", err, errlen)
               ? -1
               : 0;
}

int gpu_mtp_forward(GpuModel *g, KVCache *mkv, const float *hidden, const int *tokens, int n, float *logits,
                    int all_logits, float *hm, int *bad, char *err, size_t errlen) {
    GpuKV *d = mkv->dev;
    const Config *c = &g->cfg;
    const int V = c->vocab_size, H = c->hidden, pos = mkv->dev_len;
    const float eps = (float)c->eps;
    *bad = -1;
    if (!g->has_mtp) { snprintf(err, errlen, "the model has no MTP head"); return -1; }
    if (!d || d->g != g) { snprintf(err, errlen, "a KV cache this GPU model did not make (gpu_kv_init)"); return -1; }
    if (logits) g->last = NULL; /* its logits take the main model's place */
    for (int off = 0; off < n; off += GPU_BATCH) {
        const int nb = n - off < GPU_BATCH ? n - off : GPU_BATCH, last = off + nb == n;
        const int lg_rows = !logits ? 0 : all_logits ? nb : last ? 1 : 0, p = pos + off;
        if (cuda_upload(g->tokens, tokens + off, (size_t)nb * sizeof(int), "token ids", err, errlen) ||
            cuda_upload(g->pos, &p, sizeof(int), "the position", err, errlen) ||
            cuda_upload(g->xb, hidden + (size_t)off * H, (size_t)nb * H * 4, "the hidden states", err, errlen))
            return -1;
        /* cat [nb, 2H] = [RMSNorm(E[t_i]) | RMSNorm(h_i)], embedding half first */
        cuda_embed(g->x, g->embed.d[0], g->embed.dtype, g->tokens, nb, H);
        cuda_rmsnorm(g->cat, 2 * H, g->x, H, g->mtp_norm_emb, nb, H, eps);
        cuda_rmsnorm(g->cat + H, 2 * H, g->xb, H, g->mtp_norm_hid, nb, H, eps);
        mm(g->x, g->cat, &g->mtp_fc, nb, 0);
        int kind;
        layer_run(g, &g->mtp_layer, d, 0, nb, splits_for(g, d, nb, p, &kind));
        cuda_rmsnorm(g->xb, H, g->x, H, g->mtp_norm, nb, H, eps);
        cuda_find_nonfinite(g->bad, g->xb, nb, H);
        int first = INT_MAX;
        if (cuda_download(&first, g->bad, sizeof first, "the finiteness check", err, errlen) ||
            (lg_rows && logits_down(g, nb - lg_rows, lg_rows, all_logits ? logits + (size_t)off * V : logits, err,
                                    errlen)))
            return -1;
        if (hm && cuda_download(hm + (size_t)off * H, g->xb, (size_t)nb * H * 4, "the MTP states", err, errlen))
            return -1;
        if (cuda_sync("the MTP forward", err, errlen)) return -1;
        mkv->dev_len = p + nb;
        if (first != INT_MAX) {
            *bad = off + first;
            return 0;
        }
    }
    return 0;
}

int gpu_can_sample(const GpuModel *g) { return g->cfg.vocab_size <= CUDA_SAMPLE_MAX_VOCAB; }

int gpu_sample(GpuModel *g, const SampleDraw *sd, int *token, char *err, size_t errlen) {
    const int V = g->cfg.vocab_size;
    float *logits = g->last;
    if (!logits) {
        snprintf(err, errlen, "sampling on the GPU: no logits there (the last forward made none)");
        return -1;
    }
    if (!gpu_can_sample(g)) {
        snprintf(err, errlen, "sampling on the GPU: a vocabulary of %d tokens (it takes at most %d)", V,
                 CUDA_SAMPLE_MAX_VOCAB);
        return -1;
    }
    if (sd->n_pen < 0 || sd->n_pen > V) {
        snprintf(err, errlen, "sampling on the GPU: %d penalised tokens in a vocabulary of %d", sd->n_pen, V);
        return -1;
    }
    int pick[2];
    if ((sd->n_pen && cuda_upload(g->pen, sd->pen, 2 * (size_t)sd->n_pen * sizeof(int), "the penalised tokens", err,
                                  errlen)))
        return -1;
    /* the penalties change the logits in place: a second draw would see them twice */
    if (sd->n_pen) g->last = NULL;
    cuda_sample(g->pick, logits, V, g->prob, g->pen, sd->n_pen, sd->temperature, sd->top_k, sd->top_p, sd->min_p,
                sd->coin, sd->repeat, sd->frequency, sd->presence);
    if (cuda_download(pick, g->pick, sizeof pick, "the sampled token", err, errlen) ||
        cuda_sync("sampling", err, errlen))
        return -1;
    *token = pick[0];
    return 0;
}

#else /* a build without CUDA: opening says so (cuda_open), so nothing below it is reached */

static int no_cuda(char *err, size_t errlen) {
    CudaInfo info;
    return cuda_open(&info, err, errlen);
}
int gpu_model_open(GpuModel **g, const Model *m, int wmem, char *err, size_t errlen) {
    (void)wmem;
    *g = NULL;
    return gpu_supports(&m->cfg, NULL, err, errlen) ? -1 : no_cuda(err, errlen);
}
int gpu_model_random(GpuModel **g, const Config *c, int q8, unsigned long long seed, char *err, size_t errlen) {
    (void)c, (void)q8, (void)seed;
    *g = NULL;
    return no_cuda(err, errlen);
}
void gpu_model_free(GpuModel *g) { (void)g; }
int gpu_model_to_host(GpuModel *g, char *err, size_t errlen) {
    (void)g;
    return no_cuda(err, errlen);
}
void gpu_model_set_graphs(GpuModel *g, int on) { (void)g, (void)on; }
int gpu_kv_fill_random(KVCache *kv, int n, unsigned long long seed, char *err, size_t errlen) {
    (void)kv, (void)n, (void)seed;
    return no_cuda(err, errlen);
}
int gpu_profile(GpuModel *g, KVCache *kv, int reps, FILE *out, char *err, size_t errlen) {
    (void)g, (void)kv, (void)reps, (void)out;
    return no_cuda(err, errlen);
}
const char *gpu_model_device(const GpuModel *g) { (void)g; return "none"; }
size_t gpu_model_bytes(const GpuModel *g) { (void)g; return 0; }
size_t gpu_model_mapped_bytes(const GpuModel *g) { (void)g; return 0; }
size_t gpu_model_mem(const GpuModel *g) { (void)g; return 0; }
int gpu_kv_init(GpuModel *g, KVCache *kv, const KVSpec *spec, int ctx, int mtp, char *err, size_t errlen) {
    (void)g, (void)kv, (void)spec, (void)ctx, (void)mtp;
    return no_cuda(err, errlen);
}
int gpu_forward(GpuModel *g, KVCache *kv, const int *tokens, int n, float *logits, int all_logits, float *hidden,
                int *bad, char *err, size_t errlen) {
    (void)g, (void)kv, (void)tokens, (void)n, (void)logits, (void)all_logits, (void)hidden, (void)bad;
    return no_cuda(err, errlen);
}
int gpu_mtp_forward(GpuModel *g, KVCache *mkv, const float *hidden, const int *tokens, int n, float *logits,
                    int all_logits, float *hm, int *bad, char *err, size_t errlen) {
    (void)g, (void)mkv, (void)hidden, (void)tokens, (void)n, (void)logits, (void)all_logits, (void)hm, (void)bad;
    return no_cuda(err, errlen);
}
int gpu_trace_q(GpuModel *g, float *host, int rows, char *err, size_t errlen) {
    (void)g, (void)rows;
    return host ? no_cuda(err, errlen) : 0;
}
int gpu_kv_read_f32(const KVCache *kv, int layer, int head, int t0, int n, float *k, float *v, char *err,
                    size_t errlen) {
    (void)kv, (void)layer, (void)head, (void)t0, (void)n, (void)k, (void)v;
    return no_cuda(err, errlen);
}

int gpu_can_sample(const GpuModel *g) {
    (void)g;
    return 0;
}
int gpu_sample(GpuModel *g, const SampleDraw *sd, int *token, char *err, size_t errlen) {
    (void)g, (void)sd, (void)token;
    return no_cuda(err, errlen);
}

#endif
