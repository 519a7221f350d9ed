/* fuzz_request.c: libFuzzer harness for serve/request.c.
 *
 * Data flow: arbitrary bytes -> request_parse, as the body of a chat
 * request and of a completion request, with thinking on and off. A
 * server's request bodies come from anyone who can reach its port, so
 * beyond "no crash, no leak, no undefined behaviour" (ASan + UBSan) it
 * checks what request.h promises:
 *   - failure: one non-empty line in err, and the Request left empty;
 *   - success: a NUL-terminated prompt; max_tokens -1 or in [0, 2^30];
 *     temperature in [0, 100], top_p in (0, 1], min_p in [0, 1], top_k >=
 *     0 when given; penalties NaN (not given) or in their ranges; at most
 *     REQUEST_MAX_STOP stop strings of 1 to REQUEST_MAX_STOP_LEN bytes;
 *     kv_name NUL-terminated within its array;
 *   - a chat prompt ends with a generation prompt the template gives.
 * Built and run by `make fuzz` / `make fuzz-run` (tests/fuzz/run.sh).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/request.h"

static void die(const char *what) {
    fprintf(stderr, "fuzz_request: property failed: %s\n", what);
    abort();
}

static int in(float x, float lo, float hi) { return x >= lo && x <= hi; }

static void check(const char *data, size_t size, int chat, int think) {
    Request r;
    char err[512] = "";
    if (request_parse(data, size, chat, think, !think, &r, err, sizeof err)) {
        if (!err[0] || strpbrk(err, "\r\n")) die("error is not one non-empty line");
        if (r.prompt || r.n_stop) die("a failed parse left data in the request");
        return;
    }
    if (!r.prompt) die("no prompt");
    (void)strlen(r.prompt);
    if (r.max_tokens < -1 || r.max_tokens > (1 << 30)) die("max_tokens out of range");
    if (r.has_temp && !in(r.temperature, 0, 100)) die("temperature out of range");
    if (r.has_top_p && !(r.top_p > 0 && r.top_p <= 1)) die("top_p out of range");
    if (r.has_min_p && !in(r.min_p, 0, 1)) die("min_p out of range");
    if (r.has_top_k && r.top_k < 0) die("top_k negative");
    if (!isnan(r.frequency) && !in(r.frequency, 0, 2)) die("frequency_penalty out of range");
    if (!isnan(r.presence) && !in(r.presence, 0, 2)) die("presence_penalty out of range");
    if (!isnan(r.repetition) && !in(r.repetition, 1e-3f, 100)) die("repetition_penalty out of range");
    if (r.n_stop < 0 || r.n_stop > REQUEST_MAX_STOP) die("stop count");
    for (int i = 0; i < r.n_stop; i++) {
        size_t l = strlen(r.stop[i]);
        if (l < 1 || l > REQUEST_MAX_STOP_LEN) die("stop length");
    }
    if (!memchr(r.kv_name, 0, sizeof r.kv_name)) die("kv_name not terminated");
    if (chat) {
        /* the request's enable_thinking may override think */
        const char *tails[] = {"<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n",
                               "<|im_start|>assistant\n<think>\n"};
        const size_t n = strlen(r.prompt);
        int ok = 0;
        for (int i = 0; i < 3; i++) {
            const size_t t = strlen(tails[i]);
            ok |= n >= t && !strcmp(r.prompt + n - t, tails[i]) && (i < 2 || !think);
        }
        if (!ok) die("chat prompt without the generation prompt");
    }
    request_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int chat = 0; chat < 2; chat++)
        for (int think = 0; think < 2; think++) check((const char *)data, size, chat, think);
    return 0;
}
