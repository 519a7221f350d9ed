/* test_session.c: -m chat --session FILE through the real binary
 * ($RUN_BIN): a chat split over runs that save and reload the cache gives
 * the tokens one run gives (greedy, and seeded sampling), on the shipped
 * Qwen3 model and the hybrid Qwen3.5 fixture (its recurrent state is in
 * the file), over float, compressed and KIVI caches; a file that does not
 * fit the run is refused with one line and left as it was; a failed write
 * keeps the chat's text; --session outside chat is a usage error. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv/kvfile.h"
#include "tests/util.h"

#define QWEN3 "models/qwen3-kjv-mtp"
#define QWEN35 "tests/data/fixtures/qwen35"

static const char *bin(void) { return getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run"; }

/* A path of this test's own (each test runs in its own process). */
static void tmp(char *out, size_t n, const char *what) {
    snprintf(out, n, "/tmp/run_sess_%d_%s", (int)getpid(), what);
}

/* Runs `$RUN_BIN args` with the lines in input (NULL: none) on stdin;
 * returns the exit code, stdout and stderr malloc'd. */
static int run(const char *input, const char *args, char **out, char **err) {
    char in[128], po[128], pe[128], cmd[4096];
    tmp(in, sizeof in, "in"), tmp(po, sizeof po, "out"), tmp(pe, sizeof pe, "err");
    FILE *f = fopen(in, "wb");
    cr_assert(f);
    if (input) fputs(input, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s %s <%s >%s 2>%s", bin(), args, in, po, pe);
    int st = system(cmd);
    *out = slurp(po, NULL);
    *err = slurp(pe, NULL);
    remove(in), remove(po), remove(pe);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The lines of s that start with "error:". */
static int error_lines(const char *s) {
    int n = !strncmp(s, "error:", 6);
    for (const char *p = strchr(s, '\n'); p; p = strchr(p + 1, '\n')) n += !strncmp(p + 1, "error:", 6);
    return n;
}

/* Three messages over three runs that share a session file, against the
 * same three in one run: stdout must be the same bytes. */
static void expect_split_equals_whole(const char *model, const char *opts) {
    char f[128], a[1024], *o[4], *e[4];
    tmp(f, sizeof f, "chat.kv");
    remove(f);
    snprintf(a, sizeof a, "%s -m chat %s -i 'Who was Moses?' --session %s", model, opts, f);
    cr_assert_eq(run(NULL, a, &o[0], &e[0]), 0, "%s: %s", a, e[0]);
    cr_expect(strstr(e[0], "none yet, a new chat"), "%s", e[0]);
    snprintf(a, sizeof a, "%s -m chat %s -i 'And Aaron?' --session %s", model, opts, f);
    cr_assert_eq(run("Tell me more.\n", a, &o[1], &e[1]), 0, "%s: %s", a, e[1]);
    cr_expect(strstr(e[1], " restored\n") && strstr(e[1], " saved\n"), "%s", e[1]);
    snprintf(a, sizeof a, "%s -m chat %s -i 'Where?' --session %s", model, opts, f);
    cr_assert_eq(run(NULL, a, &o[2], &e[2]), 0, "%s: %s", a, e[2]);
    cr_expect(strstr(e[2], " restored\n"), "%s", e[2]);
    snprintf(a, sizeof a, "%s -m chat %s -i 'Who was Moses?'", model, opts);
    cr_assert_eq(run("And Aaron?\nTell me more.\nWhere?\n", a, &o[3], &e[3]), 0, "%s: %s", a, e[3]);
    size_t n0 = strlen(o[0]), n1 = strlen(o[1]), n2 = strlen(o[2]);
    char *split = malloc(n0 + n1 + n2 + 1);
    cr_assert(split);
    memcpy(split, o[0], n0), memcpy(split + n0, o[1], n1), memcpy(split + n0 + n1, o[2], n2 + 1);
    cr_expect_gt(n0 + n1 + n2, 4, "%s %s: no replies", model, opts);
    cr_expect_str_eq(split, o[3], "%s %s: over three runs vs in one", model, opts);
    free(split);
    for (int i = 0; i < 4; i++) free(o[i]), free(e[i]);
    remove(f);
}

/* Replies cut by -n leave their last token out of the cache, the drafter
 * (on by default: both models have an MTP head) has rows still to write,
 * and kivi2 keeps its newest positions in f32: all of it comes back. */
static void over_schemes(const char *model) {
    const char *kv[] = {"f32", "f16", "tbq4", "kivi2", "kivi2:g16:r16"};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++) {
        char o[128];
        snprintf(o, sizeof o, "-t 0 -n 8 -kv %s", kv[i]);
        expect_split_equals_whole(model, o);
    }
}

Test(session, qwen3_over_runs_is_one_run) { over_schemes(QWEN3); }

Test(session, qwen35_over_runs_is_one_run) { over_schemes(QWEN35); }

/* Without drafts, with penalties (their window is saved), past a full
 * context (turns dropped and fed again; replies that reach its end, their
 * last tokens decoded without drafts), and a system prompt. */
Test(session, penalties_full_context_and_system_prompt) {
    expect_split_equals_whole(QWEN3, "-t 0 -n 8 -kv q8 -spec 0 --repeat-penalty 1.5");
    expect_split_equals_whole(QWEN3, "-t 0 -n 30 -c 64 -kv f16 -spec 2 -y 'Be brief'");
    expect_split_equals_whole(QWEN3, "-t 0 -n -1 -c 64 -kv tbq4");
    expect_split_equals_whole(QWEN35, "-t 0 -n 30 -c 64 -kv tbq4 --presence-penalty 1");
    expect_split_equals_whole(QWEN35, "-t 0 -n -1 -c 64 -kv f16");
}

/* The sampler's generator goes on from the file unless -s is given: a
 * seeded chat over two runs is the seeded chat in one. */
Test(session, seeded_sampling_goes_on) {
    const char *models[] = {QWEN3, QWEN35};
    for (int m = 0; m < 2; m++) {
        char f[128], a[1024], *o[3], *e[3];
        tmp(f, sizeof f, "seed.kv");
        remove(f);
        snprintf(a, sizeof a, "%s -m chat -t 0.9 -n 12 -s 7 -i 'Who was Moses?' --session %s", models[m], f);
        cr_assert_eq(run(NULL, a, &o[0], &e[0]), 0, "%s", e[0]);
        snprintf(a, sizeof a, "%s -m chat -t 0.9 -n 12 -i 'And Aaron?' --session %s", models[m], f);
        cr_assert_eq(run(NULL, a, &o[1], &e[1]), 0, "%s", e[1]);
        snprintf(a, sizeof a, "%s -m chat -t 0.9 -n 12 -s 7 -i 'Who was Moses?'", models[m]);
        cr_assert_eq(run("And Aaron?\n", a, &o[2], &e[2]), 0, "%s", e[2]);
        size_t n0 = strlen(o[0]);
        cr_expect(!strncmp(o[2], o[0], n0) && !strcmp(o[2] + n0, o[1]), "%s: %s%s vs %s", models[m], o[0], o[1],
                  o[2]);
        for (int i = 0; i < 3; i++) free(o[i]), free(e[i]);
        remove(f);
    }
}

/* A file the run cannot continue: exit 1, one error line naming the
 * file, and the file's bytes as they were. */
static void expect_refused(const char *path, const char *opts, const char *says) {
    size_t n0, n1;
    char *before = slurp(path, &n0), a[1024], *o, *e;
    snprintf(a, sizeof a, "%s -m chat -t 0 -n 4 -i 'More' --session %s %s", QWEN3, path, opts);
    cr_expect_eq(run(NULL, a, &o, &e), 1, "%s: %s", a, e);
    cr_expect_eq(error_lines(e), 1, "%s: %s", a, e);
    cr_expect(strstr(e, path) && strstr(e, says), "%s: expected '%s': %s", a, says, e);
    cr_expect_str_empty(o, "%s: printed a reply: %s", a, o);
    char *after = slurp(path, &n1);
    cr_expect(n0 == n1 && !memcmp(before, after, n0), "%s: the file changed", a);
    free(before), free(after), free(o), free(e);
}

Test(session, refuses_what_does_not_fit_and_keeps_the_file) {
    char f[128], bad[128], a[1024], *o, *e;
    tmp(f, sizeof f, "tbq4.kv");
    tmp(bad, sizeof bad, "bad.kv");
    remove(f);
    snprintf(a, sizeof a, "%s -m chat -t 0 -n 4 -kv tbq4 -i 'Hi' --session %s", QWEN3, f);
    cr_assert_eq(run(NULL, a, &o, &e), 0, "%s", e);
    free(o), free(e);
    expect_refused(f, "-kv f16", "expected a -kv f16 cache, found tbq4");
    expect_refused(f, "-kv tbq4 -c 8", "raise -c");
    expect_refused(f, "-kv tbq4 -y 'Be brief'", "-y");
    expect_refused(f, "-kv tbq4 -wq q8", "another model's");
    size_t n;
    char *good = slurp(f, &n);
    /* one byte flipped in the middle, then the first half alone, then not ours */
    FILE *w = fopen(bad, "wb");
    good[n / 2] ^= 0x40;
    cr_assert(w && fwrite(good, 1, n, w) == n);
    fclose(w);
    expect_refused(bad, "-kv tbq4", "damaged");
    cr_assert((w = fopen(bad, "wb")) && fwrite(good, 1, n / 2, w) == n / 2);
    fclose(w);
    expect_refused(bad, "-kv tbq4", "truncated");
    cr_assert((w = fopen(bad, "wb")) && fputs("Who was Moses?\n", w) >= 0);
    fclose(w);
    expect_refused(bad, "-kv tbq4", "shorter than a header");
    free(good);
    remove(f), remove(bad);
}

/* A write that cannot happen: the chat's text is printed all the same,
 * one error line names the file, exit 1. */
Test(session, write_into_a_missing_folder_fails_after_the_chat) {
    char f[256], a[1024], *o, *e;
    tmp(f, sizeof f, "no/such/folder/chat.kv");
    snprintf(a, sizeof a, "%s -m chat -t 0 -n 6 -i 'Who was Moses?' --session %s", QWEN3, f);
    cr_expect_eq(run(NULL, a, &o, &e), 1, "%s", e);
    cr_expect_gt(strlen(o), 2, "the reply was not printed: %s", e);
    cr_expect_eq(error_lines(e), 1, "%s", e);
    cr_expect(strstr(e, "error: --session") && strstr(e, f) && strstr(e, "cannot write"), "%s", e);
    free(o), free(e);
}

Test(session, only_in_chat_and_on_the_cpu) {
    char *o, *e;
    cr_expect_eq(run(NULL, QWEN3 " -i 'Hi' -n 2 --session /tmp/run_sess_x.kv", &o, &e), 2, "%s", e);
    cr_expect(strstr(e, "--session") && strstr(e, "-m chat"), "%s", e);
    free(o), free(e);
    cr_expect_eq(run(NULL, QWEN3 " -m chat -i 'Hi' -dev cuda --session /tmp/run_sess_x.kv", &o, &e), 2, "%s", e);
    cr_expect(strstr(e, "--session") && strstr(e, "GPU"), "%s", e);
    free(o), free(e);
}

/* A session whose penalties' window holds an id the vocabulary does not
 * have (its check recomputed, as a hand-made file would have it) is
 * refused before anything is fed, naming the window. */
Test(session, refuses_foreign_token_ids) {
    char f[128], a[512], *o, *e;
    tmp(f, sizeof f, "ids.kv");
    remove(f);
    snprintf(a, sizeof a, QWEN3 " -m chat -n 4 -t 0 --repeat-penalty 1.1 -spec 0 -i 'Who was Moses?' --session %s", f);
    cr_assert_eq(run(NULL, a, &o, &e), 0, "%s", e);
    free(o), free(e);
    KVFileHead h;
    int *tok, np;
    void *parts[KVFILE_MAX_PARTS];
    size_t n[KVFILE_MAX_PARTS];
    char err[512];
    cr_assert_eq(kvfile_read(f, &h, &tok, KVFILE_MAX_PARTS, parts, n, &np, err, sizeof err), 0, "%s", err);
    /* the last part is the window (run.c, SESSION_WINDOW) */
    cr_assert(np >= 1 && n[np - 1] >= sizeof(int), "no penalties' window in the session");
    ((int *)parts[np - 1])[0] = 1 << 30;
    cr_assert_eq(kvfile_write(f, &h, tok, np, (const void *const *)parts, n, err, sizeof err), 0, "%s", err);
    free(tok);
    for (int i = 0; i < np; i++) free(parts[i]);
    snprintf(a, sizeof a, QWEN3 " -m chat -n 4 -t 0 --repeat-penalty 1.1 -spec 0 -i 'And Aaron?' --session %s", f);
    cr_expect_eq(run(NULL, a, &o, &e), 1, "%s", e);
    cr_expect(strstr(e, "penalties' window") && error_lines(e) == 1, "%s", e);
    cr_expect(o[0] == 0, "nothing is fed: %s", o);
    free(o), free(e);
    remove(f);
}
