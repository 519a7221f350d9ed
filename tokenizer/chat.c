/* chat.c: Qwen3 chat template rendering (see chat.h for the layout). */
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

char *chat_first_turn(const char *system, const char *user, int thinking) {
    int sys = system && *system;
    const char *parts[] = {
        sys ? "<|im_start|>system\n" : "", sys ? system : "", sys ? "<|im_end|>\n" : "",
        "<|im_start|>user\n", user, "<|im_end|>\n", gen_prompt(thinking),
    };
    return join(parts, 7);
}

char *chat_next_turn(const char *user, int thinking) {
    const char *parts[] = {"<|im_end|>\n<|im_start|>user\n", user, "<|im_end|>\n", gen_prompt(thinking)};
    return join(parts, 4);
}
