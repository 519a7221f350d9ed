/* request.c: an OpenAI API request body into a Request (request.h). */
#include "serve/request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/json.h"
#include "format/quote.h"
#include "tokenizer/chat.h"

/* Chat messages per request, and the bytes of their text together: past
 * these a request cannot fit any context. */
#define MAX_MESSAGES 4096

void request_free(Request *r) {
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* A member that, when present, must be a number (an integer when
 * integer says so) in [lo, hi]: 1 given, 0
 * absent (or null, which clients send for "default"), -1 wrong (err set). */
static int get_num(const Json *o, const char *key, double lo, double hi, int integer, double *out, char *err,
                   size_t errlen) {
    const Json *v = json_get(o, key);
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_NUMBER || !(v->number >= lo && v->number <= hi)) {
        char found[64];
        if (v->type == JSON_NUMBER) snprintf(found, sizeof found, "%.17g", v->number);
        else snprintf(found, sizeof found, "%s %s", v->type == JSON_ARRAY || v->type == JSON_OBJECT ? "an" : "a",
                      json_type_name(v->type));
        snprintf(err, errlen, "%s: expected %s in [%.17g, %.17g], found %s", key, integer ? "an integer" : "a number",
                 lo, hi, found);
        return -1;
    }
    *out = v->number;
    return 1;
}

/* The same for an integer. */
static int get_int(const Json *o, const char *key, double lo, double hi, double *out, char *err, size_t errlen) {
    int rc = get_num(o, key, lo, hi, 1, out, err, errlen);
    if (rc == 1 && *out != floor(*out)) {
        snprintf(err, errlen, "%s: expected an integer, found %g", key, *out);
        return -1;
    }
    return rc;
}

/* A message's content: a string, or the parts of an array, which must all
 * be {"type": "text", "text": ...} (this engine reads text only), joined. */
static char *content_text(const Json *c, int i, char *err, size_t errlen) {
    if (c && c->type == JSON_STRING && strlen(c->str) != c->len) {
        snprintf(err, errlen, "messages[%d].content: expected text, found a NUL byte in it", i);
        return NULL;
    }
    if (c && c->type == JSON_STRING) return strdup(c->str);
    if (!c || c->type != JSON_ARRAY) {
        snprintf(err, errlen, "messages[%d].content: expected a string or an array of text parts, found %s", i,
                 c ? json_type_name(c->type) : "nothing");
        return NULL;
    }
    size_t len = 0;
    for (size_t k = 0; k < c->len; k++) {
        const Json *p = json_at(c, k);
        const char *type = json_get_str(p, "type"), *text = json_get_str(p, "text");
        if (!type || strcmp(type, "text") || !text || strlen(text) != json_get(p, "text")->len) {
            char q[QUOTE_BUF];
            snprintf(err, errlen, "messages[%d].content[%zu]: expected a part {\"type\": \"text\", \"text\": ...} "
                     "(text only), found %s%s", i, k, type ? "type " : "another part",
                     type ? quote_str(type, q, sizeof q) : "");
            return NULL;
        }
        len += strlen(text);
    }
    char *out = malloc(len + 1), *q = out;
    if (!out) { snprintf(err, errlen, "out of memory"); return NULL; }
    for (size_t k = 0; k < c->len; k++) {
        const char *text = json_get_str(json_at(c, k), "text");
        size_t l = strlen(text);
        memcpy(q, text, l);
        q += l;
    }
    *q = 0;
    return out;
}

/* messages -> the prompt text through the chat template. */
static int read_messages(const Json *msgs, int thinking, int open_think, Request *r, char *err, size_t errlen) {
    if (!msgs || msgs->type != JSON_ARRAY || msgs->len == 0 || msgs->len > MAX_MESSAGES) {
        snprintf(err, errlen, "messages: expected an array of 1 to %d messages, found %s", MAX_MESSAGES,
                 !msgs ? "none" : msgs->type != JSON_ARRAY ? json_type_name(msgs->type) : "too many or none");
        return -1;
    }
    const int n = (int)msgs->len;
    const char **roles = calloc((size_t)n, sizeof *roles);
    char **texts = calloc((size_t)n, sizeof *texts);
    int rc = -1;
    if (!roles || !texts) { snprintf(err, errlen, "out of memory"); goto out; }
    for (int i = 0; i < n; i++) {
        const Json *m = json_at(msgs, (size_t)i);
        const char *role = json_get_str(m, "role");
        if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))) {
            char q[QUOTE_BUF];
            snprintf(err, errlen, "messages[%d].role: expected system, user or assistant, found %s", i,
                     role ? quote_str(role, q, sizeof q) : "none");
            goto out;
        }
        roles[i] = role;
        const Json *c = json_get(m, "content");
        /* an assistant message may carry no content (null) */
        if (!strcmp(role, "assistant") && c && c->type == JSON_NULL) texts[i] = strdup("");
        else if (!(texts[i] = content_text(c, i, err, errlen))) goto out;
        if (!texts[i]) { snprintf(err, errlen, "out of memory"); goto out; }
    }
    r->prompt = chat_render(roles, (const char *const *)texts, n, thinking, open_think);
    if (!r->prompt) snprintf(err, errlen, "out of memory");
    else rc = 0;
