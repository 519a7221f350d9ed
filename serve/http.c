/* http.c: the HTTP side of ./run -m serve (serve.h): libmicrohttpd with a
 * thread per connection, OpenAI's request and response shapes, errors as
 * JSON bodies {"error": {"message", "type", "code"}}.
 *
 * A connection's thread reads the body (at most REQUEST_MAX_BODY), checks
 * and tokenizes the request, submits a Job to the engine and then waits on
 * it: for a plain request until it is done (one JSON body, status chosen
 * at the end), for a stream through a content callback that writes each
 * piece of text as a server-sent event as it comes. A client that hangs up
 * is noticed within WAIT_S and its job cancelled. With an API key (-m
 * serve --api-key), a /v1/ request without it is answered 401 at the first
 * call, from its headers, before any of its body is read.
 */
#include "serve/serve.h"
#include "tokenizer/chat.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <omp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve/engine.h"
#include "serve/request.h"
#include "tokenizer/unicode.h"

/* Seconds a connection waits on its job before it looks whether the client is still there. */
#define WAIT_S 0.2

typedef struct {
    const ServeOpts *o;
    Model *m;
    const Tokenizer *tok;
    Engine e;
    atomic_long ids;    /* response ids */
} Server;

/* A connection's request: its body as it arrives. */
typedef struct {
    char *body;
    size_t len, cap;
    int too_big;
} Conn;

/* A streamed response: the job, what of its text went out, and bytes
 * formatted but not yet taken by libmicrohttpd. */
typedef struct {
    Server *s;
    Job *j;
    struct MHD_Connection *c;
    int chat, ended, role_sent;
    long id;
    long created;
    size_t sent;
    char *out;
    size_t out_len, out_off;
} Stream;

/* ------------------------------------------------------------ JSON out */

/* s[0..n) as a JSON string; bytes that are not UTF-8 (a token may end in
 * half a character) become U+FFFD, so the body is always valid JSON. */
static void put_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = uni_decode((const unsigned char *)s + i, n - i, &cp);
        if (cp >= UNI_RAW_BYTE) fputs("\\ufffd", f);
        else if (cp == '"' || cp == '\\') fprintf(f, "\\%c", (int)cp);
        else if (cp == '\n') fputs("\\n", f);
        else if (cp < 0x20) fprintf(f, "\\u%04x", (unsigned)cp);
        else fwrite(s + i, 1, l, f);
        i += l;
    }
    fputc('"', f);
}

/* Memory a FILE writes into (open_memstream), for building bodies. */
typedef struct {
    char *buf;
    size_t len;
    FILE *f;
} Text;

static FILE *text_open(Text *t) {
    t->buf = NULL;
    t->len = 0;
    return t->f = open_memstream(&t->buf, &t->len);
}

/* Closes t; its bytes stay in t->buf (NULL when out of memory). */
static int text_close(Text *t) {
    int bad = !t->f || ferror(t->f);
    if (t->f && fclose(t->f)) bad = 1;
    if (bad) {
        free(t->buf);
        t->buf = NULL;
    }
    return bad ? -1 : 0;
}

static enum MHD_Result send_body(struct MHD_Connection *c, unsigned status, const char *type, char *buf,
                                 size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    /* a 401 is only ever the API key's, and RFC 6750 has it name the scheme */
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* An error as OpenAI's clients read it. */
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg) {
    Text t;
    FILE *f = text_open(&t);
    if (f) {
        const char *type = status == 503 ? "server_busy" : status >= 500 ? "server_error"
                           : status == 404 ? "not_found_error" : "invalid_request_error";
        fprintf(f, "{\"error\":{\"message\":");
        put_str(f, msg, strlen(msg));
        fprintf(f, ",\"type\":\"%s\",\"code\":%u}}\n", type, status);
    }
    if (text_close(&t)) return MHD_NO;
    return send_body(c, status, "application/json", t.buf, t.len);
}

/* The usage object every response carries. */
static void put_usage(FILE *f, const Job *j) {
    fprintf(f, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
               "\"prompt_tokens_details\":{\"cached_tokens\":%d}}", j->n_ids, j->n_gen,
            j->n_ids + j->n_gen, j->reused);
}

