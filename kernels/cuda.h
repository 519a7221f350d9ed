/* cuda.h: the CUDA device, its memory, and the launchers of the GPU twins
 * of the CPU kernels (the .cu files in kernels/ and attn/), callable from C.
 *
 * Data flow: model/gpu.c opens the device, uploads the weights once and
 * runs the forward by calling these launchers on one stream; each mirrors
 * a C function that tests hold it to (named beside it). All launchers are
 * asynchronous: a launch error is recorded with the op's name, and
 * cuda_sync reports it, or an error the device raised while running, in
 * one line. Pointers named d_* are device memory.
 *
 * Built only where nvcc is (make CUDA=1, the default then); cuda_built()
 * and cuda_device_count() exist in every build so that callers need no
 * #ifdef: without CUDA they say so and count no device.
 */
#ifndef CUDA_H
#define CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What --version prints: "sm_80 sm_86 ..." of this build, or NULL when
 * the binary was built without CUDA. */
const char *cuda_built(void);
/* Usable CUDA devices: 0 on any error (no driver, no device, a build
 * without CUDA), never a failure. */
int cuda_device_count(void);

typedef struct {
    char name[256];
    int sm_count, cc_major, cc_minor;
    size_t mem_total; /* bytes */
    int integrated;   /* the GPU shares the system's memory (GB10, Thor, Jetson) */
    int pageable;     /* kernels may read pageable host memory (ATS, or HMM on x86) */
    int host_tables;  /* ... through the host's page tables (ATS: Grace, GB10) */
    int ro_register;  /* cudaHostRegisterReadOnly takes a read-only mapping */
} CudaInfo;

/* Opens device 0 and the stream every launcher runs on. 0 ok, -1 with one
 * line in err (no device, no driver, or a build without CUDA). */
int cuda_open(CudaInfo *info, char *err, size_t errlen);
/* Device memory of bytes for what (named in the error line with the bytes
 * free), NULL with err on failure. On an integrated GPU cudaMemGetInfo's
 * free figure counts the page cache as used (it reads MemFree), so there
 * the budget is the system's MemAvailable (/proc/meminfo, as llama.cpp
 * reads it there) less the weights the GPU reads where they are mapped
 * (cuda_host_map), and a request above it is refused before cudaMalloc,
 * which the kernel might otherwise grant by evicting or swapping. */
void *cuda_alloc(size_t bytes, const char *what, char *err, size_t errlen);
void cuda_free(void *d);
/* Where kernels read host memory [p, p + bytes) in place, p page-aligned
 * (a checkpoint file's read-only mapping): p itself where the GPU reads
 * pageable memory (info.pageable), else the device address of the range
 * registered read-only (cudaHostRegister, which pins its pages). NULL with
 * err naming why when neither works. On an integrated GPU the bytes so
 * mapped are kept out of cuda_alloc's budget. cuda_host_unmap(p, bytes)
 * undoes what cuda_host_map(p, bytes) did. */
const void *cuda_host_map(const void *p, size_t bytes, char *err, size_t errlen);
void cuda_host_unmap(const void *p, size_t bytes);
/* Host <-> device copies on the stream (synchronous for pageable memory).
 * 0 ok, -1 with err naming what. */
int cuda_upload(void *d_dst, const void *src, size_t bytes, const char *what, char *err, size_t errlen);
int cuda_download(void *dst, const void *d_src, size_t bytes, const char *what, char *err, size_t errlen);
int cuda_memset(void *d, int v, size_t bytes);
/* rows rows of width bytes, spitch bytes apart in src to dpitch apart in
 * dst, both on the device, queued on the stream; a failure shows at the
 * next cuda_sync. */
void cuda_copy_rows(void *d_dst, size_t dpitch, const void *d_src, size_t spitch, size_t width, int rows);
/* Waits for the stream; 0, or -1 with one line naming the op (the first
 * launch that failed, else where) and the CUDA error string. */
int cuda_sync(const char *where, char *err, size_t errlen);
/* Programmatic dependent launch between the decode step's kernels
 * (kernels/cuda_common.cuh), on by default where the GPU has it (9.0 and
 * up, running code compiled for 9.0 or later) unless RUN_CUDA_PDL=0;
 * returns whether it was on. Graphs keep what they were captured with. */
int cuda_set_pdl(int on);
/* Free and total device memory now. */
void cuda_mem(size_t *free_b, size_t *total_b);
/* The device's copy bandwidth in GB/s (bytes read plus bytes written, the
 * best of a few device-to-device copies of bytes), 0 on failure: the
 * roofline benchmarks compare against. */
