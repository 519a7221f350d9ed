/* chat.h: the Qwen3 (and Qwen3.5) chat template, rendered to text for tok_encode.
 *
 * Data flow: user input -> chat_first_turn / chat_next_turn -> text ->
 * tok_encode (which turns <|im_start|>, <|im_end|>, <think> into their ids)
 * -> the model. Follows the chat_template of Qwen3's tokenizer_config.json for
 * a system + user conversation without tools:
 *   [<|im_start|>system\n{system}<|im_end|>\n]
 *   <|im_start|>user\n{user}<|im_end|>\n
 *   <|im_start|>assistant\n            (generation prompt)
 *   <think>\n\n</think>\n\n             (only with thinking off)
 * Qwen3.5's template differs in one place: with thinking on, the generation
 * prompt opens the think block itself ("<think>\n" after it).
 * A follow-up turn continues a KV cache that already holds everything up to the
 * end of the previous assistant reply (its sampled <|im_end|> not fed back),
 * so it only closes that reply and opens the next user turn. Unlike the full
 * template re-rendered from scratch, the earlier reply keeps its <think> block.
 * User text is inserted verbatim: special-token text inside it becomes the
 * special token, exactly as with Hugging Face's apply_chat_template + encode.
 */
#ifndef CHAT_H
#define CHAT_H

/* First turn: optional system prompt (NULL or "" for none), the user message,
 * and the generation prompt. Returns a malloc'd NUL-terminated string, NULL
 * when out of memory. */
char *chat_first_turn(const char *system, const char *user, int thinking);
/* Follow-up turn after an assistant reply: "<|im_end|>\n" + user turn +
 * generation prompt. Same ownership as chat_first_turn. */
char *chat_next_turn(const char *user, int thinking);
/* The pieces the two are made of, for a chat that feeds its turns again
 * after dropping old ones: the system block ("" for none), a user block
 * with the generation prompt, and the text that closes a reply. Same
 * ownership; first turn = system + user, next turn = CHAT_CLOSE + user. */
char *chat_system(const char *system);
char *chat_user(const char *user, int thinking);
/* Qwen3.5's template opens the think block itself when thinking is on:
 * the generation prompt ends "<|im_start|>assistant\n<think>\n". */
char *chat_user_open_think(const char *user, int thinking);
#define CHAT_CLOSE "<|im_end|>\n"

/* The template's turn markers, <|im_start|> and <|im_end|>, must be special
 * tokens of the tokenizer, or the chat would reach the model spelled out in
 * pieces it never saw: the first one t lacks, or NULL when it has both. */
struct Tokenizer;
const char *chat_missing_token(const struct Tokenizer *t);

/* A whole conversation as the template renders it from scratch (the
 * server's chat requests): each message in order as
 * <|im_start|>{role}\n{content}<|im_end|>\n, an assistant's content
 * without its think block (the template drops the reasoning of replies
 * before the last user message), then the generation prompt; open_think:
 * Qwen3.5's, which opens the think block when thinking is on. roles[i] is
 * "system", "user" or "assistant". Same ownership as chat_first_turn. */
char *chat_render(const char *const *roles, const char *const *contents, int n, int thinking, int open_think);

#endif