/* The head every response and chunk begins with. */
static void put_head(FILE *f, const Server *s, int chat, int chunk, long id, long created) {
    fprintf(f, "{\"id\":\"%s-%ld\",\"object\":\"%s\",\"created\":%ld,\"model\":", chat ? "chatcmpl" : "cmpl", id,
            chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion", created);
    put_str(f, s->o->model_name, strlen(s->o->model_name));
}

/* One choice: text[0..n), and its finish reason (NULL: not yet, a chunk). */
static void put_choice(FILE *f, int chat, int chunk, int first, const char *text, size_t n, const char *finish) {
    fprintf(f, ",\"choices\":[{\"index\":0,");
    if (!chat) {
        fprintf(f, "\"text\":");
        put_str(f, text, n);
        fprintf(f, ",\"logprobs\":null,");
    } else if (chunk) {
        fprintf(f, "\"delta\":{");
        if (first) fprintf(f, "\"role\":\"assistant\"%s", n || !finish ? "," : "");
        if (n || !finish) {
            fprintf(f, "\"content\":");
            put_str(f, text, n);
        }
        fprintf(f, "},");
    } else {
        fprintf(f, "\"message\":{\"role\":\"assistant\",\"content\":");
        put_str(f, text, n);
        fprintf(f, "},");
    }
    if (finish) fprintf(f, "\"finish_reason\":\"%s\"}]", finish);
    else fprintf(f, "\"finish_reason\":null}]");
}

/* ----------------------------------------------------------- requests */

/* Whether got is key, in time that depends on the key's length only: no
 * exit at the first byte that differs, which would tell a client by the
 * time an answer takes how much of a guess was right. volatile keeps the
 * compiler from adding that exit. */
static int key_equal(const char *got, const char *key) {
    const size_t gn = strlen(got), kn = strlen(key);
    volatile unsigned char diff = gn != kn;
    for (size_t i = 0; i < kn; i++) diff |= (unsigned char)(key[i] ^ got[i < gn ? i : 0]);
    return diff == 0;
}

/* Why a request may not pass the API key check, or NULL when it carries
 * the key. The messages never repeat what the client sent. */
static const char *auth_refusal(struct MHD_Connection *c, const char *key) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h) return "no API key: this server wants the header Authorization: Bearer KEY";
    /* the scheme's name is case-insensitive (RFC 7235) */
    if (strncasecmp(h, "Bearer ", 7)) return "Authorization: expected Bearer and the API key";
    h += 7;
    while (*h == ' ') h++;
    return key_equal(h, key) ? NULL : "the API key is not this server's";
}

