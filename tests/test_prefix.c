/* test_prefix.c: the saved form of a whole cache (kv_cache_save / load),
 * the files it is written in (kv/kvfile.c) and the chunk cache of exact
 * prefix reuse (kv/prefix.c), over caches of random vectors with a
 * recurrent state beside them, for schemes of each storage form. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/matmul.h"
#include "kv/kvfile.h"
#include "kv/prefix.h"
#include "model/model.h"

#define TEST_SEED 0x5eed0fc4a11ULL
#include "tests/util.h"

enum { LAYERS = 2, HEADS = 2, D = 64, STATE = 100, C = 32 };

static void open_cache(KVCache *c, const char *spec, int cap) {
    KVSpec sp;
    char err[256];
    cr_assert_eq(kv_spec_parse(spec, &sp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_cache_init(c, &sp, LAYERS, HEADS, D, cap, err, sizeof err), 0, "%s", err);
    c->state_floats = STATE;
    c->state = calloc(STATE, sizeof(float));
}

/* Position t of sequence `seq`: the same vectors for the same (seq, t),
 * and a state that is a function of the length. */
static void append_pos(KVCache *c, int seq, int t) {
    float x[D];
    for (int l = 0; l < LAYERS; l++)
        for (int h = 0; h < HEADS; h++) {
            for (int j = 0; j < D; j++) x[j] = sinf(0.37f * (float)(t * 131 + j * 7 + l * 3 + h) + (float)seq);
            kv_stream_append(kv_k(c, l, h), x);
            for (int j = 0; j < D; j++) x[j] = cosf(0.23f * (float)(t * 97 + j * 5 + l + h * 11) - (float)seq);
            kv_stream_append(kv_v(c, l, h), x);
        }
    for (int i = 0; i < STATE; i++) c->state[i] = (float)(t + 1) * 0.5f + (float)i + (float)seq;
}

static uint8_t *saved(const KVCache *c, size_t *n) {
    char err[256];
    *n = kv_cache_save_bytes(c, 0, kv_cache_len(c));
    uint8_t *b = malloc(*n + 1);
    cr_assert_eq(kv_cache_save(c, 0, b, *n, err, sizeof err), 0, "%s", err);
    return b;
}

static void expect_same(const KVCache *a, const KVCache *b, const char *what) {
    size_t na, nb;
    cr_assert_eq(kv_cache_len(a), kv_cache_len(b), "%s: lengths %d and %d", what, kv_cache_len(a), kv_cache_len(b));
    uint8_t *sa = saved(a, &na), *sb = saved(b, &nb);
    cr_expect(na == nb && memcmp(sa, sb, na) == 0, "%s: saved forms differ", what);
    free(sa);
    free(sb);
}

static const char *const specs[] = {"f16", "q8", "tbq4", "kivi2:g16:r32", "q8/kivi4"};

/* A cache built by loading chunks is the cache that computed them, for
 * every scheme form, with the state as it was at the last chunk's end;
 * then both go on alike. */
Test(prefix, load_gives_the_cache_that_stored) {
    int tokens[8 * C + 16];
    for (int i = 0; i < 8 * C + 16; i++) tokens[i] = i * 7 % 1000;
    for (size_t si = 0; si < sizeof specs / sizeof *specs; si++) {
        PrefixCache *p;
        char err[256], warn[512];
        cr_assert_eq(prefix_init(&p, 64 << 20, C, NULL, 42, err, sizeof err), 0, "%s", err);
        KVCache a, b;
        open_cache(&a, specs[si], 8 * C + 16);
        open_cache(&b, specs[si], 8 * C + 40);
        PrefixKey ka, kb;
        prefix_start(p, &a.spec, &ka);
        for (int t = 0; t < 8 * C + 16; t++) {
            append_pos(&a, 0, t);
            if ((t + 1) % C == 0) {
                prefix_store(p, &a, tokens, &ka, warn, sizeof warn);
                cr_expect_str_empty(warn);
            }
        }
        prefix_start(p, &b.spec, &kb);
        /* at most 8C + 16 tokens: 8 chunks, the 16 after them computed */
        cr_expect_eq(prefix_load(p, &b, tokens, 8 * C + 16, &kb, warn, sizeof warn), 8 * C, "%s", specs[si]);
        cr_expect_eq(kb.t, 8 * C);
        for (int i = 0; i < STATE; i++)
            cr_expect_eq(b.state[i], (float)(8 * C) * 0.5f + (float)i, "%s: state at the last chunk's end", specs[si]);
        for (int t = 8 * C; t < 8 * C + 16; t++) append_pos(&b, 0, t);
        expect_same(&a, &b, specs[si]);
        kv_cache_free(&a);
        kv_cache_free(&b);
        PrefixStats st;
        prefix_stats(p, &st);
        cr_expect_eq(st.hits, 8);
        cr_expect_eq(st.stored, 8);
        cr_expect_eq(st.reused, 8 * C);
        cr_expect_eq(st.n_schemes, 1);
        cr_expect_eq(st.bytes, st.scheme_bytes[0]);
        cr_expect_eq(prefix_free(p, warn, sizeof warn), 0);
    }
}

