/* test_serve.c: ./run -m serve through HTTP as a client sees it: the
 * endpoints, greedy and seeded text equal to the CLI's, requests in one
 * batch equal to the same requests alone (every scheme family), streams
 * equal to plain responses, stop strings, bad requests answered with a
 * JSON error naming the field, a full queue answered 503, a client that
 * hangs up freeing its slot, the API key. The server is $RUN_BIN on the
 * shipped model; a build without libmicrohttpd skips (its -h lists no
 * serve). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/util.h"

#define MODEL "models/qwen3-kjv-mtp"

static const char *bin(void) { return getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run"; }

typedef struct {
    pid_t pid;
    int port;
    char err_path[128];
    const char *headers; /* header lines every request sends, each ending \r\n */
} Server;

/* Whether this ./run has the server. */
static int has_serve(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s -h | grep -q ' | serve'", bin());
    return system(cmd) == 0;
}

/* Starts ./run MODEL -m serve --port 0 with extra args and waits for the
 * line naming its port. */
static void server_start_model(Server *s, const char *model, const char *args) {
    if (!has_serve()) cr_skip_test("this ./run was built without libmicrohttpd");
    s->headers = "";
    static int n_started;
    snprintf(s->err_path, sizeof s->err_path, "/tmp/run_serve_err.%d.%d", (int)getpid(), n_started++);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec %s %s -m serve --port 0 -T 1 %s 2>%s", bin(), model, args, s->err_path);
    s->pid = fork();
    cr_assert(s->pid >= 0);
    if (s->pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->port = 0;
    for (int i = 0; i < 600 && !s->port; i++) {
        usleep(50000);
        FILE *f = fopen(s->err_path, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            const char *p = strstr(line, "listening on http://127.0.0.1:");
            if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        }
        if (f) fclose(f);
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) break;
    }
    cr_assert(s->port > 0, "the server did not start: %s", slurp(s->err_path, NULL));
}

static void server_start(Server *s, const char *args) { server_start_model(s, MODEL, args); }

/* SIGTERM: the server must stop by itself, exit 0, say so. */
static void server_stop(Server *s) {
    kill(s->pid, SIGTERM);
    int st = -1;
    for (int i = 0; i < 200; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) break;
        usleep(50000);
    }
    char *err = slurp(s->err_path, NULL);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server did not exit 0 on SIGTERM: %s", err);
    cr_expect(strstr(err, "serve: stopping") != NULL, "%s", err);
    free(err);
    remove(s->err_path);
}

typedef struct {
    int status;
    char head[1024]; /* the status line and headers (their first 1023 bytes) */
    char *body;      /* malloc'd, NUL-terminated */
} Reply;

/* Sockets time out instead of the tests: Criterion 2.4.1's runner leaks
 * (and so fails under LeakSanitizer) when tests with .timeout overlap.
 * No request here takes a minute; a hung server fails the read. */
static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    const struct timeval tv = {.tv_sec = 120};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "cannot connect to port %d", port);
    return fd;
}

/* Sends an HTTP/1.0 request (so the body ends with the connection, no
 * chunking), with extra header lines. */
