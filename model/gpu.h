/* gpu.h: a Qwen3 model's forward pass on one CUDA GPU (-dev cuda).
 *
 * Data flow: run.c loads the model as for the CPU (weights mapped, not
 * relaid), then model_to_gpu (model.h) uploads every weight once into one
 * device arena in its stored dtype, or leaves the matrices where the
 * files are mapped for the GPU to read there (-wmem); from then on model_forward,
 * model_mtp_forward and model_kv_init come here. Per step only token ids
 * and the position go up, and the logits (or hidden states) a caller asks
 * for come down. The KV cache lives in device memory (f32 or f16 rows, q8 tiles,
 * attended in place by attn/attn.cu), hung on the KVCache (kv.h, dev).
 *
 *   tokens [n] -> embed -> layers (rmsnorm, q|k|v, q/k norm + RoPE + store,
 *   attention, o + residual, rmsnorm, gate|up, swiglu, down + residual)
 *   -> rmsnorm -> hidden [n, H] -> lm_head -> logits [n, V]
 *
 * A forward of up to 8 tokens (decode, speculative verification) is
 * captured once per token count, split count and cache as a CUDA graph
 * and replayed, so that a small model's step is not bound by launch
 * overhead; RUN_CUDA_GRAPHS=0 launches kernel by kernel instead (for
 * comparison). Every function returns 0, or -1 with one line in err.
 */
#ifndef GPU_H
#define GPU_H

#include <stddef.h>
#include <stdio.h>

#include "kv/kv.h"
#include "model/config.h"
#include "sample/sampler.h"

typedef struct Model Model;
typedef struct GpuModel GpuModel;

/* Whether a model of config c and a cache of spec (NULL: any) can run on
 * the GPU: 0, or -1 with a line naming what cannot (Gated DeltaNet
 * layers, a KV scheme without a CUDA kernel yet). Asks nothing of the
 * device. */
int gpu_supports(const Config *c, const KVSpec *spec, char *err, size_t errlen);
/* The scheme's part of that alone (the CLI checks it before any model is read). */
int gpu_supports_kv(const KVSpec *spec, char *err, size_t errlen);
/* The CUDA_KV_* format (kernels/cuda.h) of a scheme's name, -1 for one the
 * GPU does not take. */
int gpu_kv_fmt(const char *name);
/* Where the matrices live (-wmem): read in place from the checkpoint's
 * mapping (MAP), or uploaded once into device memory (COPY); AUTO maps on
 * a GPU that shares the system's memory and reads pageable memory (GB10,
 * Thor), and copies elsewhere: into HBM on a GH200, whose GPU would read
 * a mapping over NVLink-C2C at a tenth of its HBM's bandwidth, and on a
 * discrete card, whose GPU would read it over PCIe. */
enum { GPU_WMEM_AUTO, GPU_WMEM_MAP, GPU_WMEM_COPY };
/* Opens the device and puts m's weights (and its MTP module's) where wmem
 * says. Mapped, a matrix's rows are read where the checkpoint holds them
 * and give the same bits as a copy; one that cannot be (-wq q8 blocks, a
 * tensor the loader copied or aligned to fewer than 8 bytes) is copied,
 * as are the norms (f32 vectors the loader made). */
int gpu_model_open(GpuModel **g, const Model *m, int wmem, char *err, size_t errlen);
/* The shape of c with random bf16 weights made on the device (benchmarks:
 * no checkpoint needed), or q8 ones (q8 1: every matrix but the
 * embedding, as -wq q8 makes them); RoPE uses the plain theta frequencies. */
int gpu_model_random(GpuModel **g, const Config *c, int q8, unsigned long long seed, char *err, size_t errlen);
/* Moves a random bf16 model's matrices (gpu_model_random, q8 0) into host
 * memory that the GPU reads in place, as -wmem map reads a checkpoint:
 * q, k and v as three tensors, gate and up as two, the embedding (and a
 * tied lm_head) too; the norms stay on the device (benchmarks: decode
 * with -wmem map). */
