/* attn.c: online-softmax attention over a compressed KV stream.
 *
 * Data flow: run.c -> model -> attn -> kv -> kernels: model/ appends
 * ntok positions' k and v to one kv head's streams and calls attn_block
 * with that head's query group (token j's nq heads at q + j * ld, [nq, d]);
 * scores and value sums come from the kv/ scheme table (kv_score,
 * kv_accum), the running max and exponentials from kernels/ops.h; the
 * output, laid out as q, goes back to model/'s o_proj.
 *
 * Per kv head: rotate the queries into the K scheme's domain once (scale
 * folded in), then walk the positions in ATTN_CHUNK blocks: scores from the
 * scheme's score function, a running max m and denominator l per head
 * (Milakov & Gimelshein 2018, the FlashAttention recurrence), values summed
 * by the scheme's accumulate function in the V scheme's domain, and one
 * rotation back at the end. Nothing dequantizes the cache into a buffer.
 * A block of consecutive tokens shares each chunk's pass over K and V (the
 * scheme's score and accumulate take all their queries at once), and each
 * query's softmax runs over exactly the chunks and positions it would get
 * alone, the positions past its own weighted by exact zeros. A windowed
 * scheme (KIVI) shares only the chunks its later appends leave as they
 * read; the last ones, around its float window, go token by token.
 */
#include "attn/attn.h"
#include "kernels/flush.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


size_t attn_scratch_floats(int nq, int d) {
    /* qd [nq,d] + acc [nq,d] + p [nq,CHUNK] + m [nq] + l [nq], rounded up to
     * whole 64-byte lines so that threads' scratch laid end to end never
     * share one */
    return ((size_t)nq * (2 * (size_t)d + ATTN_CHUNK + 2) + 15) & ~(size_t)15;
}

/* One chunk [t0, t1) for nall queries (rotated qd [nall, d], running m, l,
 * acc [nall, d], scores p [nall, ATTN_CHUNK]), query i seeing positions
 * [0, end0 + i / nq): the scheme's scores, each query's softmax step over
 * what it sees, then the scheme's sums. */
static void attend_chunk(const KVStream *k, const KVStream *v, int t0, int t1, int nall, int nq, int end0,
                         const float *qd, float *p, float *m, float *l, float *acc) {
    const int d = k->d, n = t1 - t0;
    kv_score(k, qd, nall, t0, t1, p, ATTN_CHUNK);
    for (int i = 0; i < nall; i++) {
        /* this query sees positions [0, end): of this chunk, the first ni */
        const int end = end0 + i / nq, ni = end - t0 < n ? end - t0 : n;
        float *pi = p + (size_t)i * ATTN_CHUNK;
        if (ni <= 0) {
            memset(pi, 0, (size_t)n * sizeof(float));
            continue;
        }
        float cm = max_from(pi, ni, m[i]);
        /* rescale what was accumulated under the old max */
        float corr = expf(m[i] - cm);
        if (corr != 1.0f) {
            float *ai = acc + (size_t)i * d;
            for (int j = 0; j < d; j++) ai[j] *= corr;
        }
        l[i] = l[i] * corr + exp_sub_sum(pi, ni, cm);
        m[i] = cm;
        /* positions it does not see weigh exactly 0: acc gains exact zeros */
        memset(pi + ni, 0, (size_t)(n - ni) * sizeof(float));
    }
    kv_accum(v, p, ATTN_CHUNK, nall, t0, t1, acc);
}

/* Positions every token of a block reads alike: all of them, or for a
 * windowed scheme the ones settled when the block's first token (which
 * sees len0) was appended. */
static int shared_positions(const KVStream *s, int len0) {
    if (!s->scheme->windowed) return s->len;
    return s->scheme->settled ? s->scheme->settled(s, len0) : 0;
}

