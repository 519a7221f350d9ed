/* sampler.c: the next token from a row of logits (see sampler.h).
 *
 * Data flow: beside the main chain (run.c -> model -> attn -> kv ->
 * kernels): run.c and speculative/ pass the logits [V] of a position here after
 * model_forward; the chosen id is fed back to the model. In order:
 *
 *   logits [V] -> penalties (recent window) -> / temperature -> softmax
 *   -> top-k -> top-p -> min-p -> renormalise -> draw (xorshift64*)
 *   (temperature 0: argmax after the penalties)
 *
 * Penalties follow llama.cpp's; the filter chain the order of Hugging
 * Face's and llama.cpp's defaults. */
#include "sample/sampler.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int sampler_init(Sampler *s, int vocab, float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    s->min_p = min_p;
    s->rng = seed ? seed : 0x9E3779B97F4A7C15ULL;
    s->vocab = vocab;
    s->repeat = 1;
    s->frequency = s->presence = 0;
    s->last_n = 0;
    s->hist = s->count = s->pen = NULL;
    s->pen_logits = NULL;
    s->n_seen = 0;
    s->prob = malloc((size_t)vocab * sizeof(float));
    s->idx = malloc((size_t)vocab * sizeof(int));
    return s->prob && s->idx ? 0 : -1;
}

void sampler_free(Sampler *s) {
    free(s->prob);
    free(s->idx);
    free(s->pen);
    free(s->pen_logits);
    free(s->hist);
    free(s->count);
}

int sampler_set_penalties(Sampler *s, int last_n, float repeat, float frequency, float presence) {
    free(s->hist), free(s->count), free(s->pen), free(s->pen_logits);
    s->hist = s->count = s->pen = NULL, s->pen_logits = NULL;
    s->last_n = 0, s->n_seen = 0;
    s->repeat = repeat, s->frequency = frequency, s->presence = presence;
    if (last_n <= 0 || (repeat == 1 && frequency == 0 && presence == 0)) return 0;
    s->hist = malloc((size_t)last_n * sizeof(int));
    s->count = calloc((size_t)s->vocab, sizeof(int));
    s->pen = malloc(2 * (size_t)last_n * sizeof(int));
    s->pen_logits = malloc((size_t)s->vocab * sizeof(float));
    if (!s->hist || !s->count || !s->pen || !s->pen_logits) return -1;
    s->last_n = last_n;
    return 0;
}

int sampler_penalizes(const Sampler *s) { return s->last_n > 0; }

void sampler_accept(Sampler *s, int id) {
    if (!s->last_n) return;
    s->hist[s->n_seen++ % s->last_n] = id;
}

/* The window's distinct tokens in the order they were seen into pen [n],
 * their counts into pen [last_n ..]: n. count is left all zero. */
static int window_tokens(Sampler *s) {
    const int w = s->n_seen < s->last_n ? (int)s->n_seen : s->last_n;
    int n = 0;
    for (int i = 0; i < w; i++)
        if (s->hist[i] >= 0 && s->hist[i] < s->vocab) s->count[s->hist[i]]++;
    for (int i = 0; i < w; i++) {
        const int t = s->hist[i];
        if (t < 0 || t >= s->vocab || !s->count[t]) continue;
        s->pen[n] = t;
        s->pen[s->last_n + n++] = s->count[t];
        s->count[t] = 0; /* each token once */
    }
    return n;
}

/* logits with the penalties applied (s->pen_logits), or logits itself when off.
 * llama.cpp's order: repeat first, then frequency and presence. */
static const float *penalize(Sampler *s, const float *logits) {
    if (!s->last_n || !s->n_seen) return logits;
    memcpy(s->pen_logits, logits, (size_t)s->vocab * sizeof(float));
    const int n = window_tokens(s);
    for (int j = 0; j < n; j++) {
        const int t = s->pen[j];
        float l = s->pen_logits[t];
        l = l > 0 ? l / s->repeat : l * s->repeat;
        s->pen_logits[t] = l - (float)s->pen[s->last_n + j] * s->frequency - s->presence;
    }
    return s->pen_logits;
}

void sampler_draw(Sampler *s, SampleDraw *d) {
    d->temperature = s->temperature, d->top_k = s->top_k, d->top_p = s->top_p, d->min_p = s->min_p;
    d->repeat = s->repeat, d->frequency = s->frequency, d->presence = s->presence;
    d->n_pen = 0, d->pen = s->pen;
    if (s->last_n && s->n_seen) {
        d->n_pen = window_tokens(s);
        /* counts right after the tokens: [2 n_pen] as SampleDraw says */
        memmove(s->pen + d->n_pen, s->pen + s->last_n, (size_t)d->n_pen * sizeof(int));
    }
    d->coin = s->temperature > 0 ? sampler_uniform(s) : 0;
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
    logits = penalize(s, logits);
    if (s->temperature <= 0) return sampler_argmax(logits, s->vocab);
    sampler_dist(s, logits);
    /* the running sum in f64: an f32 one over a 150K vocabulary drifts by
     * 1e-4 of the mass, which would move every boundary after it */
    const float r = sampler_uniform(s);
    double c = 0;
    int last = 0;
    for (int i = 0; i < s->vocab; i++) {
        if (s->prob[i] <= 0) continue;
        c += s->prob[i];
        last = i;
        if (r < c) return i;
    }
    return last; /* rounding left r just above the total */
}
