/* prefix.c: the chunk cache of exact prefix reuse (prefix.h draws it).
 *
 * Chunks sit in a hash table by key and on a list from most to least
 * recently used; bytes counts their stored forms (and tokens), which the
 * budget bounds. A chunk's file in the folder is named by its key.
 */
#include "kv/prefix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/kvfile.h"

typedef struct Chunk {
    uint64_t key[2];
    int t1;                   /* its positions are [t1 - C, t1) */
    int *tokens;              /* [C] */
    uint8_t *blob;            /* kv_cache_save of its positions */
    size_t n;                 /* blob bytes */
    int scheme;               /* index in PrefixStats.scheme */
    int on_disk;              /* its file is in the folder already */
    int pinned;               /* in use by the load under way: not evicted */
    struct Chunk *newer, *older, *next_in_bucket;
} Chunk;

struct PrefixCache {
    int chunk;
    char *dir;
    uint64_t model;
    Chunk **buckets;          /* [n_buckets], a power of two */
    size_t n_buckets, count;
    Chunk *newest, *oldest;
    PrefixStats st;
};

int prefix_init(PrefixCache **pp, size_t budget, int chunk, const char *dir, uint64_t model, char *err, size_t errlen) {
    *pp = NULL;
    if (chunk < KV_SAVE_ALIGN || chunk > 1 << 16 || chunk % KV_SAVE_ALIGN) {
        snprintf(err, errlen, "--cache-chunk: expected a multiple of %d in [%d, 65536], found %d", KV_SAVE_ALIGN,
                 KV_SAVE_ALIGN, chunk);
        return -1;
    }
    struct stat st;
    /* errno of what failed, -1 for a path that is not a folder */
    const int bad = !dir ? 0 : stat(dir, &st) ? errno : !S_ISDIR(st.st_mode) ? -1 : access(dir, W_OK | X_OK) ? errno : 0;
    if (bad) {
        snprintf(err, errlen, "--cache-dir %s: expected a folder this process can write, found %s", dir,
                 bad < 0 ? "something else" : strerror(bad));
        return -1;
    }
    PrefixCache *p = calloc(1, sizeof *p);
    if (p) p->buckets = calloc(p->n_buckets = 1024, sizeof *p->buckets);
    if (p && dir) p->dir = strdup(dir);
    if (!p || !p->buckets || (dir && !p->dir)) {
        if (p) free(p->buckets), free(p->dir);
        free(p);
        snprintf(err, errlen, "out of memory for the prefix cache");
        return -1;
    }
    p->chunk = chunk;
    p->model = model;
    p->st.budget = budget;
    *pp = p;
    return 0;
}

int prefix_chunk(const PrefixCache *p) { return p->chunk; }

void prefix_start(const PrefixCache *p, const KVSpec *spec, PrefixKey *k) {
    char name[64];
    kv_spec_name(spec, name, sizeof name);
    uint64_t seed = kv_hash64(&p->model, sizeof p->model, (uint64_t)p->chunk);
    k->h[0] = kv_hash64(name, strlen(name), seed);
    k->h[1] = kv_hash64(name, strlen(name), ~seed);
    k->t = 0;
}

/* The key of k's prefix followed by one chunk of tokens. */
static void key_next(const PrefixCache *p, const PrefixKey *k, const int *tokens, uint64_t out[2]) {
    const size_t n = (size_t)p->chunk * sizeof *tokens;
    out[0] = kv_hash64(tokens, n, k->h[0]);
    out[1] = kv_hash64(tokens, n, k->h[1] ^ 0x5bd1e9955bd1e995ULL);
}

static Chunk **bucket(PrefixCache *p, const uint64_t key[2]) { return &p->buckets[key[0] & (p->n_buckets - 1)]; }

static Chunk *find(PrefixCache *p, const uint64_t key[2], const int *tokens) {
    for (Chunk *c = *bucket(p, key); c; c = c->next_in_bucket)
        if (c->key[0] == key[0] && c->key[1] == key[1] && !memcmp(c->tokens, tokens, (size_t)p->chunk * sizeof *tokens))
            return c;
    return NULL;
}

static void unlink_lru(PrefixCache *p, Chunk *c) {
    if (c->newer) c->newer->older = c->older;
    else p->newest = c->older;
    if (c->older) c->older->newer = c->newer;
    else p->oldest = c->newer;
    c->newer = c->older = NULL;
}