void attn_block(const KVStream *k, const KVStream *v, const float *q, int nq, int ntok, size_t ld, float scale,
                float *out, float *scratch) {
    const int d = k->d, len = k->len, nall = nq * ntok, len0 = len - ntok + 1;
    float *qd = scratch, *acc = qd + (size_t)nall * d, *p = acc + (size_t)nall * d;
    float *m = p + (size_t)nall * ATTN_CHUNK, *l = m + nall;
    const int ks = shared_positions(k, len0), vs = shared_positions(v, len0), shared = ks < vs ? ks : vs;
    /* Subnormals are flushed to zero (flush_on) until the end:
     * scores spread over more than 87 give weights below FLT_MIN, and a
     * scheme's scale times a weight can fall there too, and every subnormal
     * operand or result costs a microcode assist, enough to slow long
     * attention several times over (docs/kernel-notes.md#subnormals). What
     * they would add is below 1e-38 of the output. */
    const uint64_t fp = flush_on();
    /* query i is head i % nq of token i / nq */
    for (int i = 0; i < nall; i++) {
        kv_to_domain_scaled(k, q + (size_t)(i / nq) * ld + (size_t)(i % nq) * d, scale, qd + (size_t)i * d);
        m[i] = -INFINITY;
        l[i] = 0;
    }
    memset(acc, 0, (size_t)nall * d * sizeof(float));
    for (int t0 = 0; t0 < len; t0 += ATTN_CHUNK) {
        const int t1 = t0 + ATTN_CHUNK < len ? t0 + ATTN_CHUNK : len;
        if (t1 <= shared) {
            attend_chunk(k, v, t0, t1, nall, nq, len0, qd, p, m, l, acc);
            continue;
        }
        /* past the settled positions each token reads the streams as they
         * were right after its own append: a copy with that length, and
         * the chunk cut where its decode would cut it */
        for (int j = 0; j < ntok; j++) {
            if (t0 >= len0 + j) continue;
            KVStream kj = *k, vj = *v;
            kj.len = vj.len = len0 + j;
            const int tj = t0 + ATTN_CHUNK < kj.len ? t0 + ATTN_CHUNK : kj.len;
            const size_t i = (size_t)j * nq;
            attend_chunk(&kj, &vj, t0, tj, nq, nq, kj.len, qd + i * d, p + i * ATTN_CHUNK, m + i, l + i, acc + i * d);
        }
    }
    for (int i = 0; i < nall; i++) {
        kv_from_domain_scaled(v, acc + (size_t)i * d, 1.0f / l[i], out + (size_t)(i / nq) * ld + (size_t)(i % nq) * d);
    }
    flush_off(fp);
}

void attn_group(const KVStream *k, const KVStream *v, const float *q, int nq, float scale, float *out,
                float *scratch) {
    attn_block(k, v, q, nq, 1, 0, scale, out, scratch);
}

int attn_group_ref(const KVStream *k, const KVStream *v, const float *q, int nq, float scale, float *out) {
    const int d = k->d, len = k->len;
    float *s = malloc((size_t)(len ? len : 1) * sizeof(float)), *x = malloc((size_t)d * sizeof(float));
    if (!s || !x) {
        free(s), free(x);
        return -1;
    }
    for (int i = 0; i < nq; i++) {
        const float *qi = q + (size_t)i * d;
        float mx = -INFINITY, sum = 0;
        for (int t = 0; t < len; t++) {
            kv_stream_get(k, t, x);
            float a = 0;
            for (int j = 0; j < d; j++) a += qi[j] * x[j];
            s[t] = a * scale;
            mx = s[t] > mx ? s[t] : mx;
        }
        for (int t = 0; t < len; t++) sum += (s[t] = expf(s[t] - mx));
        float *oi = out + (size_t)i * d;
        memset(oi, 0, (size_t)d * sizeof(float));
        for (int t = 0; t < len; t++) {
            kv_stream_get(v, t, x);
            for (int j = 0; j < d; j++) oi[j] += s[t] / sum * x[j];
        }
    }
    free(s);
    free(x);
    return 0;
}