/* Only a true prefix matches: a token changed in chunk 2 stops the load
 * there; another scheme finds nothing; a load never takes the last
 * chunk when it ends at n (the caller's limit). */
Test(prefix, only_a_true_prefix_matches) {
    PrefixCache *p;
    char err[256], warn[512];
    cr_assert_eq(prefix_init(&p, 64 << 20, C, NULL, 42, err, sizeof err), 0, "%s", err);
    int tokens[4 * C], other[4 * C];
    for (int i = 0; i < 4 * C; i++) tokens[i] = other[i] = i;
    other[2 * C + 3] = 999;
    KVCache a, b;
    PrefixKey k;
    open_cache(&a, "tbq4", 4 * C);
    prefix_start(p, &a.spec, &k);
    for (int t = 0; t < 4 * C; t++) {
        append_pos(&a, 0, t);
        if ((t + 1) % C == 0) prefix_store(p, &a, tokens, &k, warn, sizeof warn);
    }
    open_cache(&b, "tbq4", 4 * C);
    prefix_start(p, &b.spec, &k);
    cr_expect_eq(prefix_load(p, &b, other, 4 * C, &k, warn, sizeof warn), 2 * C);
    kv_cache_free(&b);
    open_cache(&b, "tbq4", 4 * C);
    prefix_start(p, &b.spec, &k);
    cr_expect_eq(prefix_load(p, &b, tokens, 4 * C - 1, &k, warn, sizeof warn), 3 * C);
    kv_cache_free(&b);
    open_cache(&b, "q8", 4 * C);
    prefix_start(p, &b.spec, &k);
    cr_expect_eq(prefix_load(p, &b, tokens, 4 * C, &k, warn, sizeof warn), 0);
    kv_cache_free(&b);
    kv_cache_free(&a);
    prefix_free(p, warn, sizeof warn);
}

/* Within the budget, a prefix leaves memory from its end, so that what
 * stays is still a prefix that loads. */
Test(prefix, budget_evicts_from_the_end_of_a_prefix) {
    KVCache a;
    open_cache(&a, "f16", 6 * C);
    const size_t per = kv_cache_save_bytes(&a, 0, C) + C * sizeof(int);
    PrefixCache *p;
    char err[256], warn[512];
    cr_assert_eq(prefix_init(&p, 3 * per, C, NULL, 42, err, sizeof err), 0, "%s", err);
    int tokens[6 * C];
    for (int i = 0; i < 6 * C; i++) tokens[i] = i;
    PrefixKey k;
    prefix_start(p, &a.spec, &k);
    for (int t = 0; t < 6 * C; t++) {
        append_pos(&a, 0, t);
        if ((t + 1) % C == 0) prefix_store(p, &a, tokens, &k, warn, sizeof warn);
    }
    PrefixStats st;
    prefix_stats(p, &st);
    /* chunks 0-2 fill it; 3 goes in behind 2 and out at once; 4 and 5,
     * whose parents are gone, could never load and are not kept */
    cr_expect_eq(st.stored, 4);
    cr_expect_eq(st.evicted, 1);
    cr_expect_leq(st.bytes, 3 * per);
    KVCache b;
    open_cache(&b, "f16", 6 * C);
    prefix_start(p, &b.spec, &k);
    cr_expect_eq(prefix_load(p, &b, tokens, 6 * C, &k, warn, sizeof warn), 3 * C);
    kv_cache_free(&a);
    kv_cache_free(&b);
    prefix_free(p, warn, sizeof warn);
}

static void tmp_dir(char *out, size_t n) {
    snprintf(out, n, "/tmp/run-prefix-XXXXXX");
    cr_assert_not_null(mkdtemp(out));
}

