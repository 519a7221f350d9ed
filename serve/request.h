/* request.h: an OpenAI API request body, read and checked.
 *
 * Data flow: serve/http.c hands the body of POST /v1/completions or
 * /v1/chat/completions here; what comes back is the prompt as text (a chat
 * rendered with the model's template, tokenizer/chat.h) and the generation
 * settings, or one line naming the field that is wrong. The body is
 * hostile input: sizes are bounded, every field's type and range checked,
 * fields this engine does not know are ignored as OpenAI clients expect.
 *
 * Fields: prompt (a string, or an array of one string) | messages
 * [{role: system|user|assistant, content: a string or [{type: "text",
 * text}]}], max_tokens (or max_completion_tokens), temperature, top_p,
 * top_k, min_p, seed, stop (a string or up to 4), stream, n (1 only),
 * frequency_penalty, presence_penalty, repetition_penalty, and two
 * extensions: kv (the KV scheme, as -kv takes it) and
 * chat_template_kwargs.enable_thinking. Fields asking for what plain text
 * generation cannot give (logprobs, top_logprobs, tools, functions,
 * tool_choice, response_format, echo, best_of, suffix, logit_bias) are
 * refused when set to anything but their off value.
 */
#ifndef REQUEST_H
#define REQUEST_H

#include <stddef.h>

/* Request bodies larger than this are refused (413): 8 MiB is about two
 * million tokens of text, past any context. */
#define REQUEST_MAX_BODY (8u << 20)
#define REQUEST_MAX_STOP 4
/* bytes of one stop string */
#define REQUEST_MAX_STOP_LEN 256

typedef struct {
    char *prompt;          /* the text to encode (malloc'd) */
    int max_tokens;        /* -1: not given */
    int stream;
    /* sampling: has_* says the field was given */
    int has_temp, has_top_p, has_top_k, has_min_p, has_seed;
    float temperature, top_p, min_p;
    int top_k;
    unsigned long long seed;
    float frequency, presence, repetition; /* penalties (0, 0, 1 = off); NAN: not given */
    char *stop[REQUEST_MAX_STOP];           /* malloc'd, NUL-terminated */
    int n_stop;
    char kv_name[64];      /* the "kv" field, "" when not given (not yet parsed: kv_spec_parse) */
} Request;

/* Reads body[0..n) of a chat (chat = 1) or completion request into r.
 * thinking: the chat template's default for enable_thinking; open_think:
 * the template opens the think block itself (Qwen3.5). 0 ok; -1 with one
 * line in err naming the field, what was expected and what was found (r
 * is then empty). */
int request_parse(const char *body, size_t n, int chat, int thinking, int open_think, Request *r, char *err,
                  size_t errlen);
void request_free(Request *r);

#endif
