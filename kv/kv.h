/* kv.h: the KV cache and the one table every storage scheme fills in.
 *
 * Data flow: model/ projects k and v for a position, kv_stream_append stores
 * them in the scheme's own compressed format, and attn/ reads them back only
 * through the scheme's score / accumulate functions (or, as the reference
 * path, its dequantize function). No float copy of the cache exists.
 *
 * Unit of storage is a stream: the sequence of one kv head's K (or V)
 * vectors of one layer, positions 0..len-1, each of head_dim floats.
 *
 *   KVCache
 *   └── layer l (n_layers)
 *       ├── K streams [n_kv_heads]   scheme ks
 *       └── V streams [n_kv_heads]   scheme vs
 *   stream: | vec 0 | vec 1 | ... | vec cap-1 |   vec_bytes each (per-vector schemes)
 *
 * Schemes may work in a transformed "domain" (e.g. a Hadamard-rotated basis).
 * dequant, score and accum all work in that domain; attention rotates the
 * query into the K scheme's domain once (to_domain) and brings the output
 * back from the V scheme's domain once (from_domain). Identity when NULL.
 * The model follows ggml's type-traits idea: dequant is the mandatory
 * reference, score/accum are optional fast paths tested against it.
 */
#ifndef KV_H
#define KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct KVStream KVStream;

/* Deepest rollback a stream must support (speculative decoding drafts far
 * fewer); kv_stream_truncate refuses deeper ones. */
#define KV_MAX_ROLLBACK 64
/* score and accum must give each query the same bits whatever other
 * queries share the call, for nq up to this (past it a scheme may switch
 * kernels: the integer accumulates of q8 and tbq take at most 8). Prefill's
 * attention blocks rely on it (attn/attn.h), and
 * kv/queries_do_not_depend_on_their_neighbours holds every scheme to it. */
#define KV_MAX_NQ 8
/* Where a saved run of positions may begin (kv_stream_save): q8's tiles
 * hold 16 positions, and every other scheme's positions are independent
 * or, for KIVI, counted from len alone. */
#define KV_SAVE_ALIGN 16
/* The version of the schemes' stored forms that saved files hold: raised
 * whenever any scheme's layout or rounding changes, so that an older
 * build's files are refused rather than read (model_identity hashes it). */
#define KV_FORMAT 1
/* Largest head_dim a stream accepts (Qwen3 uses 128; 256 exists elsewhere). */
#define KV_MAX_DIM 512

/* Scheme options parsed from "-kv name:opt:opt", e.g. kivi2:g32:r128. */
typedef struct {
    int group;    /* KIVI group length G (0 = scheme default) */
    int residual; /* KIVI residual window R (0 = scheme default) */
} KVOpts;

