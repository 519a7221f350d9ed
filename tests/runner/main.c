/* main.c: a plain test runner for the tests' Criterion subset
 * (tests/runner/criterion/criterion.h), for machines where Criterion does
 * not run, such as aarch64 under qemu-user (docs/arm.md).
 *
 *   test_plain [--verbose] [-j N] [--filter GLOB]... [--exclude GLOB]...
 *              [--timeout S] [--timeout-scale X] [--list]
 *
 * Tests run sorted by suite, then name, each in a forked process (one at a
 * time, or N side by side with -j N): the suite's init, the test's init,
 * the test, the test's fini, the suite's fini. A test's .timeout times
 * --timeout-scale X (emulation is slow), or --timeout S for a test without
 * one, is an alarm in that process; past it the test is killed and counted
 * as crashing. GLOBs match "suite/name" (fnmatch). Output is Criterion's:
 * failures as they happen, [PASS] lines with --verbose, and a synthesis
 * line; the exit code is 0 when no test failed or crashed. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>

#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A child's exit codes: passed, failed, skipped. */
enum { CHILD_PASS = 0, CHILD_FAIL = 1, CHILD_SKIP = 77 };

static struct crr_test *tests;
static struct crr_suite *suites;
static int failed;      /* in the child: some check failed */
static jmp_buf test_end; /* in the child: where cr_assert and cr_skip_test go */
static int in_test;      /* in the child: test_end is set */
static int skipped;

void crr_register(struct crr_test *t) {
    t->next = tests;
    tests = t;
}

void crr_register_suite(struct crr_suite *s) {
    s->next = suites;
    suites = s;
}

