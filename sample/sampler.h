/* sampler.h: picks the next token from a row of logits.
 *
 * Data flow: run.c hands the last position's logits [V] here after each
 * forward; the chosen id goes back into the model. Greedy when the
 * temperature is 0; otherwise temperature, then top-k, top-p (nucleus) and
 * min-p filters in that order (the order of Hugging Face's and llama.cpp's
 * default chains), then a draw from a seeded generator, so a seed
 * reproduces a run exactly.
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
    /* scratch [vocab] */
    float *prob;
    int *idx;
} Sampler;

int sampler_init(Sampler *s, int vocab, float temperature, int top_k, float top_p, float min_p, uint64_t seed);
void sampler_free(Sampler *s);
int sampler_argmax(const float *logits, int n);
/* The filtered distribution: writes probabilities into s->prob (zero for
 * tokens the filters removed). Used by sampling and by speculative checks. */
void sampler_dist(Sampler *s, const float *logits);
int sampler_sample(Sampler *s, const float *logits);
/* Uniform in [0, 1) from the sampler's generator. */
float sampler_uniform(Sampler *s);

#endif