double cuda_copy_gbps(size_t bytes);
/* Seconds between two points of the stream's work: cuda_timer_start, then
 * cuda_timer_stop waits for the stream and returns the time between. */
void cuda_timer_start(void);
double cuda_timer_stop(void);

/* CUDA graphs of the stream's work: cuda_graph_begin starts capturing,
 * cuda_graph_end instantiates what was captured into *graph (0 ok), and
 * cuda_graph_launch replays it. The captured kernels read positions and
 * token ids from device memory, so one graph serves every step of the
 * same shape (model/gpu.c keys them by token and split count). */
int cuda_graph_begin(char *err, size_t errlen);
int cuda_graph_end(void **graph, char *err, size_t errlen);
int cuda_graph_launch(void *graph, char *err, size_t errlen);
void cuda_graph_free(void *graph);

/* Weight element types on the device, as kernels/matmul.h's DType.
 * CUDA_Q8 is DT_Q8 (-wq q8) in one buffer, the codes then the scales:
 *   | int8 q [rows][cols] | f32 d [rows][cols / 32] |     w = q * d
 * so that the matrices a matmul reads together stack as one. */
enum { CUDA_F32 = 0, CUDA_F16 = 1, CUDA_BF16 = 2, CUDA_Q8 = 3 };
/* Bytes of one weight of dtype (a q8 code; its scale aside), and of a
 * [rows, cols] matrix of dtype on the device. */
static inline size_t cuda_dtype_bytes(int dtype) { return dtype == CUDA_F32 ? 4 : dtype == CUDA_Q8 ? 1 : 2; }
static inline size_t cuda_weight_bytes(int dtype, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    return n * cuda_dtype_bytes(dtype) + (dtype == CUDA_Q8 ? n / 32 * 4 : 0);
}

/* ---- kernels/ops.cu: twins of kernels/ops.c ---- */
/* x[i] = row tokens[i] of E [V, H] widened to f32, i < n (weight_row). */
void cuda_embed(float *d_x, const void *d_E, int dtype, const int *d_tokens, int n, int H);
/* y[i] = rmsnorm(x[i], w) for n rows of H, rows ldy and ldx floats apart
 * (rmsnorm; y may alias x). */
void cuda_rmsnorm(float *d_y, int ldy, const float *d_x, int ldx, const float *d_w, int n, int H, float eps);
/* The KV caches on the GPU, one stream per (layer, kv head) of cap
 * positions, as on the CPU (kv/f32.c, kv/f16.c, kv/q8.c, kv/tbq_common.h,
 * kv/q4.c, kv/q4h.c, kv/lm3.c):
 *   CUDA_KV_F32, CUDA_KV_F16  rows [cap, hd]
 *   CUDA_KV_Q8  tiles of 16 positions, |fp16 scales [hd/32][16]|codes [16 hd]|,
 *               K codes [hd/4][16][4 int8], V codes [8 pairs][hd][2 int8]
 *   CUDA_KV_TBQ2, _TBQ3, _TBQ4  one vector per position, hd / 128 blocks of
 *               |fp16 d|128 codes of b bits|, in the rotated domain; the
 *               positions rounded up to 32 (kv/tbq.cuh)
 *   CUDA_KV_Q4, _Q4H  one row of hd / 32 q4_0 blocks |fp16 d|16 bytes of
 *               nibbles| per position (q4h in the Hadamard domain), the
 *               positions rounded up to 32; hd 128 only (the attention's
 *               staging of 256-wide rows does not fit its shared memory)
 *   CUDA_KV_LM3  one vector per position, |fp32 r|hd 3-bit codes|, the
 *               positions rounded up to 32; hd 128 only (the codebook is
 *               tbq3's at 128 values)
 *   CUDA_KV_POLAR4  one vector per position, |fp32 γ|128 4-bit codes| in
 *               the domain of the layer's dense rotation R, the positions
 *               rounded up to 32; hd 128 only (the kernels rotate with one
 *               thread per column of R)
 * (tools/gpu-check.sh's NCU step names attention kernels by these values.) */