typedef struct KVScheme {
    const char *name;
    const char *desc; /* one line for -h and tables */
    /* Bits per stored value for head dim d (incl. scales), for tables. */
    double (*bits)(int d, const KVOpts *o);
    /* 0 if the scheme can store vectors of head dim d; else -1 and one line in err. */
    int (*check)(int d, const KVOpts *o, char *err, size_t errlen);
    /* Allocates storage for cap positions. layer seeds per-layer transforms. */
    int (*init)(KVStream *s, char *err, size_t errlen);
    void (*free)(KVStream *s);
    /* Stores one vector x[d] at position s->len (caller increments nothing). */
    void (*append)(KVStream *s, const float *x);
    /* Drops positions >= n, for len - KV_MAX_ROLLBACK <= n <= len. Appending
     * afterwards must give the same stored state as if those positions had
     * never been appended (schemes with a float window keep what they need). */
    void (*truncate)(KVStream *s, int n);
    /* Reference read: position t, in the scheme's domain, out[d]. */
    void (*dequant)(const KVStream *s, int t, float *out);
    /* Optional domain change for queries (K streams) and outputs (V streams):
     * y[d] = R x, x[d] = R^T y. NULL means identity. */
    void (*to_domain)(const KVStream *s, const float *x, float *y);
    void (*from_domain)(const KVStream *s, const float *y, float *x);
    /* Optional fast path: out[i*ldo + (t-t0)] = q_i . k_t for i < nq, t in [t0,t1),
     * q[nq][d] already in the domain. */
    void (*score)(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo);
    /* Optional fast path: acc[i][d] += sum_t p[i*ldp + (t-t0)] * v_t, in the domain. */
    void (*accum)(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc);
    /* Bytes the stream holds for cap positions (what init allocated). */
    size_t (*bytes)(const KVStream *s);
    /* On AVX-512 VNNI (avx512vnni) some schemes score with the queries
     * rounded to 8-bit integers (vpdpbusd; lm3's to 14-bit words,
     * vpdpwssd), and q8, q4, q4h, tbq4, tbq3, tbq2 and polar4 do the same on
     * AVX2 (avx2, vpmaddubsw; KIVI too, its scaled queries rounded to
     * 16-bit words, vpmaddwd) and q8, q4, q4h, tbq4/3/2 and polar4 on
     * aarch64's dotprod (sdot), with the same integers. score_err bounds
     * what that adds beyond float rounding, as a share of ‖q‖·‖k‖;
     * score_int is the same integer arithmetic in plain C, which the
     * kernel matches bit for bit wherever a level runs it (returns -1
     * where a stream or query cannot take that path: other head dims,
     * non-finite queries; for KIVI V streams and a q·s or q·z that
     * overflows). 0 / NULL for float schemes. */
    float score_err;
    int (*score_int)(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo);
    /* Likewise for accum: on avx512vnni q8, tbq, polar4 and lm3, and on
     * avx2 q8, tbq4, tbq2 and polar4, round the weights p_t · scale to 16-bit
     * integers per span of positions (vpdpwssd, kv/pairs16.h; vpmaddwd on
     * AVX2); accum_err bounds what that adds, as a
     * share of Σ_t |p_t · v_t[j]|, and the tests hold the kernel to the
     * float reference within it. */
    float accum_err;
    /* 1 when an append can change how earlier positions read back (KIVI's
     * float window, quantized later). Such a scheme's truncate only moves
     * len, so a copy of the stream with len set back to n >= len -
     * KV_MAX_ROLLBACK reads as the stream did when it held n positions, and
     * settled(s, n) says where its reads stop changing: positions below it
     * read the same at length n and at every later length. Prefill's
     * attention blocks read those once for all their tokens, the rest
     * token by token as decode does (attn/attn.c). */
    int windowed;
    int (*settled)(const KVStream *s, int n);
    /* The stored form of positions [t0, len), t0 a multiple of
     * KV_SAVE_ALIGN, as kv_stream_save hands it out and kv_stream_load
     * takes it back (prefix reuse, saved sessions): loaded onto a stream
     * holding the same first t0 positions, it leaves that stream as this
     * one, byte for byte in everything a read or a later append sees.
     * A scheme gives one of two forms. span: positions [t0, t1) are the
     * bytes [span(t0), span(t1)) of data (span(len) covers a partly
     * filled tile), which kv.c copies. Else save_bytes, save and load, for
     * a stored form that is not one byte range (KIVI's float window):
     * save_bytes is what save writes for [t0, t1), computed from the
     * positions alone, so that a reader can check a size before loading;
     * load takes s from s->len to len. */
    size_t (*span)(const KVStream *s, int t);
    size_t (*save_bytes)(const KVStream *s, int t0, int t1);
    void (*save)(const KVStream *s, int t0, uint8_t *out);
    void (*load)(KVStream *s, int len, const uint8_t *in);
} KVScheme;

struct KVStream {
    const KVScheme *scheme;
    KVOpts opts;
    int d;      /* head_dim */
    int cap;    /* positions allocated */
    int len;    /* positions stored */
    int layer;  /* layer index, for per-layer transforms */
    int role;   /* 0 = K stream, 1 = V stream */
    uint8_t *data; /* scheme-owned storage */
    void *aux;     /* scheme-owned extra state (windows, rotations) */
};

/* A K scheme and a V scheme with their options, parsed from "-kv". */
typedef struct {
    const KVScheme *k, *v;
    KVOpts ko, vo;
} KVSpec;

typedef struct {
    KVSpec spec;
    int n_layers, n_kv, d, cap;
    KVStream *k; /* [n_layers * n_kv] */
    KVStream *v; /* [n_layers * n_kv] */
    /* Recurrent layers' per-sequence state (Gated DeltaNet), f32 whatever
     * the scheme: the model sizes, lays out and updates it, the cache owns
     * it. It is zero at position 0, so truncating to 0 zeroes it; a
     * recurrence cannot be taken back, so whoever truncates elsewhere
     * (speculative decoding) restores it. NULL for attention-only models. */
    float *state;
    size_t state_floats;
    /* A cache in GPU memory (model/gpu.c, -dev cuda) has no streams here
     * (k, v NULL): dev is the device side, dev_len its positions,
     * dev_bytes its size, dev_free what releases it. */
    void *dev;
    int dev_len;
    size_t dev_bytes;
    void (*dev_free)(void *dev);
} KVCache;

/* The registry, in the order tables list them. */
extern const KVScheme *const kv_schemes[];
extern const int kv_n_schemes;
const KVScheme *kv_find(const char *name);