int gpu_model_to_host(GpuModel *g, char *err, size_t errlen);
void gpu_model_free(GpuModel *g);
/* "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GB; integrated 0,
 * pageable 1, host page tables 0, read-only register 1)": the attributes
 * -wmem reads; the bytes the weights take in device
 * memory, and the bytes read where the checkpoint is mapped (-wmem). */
const char *gpu_model_device(const GpuModel *g);
size_t gpu_model_bytes(const GpuModel *g);
size_t gpu_model_mapped_bytes(const GpuModel *g);
/* The device's memory in bytes. */
size_t gpu_model_mem(const GpuModel *g);

/* Turns graph capture on or off (RUN_CUDA_GRAPHS sets it at open). */
void gpu_model_set_graphs(GpuModel *g, int on);

/* A cache of ctx positions (mtp: the MTP module's one layer) in device
 * memory, hung on kv (kv->dev); kv_cache_len/truncate/free then work on it. */
int gpu_kv_init(GpuModel *g, KVCache *kv, const KVSpec *spec, int ctx, int mtp, char *err, size_t errlen);

/* Fills kv's first n positions with random values and sets its length
 * to n (benchmarks: a long context without its prefill). */
int gpu_kv_fill_random(KVCache *kv, int n, unsigned long long seed, char *err, size_t errlen);

/* Times each op of a decode step alone (layer 0's, reps times back to
 * back at kv's length; the step's last row of the cache is written) and
 * the whole step, as a table of microseconds on out (benchmarks). */
int gpu_profile(GpuModel *g, KVCache *kv, int reps, FILE *out, char *err, size_t errlen);

/* model_forward on the GPU: tokens [n] at positions [len, len + n) of kv;
 * logits [n, V] (all_logits) or [V] of the last token, and hidden [n, H],
 * each copied back only when not NULL; the last token's logits always stay
 * on the device for gpu_sample. *bad: the first of the n rows whose hidden
 * state (after the final norm) is not all finite, or -1; the forward
 * stops after the chunk that holds it. */
int gpu_forward(GpuModel *g, KVCache *kv, const int *tokens, int n, float *logits, int all_logits, float *hidden,
                int *bad, char *err, size_t errlen);
/* -m kvstats: from the next gpu_forward on, each layer's queries (after
 * their norm and RoPE, as model.c's trace_q) go to host [layers][rows]
 * [n_heads * head_dim], the forward's token i in row i of its layer, and
 * the forwards run outside the captured graphs; a forward of more than
 * rows tokens fails. host NULL stops it. 0, or -1 with err. (Over a
 * polar4 cache the queries come rotated: its store rotates them in place.) */
int gpu_trace_q(GpuModel *g, float *host, int rows, char *err, size_t errlen);
/* Positions [t0, t0 + n) of an f32 cache's K and V streams of (cache
 * layer, kv head) into k and v [n, head_dim]. 0, or -1 with err. */
int gpu_kv_read_f32(const KVCache *kv, int layer, int head, int t0, int n, float *k, float *v, char *err,
                    size_t errlen);
/* The next token from the last row of the last gpu_forward's logits,
 * which stay on the device (only the id comes back): what sampler_sample
 * would pick with the same SampleDraw (sample/sampler.cu). Fails where
 * there are none: after a gpu_mtp_forward that made logits, a profile, a
 * failed forward, or a draw with penalties (which change them in place). */
int gpu_sample(GpuModel *g, const SampleDraw *sd, int *token, char *err, size_t errlen);
/* Whether gpu_sample takes this model's vocabulary (at most 2^18 tokens). */
int gpu_can_sample(const GpuModel *g);
/* model_mtp_forward on the GPU: hidden [n, H] rows in, the MTP cache mkv;
 * *bad as above, for the MTP states. */
int gpu_mtp_forward(GpuModel *g, KVCache *mkv, const float *hidden, const int *tokens, int n, float *logits,
                    int all_logits, float *hm, int *bad, char *err, size_t errlen);

#endif