static void push_newest(PrefixCache *p, Chunk *c) {
    c->older = p->newest;
    c->newer = NULL;
    if (p->newest) p->newest->newer = c;
    p->newest = c;
    if (!p->oldest) p->oldest = c;
}

static size_t held_bytes(const PrefixCache *p, const Chunk *c) { return c->n + (size_t)p->chunk * sizeof(int); }

static void path_of(const PrefixCache *p, const uint64_t key[2], char *out, size_t n) {
    snprintf(out, n, "%s/%016llx%016llx.kvc", p->dir, (unsigned long long)key[0], (unsigned long long)key[1]);
}

/* Writes c to the folder unless it is there already; 0 ok, -1 with warn. */
static int spill(PrefixCache *p, Chunk *c, char *warn, size_t wlen) {
    if (!p->dir || c->on_disk) return 0;
    char path[4200];
    path_of(p, c->key, path, sizeof path);
    KVFileHead h = {.model = p->model, .t0 = c->t1 - p->chunk, .t1 = c->t1, .key = {c->key[0], c->key[1]}};
    snprintf(h.spec, sizeof h.spec, "%s", p->st.scheme[c->scheme]);
    const void *part = c->blob;
    if (kvfile_write(path, &h, c->tokens, 1, &part, &c->n, warn, wlen)) {
        p->st.disk_errors++;
        return -1;
    }
    p->st.disk_writes++;
    c->on_disk = 1;
    return 0;
}

static void chunk_free(Chunk *c) {
    free(c->tokens);
    free(c->blob);
    free(c);
}

/* Takes c out of memory without writing it. */
static void forget(PrefixCache *p, Chunk *c) {
    unlink_lru(p, c);
    Chunk **b = bucket(p, c->key);
    while (*b != c) b = &(*b)->next_in_bucket;
    *b = c->next_in_bucket;
    p->st.bytes -= held_bytes(p, c);
    p->st.scheme_bytes[c->scheme] -= held_bytes(p, c);
    p->count--;
    chunk_free(c);
}

/* Takes c out of memory (written to the folder first when there is one). */
static void evict(PrefixCache *p, Chunk *c, char *warn, size_t wlen) {
    spill(p, c, warn, wlen);
    p->st.evicted++;
    forget(p, c);
}

/* Drops a chunk that cannot be used (a stored form of another size than
 * this build's), from memory and from the folder, so that the chunk
 * computed next in its place is kept instead. */
static void discard(PrefixCache *p, Chunk *c) {
    if (p->dir) {
        char path[4200];
        path_of(p, c->key, path, sizeof path);
        unlink(path);
    }
    p->st.disk_errors++;
    forget(p, c);
}

/* The index of a scheme's name in the stats, added if new; when the
 * table is full, its last line counts every other scheme as "other"
 * (a client naming many option variants must not turn reuse off). */
static int scheme_index(PrefixCache *p, const char *name) {
    for (int i = 0; i < p->st.n_schemes; i++)
        if (!strcmp(p->st.scheme[i], name)) return i;
    if (p->st.n_schemes >= PREFIX_MAX_SCHEMES - 1) {
        if (p->st.n_schemes == PREFIX_MAX_SCHEMES - 1) {
            snprintf(p->st.scheme[PREFIX_MAX_SCHEMES - 1], sizeof p->st.scheme[0], "other");
            p->st.scheme_bytes[PREFIX_MAX_SCHEMES - 1] = 0;
            p->st.n_schemes = PREFIX_MAX_SCHEMES;
        }
        return PREFIX_MAX_SCHEMES - 1;
    }
    snprintf(p->st.scheme[p->st.n_schemes], sizeof p->st.scheme[0], "%s", name);
    p->st.scheme_bytes[p->st.n_schemes] = 0;
    return p->st.n_schemes++;
}

/* Puts c (key, t1, tokens, blob, n, on_disk set) in memory, as the
 * newest chunk or, given its parent, just older than it, then makes room
 * from the oldest end: a prefix leaves memory from its end, the new
 * chunk first when it is the oldest (spilled like any other). Returns c,
 * or NULL when it did not stay (freed). */