void crr_fail(int fatal, const char *file, int line, const char *expr, const char *fmt, ...) {
    (void)fatal;
    failed = 1;
    fprintf(stderr, "[----] %s:%d: Assertion Failed\n[----]   %s\n", file, line, expr);
    if (fmt[0]) {
        va_list ap;
        va_start(ap, fmt);
        fputs("[----]   ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    fflush(stderr);
}

void crr_abort(void) {
    if (in_test) longjmp(test_end, 1);
    _exit(CHILD_FAIL); /* an assert in init or fini */
}

void crr_skip(const char *fmt, ...) {
    if (fmt[0]) {
        va_list ap;
        va_start(ap, fmt);
        fputs("[SKIP] ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    skipped = 1;
    crr_abort();
}

void crr_log(const char *tag, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs(tag, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
}

static const struct crr_suite *suite_of(const struct crr_test *t) {
    for (const struct crr_suite *s = suites; s; s = s->next)
        if (strcmp(s->name, t->suite) == 0) return s;
    return NULL;
}

/* The test's body, which cr_assert and cr_skip_test leave by longjmp. */
static void run_body(void (*fn)(void)) {
    if (!setjmp(test_end)) {
        in_test = 1;
        fn();
    }
    in_test = 0;
}

/* In the child: the test between its inits and finis; never returns. */
static void run_child(const struct crr_test *t, unsigned alarm_s) {
    const struct crr_suite *s = suite_of(t);
    if (alarm_s) alarm(alarm_s);
    if (s && s->extra.init) s->extra.init();
    if (t->extra.init) t->extra.init();
    run_body(t->fn);
    if (t->extra.fini) t->extra.fini();
    if (s && s->extra.fini) s->extra.fini();
    fflush(NULL);
    _exit(skipped ? CHILD_SKIP : failed ? CHILD_FAIL : CHILD_PASS);
}

static int by_name(const void *a, const void *b) {
    const struct crr_test *x = *(const struct crr_test *const *)a, *y = *(const struct crr_test *const *)b;
    const int c = strcmp(x->suite, y->suite);
    return c ? c : strcmp(x->name, y->name);
}

static int matches(const char *const *globs, int n, const char *id) {
    for (int i = 0; i < n; i++)
        if (fnmatch(globs[i], id, 0) == 0) return 1;
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    pid_t pid;
    const struct crr_test *t;
    double start, limit;
} Running;

static void usage(void) {
    fprintf(stderr, "usage: test_plain [--verbose] [-j N] [--filter GLOB]... [--exclude GLOB]... [--timeout S]\n"
                    "                  [--timeout-scale X] [--list]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *filters[64], *excludes[64];
    int nf = 0, ne = 0, verbose = 0, list = 0, jobs = 1;
    double def_timeout = 0, scale = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--verbose")) verbose = 1;
        else if (!strcmp(a, "--list")) list = 1;
        else if (!strcmp(a, "-j") && i + 1 < argc) jobs = atoi(argv[++i]);
        else if (!strncmp(a, "-j", 2) && a[2]) jobs = atoi(a + 2);
        else if (!strcmp(a, "--filter") && i + 1 < argc && nf < 64) filters[nf++] = argv[++i];
        else if (!strcmp(a, "--exclude") && i + 1 < argc && ne < 64) excludes[ne++] = argv[++i];
        else if (!strcmp(a, "--timeout") && i + 1 < argc) def_timeout = atof(argv[++i]);
        else if (!strcmp(a, "--timeout-scale") && i + 1 < argc) scale = atof(argv[++i]);
        else usage();
    }
    if (jobs < 1) jobs = 1;
    int n = 0;
    for (struct crr_test *t = tests; t; t = t->next) n++;
    const struct crr_test **all = malloc(sizeof *all * (n ? n : 1));
    n = 0;
    for (struct crr_test *t = tests; t; t = t->next) {
        char id[512];
        snprintf(id, sizeof id, "%s/%s", t->suite, t->name);
        if ((nf && !matches(filters, nf, id)) || matches(excludes, ne, id) || t->extra.disabled) continue;
        all[n++] = t;
    }
    qsort(all, n, sizeof *all, by_name);
    if (list) {
        for (int i = 0; i < n; i++) printf("%s/%s\n", all[i]->suite, all[i]->name);
        return 0;
    }
    fprintf(stderr, "[----] plain runner (tests/runner): %d tests, %d at a time\n", n, jobs);
    int passing = 0, failing = 0, crashing = 0, skips = 0, next = 0, live = 0;
    Running *run = calloc((size_t)jobs, sizeof *run);
    const double t0 = now();
    while (next < n || live) {
        /* start tests while there is room */
        while (next < n && live < jobs) {
            const struct crr_test *t = all[next++];
            const double limit = t->extra.timeout > 0 ? t->extra.timeout * scale : def_timeout;
            fflush(NULL);
            const pid_t pid = fork();
            if (pid < 0) {
                perror("fork");
                return 1;
            }
            if (pid == 0) run_child(t, limit > 0 ? (unsigned)ceil(limit) : 0);
            for (int k = 0; k < jobs; k++)
                if (!run[k].pid) {
                    run[k] = (Running){pid, t, now(), limit};
                    break;
                }
            live++;
        }
        int st;
        const pid_t pid = waitpid(-1, &st, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            perror("waitpid");
            return 1;
        }
        int k = 0;
        while (k < jobs && run[k].pid != pid) k++;
        if (k == jobs) continue; /* not a test's process */
        const struct crr_test *t = run[k].t;
        const double secs = now() - run[k].start;
        run[k].pid = 0;
        live--;
        if (WIFEXITED(st) && WEXITSTATUS(st) == CHILD_PASS) {
            passing++;
            if (verbose) fprintf(stderr, "[PASS] %s::%s: (%.2fs)\n", t->suite, t->name, secs);
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == CHILD_SKIP) {
            skips++;
            fprintf(stderr, "[SKIP] %s::%s: (%.2fs)\n", t->suite, t->name, secs);
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == CHILD_FAIL) {
            failing++;
            fprintf(stderr, "[FAIL] %s::%s: (%.2fs)\n", t->suite, t->name, secs);
        } else if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) {
            crashing++;
            fprintf(stderr, "[----] %s::%s: Timed out. (%.2fs, limit %.0fs)\n[FAIL] %s::%s\n", t->suite, t->name,
                    secs, run[k].limit, t->suite, t->name);
        } else if (WIFSIGNALED(st)) {
            crashing++;
            fprintf(stderr, "[----] %s::%s: CRASH! (signal %d: %s)\n[FAIL] %s::%s\n", t->suite, t->name,
                    WTERMSIG(st), strsignal(WTERMSIG(st)), t->suite, t->name);
        } else {
            crashing++;
            fprintf(stderr, "[----] %s::%s: exited with status %d\n[FAIL] %s::%s\n", t->suite, t->name,
                    WEXITSTATUS(st), t->suite, t->name);
        }
        fflush(stderr);
    }
    fprintf(stderr, "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: %d | Skipped: %d (%.1fs)\n",
            passing + failing + crashing, passing, failing, crashing, skips, now() - t0);
    free(run);
    free(all);
    return failing || crashing ? 1 : 0;
}