/* Parses "name[:opts]" or "kname[:opts]/vname[:opts]"; llama.cpp's q8_0
 * and q4_0 name q8 and q4. A comma is refused: it separates specs in a
 * list (-m compare), which the caller splits. 0 ok, -1 + err line. */
int kv_spec_parse(const char *s, KVSpec *spec, char *err, size_t errlen);
/* Writes the canonical name of a spec ("q8", "q8/tbq4", "kivi2:g32:r128"). */
void kv_spec_name(const KVSpec *spec, char *out, size_t n);

/* role: 0 for a K stream, 1 for a V stream (schemes that store K and V
 * differently, e.g. KIVI, read it from s->role). */
int kv_stream_init(KVStream *s, const KVScheme *sc, const KVOpts *o, int d, int cap, int layer, int role,
                   char *err, size_t errlen);
void kv_stream_free(KVStream *s);
void kv_stream_append(KVStream *s, const float *x);
/* 0 ok; -1 when n is outside [len - KV_MAX_ROLLBACK, len]. n = 0 (reset) is
 * always allowed. */
int kv_stream_truncate(KVStream *s, int n);
/* Reference reads through dequant: used by tests, kvstats and the generic
 * attention path. kv_stream_get returns the ORIGINAL domain (un-rotated). */
void kv_stream_get(const KVStream *s, int t, float *out);
void kv_score_ref(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo);
void kv_accum_ref(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc);
/* Dispatch: the scheme's fast path when it has one, else the reference. */
void kv_score(const KVStream *s, const float *q, int nq, int t0, int t1, float *out, int ldo);
void kv_accum(const KVStream *s, const float *p, int ldp, int nq, int t0, int t1, float *acc);
void kv_to_domain(const KVStream *s, const float *x, float *y);
void kv_from_domain(const KVStream *s, const float *y, float *x);
/* The same with every value times a (attention's score scale, the softmax's
 * 1 / sum), in one pass where the domain is the identity. kv_to_domain_scaled
 * is bit for bit the rotation followed by the product; kv_from_domain_scaled
 * scales y in place first (attention's accumulator, scratch by then), then
 * rotates back, which may round differently from rotating first. */
void kv_to_domain_scaled(const KVStream *s, const float *x, float a, float *y);
void kv_from_domain_scaled(const KVStream *s, float *y, float a, float *x);

/* The stored form of positions [t0, len) (KVScheme.span / save above):
 * kv_stream_save_bytes(s, t0, t1) bytes, t0 <= t1 a multiple of
 * KV_SAVE_ALIGN, counted without reading the stream; kv_stream_save
 * writes those of [t0, s->len). kv_stream_load appends such bytes, saved
 * from a stream of the same scheme, options, head dim and role whose
 * first s->len positions were this one's, up to len: 0 ok, -1 when len
 * is below s->len or above cap, or s->len is not aligned. */
size_t kv_stream_save_bytes(const KVStream *s, int t0, int t1);
void kv_stream_save(const KVStream *s, int t0, uint8_t *out);
int kv_stream_load(KVStream *s, int len, const uint8_t *in);

int kv_cache_init(KVCache *c, const KVSpec *spec, int n_layers, int n_kv, int d, int cap,
                  char *err, size_t errlen);
void kv_cache_free(KVCache *c);
/* Positions stored (all streams agree). */
int kv_cache_len(const KVCache *c);
int kv_cache_truncate(KVCache *c, int n);
/* Bytes of the recurrent state (which does not grow with the context). */
size_t kv_cache_state_bytes(const KVCache *c);
size_t kv_cache_bytes(const KVCache *c);
/* A whole cache's stored form of positions [t0, len): every stream's
 * (layer by layer, kv head by kv head, K then V), then the recurrent state
 * as it stands at len. kv_cache_save_bytes counts it for len = t1;
 * kv_cache_save writes it for the cache's len. kv_cache_load takes a
 * cache of the same shape and spec from its len t0 (aligned) to len with
 * n such bytes: 0 ok, -1 with one line in err (a size that is not the
 * one expected, a len past cap, a cache on the GPU) and the cache
 * unchanged. */
size_t kv_cache_save_bytes(const KVCache *c, int t0, int t1);
int kv_cache_save(const KVCache *c, int t0, uint8_t *out, size_t n, char *err, size_t errlen);
int kv_cache_load(KVCache *c, int len, const uint8_t *in, size_t n, char *err, size_t errlen);
static inline KVStream *kv_k(KVCache *c, int layer, int h) { return &c->k[layer * c->n_kv + h]; }
static inline KVStream *kv_v(KVCache *c, int layer, int h) { return &c->v[layer * c->n_kv + h]; }

#endif
