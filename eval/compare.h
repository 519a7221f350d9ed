/* compare.h: KV schemes side by side on one model and one text.
 *
 * Data flow: run.c's `-m compare` and `-m kvstats` modes call these with a
 * loaded model and the text's token ids. compare runs the f32 reference and
 * every scheme in lockstep over the same tokens (each with its own cache),
 * scoring each chunk of logits against the reference as it goes, then lets
 * each continue greedily; kvstats follows one scheme layer by layer.
 */
#ifndef COMPARE_H
#define COMPARE_H

#include <stdio.h>

#include "model/model.h"

typedef struct {
    char name[64];
    const char *weights;      /* what this row's matmuls ran on: "stored", "q8" or "act bf16" */
    double k_bits, v_bits;    /* bits per stored value at this context */
    double bytes_per_token;   /* KV bytes per token, all layers */
    double ratio_f16;         /* f16 bytes / these bytes */
    double ppl, dppl_pct;     /* perplexity and its change vs f32, % */
    double kl;                /* mean KL(f32 || scheme) per position, nats */
    double top1;              /* fraction of positions with the same argmax as f32 */
    double greedy;            /* fraction of the greedy continuation equal to f32's */
    double decode_tps;        /* decode tokens/s at the text's context */
} CompareRow;

/* Runs specs[0..n) (spec 0 must be f32, the reference) over ids[0..n_ids)
 * with a context of ctx, then n_gen greedy tokens each. rows[n] out.
 * The reference runs on ref with its stored weights, the other specs on m:
 * ref itself, or the same checkpoint converted to what m_weights names
 * (-wq q8, or -act bf16's relaid weights and bf16 inputs), so a row's KL
 * then counts both that and the KV.
 * 0 ok; -1 with err. */
int compare_run(Model *ref, Model *m, const char *m_weights, const KVSpec *specs, int n, const int *ids, int n_ids,
                int ctx, int n_gen, CompareRow *rows, char *err, size_t errlen);
void compare_print(FILE *f, const CompareRow *rows, int n, const char *model, int n_ids);
/* Bits per value (K and V averaged) against KL, log scale, one labelled
 * point per row (named with its weights when not stored). */
int compare_svg(const char *path, const CompareRow *rows, int n, const char *title, char *err, size_t errlen);

/* Per layer: K and V cosine and relative error of the stored vectors, and
 * the relative error of the attention output, for one scheme against f32
 * on the same queries and keys. Prints a table on f. */
int kvstats_run(Model *m, const KVSpec *spec, const int *ids, int n_ids, FILE *f, char *err, size_t errlen);

#endif
