/* criterion.h: the part of Criterion's API the tests use, for a plain
 * runner (tests/runner/main.c) where Criterion itself cannot run: under
 * qemu-user, Criterion's sandbox (BoxFort) fails to start its per-test
 * workers ("Could not spawn test instance: Protocol error") or spins, so
 * the aarch64 leg builds the same test sources against this header
 * (put first on the include path: -Itests/runner) and this runner.
 *
 *   Test(suite, name[, .timeout = s, .init = f, .fini = g])   a test
 *   TestSuite(suite[, .init = f, .fini = g])                  per-suite setup
 *   cr_assert*(..., [fmt, args])   fails the test and ends it (fini still runs)
 *   cr_expect*(..., [fmt, args])   fails the test and goes on
 *   cr_skip_test([fmt, args])      ends the test as skipped
 *   cr_log_info / cr_log_error     a line on stderr
 *
 * As in Criterion, each test runs in a process of its own (a crash or an
 * exit fails that test only), init and fini around it, and a test with a
 * timeout is killed when it runs past it. Messages must be string
 * literals (they are pasted after ""). */
#ifndef TESTS_RUNNER_CRITERION_H
#define TESTS_RUNNER_CRITERION_H

#include <stddef.h>
#include <string.h>

/* "" pasted before an absent message is a zero-length format */
#pragma GCC diagnostic ignored "-Wformat-zero-length"

struct crr_extra {
    int unused_; /* so that the designated fields never override a positional one */
    double timeout;
    void (*init)(void);
    void (*fini)(void);
    int disabled;
    const char *description;
};

struct crr_test {
    const char *suite, *name;
    void (*fn)(void);
    struct crr_extra extra;
    struct crr_test *next;
};

struct crr_suite {
    const char *name;
    struct crr_extra extra;
    struct crr_suite *next;
};

void crr_register(struct crr_test *t);
void crr_register_suite(struct crr_suite *s);
void crr_fail(int fatal, const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
__attribute__((noreturn)) void crr_abort(void);
__attribute__((noreturn)) void crr_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void crr_log(const char *tag, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define Test(suite, name, ...)                                                                                       \
    static void suite##_##name##_impl(void);                                                                         \
    static struct crr_test suite##_##name##_test = {#suite, #name, suite##_##name##_impl, {0, __VA_ARGS__}, NULL}; \
    __attribute__((constructor)) static void suite##_##name##_reg(void) { crr_register(&suite##_##name##_test); }    \
    static void suite##_##name##_impl(void)

#define TestSuite(suite, ...)                                                                                        \
    static struct crr_suite suite##_suite_data = {#suite, {0, __VA_ARGS__}, NULL};                                   \
    __attribute__((constructor)) static void suite##_suite_reg(void) { crr_register_suite(&suite##_suite_data); }

/* One check: on failure, its expression and the optional message; fatal
 * ones end the test. */
#define CRR_CHECK(fatal, cond, expr, ...)                                                                            \
    do {                                                                                                             \
        if (!(cond)) {                                                                                               \
            crr_fail(fatal, __FILE__, __LINE__, expr, "" __VA_ARGS__);                                               \
            if (fatal) crr_abort();                                                                                  \
        }                                                                                                            \
    } while (0)

#define cr_assert(cond, ...) CRR_CHECK(1, cond, #cond, __VA_ARGS__)
#define cr_expect(cond, ...) CRR_CHECK(0, cond, #cond, __VA_ARGS__)

#define cr_assert_eq(a, b, ...) CRR_CHECK(1, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) CRR_CHECK(0, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) CRR_CHECK(1, (a) != (b), #a " != " #b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) CRR_CHECK(0, (a) != (b), #a " != " #b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...) CRR_CHECK(1, (a) < (b), #a " < " #b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...) CRR_CHECK(0, (a) < (b), #a " < " #b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) CRR_CHECK(1, (a) <= (b), #a " <= " #b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) CRR_CHECK(0, (a) <= (b), #a " <= " #b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...) CRR_CHECK(1, (a) > (b), #a " > " #b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...) CRR_CHECK(0, (a) > (b), #a " > " #b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) CRR_CHECK(1, (a) >= (b), #a " >= " #b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) CRR_CHECK(0, (a) >= (b), #a " >= " #b, __VA_ARGS__)
#define cr_assert_null(p, ...) CRR_CHECK(1, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_expect_null(p, ...) CRR_CHECK(0, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...) CRR_CHECK(1, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_expect_not_null(p, ...) CRR_CHECK(0, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) CRR_CHECK(1, strcmp((a), (b)) == 0, #a " equals " #b, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) CRR_CHECK(0, strcmp((a), (b)) == 0, #a " equals " #b, __VA_ARGS__)
#define cr_assert_str_neq(a, b, ...) CRR_CHECK(1, strcmp((a), (b)) != 0, #a " differs from " #b, __VA_ARGS__)
#define cr_expect_str_neq(a, b, ...) CRR_CHECK(0, strcmp((a), (b)) != 0, #a " differs from " #b, __VA_ARGS__)
#define cr_assert_str_empty(a, ...) CRR_CHECK(1, *(a) == 0, #a " is empty", __VA_ARGS__)
#define cr_expect_str_empty(a, ...) CRR_CHECK(0, *(a) == 0, #a " is empty", __VA_ARGS__)
#define cr_assert_fail(...) CRR_CHECK(1, 0, "cr_assert_fail", __VA_ARGS__)
#define cr_expect_fail(...) CRR_CHECK(0, 0, "cr_expect_fail", __VA_ARGS__)

#define cr_skip_test(...) crr_skip("" __VA_ARGS__)
#define cr_log_info(...) crr_log("[----] ", __VA_ARGS__)
#define cr_log_warn(...) crr_log("[WARN] ", __VA_ARGS__)
#define cr_log_error(...) crr_log("[ERR ] ", __VA_ARGS__)

#endif