enum {
    CUDA_KV_F32, CUDA_KV_F16, CUDA_KV_Q8, CUDA_KV_TBQ2, CUDA_KV_TBQ3, CUDA_KV_TBQ4, CUDA_KV_Q4, CUDA_KV_Q4H, CUDA_KV_LM3,
    CUDA_KV_POLAR4
};
/* Bytes of one stream of cap positions. */
size_t cuda_kv_stream_bytes(int fmt, int hd, int cap);
/* Per token i < n at position pos + i (pos read from d_pos): every query
 * head of q [n, nh, hd] and key head of k [n, nkv, hd] RMSNormed with
 * qn / kn [hd] and NeoX-roped over its first rot dims with the tables
 * cs / sn [positions, rot / 2] (rmsnorm, rope); the keys and v [n, nkv, hd]
 * then stored at slot pos + i of the caches kc, vc [nkv streams] in format
 * fmt (f16 rounded to nearest even; q8 blocks as kv/q8.c's append, byte
 * for byte). Token i's rows of q, k and v start i * ld floats after their
 * first (one q|k|v matmul's output). A tbq, q4, q4h, lm3 or polar4 cache is
 * not stored here: the roped keys are written back over k, for its store
 * (cuda_tbq_store, cuda_q4_store, cuda_lm3_store, cuda_polar4_store). */
void cuda_qk_rope_store(float *d_q, float *d_k, const float *d_v, int ld, const float *d_qn,
                        const float *d_kn, const float *d_cs, const float *d_sn, void *d_kc, void *d_vc, int fmt,
                        const int *d_pos, int n, int nh, int nkv, int hd, int rot, int cap, float eps);
/* ---- kv/tbq.cu: twin of tbq_append ---- */
/* Token i's key k + i ld [nkv, hd] and value v + i ld rotated and coded
 * into slot pos + i (pos from d_pos) of the tbq caches kc, vc [nkv
 * streams] of format fmt, byte for byte as tbq_append codes them. */
void cuda_tbq_store(const float *d_k, const float *d_v, int ld, void *d_kc, void *d_vc, int fmt, const int *d_pos,
                    int n, int nkv, int hd, int cap);
/* ---- kv/q4.cu: twin of the q4 and q4h appends ---- */
/* The same for q4_0 caches of format fmt (CUDA_KV_Q4, CUDA_KV_Q4H), byte
 * for byte as kv/q4.c and kv/q4h.c code them. */
void cuda_q4_store(const float *d_k, const float *d_v, int ld, void *d_kc, void *d_vc, int fmt, const int *d_pos,
                   int n, int nkv, int hd, int cap);
/* ---- kv/lm3.cu: twin of lm3's append ---- */
void cuda_lm3_store(const float *d_k, const float *d_v, int ld, void *d_kc, void *d_vc, const int *d_pos, int n,
                    int nkv, int hd, int cap);
/* ---- kv/polar4.cu: twin of polar4's append ---- */
/* The same for a polar4 cache, rotated by d_rot [2, 128, 128] (R, then
 * Rᵀ: polar4_rotation's matrix of the cache layer, kv/polar4.h); and,
 * where d_q is not NULL, token i's queries d_q + i ld [nh, hd] rotated by
 * R in place, as cuda_attention takes them over a polar4 cache. */
void cuda_polar4_store(float *d_q, int nh, const float *d_k, const float *d_v, int ld, void *d_kc, void *d_vc,
                       const float *d_rot, const int *d_pos, int n, int nkv, int hd, int cap);

/* out [n, I] = silu(gate) * up for gu [n, 2I] holding gate i and up i at
 * 2i and 2i + 1, the output of the gate|up matmul over interleaved rows
 * (swiglu_ref). */
void cuda_swiglu(float *d_out, const float *d_gu, int n, int I);
/* count bf16 values uniform in [-scale, scale] from seed (benchmarks'
 * random weights), and count f32 ones. */
void cuda_fill_random(void *d_w, size_t count, unsigned long long seed, float scale);
/* A CUDA_Q8 matrix [rows, cols] of codes uniform in [-127, 127] from
 * seed and every scale scale / 127 (benchmarks' random -wq q8 weights). */
void cuda_fill_random_q8(void *d_w, int rows, int cols, unsigned long long seed, float scale);
void cuda_fill_ones(float *d_x, size_t count);
/* *out = the first row of x [n, width] holding a NaN or an infinity, or
 * INT_MAX (find_nonfinite). */
void cuda_find_nonfinite(int *d_out, const float *d_x, int n, int width);

/* ---- kernels/matmul.cu: twin of matmul_ref ---- */
/* Rows of x up to which a matmul streams W once (the decode form). */
#define CUDA_MATVEC_MAX 8
/* y [n, rows] = x [n, cols] W^T (add: y += x W^T), W [rows, cols] of
 * dtype, cols a multiple of 8 (of 32 for CUDA_Q8, whose W is always a
 * whole matrix: its scales lie rows * cols bytes on). Up to 8 rows of x
 * stream W once (decode, verification); more go through shared-memory
 * tiles (prefill). f32 sums throughout. */
