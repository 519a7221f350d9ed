/* chat.c: Qwen3 chat template rendering (see chat.h for the layout).
 *
 * Data flow: beside the main chain (run.c -> model -> attn -> kv ->
 * kernels): run.c's chat mode renders each turn here, tok_encode turns the
 * text into ids for model_forward. A first turn:
 *
 *   [<|im_start|>system\n{system}<|im_end|>\n]<|im_start|>user\n{user}<|im_end|>\n
 *   <|im_start|>assistant\n[<think>\n\n</think>\n\n]
 *
 * Follows the chat_template of Qwen3's tokenizer_config.json (no tools). */
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* Concatenates the n strings in parts into one malloc'd string. */
static char *join(const char *const *parts, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += strlen(parts[i]);
    char *out = malloc(len + 1), *p = out;
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(parts[i]);
        memcpy(p, parts[i], l);
        p += l;
    }
    *p = 0;
    return out;
}

/* The generation prompt; with thinking off the template pre-fills an empty think block. */
static const char *gen_prompt(int thinking) {
    return thinking ? "<|im_start|>assistant\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
}

char *chat_system(const char *system) {
    int sys = system && *system;
    const char *parts[] = {sys ? "<|im_start|>system\n" : "", sys ? system : "", sys ? "<|im_end|>\n" : ""};
    return join(parts, 3);
}

char *chat_user(const char *user, int thinking) {
    const char *parts[] = {"<|im_start|>user\n", user, "<|im_end|>\n", gen_prompt(thinking)};
    return join(parts, 4);
}

char *chat_user_open_think(const char *user, int thinking) {
    const char *parts[] = {"<|im_start|>user\n", user, "<|im_end|>\n", gen_prompt(thinking), thinking ? "<think>\n" : ""};
    return join(parts, 5);
}

char *chat_first_turn(const char *system, const char *user, int thinking) {
    char *s = chat_system(system), *u = chat_user(user, thinking), *out = NULL;
    if (s && u) out = join((const char *const[]){s, u}, 2);
    free(s);
    free(u);
    return out;
}

char *chat_next_turn(const char *user, int thinking) {
    char *u = chat_user(user, thinking), *out = u ? join((const char *const[]){CHAT_CLOSE, u}, 2) : NULL;
    free(u);
    return out;
}

/* An earlier reply as the template keeps it: what follows its last
 * </think>, leading newlines dropped; the whole reply when it has none. */
static const char *reply_text(const char *content) {
    const char *p = content, *q;
    while ((q = strstr(p, "</think>"))) p = q + strlen("</think>");
    if (p == content) return content;
    while (*p == '\n') p++;
    return p;
}

char *chat_render(const char *const *roles, const char *const *contents, int n, int thinking, int open_think) {
    /* five parts per message plus the generation prompt's two */
    const char **parts = malloc(((size_t)n * 5 + 2) * sizeof *parts);
    if (!parts) return NULL;
    int k = 0;
    for (int i = 0; i < n; i++) {
        const int reply = strcmp(roles[i], "assistant") == 0;
        parts[k++] = "<|im_start|>";
        parts[k++] = roles[i];
        parts[k++] = "\n";
        parts[k++] = reply ? reply_text(contents[i]) : contents[i];
        parts[k++] = "<|im_end|>\n";
    }
    parts[k++] = gen_prompt(thinking);
    parts[k++] = open_think && thinking ? "<think>\n" : "";
    char *out = join(parts, k);
    free(parts);
    return out;
}

const char *chat_missing_token(const Tokenizer *t) {
    static const char *const marks[] = {"<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 2; i++)
        if (tok_find(t, marks[i]) < 0) return marks[i];
    return NULL;
}
