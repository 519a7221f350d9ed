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
