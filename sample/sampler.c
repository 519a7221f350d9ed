/* sampler.c: see sampler.h. */
#include "sample/sampler.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdlib.h>

int sampler_init(Sampler *s, int vocab, float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    s->min_p = min_p;
    s->rng = seed ? seed : 0x9E3779B97F4A7C15ULL;
    s->vocab = vocab;
    s->prob = malloc((size_t)vocab * sizeof(float));
    s->idx = malloc((size_t)vocab * sizeof(int));
    return s->prob && s->idx ? 0 : -1;
}

void sampler_free(Sampler *s) {
    free(s->prob);
    free(s->idx);
}

int sampler_argmax(const float *logits, int n) { return argmax(logits, n); }

float sampler_uniform(Sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (float)((s->rng * 0x2545F4914F6CDD1DULL) >> 40) / 16777216.0f;
}

static const float *g_prob; /* qsort has no context argument */
static int by_prob_desc(const void *a, const void *b) {
    float pa = g_prob[*(const int *)a], pb = g_prob[*(const int *)b];
    return pa < pb ? 1 : pa > pb ? -1 : (*(const int *)a - *(const int *)b);
}

void sampler_dist(Sampler *s, const float *logits) {
    const int n = s->vocab;
    float mx = logits[0], t = s->temperature > 0 ? s->temperature : 1;
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (s->prob[i] = expf((logits[i] - mx) / t));
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (s->top_k <= 0 && s->top_p >= 1 && s->min_p <= 0) return;
    /* Candidates: the top_k most probable (quickselect, so a 150K vocab is not
     * sorted per token), else all of them; then sorted, ties by id. */
    int m = n;
    for (int i = 0; i < n; i++) s->idx[i] = i;
    g_prob = s->prob;
    if (s->top_k > 0 && s->top_k < n) {
        int lo = 0, hi = n - 1, k = s->top_k;
        while (lo < hi) {
            int piv = s->idx[(lo + hi) / 2], i = lo, j = hi;
            while (i <= j) {
                while (by_prob_desc(&s->idx[i], &piv) < 0) i++;
                while (by_prob_desc(&s->idx[j], &piv) > 0) j--;
                if (i <= j) { int t = s->idx[i]; s->idx[i++] = s->idx[j]; s->idx[j--] = t; }
            }
            if (k - 1 <= j) hi = j;
            else if (k - 1 >= i) lo = i;
            else break;
        }
        m = k;
    }
    qsort(s->idx, (size_t)m, sizeof(int), by_prob_desc);
    for (int i = m; i < n; i++) s->prob[s->idx[i]] = 0;
    /* top-p on the distribution renormalised over the candidates, as HF and llama.cpp do */
    double mass = 0;
    for (int i = 0; i < m; i++) mass += s->prob[s->idx[i]];
    int keep = m;
    if (s->top_p < 1) {
        double c = 0;
        for (int i = 0; i < m; i++) {
            c += s->prob[s->idx[i]] / mass;
            if (c >= s->top_p) { keep = i + 1; break; }
        }
    }
    if (s->min_p > 0) {
        float floor_p = s->min_p * s->prob[s->idx[0]];
        int k = 1;
        while (k < keep && s->prob[s->idx[k]] >= floor_p) k++;
        keep = k;
    }
    double kept = 0;
    for (int i = 0; i < keep; i++) kept += s->prob[s->idx[i]];
    for (int i = keep; i < m; i++) s->prob[s->idx[i]] = 0;
    for (int i = 0; i < keep; i++) s->prob[s->idx[i]] = (float)(s->prob[s->idx[i]] / kept);
}

int sampler_sample(Sampler *s, const float *logits) {
    if (s->temperature <= 0) return sampler_argmax(logits, s->vocab);
    sampler_dist(s, logits);
    float r = sampler_uniform(s), c = 0;
    int last = 0;
    for (int i = 0; i < s->vocab; i++) {
        if (s->prob[i] <= 0) continue;
        c += s->prob[i];
        last = i;
        if (r < c) return i;
    }
    return last; /* rounding left r just above the total */
}
