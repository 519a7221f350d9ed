/* test_format.c: the readers under format/ against hostile input, in
 * process (make test-asan runs them under AddressSanitizer and UBSan, which
 * is what catches a read after free or a write past a buffer):
 *   - quote(): bounded by its buffer for every input, valid UTF-8 out;
 *   - file_read / file_read_any: special files refused without blocking,
 *     size caps, pipes read for prompts;
 *   - safetensors: headers that are not objects, tensors that overlap
 *     (also behind an empty tensor), gaps in the data section. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "format/file.h"
#include "format/json.h"
#include "format/quote.h"
#include "format/safetensors.h"

/* Whether s[0 .. n) is valid UTF-8 with no control characters (C0, DEL, C1). */
static int printable_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || i + len > n || c < 0x20 || c == 0x7F || (c == 0xC2 && u[i + 1] < 0xA0)) return 0;
        for (size_t k = 1; k < len; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        /* overlongs and surrogates */
        if ((c == 0xE0 && u[i + 1] < 0xA0) || (c == 0xED && u[i + 1] > 0x9F) || (c == 0xF0 && u[i + 1] < 0x90) ||
            (c == 0xF4 && u[i + 1] > 0x8F))
            return 0;
        i += len;
    }
    return 1;
}

/* quote() into a buffer of size bytes with guard bytes after it: nothing
 * past size is written, the result is NUL-terminated within it, printable
 * UTF-8, and opens and closes with a quote. */
static void check_quote(const char *s, size_t n, size_t size) {
    char *buf = malloc(size + 16);
    memset(buf, 0x5A, size + 16);
    const char *r = quote(s, n, buf, size);
    cr_assert_eq(r, buf);
    for (size_t i = size; i < size + 16; i++) cr_assert_eq(buf[i], 0x5A, "quote wrote past its %zu bytes", size);
    if (size == 0) {
        free(buf);
        return;
    }
    size_t len = strnlen(buf, size);
    cr_assert(len < size, "no NUL within %zu bytes", size);
    if (size >= 8) {
        cr_assert(len >= 2 && buf[0] == '"' && buf[len - 1] == '"', "not quoted: %s", buf);
        cr_assert(printable_utf8(buf, len), "not printable UTF-8 (buffer %zu)", size);
    }
    free(buf);
}

Test(format, quote_is_bounded_and_printable_for_any_input) {
    /* the input that overflowed the tokenizer's old helper: continuation bytes */
    char cont[5000];
    memset(cont, 0x80, sizeof cont);
    /* every escape at once: control bytes, quotes, backslashes, C1 in UTF-8 */
    char esc[3000];
    for (size_t i = 0; i < sizeof esc; i++) esc[i] = "\n\"\\\x01\x7f\xc2\x9b"[i % 7];
    /* 4-byte characters, so a cut must fall between them */
    char wide[4001];
    for (int i = 0; i < 1000; i++) memcpy(wide + 4 * i, "\xf0\x9f\x98\x80", 4);
    /* truncated and invalid sequences mixed with text */
    const char *bad = "ab\xe2\x82\xc3(\xed\xa0\x80\xf4\x90\x80\x80\xc0\xafz\xff";
    const char *inputs[] = {cont, esc, wide, bad, "", "plain"};
    const size_t lens[] = {sizeof cont, sizeof esc, 4000, strlen(bad), 0, 5};
    for (size_t k = 0; k < sizeof inputs / sizeof *inputs; k++)
        for (size_t size = 0; size <= QUOTE_BUF + 40; size++) check_quote(inputs[k], lens[k], size);
    /* a random mix, through every small buffer */
    unsigned long long r = 42;
    char mix[300];
    for (int it = 0; it < 2000; it++) {
        for (size_t i = 0; i < sizeof mix; i++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            mix[i] = (char)(r >> 56);
        }
        check_quote(mix, 1 + (size_t)(r >> 20) % sizeof mix, 8 + (size_t)(r >> 40) % 100);
    }
}

