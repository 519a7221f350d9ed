/* bench_serve.c: the server's speed as its users see it (make bench-serve).
 *
 * Starts `./run MODEL -m serve` (RUN_BIN) once per KV scheme and user
 * count, and has that many users each stream one greedy completion at
 * the same time; every server-sent event's arrival is timed. Prints the
 * aggregate generated tokens per second (all completion tokens over the
 * wall time from the first request to the last answer), the aggregate
 * decode tokens per second (the tokens after each stream's first, from
 * the earliest first token to the last token), the time to the
 * first token and the gaps between a stream's tokens (p50 and p99 over
 * all streams), then, on a server with the prefix cache, the time to the
 * first token of a prompt with a long document in it, cold and again
 * with the same document and another question (warm), and what the
 * cache keeps of a token in each scheme.
 *
 *   bench_serve MODEL [--kv f16,tbq4] [--users 1,4,16,32] [--tokens 32] [--prefix 2048] [--threads 2]
 */
#include <arpa/inet.h>
#include <errno.h>
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "bench_serve: %s\n", what);
    exit(1);
}

typedef struct {
    pid_t pid;
    int port;
    char err[64];
} Server;

/* Starts the server with args and waits for the line naming its port. */
static void server_start(Server *s, const char *model, const char *args) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    snprintf(s->err, sizeof s->err, "/tmp/bench_serve.%d.err", (int)getpid());
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s %s -m serve --port 0 %s 2>%s", bin, model, args, s->err);
    if ((s->pid = fork()) == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->port = 0;
    for (int i = 0; i < 1200 && !s->port; i++) {
        usleep(50000);
        FILE *f = fopen(s->err, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            const char *p = strstr(line, "listening on http://127.0.0.1:");
            if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        }
        if (f) fclose(f);
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) break;
    }
    if (!s->port) {
        fprintf(stderr, "bench_serve: the server did not start: %s\n", cmd);
        exit(1);
    }
}

static void server_stop(Server *s) {
    kill(s->pid, SIGTERM);
    waitpid(s->pid, NULL, 0);
    remove(s->err);
}

/* One request over a new connection: the whole reply in *out (malloc'd),
 * and, for a stream, the arrival time of each event that carries text. */
typedef struct {
    double t0, *times;
    int n_times, cap_times;
    char *out;
    size_t len;
} Call;

static void call(int port, const char *path, const char *body, Call *c) {
    const char *method = body ? "POST" : "GET";
    body = body ? body : "";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {600, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) die("cannot connect to the server");
    char head[256];
    int hn = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n", method, path, strlen(body));
    memset(c, 0, sizeof *c);
    c->t0 = now_s();
    if (write(fd, head, (size_t)hn) != hn || write(fd, body, strlen(body)) != (ssize_t)strlen(body))
        die("cannot send a request");
    size_t cap = 1 << 16, scanned = 0;
    c->out = malloc(cap);
    for (;;) {
        if (c->len + 4096 + 1 > cap) c->out = realloc(c->out, cap *= 2);
        ssize_t r = read(fd, c->out + c->len, 4096);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        const double t = now_s();
        c->len += (size_t)r;
        c->out[c->len] = 0;
        /* each complete event with text in it arrived now */
        for (char *e; (e = strstr(c->out + scanned, "\n\n")); scanned = (size_t)(e - c->out) + 2) {
            *e = 0;
            const char *ev = c->out + scanned;
            int text = strstr(ev, "\"text\":\"") && !strstr(ev, "\"text\":\"\"");
            text |= strstr(ev, "\"content\":\"") && !strstr(ev, "\"content\":\"\"");
            *e = '\n';
            if (!text) continue;
            if (c->n_times == c->cap_times)
                c->times = realloc(c->times, (size_t)(c->cap_times = c->cap_times ? 2 * c->cap_times : 64) * sizeof(double));
            c->times[c->n_times++] = t;
        }
    }
    close(fd);
    if (!strstr(c->out, " 200 ")) {
        fprintf(stderr, "bench_serve: a request failed: %.300s\n", c->out);
        exit(1);
    }
}

static int usage_field(const char *out, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(out, k);
    return p ? atoi(p + strlen(k)) : -1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double p) {
    if (!n) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

typedef struct {
    int port, user, tokens;
    Call c;
} User;

static void *user_main(void *p) {
    User *u = p;
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\":\"And it came to pass, in the %d year of the reign\",\"max_tokens\":%d,"
             "\"temperature\":0,\"stream\":true}", u->user + 1, u->tokens);
    call(u->port, "/v1/completions", body, &u->c);
    return NULL;
}

