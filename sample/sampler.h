/* sampler.h: picks the next token from a row of logits.
 *
 * Data flow: run.c hands the last position's logits [V] here after each
 * forward; the chosen id goes back into the model. Greedy when the
 * temperature is 0; otherwise temperature, then top-k, top-p (nucleus) and
 * min-p filters in that order (the order of Hugging Face's and llama.cpp's
 * default chains), then a draw from a seeded generator, so a seed
 * reproduces a run exactly. Before all of it, optionally, llama.cpp's
 * penalties on the tokens of a recent window (sampler_accept feeds it):
 * repeat (a token's logit l becomes l / r when l > 0, else l * r), then
 * frequency (minus f per occurrence) and presence (minus p once).
 */
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stdint.h>

typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t rng;      /* xorshift64* state, never 0 */
    int vocab;
    /* penalties: off while last_n is 0 */
    float repeat, frequency, presence;
    int last_n;        /* window length */
    int *hist;         /* [last_n] ring of the latest tokens */
    long n_seen;       /* tokens accepted so far */
    /* scratch [vocab] */
    float *prob;
    int *idx;
    float *pen_logits; /* the penalised logits */
    int *count;        /* occurrences in the window, zero between calls */
    int *pen;          /* [2 last_n]: a window's distinct tokens, then their counts */
} Sampler;

/* One draw's worth of a Sampler for a device that samples where the logits
 * are (model_sample): the filters, the coin sampler_sample would draw, and
 * the penalties as distinct tokens with their counts in the window. */
typedef struct {
    float temperature, top_p, min_p, coin;
    int top_k;
    float repeat, frequency, presence;
    int n_pen;          /* distinct tokens to penalise */
    const int *pen;     /* [2 n_pen]: the tokens, then their counts */
} SampleDraw;

int sampler_init(Sampler *s, int vocab, float temperature, int top_k, float top_p, float min_p, uint64_t seed);
void sampler_free(Sampler *s);
/* Turns the penalties on over the last last_n tokens (last_n 0, or repeat
 * 1, frequency and presence 0, leave them off). 0 ok, -1 out of memory. */
int sampler_set_penalties(Sampler *s, int last_n, float repeat, float frequency, float presence);
/* Whether penalties change anything: then a token's distribution depends
 * on the tokens before it, which speculative verification does not model. */
int sampler_penalizes(const Sampler *s);
/* Records a token of the context (prompt and generated) for the penalties. */
void sampler_accept(Sampler *s, int id);
int sampler_argmax(const float *logits, int n);
/* The filtered distribution: writes probabilities into s->prob (zero for
 * tokens the filters removed). Used by sampling and by speculative checks. */
void sampler_dist(Sampler *s, const float *logits);
int sampler_sample(Sampler *s, const float *logits);
/* Uniform in [0, 1) from the sampler's generator. */
float sampler_uniform(Sampler *s);
/* What sampler_sample would use for the next token, as a SampleDraw
 * (consumes its coin from the generator, as sampler_sample does). */
void sampler_draw(Sampler *s, SampleDraw *d);

#endif