static Chunk *insert(PrefixCache *p, Chunk *c, Chunk *parent, const char *scheme, char *warn, size_t wlen) {
    c->scheme = scheme_index(p, scheme);
    if (held_bytes(p, c) > p->st.budget) {
        /* more than all of memory: it can still live in the folder */
        spill(p, c, warn, wlen);
        chunk_free(c);
        return NULL;
    }
    /* a table as long as its chunks keeps buckets short */
    if (p->count + 1 > p->n_buckets) {
        Chunk **nb = calloc(2 * p->n_buckets, sizeof *nb);
        if (nb) {
            for (size_t i = 0; i < p->n_buckets; i++)
                for (Chunk *x = p->buckets[i], *nx; x; x = nx) {
                    nx = x->next_in_bucket;
                    x->next_in_bucket = nb[x->key[0] & (2 * p->n_buckets - 1)];
                    nb[x->key[0] & (2 * p->n_buckets - 1)] = x;
                }
            free(p->buckets);
            p->buckets = nb;
            p->n_buckets *= 2;
        }
    }
    Chunk **b = bucket(p, c->key);
    c->next_in_bucket = *b;
    *b = c;
    if (!parent) push_newest(p, c);
    else {
        c->newer = parent;
        c->older = parent->older;
        if (parent->older) parent->older->newer = c;
        else p->oldest = c;
        parent->older = c;
    }
    p->count++;
    p->st.bytes += held_bytes(p, c);
    p->st.scheme_bytes[c->scheme] += held_bytes(p, c);
    p->st.stored++;
    /* a chunk read for a load under way stays (the load pins it) */
    if (!parent) c->pinned++;
    int gone = 0;
    while (p->st.bytes > p->st.budget) {
        Chunk *v = p->oldest;
        while (v && v->pinned) v = v->newer;
        if (!v) break;
        gone |= v == c;
        evict(p, v, warn, wlen);
    }
    if (!parent) c->pinned--;
    if (!gone && p->st.bytes > p->st.budget) evict(p, c, warn, wlen), gone = 1;
    return gone ? NULL : c;
}

/* A chunk not in memory, from its file: NULL when there is none or it
 * cannot be used (warn says why, unless it simply is not there). */
static Chunk *from_disk(PrefixCache *p, const uint64_t key[2], const char *scheme, int t1, const int *tokens,
                        char *warn, size_t wlen) {
    char path[4200], err[512];
    path_of(p, key, path, sizeof path);
    struct stat st;
    if (stat(path, &st)) return NULL;
    KVFileHead h;
    int *tok, np;
    void *part;
    size_t n;
    if (kvfile_read(path, &h, &tok, 1, &part, &n, &np, err, sizeof err)) {
        snprintf(warn, wlen, "prefix cache: skipped %s", err);
        p->st.disk_errors++;
        return NULL;
    }
    const char *why = h.model != p->model ? "another model's" : strcmp(h.spec, scheme) ? "another scheme's"
                      : h.t0 != t1 - p->chunk || h.t1 != t1 || np != 1 ? "for other positions"
                      : h.key[0] != key[0] || h.key[1] != key[1] || memcmp(tok, tokens, (size_t)p->chunk * sizeof *tok)
                          ? "for other tokens"
                          : NULL;
    Chunk *c = why ? NULL : calloc(1, sizeof *c);
    if (!c) {
        snprintf(warn, wlen, "prefix cache: skipped %s: %s", path, why ? why : "out of memory");
        p->st.disk_errors++;
        free(tok);
        if (np) free(part);
        return NULL;
    }
    *c = (Chunk){.key = {key[0], key[1]}, .t1 = t1, .tokens = tok, .blob = part, .n = n, .on_disk = 1};
    p->st.disk_reads++;
    return insert(p, c, NULL, scheme, warn, wlen);
}