out:
    for (int i = 0; texts && i < n; i++) free(texts[i]);
    free(texts);
    free(roles);
    return rc;
}

/* stop: a string or an array of up to REQUEST_MAX_STOP non-empty strings. */
static int read_stop(const Json *s, Request *r, char *err, size_t errlen) {
    if (!s || s->type == JSON_NULL) return 0;
    const int one = s->type == JSON_STRING;
    if (!one && (s->type != JSON_ARRAY || s->len > REQUEST_MAX_STOP)) {
        snprintf(err, errlen, "stop: expected a string or an array of up to %d strings, found %s", REQUEST_MAX_STOP,
                 s->type == JSON_ARRAY ? "a longer array" : json_type_name(s->type));
        return -1;
    }
    const size_t n = one ? 1 : s->len;
    for (size_t i = 0; i < n; i++) {
        const Json *e = one ? s : json_at(s, i);
        if (e->type != JSON_STRING || e->len == 0 || e->len > REQUEST_MAX_STOP_LEN || strlen(e->str) != e->len) {
            snprintf(err, errlen, "stop[%zu]: expected a string of 1 to %d bytes without NUL, found %s", i,
                     REQUEST_MAX_STOP_LEN, e->type == JSON_STRING ? "another length" : json_type_name(e->type));
            return -1;
        }
        if (!(r->stop[r->n_stop] = strdup(e->str))) { snprintf(err, errlen, "out of memory"); return -1; }
        r->n_stop++;
    }
    return 0;
}

/* Fields whose request this engine cannot honour, set to anything but
 * their "off" value: refused by name rather than ignored, since a client
 * that asks for tool calls, log-probabilities or a JSON schema and gets
 * plain text back has been answered wrongly. */
static int refuse_unsupported(const Json *o, char *err, size_t errlen) {
    static const char *const fields[] = {"logprobs", "top_logprobs", "tools", "functions", "tool_choice",
                                         "response_format", "echo", "best_of", "suffix", "logit_bias"};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        const Json *v = json_get(o, fields[i]);
        if (!v) continue;
        /* off: null, false, 0 or 1 (best_of), "", [], {}, "none" / "auto" (tool_choice without tools),
         * {"type": "text"} (response_format) */
        int off = v->type == JSON_NULL || (v->type == JSON_BOOL && !v->boolean) ||
                  (v->type == JSON_NUMBER && (v->number == 0 || (!strcmp(fields[i], "best_of") && v->number == 1))) ||
                  ((v->type == JSON_STRING || v->type == JSON_ARRAY || v->type == JSON_OBJECT) && v->len == 0);
        if (!strcmp(fields[i], "tool_choice") && v->type == JSON_STRING)
            off |= !strcmp(v->str, "none") || !strcmp(v->str, "auto");
        const char *type = json_get_str(v, "type");
        if (!strcmp(fields[i], "response_format") && type && !strcmp(type, "text")) off = 1;
        if (!off) {
            snprintf(err, errlen, "%s: not supported by this server (plain text generation only); leave it out",
                     fields[i]);
            return -1;
        }
    }
    return 0;
}