Test(format, quote_escapes_and_cuts_where_it_says) {
    char b[QUOTE_BUF];
    cr_expect_str_eq(quote("a\nb\"c\\", 6, b, sizeof b), "\"a\\x0Ab\\x22c\\x5C\"");
    cr_expect_str_eq(quote("\xc2\x9b[2J", 5, b, sizeof b), "\"\\u009B[2J\"", "C1 CSI escaped, found %s", b);
    cr_expect_str_eq(quote("\x80\xff", 2, b, sizeof b), "\"\\x80\\xFF\"");
    cr_expect_str_eq(quote("\xc3\xa9t\xc3\xa9", 5, b, sizeof b), "\"\xc3\xa9t\xc3\xa9\"", "valid UTF-8 kept");
    char longs[200];
    memset(longs, 'x', sizeof longs);
    quote(longs, sizeof longs, b, sizeof b);
    cr_expect_eq(strlen(b), 1 + QUOTE_TEXT + 3 + 1, "cut after QUOTE_TEXT bytes: %s", b);
    cr_expect(strstr(b, "...\"") != NULL);
}

static char tmp[256];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/run_test_format_XXXXXX");
    cr_assert(mkdtemp(tmp));
}

static void teardown(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_expect_eq(system(cmd), 0);
}

/* tmp/name */
static const char *at(const char *name) {
    static char p[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmp, name);
    return p[k];
}

/* Each special file is refused at once, naming what it is; a FIFO with no
 * writer would block a plain open() forever, so the test runs under an
 * alarm that fails it instead of hanging. */
Test(format, special_files_are_refused_without_blocking, .init = setup, .fini = teardown, .timeout = 20) {
    char err[512];
    size_t n;
    cr_assert_eq(mkfifo(at("fifo"), 0600), 0);
    cr_assert_eq(mkdir(at("dir"), 0700), 0);
    int sk = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", at("sock"));
    cr_assert_eq(bind(sk, (struct sockaddr *)&sa, sizeof sa), 0);
    const char *paths[] = {at("fifo"), at("dir"), at("sock"), "/dev/zero", "/dev/null"};
    const char *kinds[] = {"a FIFO", "a directory", "a socket", "a character device", "a character device"};
    for (int i = 0; i < 5; i++) {
        char *b = file_read(paths[i], 1 << 20, &n, err, sizeof err);
        cr_expect_null(b, "%s was read", paths[i]);
        cr_expect(strstr(err, paths[i]) && strstr(err, "expected a regular file") && strstr(err, kinds[i]),
                  "%s: %s", paths[i], err);
        cr_expect_null(json_parse_file(paths[i], 1 << 20, err, sizeof err));
        cr_expect(strstr(err, kinds[i]), "json_parse_file: %s", err);
        TensorStore ts;
        cr_expect_eq(st_open_file(&ts, paths[i], err, sizeof err), -1);
        cr_expect(strstr(err, kinds[i]), "st_open_file: %s", err);
    }
    close(sk);
}

Test(format, size_caps, .init = setup, .fini = teardown) {
    char err[512];
    size_t n;
    FILE *f = fopen(at("big.json"), "w");
    for (int i = 0; i < 3000; i++) fputs("          ", f);
    fputs("{}", f);
    fclose(f);
    cr_expect_null(file_read(at("big.json"), 30000, &n, err, sizeof err));
    cr_expect(strstr(err, "expected at most 30000 bytes, found 30002 bytes"), "%s", err);
    cr_expect_null(json_parse_file(at("big.json"), 1 << 10, err, sizeof err));
    char *b = file_read(at("big.json"), 30002, &n, err, sizeof err);
    cr_assert_not_null(b, "%s", err);
    cr_expect_eq(n, 30002);
    cr_expect_eq(b[n], 0, "NUL-terminated");
    free(b);
    /* a prompt file may be a device or a pipe, read up to its cap */
    cr_expect_null(file_read_any("/dev/zero", 1 << 20, &n, err, sizeof err));
    cr_expect(strstr(err, "/dev/zero: expected at most 1 MiB, found more"), "%s", err);
    cr_expect_null(file_read_any(tmp, 1 << 20, &n, err, sizeof err));
    cr_expect(strstr(err, "found a directory"), "%s", err);
}