void cuda_matmul(float *d_y, const float *d_x, const void *d_W, int dtype, int rows, int cols, int n, int add);

/* The decode form (n <= CUDA_MATVEC_MAX) with what surrounds a matmul in a layer taken
 * into the same pass: xmode 1 RMSNorms each row of x with nw and eps
 * first (what cuda_rmsnorm then cuda_matmul give, bit for bit); pair 1
 * reads W's rows as interleaved gate and up rows (2i, 2i + 1) and stores
 * y [n, rows / 2] = silu(gate) * up (what cuda_matmul then cuda_swiglu
 * give, bit for bit). */
void cuda_matvec(float *d_y, const float *d_x, int xmode, const float *d_nw, float eps, const void *d_W, int dtype,
                 int rows, int cols, int n, int pair, int add);

/* Both of the above are this one launch over a whole matrix. Its fields
 * also describe a part of one, which is how model/gpu.c reads a
 * checkpoint where it is mapped (-wmem map): q, k and v as three launches
 * into their columns of one output, gate and up from two tensors. Every
 * output's sum is the whole matrix's to the bit, because the launch's
 * shape (warps per row, the prefill kernel) follows shape_rows, the
 * whole matrix's rows, and a sum only ever meets its own row.
 *   W          rows [rows, cols] of dtype, row r at element r ld of w;
 *              pair (decode only): gate row i from w, up row i from w2
 *   y          output (token t, row r) at y[t ldy + r ys]
 *   q8         a whole matrix only: its scales follow its codes (above)
 *   narrow     W's rows are only 8-byte aligned: they are read in 8-byte
 *              loads (the same bytes, so the same sums) */
typedef struct {
    float *y;
    const float *x; /* [n, cols] */
    const void *w, *w2;
    size_t ld;
    int dtype, rows, cols, n, ldy, ys, shape_rows, pair, add, narrow;
    int xmode; /* decode only: RMSNorm each row of x with nw and eps first */
    const float *nw;
    float eps;
} CudaMatmul;
void cuda_matmul_run(const CudaMatmul *m);

/* ---- attn/attn.cu: twin of attn_group_ref over every cache above ---- */
/* Causal attention of n tokens at positions pos .. pos + n - 1 (pos from
 * d_pos) over the caches kc, vc [nkv streams] of one layer in format fmt, holding
 * positions 0 .. pos + n - 1: out [n, nh, hd] from q [n, nh, hd] (query
 * head h reads kv head h / (nh / nkv)). Split-K flash-decoding: each kv
 * head's positions are cut into splits, each split's partial softmax goes
 * to part (cuda_attn_part_floats), and the last split to finish merges
 * them, found by counters in count ([n * nkv] ints, zero before the first
 * call; every call leaves them zero).
 * Token i's queries start i * ldq floats after the first. Over a polar4
 * cache the queries come rotated by R (cuda_polar4_store) and d_rot is the
 * layer's rotation (the output is rotated back by its Rᵀ); other formats
 * take NULL. */
size_t cuda_attn_part_floats(int n, int nh, int hd, int splits);
/* Splits for n tokens over cap positions on sm_count SMs (at most 256;
 * 1 writes out directly). */
int cuda_attn_splits(int n, int nh, int nkv, int hd, int cap, int sm_count);
void cuda_attention(float *d_out, const float *d_q, int ldq, const void *d_kc, const void *d_vc, int fmt,
                    const float *d_rot, const int *d_pos, int n, int nh, int nkv, int hd, int cap, float scale, float *d_part,
                    int *d_count, int splits);

/* ---- sample/sampler.cu: twin of sampler_sample ---- */
/* The next token from logits [V] (V <= CUDA_SAMPLE_MAX_VOCAB), as
 * sampler_sample picks it with the same filters and coin (SampleDraw in
 * sample/sampler.h): out[0] the token, out[1] how many tokens had a
 * non-zero chance. The penalties change logits in place; prob [V] is
 * scratch; pen [2 n_pen] holds the distinct penalised tokens, then their
 * counts. */
#define CUDA_SAMPLE_MAX_VOCAB (1 << 18)
void cuda_sample(int *d_out, float *d_logits, int V, float *d_prob, const int *d_pen, int n_pen, float temperature,
                 int top_k, float top_p, float min_p, float coin, float repeat, float frequency, float presence);

#ifdef __cplusplus
}
#endif

#endif