static void send_request(int fd, const char *method, const char *path, const char *headers, const char *body,
                         size_t n) {
    char head[1024];
    int k = snprintf(head, sizeof head, "%s %s HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     "%sContent-Length: %zu\r\n\r\n", method, path, headers, n);
    cr_assert_eq(write(fd, head, (size_t)k), k);
    for (size_t off = 0; off < n;) {
        /* the server may answer 413 or 401 before reading all, and close:
         * an error here, not SIGPIPE */
        ssize_t w = send(fd, body + off, n - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
}

/* Reads the whole reply: status, then the body after the headers. */
static Reply read_reply(int fd) {
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    ssize_t r;
    while ((r = read(fd, b + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (len + 1 == cap) b = realloc(b, cap *= 2);
    }
    b[len] = 0;
    close(fd);
    /* no status line (the connection closed unanswered): status 0, for the caller's message */
    Reply rp = {0, "", NULL};
    if (sscanf(b, "HTTP/1.%*d %d", &rp.status) != 1) rp.status = 0;
    const char *body = strstr(b, "\r\n\r\n");
    snprintf(rp.head, sizeof rp.head, "%.*s", body ? (int)(body - b) : 0, b);
    rp.body = strdup(body ? body + 4 : "");
    free(b);
    return rp;
}

static Reply http(const Server *s, const char *method, const char *path, const char *body) {
    int fd = connect_to(s->port);
    send_request(fd, method, path, s->headers, body ? body : "", body ? strlen(body) : 0);
    return read_reply(fd);
}

/* The JSON string value after "key": in body, unescaped for the escapes
 * the server writes (\n, \", \\, \uXXXX below 0x80), malloc'd; NULL if none. */
static char *json_str(const char *body, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":\"", key);
    const char *p = strstr(body, k);
    if (!p) return NULL;
    p += strlen(k);
    char *out = malloc(strlen(p) + 1), *q = out;
    for (; *p && *p != '"'; p++) {
        if (*p != '\\') { *q++ = *p; continue; }
        p++;
        if (*p == 'n') *q++ = '\n';
        else if (*p == 'u') {
            unsigned c = 0;
            sscanf(p + 1, "%4x", &c);
            *q++ = (char)c;
            p += 4;
        } else *q++ = *p;
    }
    *q = 0;
    return out;
}

/* The concatenated "key" strings of every event of an SSE body. */
static char *sse_text(const char *body, const char *key) {
    char *out = calloc(1, strlen(body) + 1);
    for (const char *p = body; (p = strstr(p, "data: {")); p++) {
        const char *end = strstr(p, "\n\n");
        char *ev = strndup(p, end ? (size_t)(end - p) : strlen(p));
        char *t = json_str(ev, key);
        if (t) strcat(out, t);
        free(t);
        free(ev);
    }
    return out;
}

/* The CLI's continuation of prompt: stdout less the echoed prompt and the final newline. */
static char *cli_text(const char *prompt, const char *opts) {
    char cmd[1024], path[128];
    snprintf(path, sizeof path, "/tmp/run_serve_cli.%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s " MODEL " -i '%s' -T 1 %s >%s 2>/dev/null", bin(), prompt, opts, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    size_t n;
    char *out = slurp(path, &n);
    remove(path);
    cr_assert(n > strlen(prompt) && !strncmp(out, prompt, strlen(prompt)) && out[n - 1] == '\n');
    out[n - 1] = 0;
    char *t = strdup(out + strlen(prompt));
    free(out);
    return t;
}

Test(serve, endpoints) {
    Server s;
    server_start(&s, "");
    Reply r = http(&s, "GET", "/health", NULL);
    cr_expect_eq(r.status, 200);
    cr_expect(strstr(r.body, "\"status\":\"ok\""), "%s", r.body);
    free(r.body);
    r = http(&s, "GET", "/v1/models", NULL);
    cr_expect_eq(r.status, 200);
    cr_expect(strstr(r.body, "\"object\":\"list\"") && strstr(r.body, "\"id\":\"qwen3-kjv-mtp\""), "%s", r.body);
    free(r.body);
    r = http(&s, "GET", "/metrics", NULL);
    cr_expect_eq(r.status, 200);
    cr_expect(strstr(r.body, "# TYPE run_requests_total counter\nrun_requests_total 0\n"), "%s", r.body);
    free(r.body);
    r = http(&s, "GET", "/v1/nothing", NULL);
    cr_expect_eq(r.status, 404);
    cr_expect(strstr(r.body, "{\"error\":{\"message\":\"no such path: /v1/nothing"), "%s", r.body);
    free(r.body);
    r = http(&s, "GET", "/v1/completions", NULL);
    cr_expect_eq(r.status, 405);
    free(r.body);
    server_stop(&s);
}

/* Greedy and seeded text through the server is the CLI's, and usage counts the tokens. */
Test(serve, text_is_the_cli_text) {
    Server s;
    server_start(&s, "");
    const char *prompt = "And God said";
    char *want = cli_text(prompt, "-n 24 -t 0 -kv tbq4 -spec 0");
    Reply r = http(&s, "POST", "/v1/completions",
                   "{\"prompt\":\"And God said\",\"max_tokens\":24,\"temperature\":0,\"kv\":\"tbq4\"}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    char *got = json_str(r.body, "text");
    cr_expect(got && !strcmp(got, want), "server '%s', cli '%s'", got, want);
    int pt = -1, ct = -1, tt = -1;
    const char *u = strstr(r.body, "\"usage\":{");
    cr_expect(u && sscanf(u, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d", &pt, &ct,
                          &tt) == 3 && pt > 0 && ct == 24 && tt == pt + ct, "%s", r.body);
    cr_expect(strstr(r.body, "\"finish_reason\":\"length\""), "%s", r.body);
    free(got), free(want), free(r.body);
    want = cli_text(prompt, "-n 24 -t 0.9 -s 7 -spec 0");
    r = http(&s, "POST", "/v1/completions",
             "{\"prompt\":\"And God said\",\"max_tokens\":24,\"temperature\":0.9,\"seed\":7}");
    got = json_str(r.body, "text");
    cr_expect(got && !strcmp(got, want), "seeded: server '%s', cli '%s'", got, want);
    free(got), free(want), free(r.body);
    server_stop(&s);
}

typedef struct {
    const Server *s;
    const char *body;
    Reply r;
} Call;

static void *call(void *p) {
    Call *c = p;
    c->r = http(c->s, "POST", "/v1/completions", c->body);
    return NULL;
}

/* Requests computed together in one batch get what they get alone: a row's
 * result does not depend on the rows beside it, whatever their schemes,
 * on the Qwen3 model and on the Qwen3.5 hybrid (each sequence its own
 * recurrent state). */
static void check_batched(const char *model) {
    Server s;
    server_start_model(&s, model, "-np 4");
    const char *bodies[] = {
        "{\"prompt\":\"In the beginning\",\"max_tokens\":48,\"temperature\":0,\"kv\":\"f32\"}",
        "{\"prompt\":\"And the LORD spake unto Moses, saying\",\"max_tokens\":40,\"temperature\":0,\"kv\":\"tbq4\"}",
        "{\"prompt\":\"Blessed are\",\"max_tokens\":48,\"temperature\":0.8,\"seed\":3,\"kv\":\"kivi2\"}",
        "{\"prompt\":\"The\",\"max_tokens\":44,\"temperature\":0,\"kv\":\"q8/q4\"}",
    };
    Call alone[4], together[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        alone[i] = (Call){&s, bodies[i], {0, "", NULL}};
        call(&alone[i]);
        cr_assert_eq(alone[i].r.status, 200, "%s", alone[i].r.body);
    }
    for (int i = 0; i < 4; i++) {
        together[i] = (Call){&s, bodies[i], {0, "", NULL}};
        pthread_create(&t[i], NULL, call, &together[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) {
        char *a = json_str(alone[i].r.body, "text"), *b = json_str(together[i].r.body, "text");
        cr_expect(a && b && !strcmp(a, b), "%s, request %d: alone '%s', batched '%s'", model, i, a, b);
        free(a), free(b), free(alone[i].r.body), free(together[i].r.body);
    }
    /* the second round did run batched: some steps had more than one row */
    Reply m = http(&s, "GET", "/metrics", NULL);
    const char *p = strstr(m.body, "\nrun_steps_total "), *q = strstr(m.body, "\nrun_step_rows_total ");
    cr_assert(p && q, "%s", m.body);
    long steps = atol(p + strlen("\nrun_steps_total ")), rows = atol(q + strlen("\nrun_step_rows_total "));
    cr_expect(rows > steps + 16, "%s: no batching seen: %ld rows in %ld steps", model, rows, steps);
    free(m.body);
    server_stop(&s);
}

Test(serve, batched_requests_match_alone) { check_batched(MODEL); }
Test(serve, batched_requests_match_alone_hybrid) { check_batched("models/qwen35-kjv-mtp"); }

/* A stream carries the same text as the plain response, the role first,
 * then finish_reason and usage, then [DONE]; a stop string ends both at
 * the same place, and the stream never shows what comes after it. */
Test(serve, stream_and_stop_strings) {
    Server s;
    server_start(&s, "");
    const char *chat = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
                       "\"Who made the light?\"}],\"max_tokens\":30,\"temperature\":0%s}";
    char body[1024];
    snprintf(body, sizeof body, chat, "");
    Reply plain = http(&s, "POST", "/v1/chat/completions", body);
    cr_assert_eq(plain.status, 200, "%s", plain.body);
    char *want = json_str(plain.body, "content");
    cr_assert(want && strlen(want) > 8, "%s", plain.body);
    snprintf(body, sizeof body, chat, ",\"stream\":true");
    Reply st = http(&s, "POST", "/v1/chat/completions", body);
    cr_assert_eq(st.status, 200);
    char *got = sse_text(st.body, "content");
    cr_expect(!strcmp(got, want), "stream '%s', plain '%s'", got, want);
    cr_expect(strstr(st.body, "\"delta\":{\"role\":\"assistant\""), "%s", st.body);
    cr_expect(strstr(st.body, "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":"), "%s", st.body);
    const size_t bl = strlen(st.body);
    cr_expect(bl > 16 && !strcmp(st.body + bl - 14, "data: [DONE]\n\n"), "%s", st.body);
    free(got), free(st.body);
    /* a stop string from the middle of the reply: everything before it, finish_reason stop */
    /* two stops, listed later-first: the text ends at the earlier match */
    char stop[2][8] = {{0}}, esc[2][32];
    memcpy(stop[0], want + 8, 3);
    memcpy(stop[1], want + 5, 3);
    for (int k = 0; k < 2; k++) {
        char *e = esc[k];
        for (const char *c = stop[k]; *c; c++) {
            if (*c == '"' || *c == '\\') *e++ = '\\';
            if (*c == '\n') { *e++ = '\\'; *e++ = 'n'; continue; }
            *e++ = *c;
        }
        *e = 0;
    }
    const size_t c0 = (size_t)(strstr(want, stop[0]) - want), c1 = (size_t)(strstr(want, stop[1]) - want);
    const size_t cut = c0 < c1 ? c0 : c1;
    for (int stream = 0; stream < 2; stream++) {
        char extra[160];
        snprintf(extra, sizeof extra, ",\"stop\":[\"zzzz\",\"%s\",\"%s\"]%s", esc[0], esc[1],
                 stream ? ",\"stream\":true" : "");
        snprintf(body, sizeof body, chat, extra);
        Reply r = http(&s, "POST", "/v1/chat/completions", body);
        char *t = stream ? sse_text(r.body, "content") : json_str(r.body, "content");
        cr_expect(t && strlen(t) == cut && !strncmp(t, want, cut), "stops '%s', '%s' (stream %d): '%s' of '%s'",
                  stop[0], stop[1], stream, t, want);
        cr_expect(strstr(r.body, "\"finish_reason\":\"stop\""), "%s", r.body);
        free(t), free(r.body);
    }
    free(want), free(plain.body);
    server_stop(&s);
}

/* Bad requests: a JSON error with the status and the field named. */
/* A model whose tokenizer lacks the chat template's special tokens answers
 * chat requests with 501 and a message naming them; completions still run. */
Test(serve, chat_needs_its_special_tokens) {
    char dir[] = "/tmp/run_serve_nochat_XXXXXX", cmd[512];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp tests/data/fixtures/tiny/* %s/ && chmod u+w %s/* && sed -i "
             "'s/\"content\": \"<|im_start|>\"/\"content\": \"<|im_strat|>\"/' %s/tokenizer.json", dir, dir, dir);
    cr_assert_eq(system(cmd), 0);
    Server s;
    server_start_model(&s, dir, "-c 64");
    Reply r = http(&s, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    cr_expect_eq(r.status, 501, "%s", r.body);
    cr_expect(strstr(r.body, "no <|im_start|> and <|im_end|> tokens"), "%s", r.body);
    free(r.body);
    r = http(&s, "POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}");
    cr_expect_eq(r.status, 200, "%s", r.body);
    free(r.body);
    server_stop(&s);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(serve, bad_requests_are_named) {
    Server s;
    server_start(&s, "-c 128 --kv-mb 1");
    const struct {
        const char *path, *body, *says;
        int status;
    } cases[] = {
        {"/v1/completions", "{", "the body is not JSON", 400},
        {"/v1/completions", "[1]", "expected a JSON object", 400},
        {"/v1/completions", "{\"max_tokens\":3}", "prompt: expected a string", 400},
        {"/v1/completions", "{\"prompt\":\"x\",\"temperature\":\"hot\"}", "temperature: expected a number", 400},
        {"/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2.5}", "max_tokens: expected an integer", 400},
        {"/v1/completions", "{\"prompt\":\"x\",\"top_p\":0}", "top_p: expected a number in", 400},
        {"/v1/completions", "{\"prompt\":\"x\",\"kv\":\"tbq9\"}", "kv: unknown scheme 'tbq9'", 400},
        {"/v1/completions", "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop: expected", 400},
        {"/v1/completions", "{\"prompt\":\"x\",\"n\":3}", "n: expected an integer in [1, 1]", 400},
        {"/v1/completions", "{\"prompt\":\"x\",\"logprobs\":5}", "logprobs: not supported", 400},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
                                 "\"function\"}]}", "tools: not supported", 400},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
                                 "{\"type\":\"json_object\"}}", "response_format: not supported", 400},
        {"/v1/completions", "{\"prompt\":\"x\",\"stream\":1}", "stream: expected true or false", 400},
        {"/v1/completions", "{\"prompt\":\"\"}", "prompt: empty", 400},
        {"/v1/completions", "{\"prompt\":\"ab\xff\xfe\"}", "the body is not UTF-8 (byte 13)", 400},
        {"/v1/completions", "{\"prompt\":\"\xc3\xa9\xed\xa0\x80\"}", "the body is not UTF-8 (byte 13)", 400},
        {"/v1/completions", "{\"prompt\":\"a\\ud800b\"}", "unpaired surrogate", 400},
        {"/v1/completions", "{\"prompt\":\"x\xc3", "the body is not UTF-8 (byte 12)", 400},
        {"/v1/completions", "\xff", "the body is not UTF-8 (byte 0)", 400},
        {"/v1/chat/completions", "{\"messages\":[]}", "messages: expected an array of 1 to", 400},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].role", 400},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
         "messages[0].content[0]", 400},
        {"/v1/completions", "{\"prompt\":\"x\",\"kv\":\"f32\",\"max_tokens\":120}", "more than the server's budget",
         400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        Reply r = http(&s, "POST", cases[i].path, cases[i].body);
        cr_expect_eq(r.status, cases[i].status, "%s: status %d: %s", cases[i].body, r.status, r.body);
        cr_expect(!strncmp(r.body, "{\"error\":{\"message\":", 20) && strstr(r.body, cases[i].says),
                  "%s: expected '%s' in %s", cases[i].body, cases[i].says, r.body);
        free(r.body);
    }
    /* a prompt longer than the context */
    char lng[4096] = "{\"prompt\":\"";
    for (int i = 0; i < 100; i++) strcat(lng, "In the beginning ");
    strcat(lng, "\"}");
    Reply r = http(&s, "POST", "/v1/completions", lng);
    cr_expect_eq(r.status, 400, "%s", r.body);
    cr_expect(strstr(r.body, "tokens do not fit the context of 128 (the server's -c)"), "%s", r.body);
    free(r.body);
    /* a body past the bound: 413 */
    size_t big = (8u << 20) + 10;
    char *b = malloc(big);
    memset(b, ' ', big);
    int fd = connect_to(s.port);
    send_request(fd, "POST", "/v1/completions", s.headers, b, big);
    r = read_reply(fd);
    cr_expect_eq(r.status, 413, "%s", r.body);
    free(r.body), free(b);
    /* after all that the server still answers, the unsupported fields at their off values taken */
    r = http(&s, "POST", "/v1/completions",
             "{\"prompt\":\"x\",\"max_tokens\":2,\"logprobs\":null,\"tools\":[],\"tool_choice\":\"none\","
             "\"response_format\":{\"type\":\"text\"},\"echo\":false,\"best_of\":1,\"logit_bias\":{}}");
    cr_expect_eq(r.status, 200, "%s", r.body);
    free(r.body);
    server_stop(&s);
}

/* A counter or gauge of /metrics. */
static long metric(const Server *s, const char *name) {
    Reply m = http(s, "GET", "/metrics", NULL);
    char key[96];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(m.body, key);
    cr_assert(p, "no %s in %s", name, m.body);
    long v = atol(p + strlen(key));
    free(m.body);
    return v;
}

/* Waits up to 10 s for a metric to reach a value; 1 when it did. */
static int metric_becomes(const Server *s, const char *name, long value) {
    for (int i = 0; i < 100; i++) {
        if (metric(s, name) == value) return 1;
        usleep(100000);
    }
    return 0;
}

/* A completion body for prompt (a long shared part and a tail) in scheme kv. */
static char *prefix_body(const char *tail, const char *kv) {
    char *b = malloc(4096);
    int w = snprintf(b, 4096, "{\"prompt\":\"");
    for (int i = 0; i < 10; i++) w += snprintf(b + w, 4096 - (size_t)w, "In the beginning God created the heaven and the earth. ");
    snprintf(b + w, 4096 - (size_t)w, "%s\",\"max_tokens\":16,\"temperature\":0,\"kv\":\"%s\"}", tail, kv);
    return b;
}

static int cached_tokens(const char *body) {
    const char *p = strstr(body, "\"cached_tokens\":");
    return p ? atoi(p + strlen("\"cached_tokens\":")) : -1;
}

/* Exact prefix reuse: a prompt sharing its first hundred tokens with an
 * earlier one loads their chunks (usage says how many) and gets the text
 * a cold server gives, for schemes of each storage form, on the Qwen3
 * model and on the hybrid; and a server restarted on the same
 * --cache-dir finds the chunks the last one wrote. */
static void check_warm(const char *model, const char *const *kv, int nkv) {
    Server cold, warm;
    server_start_model(&cold, model, "--cache-mb 0");
    server_start_model(&warm, model, "--cache-chunk 32");
    for (int i = 0; i < nkv; i++) {
        char *a = prefix_body("And the earth was without form.", kv[i]), *b = prefix_body("Blessed are the meek.", kv[i]);
        Reply rc = http(&cold, "POST", "/v1/completions", b);
        Reply ra = http(&warm, "POST", "/v1/completions", a);
        Reply rb = http(&warm, "POST", "/v1/completions", b);
        cr_assert(rc.status == 200 && ra.status == 200 && rb.status == 200, "%s %s: %s %s", model, kv[i], rc.body, rb.body);
        char *tc = json_str(rc.body, "text"), *tb = json_str(rb.body, "text");
        cr_expect(tc && tb && !strcmp(tc, tb), "%s %s: cold '%s', warm '%s'", model, kv[i], tc, tb);
        cr_expect_eq(cached_tokens(rc.body), 0, "%s", rc.body);
        cr_expect_eq(cached_tokens(ra.body), 0, "%s", ra.body);
        cr_expect_geq(cached_tokens(rb.body), 64, "%s %s: %s", model, kv[i], rb.body);
        free(a), free(b), free(tc), free(tb), free(rc.body), free(ra.body), free(rb.body);
    }
    cr_expect_gt(metric(&warm, "run_prefix_reused_tokens_total"), 0);
    server_stop(&cold);
    server_stop(&warm);
}

Test(serve, prefix_reuse_is_exact) {
    const char *const kv[] = {"f32", "tbq4", "kivi2", "q8/q4"};
    check_warm(MODEL, kv, 4);
}

Test(serve, prefix_reuse_is_exact_hybrid) {
    const char *const kv[] = {"f16", "tbq4"};
    check_warm("models/qwen35-kjv-mtp", kv, 2);
}

Test(serve, prefix_cache_outlives_the_server) {
    char dir[64], args[160], cmd[128];
    snprintf(dir, sizeof dir, "/tmp/run-serve-cache-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(args, sizeof args, "--cache-chunk 32 --cache-dir %s", dir);
    Server s;
    char *a = prefix_body("And the earth was without form.", "tbq4"), *b = prefix_body("Blessed are the meek.", "tbq4");
    server_start(&s, "--cache-mb 0");
    Reply rc = http(&s, "POST", "/v1/completions", b);
    server_stop(&s);
    server_start(&s, args);
    Reply ra = http(&s, "POST", "/v1/completions", a);
    server_stop(&s);
    server_start(&s, args);
    Reply rb = http(&s, "POST", "/v1/completions", b);
    cr_assert(rc.status == 200 && ra.status == 200 && rb.status == 200, "%s", rb.body);
    char *tc = json_str(rc.body, "text"), *tb = json_str(rb.body, "text");
    cr_expect(tc && tb && !strcmp(tc, tb), "cold '%s', after a restart '%s'", tc, tb);
    cr_expect_geq(cached_tokens(rb.body), 64, "%s", rb.body);
    cr_expect_gt(metric(&s, "run_prefix_disk_reads_total"), 0);
    server_stop(&s);
    free(a), free(b), free(tc), free(tb), free(rc.body), free(ra.body), free(rb.body);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* Sixteen clients at once against four slots and a queue of twelve,
 * half of them streaming: every one gets a whole answer (its tokens, its
 * finish_reason, a stream's [DONE]), none an error, in bounded time. */
typedef struct {
    const Server *s;
    int i;
    Reply r;
} Client;

static void *client(void *p) {
    Client *c = p;
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0.7,\"seed\":%d,\"stream\":%s}",
             c->i % 3 ? "And God said" : "Blessed are the", 8 + c->i % 5, c->i, c->i % 2 ? "true" : "false");
    c->r = http(c->s, "POST", "/v1/completions", body);
    return NULL;
}

Test(serve, sixteen_clients_at_once) {
    Server s;
    server_start(&s, "-np 4 --queue 12");
    Client c[16];
    pthread_t t[16];
    for (int i = 0; i < 16; i++) {
        c[i] = (Client){&s, i, {0, "", NULL}};
        pthread_create(&t[i], NULL, client, &c[i]);
    }
    for (int i = 0; i < 16; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 16; i++) {
        /* sampled: an end of text may come before max_tokens */
        cr_expect_eq(c[i].r.status, 200, "client %d: %s", i, c[i].r.body);
        cr_expect(strstr(c[i].r.body, "\"finish_reason\":\"length\"") || strstr(c[i].r.body, "\"finish_reason\":\"stop\""),
                  "client %d: %s", i, c[i].r.body);
        if (i % 2) cr_expect(strstr(c[i].r.body, "data: [DONE]\n\n") != NULL, "client %d: %s", i, c[i].r.body);
        const char *u = strstr(c[i].r.body, "\"completion_tokens\":");
        cr_expect(u && atoi(u + strlen("\"completion_tokens\":")) <= 8 + i % 5, "client %d: %s", i, c[i].r.body);
        free(c[i].r.body);
    }
    cr_expect_eq(metric(&s, "run_requests_failed_total"), 0);
    cr_expect_eq(metric(&s, "run_requests_rejected_total"), 0);
    server_stop(&s);
}

/* curl, as a user types it: a chat completion, a streamed one (-N), and
 * the same text in both. */
Test(serve, curl) {
    if (system("curl --version >/dev/null 2>&1")) cr_skip_test("no curl here");
    Server s;
    server_start(&s, "");
    char cmd[1024], path[64];
    snprintf(path, sizeof path, "/tmp/run_serve_curl.%d", (int)getpid());
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Who made the light?\"}],\"max_tokens\":12,"
                       "\"temperature\":0";
    snprintf(cmd, sizeof cmd, "curl -sf http://127.0.0.1:%d/v1/chat/completions -H 'Content-Type: application/json' "
             "-d '%s}' >%s", s.port, body, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    char *plain = slurp(path, NULL), *text = json_str(plain, "content");
    cr_expect(text && strstr(plain, "\"object\":\"chat.completion\"") && strstr(plain, "\"usage\""), "%s", plain);
    snprintf(cmd, sizeof cmd, "curl -sfN http://127.0.0.1:%d/v1/chat/completions -d '%s,\"stream\":true}' >%s", s.port,
             body, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    char *sse = slurp(path, NULL), *streamed = sse_text(sse, "content");
    cr_expect(strstr(sse, "data: [DONE]\n\n") != NULL, "%s", sse);
    cr_expect(text && !strcmp(streamed, text), "streamed '%s', plain '%s'", streamed, text);
    free(plain), free(text), free(sse), free(streamed);
    remove(path);
    server_stop(&s);
}

/* The official openai npm client, unchanged (tools/clients/openai-check.mjs:
 * models, a chat completion, the same streamed, a completion, a 400 read
 * as an APIError), when it is installed (cd tools/clients && npm ci;
 * .ci/run does). */
Test(serve, openai_client) {
    if (access("tools/clients/node_modules/openai/package.json", R_OK) || system("node --version >/dev/null 2>&1"))
        cr_skip_test("the openai npm client is not installed (cd tools/clients && npm ci)");
    Server s;
    server_start(&s, "");
    char cmd[512], path[64];
    snprintf(path, sizeof path, "/tmp/run_serve_openai.%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "timeout -s KILL 300 node tools/clients/openai-check.mjs http://127.0.0.1:%d/v1 >%s 2>&1",
             s.port, path);
    const int rc = system(cmd);
    char *out = slurp(path, NULL);
    cr_expect(rc == 0 && strstr(out, "openai-check: ok"), "%s", out);
    free(out);
    remove(path);
    server_stop(&s);
}

/* A request left open: the socket, after the request is sent. */
static int open_request(const Server *s, const char *body) {
    int fd = connect_to(s->port);
    send_request(fd, "POST", "/v1/completions", s->headers, body, strlen(body));
    return fd;
}

/* One slot and one place in the queue: past them a request is refused with
 * 503; a client that hangs up while queued leaves the queue, one that
 * hangs up while running (streamed or not) frees its slot. */
Test(serve, full_server_503_and_hangups_free) {
    Server s;
    server_start(&s, "-np 1 --queue 1");
    const char *lng = "{\"prompt\":\"x\",\"max_tokens\":500,\"stream\":true,\"temperature\":0}";
    const char *small = "{\"prompt\":\"x\",\"max_tokens\":2}";
    int a = open_request(&s, lng);
    cr_assert(metric_becomes(&s, "run_sequences_active", 1));
    int b = open_request(&s, lng);
    cr_assert(metric_becomes(&s, "run_requests_queued", 1));
    Reply busy = http(&s, "POST", "/v1/completions", small);
    cr_expect_eq(busy.status, 503, "%s", busy.body);
    cr_expect(strstr(busy.body, "\"type\":\"server_busy\"") && strstr(busy.body, "--queue"), "%s", busy.body);
    free(busy.body);
    cr_expect_eq(metric(&s, "run_requests_rejected_total"), 1);
    close(b);
    cr_expect(metric_becomes(&s, "run_requests_queued", 0), "a hung-up queued request kept its place");
    close(a);
    cr_expect(metric_becomes(&s, "run_sequences_active", 0), "a hung-up stream kept its slot");
    /* not streamed: noticed while its text comes, long before its 500 tokens */
    const long before = metric(&s, "run_generated_tokens_total");
    int c = open_request(&s, "{\"prompt\":\"x\",\"max_tokens\":500,\"temperature\":0}");
    cr_assert(metric_becomes(&s, "run_sequences_active", 1));
    close(c);
    cr_expect(metric_becomes(&s, "run_sequences_active", 0), "a hung-up plain request kept its slot");
    cr_expect(metric(&s, "run_generated_tokens_total") - before < 500, "the plain request ran to its end");
    Reply ok = http(&s, "POST", "/v1/completions", small);
    cr_expect_eq(ok.status, 200, "%s", ok.body);
    free(ok.body);
    server_stop(&s);
}

/* The command line: serve's own flags and what they do not go with. */
Test(serve, usage_errors) {
    if (!has_serve()) cr_skip_test("this ./run was built without libmicrohttpd");
    const char *args[] = {MODEL " -m serve -i hello", MODEL " --port 8080", MODEL " -m serve -np 0",
                          MODEL " -m serve --port 70000", MODEL " -m serve -dev cuda", MODEL " --cache-mb 8",
                          MODEL " -m serve --cache-chunk 20", MODEL " -m serve --cache-mb 0 --cache-dir /tmp"};
    const char *says[] = {"not -i or -f", "are for -m serve", "-np: expected", "--port: expected", "CPU only",
                          "are for -m serve", "--cache-chunk: expected a multiple of 16", "the prefix cache is off"};
    for (int i = 0; i < 8; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>/tmp/run_serve_usage.%d", bin(), args[i], (int)getpid());
        int st = system(cmd);
        snprintf(cmd, sizeof cmd, "/tmp/run_serve_usage.%d", (int)getpid());
        char *err = slurp(cmd, NULL);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: exit %d", args[i], WEXITSTATUS(st));
        cr_expect(strstr(err, says[i]), "%s: %s", args[i], err);
        free(err);
        remove(cmd);
    }
    /* a cache folder that is not one: one line naming it, exit 1 */
    char cmd0[512], path0[128];
    snprintf(path0, sizeof path0, "/tmp/run_serve_usage.%d", (int)getpid());
    snprintf(cmd0, sizeof cmd0, "%s " MODEL " -m serve --port 0 --cache-dir /nonexistent/run 2>%s", bin(), path0);
    int st0 = system(cmd0);
    char *err0 = slurp(path0, NULL);
    cr_expect(WIFEXITED(st0) && WEXITSTATUS(st0) == 1, "exit %d: %s", WEXITSTATUS(st0), err0);
    const char *e0 = strstr(err0, "error: --cache-dir /nonexistent/run: expected a folder");
    cr_expect(e0 && !strstr(e0 + 1, "error:"), "%s", err0);
    free(err0);
    remove(path0);
    /* an address in use: one line naming it, exit 1 */
    Server s;
    server_start(&s, "");
    char cmd[512], path[128];
    snprintf(path, sizeof path, "/tmp/run_serve_usage.%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s " MODEL " -m serve --port %d 2>%s", bin(), s.port, path);
    int st = system(cmd);
    char *err = slurp(path, NULL);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit %d: %s", WEXITSTATUS(st), err);
    cr_expect(strstr(err, "error: --host 127.0.0.1 --port") && strstr(err, "in use"), "%s", err);
    free(err);
    remove(path);
    server_stop(&s);
}

/* The reply to a request with the given header lines, as a fresh client sends it. */
static Reply http_with(Server *s, const char *headers, const char *method, const char *path, const char *body) {
    const char *keep = s->headers;
    s->headers = headers;
    Reply r = http(s, method, path, body);
    s->headers = keep;
    return r;
}

/* A 401 as the server gives it: the JSON error saying why, the scheme in
 * WWW-Authenticate, nothing of the key the client sent. */
static void expect_401(Reply r, const char *says, const char *sent) {
    cr_expect_eq(r.status, 401, "%s", r.body);
    cr_expect(!strncmp(r.body, "{\"error\":{\"message\":", 20) && strstr(r.body, says) &&
              strstr(r.body, "\"code\":401}}"), "expected '%s' in %s", says, r.body);
    cr_expect(strstr(r.head, "\r\nWWW-Authenticate: Bearer"), "%s", r.head);
    cr_expect(!sent || !strstr(r.body, sent), "the reply repeats the key sent: %s", r.body);
    free(r.body);
}

/* With --api-key, /v1/ answers only requests carrying the key, before
 * their body: a POST announcing 100 MB and sending none is refused at
 * once. /health and /metrics stay open; stderr never shows the key. */
Test(serve, api_key) {
    Server s;
    server_start(&s, "--api-key test-key-123");
    const char *req = "{\"prompt\":\"In the\",\"max_tokens\":4,\"temperature\":0}";
    expect_401(http(&s, "POST", "/v1/completions", req), "no API key", NULL);
    expect_401(http(&s, "GET", "/v1/models", NULL), "no API key", NULL);
    expect_401(http_with(&s, "Authorization: Bearer wrong-key-456\r\n", "POST", "/v1/completions", req),
               "the API key is not this server's", "wrong-key-456");
    /* the right key's prefix is as wrong as any other */
    expect_401(http_with(&s, "Authorization: Bearer test-key-12\r\n", "GET", "/v1/models", NULL),
               "the API key is not this server's", NULL);
    expect_401(http_with(&s, "Authorization: Basic dGVzdC1rZXktMTIz\r\n", "GET", "/v1/models", NULL),
               "expected Bearer", "dGVzdC1rZXktMTIz");
    int fd = connect_to(s.port);
    const struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const char *head = "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                       "Content-Length: 100000000\r\n\r\n";
    cr_assert_eq(write(fd, head, strlen(head)), (ssize_t)strlen(head));
    expect_401(read_reply(fd), "no API key", NULL);
    Reply r = http(&s, "GET", "/health", NULL);
    cr_expect_eq(r.status, 200, "%s", r.body);
    free(r.body);
    /* nothing refused reached the engine */
    cr_expect_eq(metric(&s, "run_requests_total"), 0);
    s.headers = "Authorization: Bearer test-key-123\r\n";
    r = http(&s, "POST", "/v1/completions", req);
    cr_expect_eq(r.status, 200, "%s", r.body);
    cr_expect(strstr(r.body, "\"object\":\"text_completion\"") && strstr(r.body, "\"completion_tokens\":4"), "%s",
              r.body);
    free(r.body);
    r = http(&s, "GET", "/v1/models", NULL);
    cr_expect_eq(r.status, 200, "%s", r.body);
    free(r.body);
    char *err = slurp(s.err_path, NULL);
    cr_expect(!strstr(err, "test-key-123"), "stderr shows the key: %s", err);
    free(err);
    server_stop(&s);
}

/* RUN_API_KEY when there is no --api-key; the flag wins over it. */
Test(serve, api_key_from_the_environment) {
    setenv("RUN_API_KEY", "env-key-789", 1);
    Server s;
    server_start(&s, "");
    expect_401(http(&s, "GET", "/v1/models", NULL), "no API key", NULL);
    Reply r = http_with(&s, "Authorization: Bearer env-key-789\r\n", "GET", "/v1/models", NULL);
    cr_expect_eq(r.status, 200, "%s", r.body);
    free(r.body);
    server_stop(&s);
    server_start(&s, "--api-key flag-key-000");
    expect_401(http_with(&s, "Authorization: Bearer env-key-789\r\n", "GET", "/v1/models", NULL),
               "the API key is not this server's", "env-key-789");
    r = http_with(&s, "Authorization: Bearer flag-key-000\r\n", "GET", "/v1/models", NULL);
    cr_expect_eq(r.status, 200, "%s", r.body);
    free(r.body);
    server_stop(&s);
    unsetenv("RUN_API_KEY");
}

/* A key that is empty or no header can carry: one line, exit 2, the key
 * not in it; -h does not show the environment's key. */
Test(serve, api_key_usage_errors) {
    if (!has_serve()) cr_skip_test("this ./run was built without libmicrohttpd");
    const char *pre[] = {"", "RUN_API_KEY=", "", "", "RUN_API_KEY='bad key'"};
    const char *args[] = {"-m serve --api-key ''", "-m serve", "-m serve --api-key 'bad key'", "--api-key k",
                          "-m serve"};
    const char *says[] = {"--api-key: expected a key, found an empty one", "RUN_API_KEY: expected a key",
                          "--api-key: expected printable ASCII", "are for -m serve", "RUN_API_KEY: expected printable"};
    char path[128];
    snprintf(path, sizeof path, "/tmp/run_serve_usage.%d", (int)getpid());
    for (int i = 0; i < 5; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "%s %s " MODEL " %s >/dev/null 2>%s", pre[i], bin(), args[i], path);
        int st = system(cmd);
        size_t n;
        char *err = slurp(path, &n);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: exit %d", cmd, WEXITSTATUS(st));
        cr_expect(strstr(err, says[i]) && n > 0 && strchr(err, '\n') == err + n - 1, "%s: %s", cmd, err);
        cr_expect(!strstr(err, "bad key"), "%s: the error shows the key: %s", cmd, err);
        free(err);
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "RUN_API_KEY=env-key-789 %s -h >%s", bin(), path);
    cr_assert_eq(system(cmd), 0);
    char *help = slurp(path, NULL);
    cr_expect(strstr(help, "  --api-key KEY    ") && !strstr(help, "env-key-789"), "%s", help);
    free(help);
    remove(path);
}