/* Whether the client closed its side (then its job is not worth finishing). */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* The stream's content callback: formatted bytes first; a chat's first
 * event, at once, gives the role (as OpenAI's does); then the job's next
 * text as a chunk event, at its end the last chunk and [DONE]. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    Stream *st = cls;
    while (st->out_off == st->out_len) {
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        free(st->out);
        st->out = NULL;
        st->out_len = st->out_off = 0;
        char *piece = NULL;
        size_t n = 0;
        int done = 0;
        if (!st->chat || st->role_sent) done = engine_wait(&st->s->e, st->j, &st->sent, &piece, &n, WAIT_S);
        if (!piece && !done && (!st->chat || st->role_sent)) {
            if (client_gone(st->c)) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        Text t;
        FILE *f = text_open(&t);
        if (f && (n || (st->chat && !st->role_sent))) {
            fprintf(f, "data: ");
            put_head(f, st->s, st->chat, 1, st->id, st->created);
            put_choice(f, st->chat, 1, st->chat && !st->role_sent, piece ? piece : "", n, NULL);
            fprintf(f, "}\n\n");
            st->role_sent = 1;
        }
        if (f && done) {
            const Job *j = st->j;
            if (!j->finish) {
                fprintf(f, "data: {\"error\":{\"message\":");
                put_str(f, j->err, strlen(j->err));
                fprintf(f, ",\"type\":\"server_error\",\"code\":500}}\n\n");
            } else {
                fprintf(f, "data: ");
                put_head(f, st->s, st->chat, 1, st->id, st->created);
                put_choice(f, st->chat, 1, 0, "", 0, j->finish);
                fprintf(f, ",");
                put_usage(f, j);
                fprintf(f, "}\n\n");
            }
            fprintf(f, "data: [DONE]\n\n");
            st->ended = 1;
        }
        free(piece);
        if (text_close(&t)) return MHD_CONTENT_READER_END_WITH_ERROR;
        st->out = t.buf;
        st->out_len = t.len;
    }
    size_t k = st->out_len - st->out_off < max ? st->out_len - st->out_off : max;
    memcpy(buf, st->out + st->out_off, k);
    st->out_off += k;
    return (ssize_t)k;
}

static void stream_free(void *cls) {
    Stream *st = cls;
    engine_release(&st->s->e, st->j);
    free(st->out);
    free(st);
}

/* A plain (not streamed) response once the job is done. */
static enum MHD_Result send_result(Server *s, struct MHD_Connection *c, Job *j, int chat) {
    size_t sent = 0;
    Text all;
    FILE *acc = text_open(&all);
    int done = 0;
    while (!done) {
        char *piece;
        size_t n;
        done = engine_wait(&s->e, j, &sent, &piece, &n, WAIT_S);
        if (piece && acc) fwrite(piece, 1, n, acc);
        free(piece);
        /* every WAIT_S at most, text or not */
        if (!done && client_gone(c)) {
            text_close(&all);
            free(all.buf);
            engine_release(&s->e, j);
            return MHD_NO;
        }
    }
    enum MHD_Result rc;
    if (text_close(&all)) rc = send_error(c, 500, "out of memory for the response");
    else if (!j->finish) rc = send_error(c, 500, j->err);
    else {
        Text t;
        FILE *f = text_open(&t);
        if (f) {
            put_head(f, s, chat, 0, atomic_fetch_add(&s->ids, 1), (long)time(NULL));
            put_choice(f, chat, 0, 0, all.buf ? all.buf : "", all.len, j->finish);
            fprintf(f, ",");
            put_usage(f, j);
            fprintf(f, "}\n");
        }
        rc = text_close(&t) ? send_error(c, 500, "out of memory for the response")
                            : send_body(c, 200, "application/json", t.buf, t.len);
    }
    free(all.buf);
    engine_release(&s->e, j);
    return rc;
}

/* POST /v1/completions and /v1/chat/completions. */
static enum MHD_Result generate(Server *s, struct MHD_Connection *c, const Conn *cn, int chat) {
    const ServeOpts *o = s->o;
    char err[1024];
    if (chat && chat_missing_token(s->tok))
        return send_error(c, 501, "messages: the model's tokenizer has no <|im_start|> and <|im_end|> tokens, which "
                                  "the chat template needs: use /v1/completions");
    Job *j = calloc(1, sizeof *j);
    if (!j) return send_error(c, 500, "out of memory");
    const int open_think = s->m->cfg.arch == ARCH_QWEN35;
    if (request_parse(cn->body ? cn->body : "", cn->len, chat, o->think, open_think, &j->rq, err, sizeof err)) {
        free(j);
        return send_error(c, 400, err);
    }
    const size_t plen = strlen(j->rq.prompt);
    int bad = 0;
    const char *why = NULL;
    /* tok_encode needs room for 3 ids per byte at most (tokenizer.h), but
     * a prompt of ctx tokens is refused anyway: no more room than that */
    const int room = 3 * plen + 8 < (size_t)o->ctx ? (int)(3 * plen + 8) : o->ctx;
    if (!(j->ids = malloc((size_t)room * sizeof(int)))) bad = 500, why = "out of memory for the prompt's tokens";
    else if ((j->n_ids = tok_encode(s->tok, j->rq.prompt, plen, j->ids, room)) < 0 && room < o->ctx)
        bad = 500, why = "out of memory for the prompt's tokens";
    else if (j->n_ids == 0) bad = 400, why = chat ? "messages: the prompt is empty" : "prompt: empty";
    else if (j->n_ids < 0 || j->n_ids >= o->ctx) {
        /* n_ids < 0: more than the room of ctx */
        if (j->n_ids < 0) j->n_ids = o->ctx;
        snprintf(err, sizeof err, "%s: %s%d tokens do not fit the context of %d (the server's -c) with room to reply",
                 chat ? "messages" : "prompt", j->n_ids == o->ctx ? "at least " : "", j->n_ids, o->ctx);
        bad = 400, why = err;
    } else if (model_check_input(s->m, j->ids, j->n_ids, err, sizeof err)) bad = 400, why = err;
    if (!bad) {
        const int want = j->rq.max_tokens >= 0 ? j->rq.max_tokens : o->n_predict;
        j->max_tokens = want < 0 || want > o->ctx - j->n_ids ? o->ctx - j->n_ids : want;
        j->cap = j->n_ids + j->max_tokens;
        char kerr[512];
        j->spec = o->spec;
        const char *kvn = j->rq.kv_name;
        if (kvn[0] && (strchr(kvn, ',') || kv_spec_parse(kvn, &j->spec, kerr, sizeof kerr))) {
            /* kv_spec_parse speaks of the flag: the field is named here */
            snprintf(err, sizeof err, "kv: %s", strchr(kvn, ',') ? "expected one scheme or a K/V pair"
                                                : strncmp(kerr, "-kv: ", 5) ? kerr : kerr + 5);
            bad = 400, why = err;
        }
        const double need = bad ? 0 : model_cache_bytes(s->m, &j->spec, j->cap);
        if (need > o->budget) {
            char hn[32], hb[32];
            snprintf(hn, sizeof hn, "%.1f MB", need / 1e6);
            snprintf(hb, sizeof hb, "%.1f MB", o->budget / 1e6);
            snprintf(err, sizeof err, "kv: a cache of %d positions in %s needs %s, more than the server's budget of %s "
                     "(--kv-mb): lower max_tokens or pick a smaller scheme", j->cap,
                     j->rq.kv_name[0] ? j->rq.kv_name : o->spec_name, hn, hb);
            bad = 400, why = err;
        }
    }
    if (bad) {
        request_free(&j->rq);
        free(j->ids);
        free(j);
        return send_error(c, (unsigned)bad, why);
    }
    const Request *rq = &j->rq;
    j->temperature = rq->has_temp ? rq->temperature : o->temperature;
    j->top_p = rq->has_top_p ? rq->top_p : o->top_p;
    j->top_k = rq->has_top_k ? rq->top_k : o->top_k;
    j->min_p = rq->has_min_p ? rq->min_p : o->min_p;
    j->last_n = o->last_n;
    if (isnan(j->rq.frequency)) j->rq.frequency = o->frequency;
    if (isnan(j->rq.presence)) j->rq.presence = o->presence;
    if (isnan(j->rq.repetition)) j->rq.repetition = o->repeat;
    if (rq->has_seed || o->has_seed) j->seed = rq->has_seed ? rq->seed : o->seed;
    else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        j->seed = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
    }
    /* max_tokens 0: the prompt is checked, nothing is computed; the job
     * is done before it starts, and the connection's release frees it */
    int sub = 0;
    if (j->max_tokens == 0) engine_job_done(j, "length");
    else if ((sub = engine_submit(&s->e, j))) {
        request_free(&j->rq);
        free(j->ids);
        free(j);
        if (sub == -2) return send_error(c, 503, "the server is stopping");
        snprintf(err, sizeof err, "the server is busy: %d requests wait already (--queue); try again later", o->queue);
        return send_error(c, 503, err);
    }
    /* waiting in the queue and the prompt may take long: no idle timeout */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)0);
    if (!rq->stream) return send_result(s, c, j, chat);
    Stream *st = calloc(1, sizeof *st);
    if (!st) {
        engine_release(&s->e, j);
        return send_error(c, 500, "out of memory");
    }
    *st = (Stream){.s = s, .j = j, .c = c, .chat = chat, .id = atomic_fetch_add(&s->ids, 1),
                   .created = (long)time(NULL)};
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result get_models(Server *s, struct MHD_Connection *c) {
    Text t;
    FILE *f = text_open(&t);
    if (f) {
        fprintf(f, "{\"object\":\"list\",\"data\":[{\"id\":");
        put_str(f, s->o->model_name, strlen(s->o->model_name));
        fprintf(f, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"run\",\"max_model_len\":%d}]}\n",
                (long)time(NULL), s->o->ctx);
    }
    if (text_close(&t)) return send_error(c, 500, "out of memory");
    return send_body(c, 200, "application/json", t.buf, t.len);
}