int prefix_load(PrefixCache *p, KVCache *c, const int *tokens, int n, PrefixKey *k, char *warn, size_t wlen) {
    char scheme[64], err[512];
    kv_spec_name(&c->spec, scheme, sizeof scheme);
    warn[0] = 0;
    const int t_in = k->t;
    Chunk **used = malloc((size_t)(n / p->chunk + 1) * sizeof *used);
    int n_used = 0;
    if (!used) {
        snprintf(warn, wlen, "prefix cache: out of memory");
        return 0;
    }
    while (k->t + p->chunk <= n && k->t + p->chunk <= c->cap && kv_cache_len(c) == k->t) {
        uint64_t key[2];
        const int *tk = tokens + k->t;
        key_next(p, k, tk, key);
        Chunk *ch = find(p, key, tk);
        if (!ch && p->dir) ch = from_disk(p, key, scheme, k->t + p->chunk, tk, warn, wlen);
        if (!ch || ch->t1 != k->t + p->chunk) {
            p->st.misses++;
            break;
        }
        if (kv_cache_load(c, k->t + p->chunk, ch->blob, ch->n, err, sizeof err)) {
            snprintf(warn, wlen, "prefix cache: a chunk did not load and was dropped: %s", err);
            p->st.misses++;
            if (!ch->pinned) discard(p, ch);
            break;
        }
        p->st.hits++;
        k->h[0] = key[0], k->h[1] = key[1];
        k->t += p->chunk;
        ch->pinned++;
        used[n_used++] = ch;
    }
    /* touched newest last: the prefix's first chunks, which every later
     * one needs, stay longest */
    for (int i = n_used - 1; i >= 0; i--) used[i]->pinned--, unlink_lru(p, used[i]), push_newest(p, used[i]);
    free(used);
    p->st.reused += k->t - t_in;
    return k->t - t_in;
}

void prefix_store(PrefixCache *p, const KVCache *c, const int *tokens, PrefixKey *k, char *warn, size_t wlen) {
    char scheme[64], err[512];
    warn[0] = 0;
    const int t1 = k->t + p->chunk;
    uint64_t key[2];
    key_next(p, k, tokens + k->t, key);
    if (kv_cache_len(c) != t1) {
        snprintf(warn, wlen, "prefix cache: expected a cache of %d positions, found %d", t1, kv_cache_len(c));
        return;
    }
    Chunk *parent = k->t ? find(p, k->h, tokens + k->t - p->chunk) : NULL;
    const int orphan = k->t && !parent;
    k->h[0] = key[0], k->h[1] = key[1];
    k->t = t1;
    Chunk *have = find(p, key, tokens + t1 - p->chunk);
    if (have && have->n == kv_cache_save_bytes(c, t1 - p->chunk, t1) && have->t1 == t1) {
        unlink_lru(p, have);
        push_newest(p, have);
        return;
    }
    /* one that did not fit this cache gives way to the one computed now */
    if (have) discard(p, have);
    /* a chunk whose parent left memory loads only from the folder, where
     * it goes straight away; with no folder it could never load */
    if (orphan && !p->dir) return;
    kv_spec_name(&c->spec, scheme, sizeof scheme);
    Chunk *ch = calloc(1, sizeof *ch);
    size_t n = kv_cache_save_bytes(c, t1 - p->chunk, t1);
    if (ch) ch->tokens = malloc((size_t)p->chunk * sizeof *tokens), ch->blob = malloc(n + 1);
    if (!ch || !ch->tokens || !ch->blob) {
        if (ch) chunk_free(ch);
        snprintf(warn, wlen, "prefix cache: out of memory for a chunk of %zu bytes", n);
        return;
    }
    *ch = (Chunk){.key = {key[0], key[1]}, .t1 = t1, .tokens = ch->tokens, .blob = ch->blob, .n = n};
    memcpy(ch->tokens, tokens + t1 - p->chunk, (size_t)p->chunk * sizeof *tokens);
    if (kv_cache_save(c, t1 - p->chunk, ch->blob, n, err, sizeof err)) {
        snprintf(warn, wlen, "prefix cache: %s", err);
        chunk_free(ch);
        return;
    }
    if (!orphan) {
        insert(p, ch, parent, scheme, warn, wlen);
        return;
    }
    ch->scheme = scheme_index(p, scheme);
    char path[4200];
    struct stat st;
    path_of(p, ch->key, path, sizeof path);
    if (stat(path, &st)) spill(p, ch, warn, wlen);
    chunk_free(ch);
}

void prefix_stats(const PrefixCache *p, PrefixStats *s) { *s = p->st; }

int prefix_free(PrefixCache *p, char *warn, size_t wlen) {
    int bad = 0;
    warn[0] = 0;
    if (!p) return 0;
    for (Chunk *c = p->newest, *o; c; c = o) {
        o = c->older;
        bad |= spill(p, c, warn, wlen);
        chunk_free(c);
    }
    free(p->buckets);
    free(p->dir);
    free(p);
    return bad ? -1 : 0;
}