/* The sampling and length fields. */
static int read_settings(const Json *o, Request *r, char *err, size_t errlen) {
    double v = 0;
    int g;
#define FIELD(call, then)       \
    if ((g = (call)) < 0) return -1; \
    if (g) { then; }
    FIELD(get_int(o, "max_tokens", 0, 1 << 30, &v, err, errlen), r->max_tokens = (int)v)
    FIELD(get_int(o, "max_completion_tokens", 0, 1 << 30, &v, err, errlen), r->max_tokens = (int)v)
    FIELD(get_num(o, "temperature", 0, 100, 0, &v, err, errlen), r->temperature = (float)v; r->has_temp = 1)
    FIELD(get_num(o, "top_p", 1e-9, 1, 0, &v, err, errlen), r->top_p = (float)v; r->has_top_p = 1)
    FIELD(get_int(o, "top_k", -1, 1 << 30, &v, err, errlen), r->top_k = v < 0 ? 0 : (int)v; r->has_top_k = 1)
    FIELD(get_num(o, "min_p", 0, 1, 0, &v, err, errlen), r->min_p = (float)v; r->has_min_p = 1)
    /* seeds up to 2^53: every one a JSON number holds exactly */
    FIELD(get_int(o, "seed", 0, 9007199254740992.0, &v, err, errlen), r->seed = (unsigned long long)v; r->has_seed = 1)
    FIELD(get_num(o, "frequency_penalty", 0, 2, 0, &v, err, errlen), r->frequency = (float)v)
    FIELD(get_num(o, "presence_penalty", 0, 2, 0, &v, err, errlen), r->presence = (float)v)
    FIELD(get_num(o, "repetition_penalty", 1e-3, 100, 0, &v, err, errlen), r->repetition = (float)v)
    FIELD(get_int(o, "n", 1, 1, &v, err, errlen), (void)0)
#undef FIELD
    const Json *st = json_get(o, "stream");
    if (st && st->type != JSON_NULL && st->type != JSON_BOOL) {
        snprintf(err, errlen, "stream: expected true or false, found a %s", json_type_name(st->type));
        return -1;
    }
    r->stream = st && st->type == JSON_BOOL && st->boolean;
    return read_stop(json_get(o, "stop"), r, err, errlen);
}

int request_parse(const char *body, size_t n, int chat, int thinking, int open_think, Request *r, char *err,
                  size_t errlen) {
    memset(r, 0, sizeof *r);
    r->max_tokens = -1;
    r->frequency = r->presence = r->repetition = NAN;
    char jerr[256];
    /* JSON text is UTF-8 (RFC 8259): other bytes would reach the tokenizer
     * as byte tokens, a prompt no client meant */
    const size_t at = utf8_valid_prefix(body, n);
    if (at < n) {
        snprintf(err, errlen, "the body is not UTF-8 (byte %zu)", at);
        return -1;
    }
    Json *o = json_parse(body, n, jerr, sizeof jerr);
    if (!o) {
        snprintf(err, errlen, "the body is not JSON: %s", jerr);
        return -1;
    }
    int rc = -1;
    if (o->type != JSON_OBJECT) {
        snprintf(err, errlen, "the body: expected a JSON object, found %s %s", o->type == JSON_ARRAY ? "an" : "a",
                 json_type_name(o->type));
        goto out;
    }
    if (refuse_unsupported(o, err, errlen) || read_settings(o, r, err, errlen)) goto out;
    /* the scheme's name; serve/http.c parses it (kv_spec_parse), so that
     * this file needs only the JSON reader and the chat template */
    const Json *kv = json_get(o, "kv");
    if (kv && kv->type != JSON_NULL) {
        if (kv->type != JSON_STRING || kv->len == 0 || kv->len >= sizeof r->kv_name || strlen(kv->str) != kv->len) {
            snprintf(err, errlen, "kv: expected a KV scheme's name (as -kv takes it), found %s",
                     kv->type == JSON_STRING ? "a string of another length" : json_type_name(kv->type));
            goto out;
        }
        for (size_t i = 0; i < kv->len; i++)
            if ((unsigned char)kv->str[i] <= ' ' || (unsigned char)kv->str[i] > '~') {
                snprintf(err, errlen, "kv: expected a KV scheme's name (as -kv takes it), found a byte 0x%02x in it",
                         (unsigned char)kv->str[i]);
                goto out;
            }
        memcpy(r->kv_name, kv->str, kv->len + 1);
    }
    if (chat) {
        const Json *kw = json_get(o, "chat_template_kwargs");
        int think = thinking;
        if (kw && kw->type != JSON_NULL && json_get(kw, "enable_thinking") &&
            !json_get_bool(kw, "enable_thinking", &think)) {
            snprintf(err, errlen, "chat_template_kwargs.enable_thinking: expected true or false");
            goto out;
        }
        if (read_messages(json_get(o, "messages"), think, open_think, r, err, errlen)) goto out;
    } else {
        /* a string, or (as clients batch prompts) an array holding one */
        const Json *p = json_get(o, "prompt");
        if (p && p->type == JSON_ARRAY && p->len == 1) p = json_at(p, 0);
        if (!p || p->type != JSON_STRING) {
            snprintf(err, errlen, "prompt: expected a string, found %s", p ? json_type_name(p->type) : "none");
            goto out;
        }
        if (strlen(p->str) != p->len) {
            snprintf(err, errlen, "prompt: expected text, found a NUL byte in it");
            goto out;
        }
        if (!(r->prompt = strdup(p->str))) { snprintf(err, errlen, "out of memory"); goto out; }
    }
    rc = 0;
out:
    json_free(o);
    if (rc) request_free(r);
    return rc;
}