Test(format, prompts_come_through_pipes) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    const char text[] = "In the beginning";
    cr_assert_eq(write(p[1], text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(p[1]);
    char path[64], err[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", p[0]);
    size_t n;
    char *b = file_read_any(path, 1 << 20, &n, err, sizeof err);
    cr_assert_not_null(b, "%s", err);
    cr_expect_eq(n, sizeof text - 1);
    cr_expect_str_eq(b, text);
    free(b);
    close(p[0]);
}

/* Writes a safetensors file: the header text, then data bytes of zeros. */
static void write_st(const char *path, const char *header, size_t data) {
    FILE *f = fopen(path, "wb");
    unsigned long long h = strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)(h >> (8 * i)) & 0xFF, f);
    fputs(header, f);
    for (size_t i = 0; i < data; i++) fputc(0, f);
    fclose(f);
}

/* st_open_file on a made-up file: 0 and nothing in err, or -1 and err
 * holding both fragments. */
static void expect_st(const char *header, size_t data, const char *frag1, const char *frag2) {
    char err[512] = "";
    TensorStore ts;
    write_st(at("x.safetensors"), header, data);
    int rc = st_open_file(&ts, at("x.safetensors"), err, sizeof err);
    if (!frag1) {
        cr_expect_eq(rc, 0, "%s: %s", header, err);
        if (rc == 0) st_close(&ts);
        return;
    }
    cr_expect_eq(rc, -1, "%s loaded", header);
    cr_expect(strstr(err, frag1) && (!frag2 || strstr(err, frag2)), "%s: %s", header, err);
    cr_expect(strchr(err, '\n') == NULL, "one line: %s", err);
}

#define T(name, off) "\"" name "\":{\"dtype\":\"F32\",\"shape\":[" #off "],\"data_offsets\":"

Test(format, safetensors_headers_that_are_not_objects, .init = setup, .fini = teardown) {
    /* each parses as JSON; the first used to be read after it was freed */
    expect_st("[1,2,3]", 0, "expected a JSON object header, found array", NULL);
    expect_st("\"model\"", 0, "found string", NULL);
    expect_st("42", 0, "found number", NULL);
    expect_st("null", 0, "found null", NULL);
    expect_st("{\"a\":[1]}", 0, "header entry \"a\" is not a tensor description", NULL);
}

Test(format, safetensors_tensors_tile_the_data_section, .init = setup, .fini = teardown) {
    /* good: a [0,8), an empty tensor at 8, b [8,16); order in the header is free */
    expect_st("{" T("b", 2) "[8,16]}," T("z", 0) "[8,8]}," T("a", 2) "[0,8]}}", 16, NULL, NULL);
    /* overlaps, plain and with an empty tensor sorting between the two */
    expect_st("{" T("a", 2) "[0,8]}," T("b", 2) "[4,12]}}", 12, "tensors \"a\" and \"b\" overlap", NULL);
    expect_st("{" T("a", 4) "[0,16]}," T("z", 0) "[4,4]}," T("b", 2) "[4,12]}," T("c", 1) "[16,20]}}", 20,
              "overlap", "\"a\"");
    expect_st("{" T("a", 2) "[0,8]}," T("b", 2) "[0,8]}}", 8, "overlap", NULL);
    /* an empty tensor inside another's bytes */
    expect_st("{" T("a", 2) "[0,8]}," T("z", 0) "[4,4]}}", 8, "overlap", NULL);
    /* gaps: between tensors, before the first, after the last */
    expect_st("{" T("a", 1) "[0,4]}," T("b", 1) "[8,12]}}", 12, "bytes [4, 8) of the data section belong to no tensor",
              NULL);
    expect_st("{" T("a", 1) "[4,8]}}", 8, "bytes [0, 4)", NULL);
    expect_st("{" T("a", 1) "[0,4]}}", 12, "bytes [4, 12) at the end of the data section", NULL);
    /* no tensors: the data section must then be empty */
    expect_st("{\"__metadata__\":{\"format\":\"pt\"}}", 0, NULL, NULL);
    expect_st("{}", 4, "bytes [0, 4)", NULL);
}

Test(format, safetensors_names_are_quoted_in_errors, .init = setup, .fini = teardown) {
    /* a name with a newline and a terminal escape stays on one printable line */
    expect_st("{\"a\\n\\u009b[2J\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
              "tensor \"a\\x0A\\u009B[2J\": expected 8 bytes", NULL);
}