/* users streams at once: aggregate tok/s, TTFT and inter-token gaps. */
static void bench_users(const char *model, const char *kv, int users, int tokens, int threads, int ctx) {
    Server s;
    char args[512];
    snprintf(args, sizeof args, "-np %d --queue 64 -kv %s -T %d -c %d --cache-mb 0", users, kv, threads, ctx);
    server_start(&s, model, args);
    Call w;
    /* a warm-up, so that page faults and thread start-up do not count */
    call(s.port, "/v1/completions", "{\"prompt\":\"In the beginning\",\"max_tokens\":4}", &w);
    free(w.out), free(w.times);
    User *u = calloc((size_t)users, sizeof *u);
    pthread_t *t = calloc((size_t)users, sizeof *t);
    const double t0 = now_s();
    for (int i = 0; i < users; i++) {
        u[i] = (User){.port = s.port, .user = i, .tokens = tokens};
        pthread_create(&t[i], NULL, user_main, &u[i]);
    }
    double end = t0;
    for (int i = 0; i < users; i++) pthread_join(t[i], NULL);
    int total = 0, ng = 0, decoded = 0;
    double *gaps = malloc(sizeof(double) * (size_t)users * (size_t)(tokens + 8)), *ttft = malloc(sizeof(double) * users);
    double first = end + 1e9;
    for (int i = 0; i < users; i++) {
        const Call *c = &u[i].c;
        const int n = usage_field(c->out, "completion_tokens");
        total += n;
        ttft[i] = c->n_times ? c->times[0] - c->t0 : 0;
        for (int k = 1; k < c->n_times; k++) gaps[ng++] = c->times[k] - c->times[k - 1];
        if (c->n_times && c->times[c->n_times - 1] > end) end = c->times[c->n_times - 1];
        /* decode: the tokens after each stream's first, from the first
         * first token to the last token (the prompts' step left out) */
        if (c->n_times && c->times[0] < first) first = c->times[0];
        decoded += n > 1 ? n - 1 : 0;
    }
    printf("%-6s %5d  %9.1f  %10.1f  %8.1f  %8.0f  %8.1f  %8.1f\n", kv, users, total / (end - t0),
           end > first ? decoded / (end - first) : 0, total / (end - t0) / users, 1e3 * pct(ttft, users, 0.5),
           1e3 * pct(gaps, ng, 0.5), 1e3 * pct(gaps, ng, 0.99));
    fflush(stdout);
    for (int i = 0; i < users; i++) free(u[i].c.out), free(u[i].c.times);
    free(u), free(t), free(gaps), free(ttft);
    server_stop(&s);
}

/* A document of about `words` words, different for each seed. */
static char *document(int words, int seed) {
    static const char *const w[] = {"and", "the", "earth", "was", "without", "form", "void", "darkness", "upon",
                                    "face", "of", "deep", "spirit", "God", "moved", "waters", "light", "day", "night",
                                    "evening", "morning", "firmament", "heaven", "seas", "grass", "herb", "seed",
                                    "fruit", "tree", "kind", "stars", "signs", "seasons", "years", "great", "lights"};
    char *d = malloc((size_t)words * 12 + 1);
    size_t n = 0;
    unsigned x = 2463534242u + (unsigned)seed * 7919u;
    for (int i = 0; i < words; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        n += (size_t)sprintf(d + n, "%s ", w[x % (sizeof w / sizeof *w)]);
    }
    d[n] = 0;
    return d;
}

/* TTFT of a prompt holding a document of about `prefix` tokens, cold,
 * then warm (the same document, another question), median of three
 * documents; and the prefix cache's bytes per cached token. */