static enum MHD_Result get_metrics(Server *s, struct MHD_Connection *c) {
    Text t;
    FILE *f = text_open(&t);
    if (f) engine_metrics(&s->e, f);
    if (text_close(&t)) return send_error(c, 500, "out of memory");
    return send_body(c, 200, "text/plain; version=0.0.4", t.buf, t.len);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    Server *s = cls;
    Conn *cn = *con_cls;
    if (!cn) {
        /* the first call has every header and none of the body: a refusal
         * here reads no body (libmicrohttpd closes the connection after an
         * answer queued this early), submits nothing, and a client without
         * the key cannot make the server hold 8 MiB for it. Every route
         * that computes or lists anything is under /v1/. */
        if (s->o->api_key && !strncmp(url, "/v1/", 4)) {
            const char *why = auth_refusal(c, s->o->api_key);
            if (why) return send_error(c, 401, why);
        }
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        return MHD_YES;
    }
    /* the body as it comes, bounded */
    if (*upload_size) {
        if (cn->len + *upload_size > REQUEST_MAX_BODY) cn->too_big = 1;
        else {
            if (cn->len + *upload_size + 1 > cn->cap) {
                size_t cap = cn->cap ? cn->cap : 4096;
                while (cap < cn->len + *upload_size + 1) cap *= 2;
                char *b = realloc(cn->body, cap);
                if (!b) return MHD_NO;
                cn->body = b;
                cn->cap = cap;
            }
            memcpy(cn->body + cn->len, upload, *upload_size);
            cn->len += *upload_size;
            cn->body[cn->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    const int post = !strcmp(method, "POST"), get = !strcmp(method, "GET");
    const int chat = !strcmp(url, "/v1/chat/completions"), comp = !strcmp(url, "/v1/completions");
    if (chat || comp) {
        if (!post) return send_error(c, 405, "this path takes POST");
        if (cn->too_big) {
            char m[128];
            snprintf(m, sizeof m, "the body is larger than %u bytes", REQUEST_MAX_BODY);
            return send_error(c, 413, m);
        }
        return generate(s, c, cn, chat);
    }
    const int models = !strcmp(url, "/v1/models"), health = !strcmp(url, "/health"), metrics = !strcmp(url, "/metrics");
    if (models || health || metrics) {
        if (!get) return send_error(c, 405, "this path takes GET");
        if (models) return get_models(s, c);
        if (metrics) return get_metrics(s, c);
        char *ok = strdup("{\"status\":\"ok\"}\n");
        return ok ? send_body(c, 200, "application/json", ok, strlen(ok)) : MHD_NO;
    }
    char m[300];
    snprintf(m, sizeof m, "no such path: %.200s (try /v1/chat/completions, /v1/completions, /v1/models, /health, "
             "/metrics)", url);
    return send_error(c, 404, m);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)cls, (void)c, (void)why;
    Conn *cn = *con_cls;
    if (cn) {
        free(cn->body);
        free(cn);
    }
    *con_cls = NULL;
}

/* The listening socket, bound here so that an address in use or port 0
 * are known before serving. */
static int listen_on(const char *host, int port, int *bound, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc) {
        snprintf(err, errlen, "--host %s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            snprintf(err, errlen, "--host %s --port %d: %s", host, port, strerror(errno));
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 128)) {
            snprintf(err, errlen, "--host %s --port %d: %s", host, port, strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return -1;
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *bound = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                            : ((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

int serve_run(const ServeOpts *o, Model *m, const Tokenizer *tok, char *err, size_t errlen) {
    Server s = {.o = o, .m = m, .tok = tok};
    atomic_init(&s.ids, 1);
    int port = 0, fd = listen_on(o->host, o->port, &port, err, errlen);
    if (fd < 0) return -1;
    EngineOpts eo = {.parallel = o->parallel, .queue = o->queue, .budget = o->budget, .threads = omp_get_max_threads(),
                     .cache_bytes = o->cache_bytes, .cache_chunk = o->cache_chunk, .cache_dir = o->cache_dir};
    if (engine_init(&s.e, m, tok, &eo, err, errlen)) {
        close(fd);
        return -1;
    }
    /* a connection per request in flight or queued, and some for the
     * cheap endpoints; past it connections are refused */
    const unsigned limit = (unsigned)(o->parallel + o->queue + 64);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC, 0, NULL, NULL,
        on_request, &s, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)120, MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_END);
    if (!d) {
        snprintf(err, errlen, "libmicrohttpd did not start on %s:%d", o->host, port);
        engine_free(&s.e);
        close(fd);
        return -1;
    }
    fprintf(stderr, "serve: listening on http://%s:%d (%d parallel, queue %d, %.1f MB for caches%s)\n", o->host,
            port, o->parallel, o->queue, o->budget / 1e6, o->api_key ? ", /v1/ needs the API key" : "");
    while (!*o->stop) usleep(100000);
    fprintf(stderr, "serve: stopping\n");
    /* no new connections; the engine ends every job, so that the
     * connections waiting on one finish, and only then do they go */
    MHD_socket q = MHD_quiesce_daemon(d);
    engine_stop(&s.e);
    MHD_stop_daemon(d);
    if (q != MHD_INVALID_SOCKET) close(q);
    engine_free(&s.e);
    return 0;
}
