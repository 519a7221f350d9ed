/* compare.h: KV schemes side by side on one model and one text.
 *
 * Data flow: run.c's `-m compare` and `-m kvstats` modes call these with a
 * loaded model and the text's token ids. compare runs the f32 reference and
 * every scheme in lockstep over the same tokens (each with its own cache),
 * scoring each chunk of logits against the reference as it goes, then lets
 * each continue greedily; its rows go to stdout as a table and, with -o, to
 * a file (eval/compare_out.c: SVG plot, CSV or JSON). kvstats follows one
 * scheme layer by layer.
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
 * then counts both that and the KV. progress (NULL: none) hears how many
 * of the run's token forwards are done, after each chunk.
 * 0 ok; -1 with err. */
typedef void (*CompareProgress)(void *ctx, long done, long total);
int compare_run(Model *ref, Model *m, const char *m_weights, const KVSpec *specs, int n, const int *ids, int n_ids,
                int ctx, int n_gen, CompareRow *rows, CompareProgress progress, void *pctx, char *err, size_t errlen);
void compare_print(FILE *f, const CompareRow *rows, int n, const char *model, int n_ids);

/* Files for the rows, by the name's extension (any case):
 *   .svg   the plot: bits per value (K and V averaged) against KL, both log
 *          scale, one labelled point per row (see compare_layout);
 *   .csv   a header row naming the fields, then one line per row with every
 *          field in CompareRow's order (RFC 4180 quoting, LF line ends);
 *   .json  {"title": ..., "rows": [{"name": ..., "weights": ..., ...}]}, the
 *          same field names.
 * Numbers are written in the shortest form that reads back as the same
 * double; a NaN or infinity is nan/inf in CSV and null in JSON. */
typedef enum { COMPARE_SVG, COMPARE_CSV, COMPARE_JSON } CompareFormat;

/* path's format, or -1 with one line in err naming path and the extensions.
 * Cheap: run.c can refuse a bad -o before the run. */
int compare_format(const char *path, char *err, size_t errlen);
/* Writes rows[0..n) to path in its format. title is the model's path; only
 * its last component (the folder's or file's name) is shown. The file is
 * written beside path under a temporary name and renamed over it when
 * complete, so a failed write leaves no file, and an existing one as it was.
 * 0 ok; -1 with one line in err. */
int compare_write(const char *path, const CompareRow *rows, int n, const char *title, char *err, size_t errlen);

/* The plot's layout in SVG user units (y grows downward), which the .svg
 * writer draws and the tests check. */
typedef struct {
    double x, y, w, h;
} CompareBox;

typedef struct {
    int shown;      /* 0 (not drawn): bits not in (0, 1e6] or |KL| not at most 1e6 (NaN, infinities) */
    int at_zero;    /* KL <= 0: the point sits on the bottom axis, KL 0 */
    double px, py;  /* the point's centre (a dot of radius COMPARE_DOT) */
    double tx, ty;  /* the label's text anchor and baseline */
    int anchor;     /* tx is the text's 0 start, 1 middle, 2 end (SVG text-anchor) */
    CompareBox box; /* the label's extent: text width estimated, with margin */
    int leader;     /* label set apart from its point: a line joins them */
    char text[128]; /* the label, unescaped */
} CompareLabel;

typedef struct {
    CompareBox area;          /* the frame; points and labels lie inside */
    double lb0, lb1;          /* log10 bits at its left and right edges (1-2-5 ticks) */
    double lk0, lk1;          /* log10 KL at y_log0 and at its top edge */
    double y_log0;            /* the bottom decade's line: above a strip for KL 0 when a row has one */
    int has_zero;             /* some row's KL is <= 0: the frame's bottom edge is KL 0 */
} ComparePlot;

#define COMPARE_DOT 4.0

/* Axes from the rows' ranges, points, and labels placed greedily: each
 * takes the first free place around its point (nearest first, farther
 * with a leader line), free meaning inside the frame, off every point and
 * every label or leader placed before it; where none is free (dozens of
 * rows in one spot), the place that overlaps least. labels[n] out.
 * 0 ok; -1 when out of memory. */
int compare_layout(const CompareRow *rows, int n, ComparePlot *plot, CompareLabel *labels);

/* Per layer: K and V cosine and relative error of the stored vectors, and
 * the relative error of the attention output, for one scheme against f32
 * on the same queries and keys. Prints a table on f. */
int kvstats_run(Model *m, const KVSpec *spec, const int *ids, int n_ids, FILE *f, char *err, size_t errlen);

#endif
