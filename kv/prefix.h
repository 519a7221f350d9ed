/* prefix.h: exact prefix reuse. A cache's stored form is kept in chunks of
 * a fixed number of positions, each found by a key that hashes every
 * token up to its end (with the model and the scheme), so that only a
 * true shared prefix matches; a new sequence whose tokens begin the same
 * way loads those chunks instead of computing them.
 *
 * Data flow: the server's engine (serve/engine.c) opens each sequence's
 * cache, calls prefix_load to fill its first positions from chunks held
 * here, computes the rest, and calls prefix_store each time the cache
 * reaches the end of a chunk of prompt (its prompt slices end there).
 * The bytes come from kv_cache_save and go back through kv_cache_load
 * (kv.h), which keeps the bits: a position's K and V and a hybrid model's
 * recurrent state do not depend on how the positions before were
 * computed, so a reused prefix gives what a cold run gives.
 *
 *   key(0) = H(model, scheme, chunk size)      key(j+1) = H(key(j), tokens of chunk j)
 *   chunk j: | key (128 bits) | tokens [C] | kv_cache_save of [jC, (j+1)C) |
 *
 * Memory is bounded (least recently used chunk out first; a load touches
 * the chunks it used newest-last, so a prefix's first chunks, which every
 * later one needs, leave after them). With a folder, a chunk that leaves
 * memory is written there (kv/kvfile.h), every chunk held is written
 * when the cache closes, and a chunk not in memory is looked for there:
 * the cache outlives the process. A file that cannot be used (another
 * model, damage, a full disk when writing) is skipped with a warning and
 * nothing else changes.
 */
#ifndef PREFIX_H
#define PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv.h"

typedef struct PrefixCache PrefixCache;

/* Where a sequence stands: the key of its tokens [0, t), t a multiple
 * of the chunk size. */
typedef struct {
    uint64_t h[2];
    int t;
} PrefixKey;

#define PREFIX_MAX_SCHEMES 32

typedef struct {
    long hits, misses;        /* chunk lookups that found one, and that did not */
    long reused;              /* positions loaded instead of computed */
    long stored, evicted;     /* chunks put in memory, and pushed out of it */
    long disk_reads, disk_writes, disk_errors;
    size_t bytes, budget;     /* held in memory, and its bound */
    int n_schemes;            /* bytes held per scheme (kv_spec_name) */
    char scheme[PREFIX_MAX_SCHEMES][64];
    size_t scheme_bytes[PREFIX_MAX_SCHEMES];
} PrefixStats;

/* budget: bytes of memory; chunk: positions per chunk, a multiple of
 * KV_SAVE_ALIGN; dir: a folder for spilled chunks or NULL; model:
 * model_identity. 0 ok, -1 with one line in err (a bad chunk size, a
 * folder that is not one or cannot be written). */
int prefix_init(PrefixCache **p, size_t budget, int chunk, const char *dir, uint64_t model, char *err, size_t errlen);
/* Writes every chunk held to the folder (when there is one), then frees.
 * 0 ok; -1 when some chunk could not be written, the last named in warn. */
int prefix_free(PrefixCache *p, char *warn, size_t wlen);
int prefix_chunk(const PrefixCache *p);
/* The key of the empty prefix of a cache in spec. */
void prefix_start(const PrefixCache *p, const KVSpec *spec, PrefixKey *k);
/* Loads onto c, which holds k->t positions of tokens, the chunks that
 * continue tokens [0, n) as far as they are held and end at n at most;
 * returns the positions loaded (k moves past them). A chunk file that
 * cannot be used is skipped and named in warn (else warn is ""). */
int prefix_load(PrefixCache *p, KVCache *c, const int *tokens, int n, PrefixKey *k, char *warn, size_t wlen);
/* c holds k->t + chunk positions, tokens [0, k->t + chunk): keeps the
 * last chunk's stored form unless it is held already, and moves k past
 * it. A failure (memory, a spill that cannot be written) is named in
 * warn; the cache stays as it was. */
void prefix_store(PrefixCache *p, const KVCache *c, const int *tokens, PrefixKey *k, char *warn, size_t wlen);
void prefix_stats(const PrefixCache *p, PrefixStats *s);

#endif