static int count_files(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c '\\.kvc$'", dir);
    FILE *f = popen(cmd, "r");
    int n = 0;
    cr_assert_eq(fscanf(f, "%d", &n), 1);
    pclose(f);
    return n;
}

/* Chunks spilled when evicted and written at close come back from the
 * folder in a new cache (a restarted server), bit for bit; another
 * model's cache in the same folder sees none of them. */
Test(prefix, folder_outlives_the_cache) {
    char dir[64], err[256], warn[512];
    tmp_dir(dir, sizeof dir);
    KVCache a;
    open_cache(&a, "kivi2:g16:r32", 5 * C);
    /* KIVI's first chunk quantizes fewer values than the later ones */
    const size_t per = kv_cache_save_bytes(&a, C, 2 * C) + C * sizeof(int);
    PrefixCache *p;
    cr_assert_eq(prefix_init(&p, 2 * per, C, dir, 42, err, sizeof err), 0, "%s", err);
    int tokens[5 * C];
    for (int i = 0; i < 5 * C; i++) tokens[i] = 3 * i;
    PrefixKey k;
    prefix_start(p, &a.spec, &k);
    for (int t = 0; t < 5 * C; t++) {
        append_pos(&a, 1, t);
        if ((t + 1) % C == 0) {
            prefix_store(p, &a, tokens, &k, warn, sizeof warn);
            cr_expect_str_empty(warn);
        }
    }
    cr_expect_eq(count_files(dir), 3, "the evicted chunks are spilled");
    cr_expect_eq(prefix_free(p, warn, sizeof warn), 0, "%s", warn);
    cr_expect_eq(count_files(dir), 5);

    cr_assert_eq(prefix_init(&p, 64 << 20, C, dir, 42, err, sizeof err), 0, "%s", err);
    KVCache b;
    open_cache(&b, "kivi2:g16:r32", 5 * C);
    prefix_start(p, &b.spec, &k);
    cr_expect_eq(prefix_load(p, &b, tokens, 5 * C, &k, warn, sizeof warn), 5 * C);
    expect_same(&a, &b, "from the folder");
    PrefixStats st;
    prefix_stats(p, &st);
    cr_expect_eq(st.disk_reads, 5);
    prefix_free(p, warn, sizeof warn);
    kv_cache_free(&b);

    cr_assert_eq(prefix_init(&p, 64 << 20, C, dir, 43, err, sizeof err), 0, "%s", err);
    open_cache(&b, "kivi2:g16:r32", 5 * C);
    prefix_start(p, &b.spec, &k);
    cr_expect_eq(prefix_load(p, &b, tokens, 5 * C, &k, warn, sizeof warn), 0);
    cr_expect_str_empty(warn);
    prefix_free(p, warn, sizeof warn);
    kv_cache_free(&b);
    kv_cache_free(&a);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* A damaged or truncated chunk file is skipped with a line naming it, and
 * the chunks before it still load; nothing wrong is used. */
Test(prefix, damaged_files_are_skipped) {
    char dir[64], err[256], warn[512], cmd[512];
    tmp_dir(dir, sizeof dir);
    KVCache a;
    open_cache(&a, "q8", 3 * C);
    PrefixCache *p;
    cr_assert_eq(prefix_init(&p, 64 << 20, C, dir, 7, err, sizeof err), 0, "%s", err);
    int tokens[3 * C];
    for (int i = 0; i < 3 * C; i++) tokens[i] = i + 5;
    PrefixKey k;
    prefix_start(p, &a.spec, &k);
    uint64_t keys[3][2];
    for (int t = 0; t < 3 * C; t++) {
        append_pos(&a, 2, t);
        if ((t + 1) % C == 0) {
            prefix_store(p, &a, tokens, &k, warn, sizeof warn);
            memcpy(keys[t / C], k.h, sizeof k.h);
        }
    }
    prefix_free(p, warn, sizeof warn);
    for (int bad = 0; bad < 2; bad++) {
        /* chunk 1's file: one byte flipped in its K bytes, or cut short */
        snprintf(cmd, sizeof cmd, "%s/%016llx%016llx.kvc", dir, (unsigned long long)keys[1][0],
                 (unsigned long long)keys[1][1]);
        FILE *f = fopen(cmd, "r+b");
        cr_assert_not_null(f);
        if (bad == 0) {
            fseek(f, 600, SEEK_SET);
            int ch = fgetc(f);
            fseek(f, 600, SEEK_SET);
            fputc(ch ^ 1, f);
            fclose(f);
        } else {
            fclose(f);
            cr_assert_eq(truncate(cmd, 700), 0);
        }
        cr_assert_eq(prefix_init(&p, 64 << 20, C, dir, 7, err, sizeof err), 0, "%s", err);
        KVCache b;
        open_cache(&b, "q8", 3 * C);
        prefix_start(p, &b.spec, &k);
        cr_expect_eq(prefix_load(p, &b, tokens, 3 * C, &k, warn, sizeof warn), C);
        cr_expect(strstr(warn, bad == 0 ? "damaged" : "truncated") != NULL, "warn: %s", warn);
        cr_expect_eq(kv_cache_len(&b), C);
        kv_cache_free(&b);
        prefix_free(p, warn, sizeof warn);
    }
    kv_cache_free(&a);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* kv_cache_load refuses a blob of the wrong size, a cache without room,
 * and a cache that is not at an aligned length, and moves nothing. */
Test(prefix, cache_load_refusals) {
    KVCache a, b;
    char err[256];
    open_cache(&a, "tbq4", 64);
    open_cache(&b, "tbq4", 40);
    for (int t = 0; t < 48; t++) append_pos(&a, 0, t);
    size_t n;
    uint8_t *s = saved(&a, &n);
    cr_expect_eq(kv_cache_load(&b, 48, s, n, err, sizeof err), -1);
    cr_expect(strstr(err, "kv load") != NULL, "%s", err);
    cr_expect_eq(kv_cache_len(&b), 0);
    kv_cache_free(&b);
    open_cache(&b, "tbq4", 64);
    cr_expect_eq(kv_cache_load(&b, 48, s, n - 1, err, sizeof err), -1);
    cr_expect(strstr(err, "expected") != NULL, "%s", err);
    cr_expect_eq(kv_cache_load(&b, 48, s, n, err, sizeof err), 0, "%s", err);
    expect_same(&a, &b, "whole load");
    free(s);
    kv_cache_free(&a);
    kv_cache_free(&b);
}

/* The file format: a round trip, and refusals naming what is wrong. */
Test(prefix, kvfile_round_trip_and_refusals) {
    char dir[64], path[128], err[512];
    tmp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/x.kvc", dir);
    KVFileHead h = {.model = 99, .spec = "tbq4", .t0 = 16, .t1 = 20, .key = {1, 2}}, g;
    int tok[4] = {5, 6, 7, 8}, *rt;
    const char a[] = "hello", b[] = "world!";
    const void *parts[2] = {a, b};
    size_t sizes[2] = {5, 6}, rs[2];
    void *rp[2];
    int np;
    cr_assert_eq(kvfile_write(path, &h, tok, 2, parts, sizes, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvfile_read(path, &g, &rt, 2, rp, rs, &np, err, sizeof err), 0, "%s", err);
    cr_expect(np == 2 && rs[0] == 5 && rs[1] == 6 && !memcmp(rp[0], a, 5) && !memcmp(rp[1], b, 6));
    cr_expect(g.model == 99 && !strcmp(g.spec, "tbq4") && g.t0 == 16 && g.t1 == 20 && g.key[1] == 2);
    cr_expect(!memcmp(rt, tok, sizeof tok));
    free(rt), free(rp[0]), free(rp[1]);
    cr_expect_eq(kvfile_read(path, &g, &rt, 1, rp, rs, &np, err, sizeof err), -1);
    cr_expect(strstr(err, "parts") != NULL, "%s", err);
    cr_expect_eq(truncate(path, 150), 0);
    cr_expect_eq(kvfile_read(path, &g, &rt, 2, rp, rs, &np, err, sizeof err), -1);
    cr_expect(strstr(err, path) && strstr(err, "truncated"), "%s", err);
    FILE *f = fopen(path, "wb");
    fputs("not a cache at all, but long enough to hold a header of one hundred and twelve bytes ........", f);
    fputs("........................................", f);
    fclose(f);
    cr_expect_eq(kvfile_read(path, &g, &rt, 2, rp, rs, &np, err, sizeof err), -1);
    cr_expect(strstr(err, "magic") != NULL, "%s", err);
    snprintf(path, sizeof path, "%s/none/x.kvc", dir);
    cr_expect_eq(kvfile_write(path, &h, tok, 2, parts, sizes, err, sizeof err), -1);
    cr_expect(strstr(err, "cannot write") != NULL, "%s", err);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* On a real model: a prompt that shares chunks with one computed before
 * (its slices ending at chunk ends, as the server's do) loads them and
 * computes the rest, and gets the logits, cache bytes and recurrent state
 * a cold run of the whole prompt in one forward gets, bit for bit: on the
 * Qwen3 fixture and on the hybrid (whose state at a chunk's end is part
 * of the chunk), for schemes of each storage form. */
static void check_warm_equals_cold(const char *fixture, const char *scheme) {
    Model m;
    char dir[128], err[512], warn[512];
    snprintf(dir, sizeof dir, "tests/data/fixtures/%s", fixture);
    cr_assert_eq(model_load(&m, dir, 0, err, sizeof err), 0, "%s", err);
    KVSpec spec;
    cr_assert_eq(kv_spec_parse(scheme, &spec, err, sizeof err), 0, "%s", err);
    enum { N = 3 * C + 10, SHARED = 2 * C + 5 };
    int p1[N], p2[N];
    for (int i = 0; i < N; i++) {
        p1[i] = p2[i] = (i * 7919 + 13) % m.cfg.vocab_size;
        if (i >= SHARED) p2[i] = (i * 104729 + 1) % m.cfg.vocab_size;
    }
    const int V = m.cfg.vocab_size;
    float *cold = malloc((size_t)V * sizeof(float)), *warm = malloc((size_t)V * sizeof(float));
    PrefixCache *p;
    cr_assert_eq(prefix_init(&p, 256 << 20, C, NULL, model_identity(&m), err, sizeof err), 0, "%s", err);
    KVCache a, b, c;
    PrefixKey k;
    cr_assert_eq(model_kv_init(&m, &a, &spec, N, 0, err, sizeof err), 0, "%s", err);
    prefix_start(p, &spec, &k);
    for (int t = 0; t < N; t += C) {
        const int n = N - t < C ? N - t : C;
        cr_assert_eq(model_forward(&m, &a, p1 + t, n, NULL, 0, NULL, err, sizeof err), 0, "%s", err);
        if (n == C) {
            prefix_store(p, &a, p1, &k, warn, sizeof warn);
            cr_expect_str_empty(warn);
        }
    }
    cr_assert_eq(model_kv_init(&m, &b, &spec, N, 0, err, sizeof err), 0, "%s", err);
    prefix_start(p, &spec, &k);
    const int got = prefix_load(p, &b, p2, N - 1, &k, warn, sizeof warn);
    cr_expect_eq(got, 2 * C, "%s %s: the shared chunks", fixture, scheme);
    cr_assert_eq(model_forward(&m, &b, p2 + got, N - got, warm, 0, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_kv_init(&m, &c, &spec, N, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_forward(&m, &c, p2, N, cold, 0, NULL, err, sizeof err), 0, "%s", err);
    cr_expect(memcmp(warm, cold, (size_t)V * sizeof(float)) == 0, "%s %s: warm logits differ from cold", fixture,
              scheme);
    if (kv_cache_state_bytes(&b))
        cr_expect(memcmp(b.state, c.state, kv_cache_state_bytes(&b)) == 0, "%s %s: states differ", fixture, scheme);
    /* whole tiles only (N % 16 <= KV_MAX_ROLLBACK positions dropped): a
     * partly filled q8 tile's unwritten bytes are no one's */
    cr_assert_eq(kv_cache_truncate(&b, N - N % 16), 0);
    cr_assert_eq(kv_cache_truncate(&c, N - N % 16), 0);
    size_t n = kv_cache_save_bytes(&b, 0, N - N % 16);
    uint8_t *sb = malloc(n), *sc = malloc(n);
    cr_assert_eq(kv_cache_save(&b, 0, sb, n, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_cache_save(&c, 0, sc, n, err, sizeof err), 0, "%s", err);
    cr_expect(memcmp(sb, sc, n) == 0, "%s %s: caches differ", fixture, scheme);
    free(sb), free(sc), free(cold), free(warm);
    kv_cache_free(&a), kv_cache_free(&b), kv_cache_free(&c);
    prefix_free(p, warn, sizeof warn);
    model_free(&m);
}

Test(prefix, warm_equals_cold_on_qwen3) {
    const char *const sc[] = {"f32", "q8", "tbq4", "kivi2", "kivi2:g16:r32", "q8/kivi4"};
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) check_warm_equals_cold("small", sc[i]);
}

Test(prefix, warm_equals_cold_on_the_hybrid) {
    const char *const sc[] = {"f16", "tbq4", "kivi2:g16:r32"};
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) check_warm_equals_cold("qwen35", sc[i]);
}

/* A chunk larger than all of memory still goes to the folder, and so do
 * the chunks after it: a cache with room finds them all there. */
Test(prefix, chunks_past_the_budget_go_to_the_folder) {
    char dir[64], err[256], warn[512], cmd[128];
    tmp_dir(dir, sizeof dir);
    KVCache a, b;
    open_cache(&a, "f16", 3 * C);
    PrefixCache *p;
    cr_assert_eq(prefix_init(&p, 1000, C, dir, 5, err, sizeof err), 0, "%s", err);
    int tokens[3 * C];
    for (int i = 0; i < 3 * C; i++) tokens[i] = 2 * i + 1;
    PrefixKey k;
    prefix_start(p, &a.spec, &k);
    for (int t = 0; t < 3 * C; t++) {
        append_pos(&a, 3, t);
        if ((t + 1) % C == 0) {
            prefix_store(p, &a, tokens, &k, warn, sizeof warn);
            cr_expect_str_empty(warn);
        }
    }
    cr_expect_eq(count_files(dir), 3);
    prefix_free(p, warn, sizeof warn);
    cr_assert_eq(prefix_init(&p, 64 << 20, C, dir, 5, err, sizeof err), 0, "%s", err);
    open_cache(&b, "f16", 3 * C);
    prefix_start(p, &b.spec, &k);
    cr_expect_eq(prefix_load(p, &b, tokens, 3 * C, &k, warn, sizeof warn), 3 * C);
    expect_same(&a, &b, "from the folder");
    prefix_free(p, warn, sizeof warn);
    kv_cache_free(&a), kv_cache_free(&b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* A chunk whose stored form is not the size this build makes (another
 * build's file, its check intact) does not load: it is dropped, its file
 * removed, and the chunk computed next in its place is kept and loads. */
Test(prefix, a_chunk_that_does_not_load_gives_way) {
    char dir[64], err[256], warn[512], cmd[128], path[256];
    tmp_dir(dir, sizeof dir);
    KVCache a, b;
    open_cache(&a, "tbq4", C);
    PrefixCache *p;
    cr_assert_eq(prefix_init(&p, 64 << 20, C, dir, 5, err, sizeof err), 0, "%s", err);
    int tokens[C];
    for (int i = 0; i < C; i++) tokens[i] = i;
    PrefixKey k;
    prefix_start(p, &a.spec, &k);
    for (int t = 0; t < C; t++) append_pos(&a, 0, t);
    prefix_store(p, &a, tokens, &k, warn, sizeof warn);
    prefix_free(p, warn, sizeof warn);
    /* the same file with a part one byte short, its check recomputed */
    snprintf(path, sizeof path, "%s/%016llx%016llx.kvc", dir, (unsigned long long)k.h[0], (unsigned long long)k.h[1]);
    KVFileHead h;
    int *tok, np;
    void *part;
    size_t n;
    cr_assert_eq(kvfile_read(path, &h, &tok, 1, &part, &n, &np, err, sizeof err), 0, "%s", err);
    n--;
    const void *cp = part;
    cr_assert_eq(kvfile_write(path, &h, tok, 1, &cp, &n, err, sizeof err), 0, "%s", err);
    free(tok), free(part);
    cr_assert_eq(prefix_init(&p, 64 << 20, C, dir, 5, err, sizeof err), 0, "%s", err);
    open_cache(&b, "tbq4", C + 16);
    prefix_start(p, &b.spec, &k);
    cr_expect_eq(prefix_load(p, &b, tokens, C, &k, warn, sizeof warn), 0);
    cr_expect(strstr(warn, "did not load") != NULL, "%s", warn);
    cr_expect_eq(count_files(dir), 0, "the file that did not load is removed");
    prefix_start(p, &a.spec, &k);
    prefix_store(p, &a, tokens, &k, warn, sizeof warn);
    prefix_start(p, &b.spec, &k);
    cr_expect_eq(prefix_load(p, &b, tokens, C, &k, warn, sizeof warn), C);
    expect_same(&a, &b, "the chunk computed again");
    prefix_free(p, warn, sizeof warn);
    kv_cache_free(&a), kv_cache_free(&b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}