static double bench_prefix(const char *model, const char *kv, int prefix, int threads, int ctx) {
    Server s;
    char args[512];
    snprintf(args, sizeof args, "-np 1 -kv %s -T %d -c %d --cache-mb 4096", kv, threads, ctx);
    server_start(&s, model, args);
    /* words per token, from one prompt's usage (max_tokens 0 computes nothing) */
    const int probe = prefix / 4 + 1;
    char *d = document(probe, 99), *body = malloc(1 << 20);
    Call c;
    snprintf(body, 1 << 20, "{\"prompt\":\"%s\",\"max_tokens\":0}", d);
    call(s.port, "/v1/completions", body, &c);
    const int words = (int)((double)probe * prefix / usage_field(c.out, "prompt_tokens")) + 1;
    free(c.out), free(c.times), free(d);
    double cold[3], warm[3];
    int cached = 0, ptok = 0;
    for (int r = 0; r < 3; r++) {
        d = document(words, r);
        for (int q = 0; q < 2; q++) {
            snprintf(body, 1 << 20, "{\"prompt\":\"%s\\nQuestion %d: what was made on the %s day?\\nAnswer:\","
                     "\"max_tokens\":1,\"temperature\":0,\"stream\":true}", d, q + 1, q ? "fourth" : "first");
            call(s.port, "/v1/completions", body, &c);
            (q ? warm : cold)[r] = c.n_times ? c.times[0] - c.t0 : 0;
            if (q) cached = usage_field(c.out, "cached_tokens"), ptok = usage_field(c.out, "prompt_tokens");
            free(c.out), free(c.times);
        }
        free(d);
    }
    /* the cache's bytes for this scheme over the positions it holds */
    call(s.port, "/metrics", NULL, &c);
    free(c.times);
    free(body);
    body = c.out;
    char key[96];
    snprintf(key, sizeof key, "run_prefix_cache_bytes{scheme=\"%s\"} ", kv);
    const char *p = strstr(body, key);
    const double bytes = p ? atof(p + strlen(key)) : 0;
    /* every chunk stored is still held (4 GB holds them all) */
    const char *rt = strstr(body, "\nrun_prefix_chunks_stored_total ");
    const long chunks = rt ? atol(rt + strlen("\nrun_prefix_chunks_stored_total ")) : 0;
    const char *cs = strstr(body, "\nrun_prefix_chunk_size ");
    const long chunk = cs ? atol(cs + strlen("\nrun_prefix_chunk_size ")) : 0;
    const double per_token = chunks && chunk ? bytes / (double)(chunks * chunk) : 0;
    printf("%-6s %7d  %7d  %9.0f  %9.0f  %7.1fx  %12.0f\n", kv, ptok, cached, 1e3 * pct(cold, 3, 0.5),
           1e3 * pct(warm, 3, 0.5), pct(cold, 3, 0.5) / pct(warm, 3, 0.5), per_token);
    fflush(stdout);
    free(body);
    server_stop(&s);
    return per_token;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_serve MODEL [--kv f16,tbq4] [--users 1,4,16,32] [--tokens 32] [--prefix 2048] "
                    "[--threads 2]\n");
    return 2;
}

/* s as a whole number in [lo, hi], else -1. */
static int whole(const char *s, int lo, int hi) {
    char *end;
    long v = strtol(s, &end, 10);
    return end == s || *end || v < lo || v > hi ? -1 : (int)v;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-' || argc % 2) return usage();
    const char *model = argv[1], *kvs = "f16,tbq4", *users = "1,4,16,32";
    int tokens = 32, prefix = 2048, threads = 2;
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *o = argv[i], *v = argv[i + 1];
        int *n = !strcmp(o, "--tokens") ? &tokens : !strcmp(o, "--prefix") ? &prefix : !strcmp(o, "--threads") ? &threads : NULL;
        if (!strcmp(o, "--kv")) kvs = v;
        else if (!strcmp(o, "--users")) users = v;
        else if (!n) return usage();
        else if ((*n = whole(v, 1, 1 << 20)) < 0) {
            fprintf(stderr, "bench_serve: %s: expected a whole number >= 1, found '%s'\n", o, v);
            return 2;
        }
    }
    char check[256];
    snprintf(check, sizeof check, "%s", users);
    char *sv = NULL;
    for (char *u = strtok_r(check, ",", &sv); u; u = strtok_r(NULL, ",", &sv))
        if (whole(u, 1, 256) < 0) {
            fprintf(stderr, "bench_serve: --users: expected user counts in 1..256 joined by commas, found '%s'\n", users);
            return 2;
        }
    signal(SIGPIPE, SIG_IGN);
    printf("%s, %d threads, %d tokens per user, greedy\n", model, threads, tokens);
    printf("kv     users  agg tok/s  decode tok/s  per user  TTFT p50  ITL p50   ITL p99   (ms)\n");
    char list[256];
    snprintf(list, sizeof list, "%s", kvs);
    char *save1 = NULL;
    for (char *kv = strtok_r(list, ",", &save1); kv; kv = strtok_r(NULL, ",", &save1)) {
        char ul[256];
        snprintf(ul, sizeof ul, "%s", users);
        char *save2 = NULL;
        for (char *u = strtok_r(ul, ",", &save2); u; u = strtok_r(NULL, ",", &save2))
            bench_users(model, kv, atoi(u), tokens, threads, 256 + tokens);
    }
    printf("\nkv     prompt  cached  cold TTFT  warm TTFT  speedup  cache B/token\n");
    snprintf(list, sizeof list, "%s", kvs);
    double first = 0;
    char *save = NULL;
    for (char *kv = strtok_r(list, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        const double b = bench_prefix(model, kv, prefix, threads, prefix + prefix / 4 + 256);
        if (!first) first = b;
        else if (b > 0) printf("  %s holds %.2fx the tokens of the first scheme in the same memory\n", kv, first / b);
    }
    return 0;
}
