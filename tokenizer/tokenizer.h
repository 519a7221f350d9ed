/* tokenizer.h: Qwen2/Qwen3 byte-level BPE, text <-> token ids.
 *
 * Data flow: prompt text -> tok_encode -> ids for the model; sampled ids ->
 * tok_stream_put -> printable UTF-8. tok_init reads a Hugging Face
 * tokenizer.json (format/json.h does the parsing) and follows the Hugging Face
 * `tokenizers` pipeline for Qwen2/Qwen3 exactly:
 *   1. added tokens (every entry of "added_tokens", special or not) are found
 *      in the raw text first, leftmost then longest, and emitted whole;
 *   2. the text between them is NFC-normalised (when the file's normalizer is NFC);
 *   3. split by the Qwen2 pre-tokenizer regex (hand-written matcher, tokenizer.c);
 *   4. each piece's bytes become BPE symbols, merged lowest rank first.
 * No BOS/EOS is added. Added tokens' lstrip/rstrip/single_word/normalized flags
 * are not applied (all false in Qwen2/Qwen3 files).
 *
 * Invalid UTF-8 in the input: each offending byte is kept as its own byte
 * symbol (the regex sees it as punctuation), so decode(encode(x)) gives back
 * the exact bytes; Hugging Face cannot take such input at all (Rust &str).
 */
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/* Largest token id accepted from a file (tables are dense up to the highest id). */
#define TOK_MAX_ID (1 << 24)

/* One token's bytes: Tokenizer.bytes[off .. off + len); len 0 = no token has this id. */
typedef struct { uint32_t off, len; } TokPiece;

/* One BPE merge in the pair hash: (left, right) ids -> rank (line in
 * model.merges) and the merged token's id; rank -1 marks an empty slot. */
typedef struct { int32_t left, right, rank, id; } TokMerge;

/* Fields are read-only after tok_init; use the functions below. */
typedef struct Tokenizer {
    int n_ids;             /* highest id + 1 over vocab and added tokens */
    TokPiece *pieces;      /* [n_ids] raw bytes of each token */
    char *bytes;           /* all token bytes, back to back */
    int32_t *vocab_slots;  /* [vocab_mask + 1] open-addressing hash: raw bytes -> vocab id, -1 empty */
    uint32_t vocab_mask;
    TokMerge *merges;      /* [merge_mask + 1] open-addressing hash keyed by (left, right) */
    uint32_t merge_mask;
    int32_t *added;        /* [n_added] added token ids, longest content first */
    int n_added;
    uint8_t added_first[32]; /* bit set of the first bytes of added tokens' contents */
    int byte_id[256];      /* id of the one-byte symbol for each byte */
    int nfc;               /* normalizer is NFC */
    int marks;             /* the split regex is Qwen3.5's: marks (\p{M}) count with letters */
    int ignore_merges;     /* model.ignore_merges: a piece found whole in the vocab skips BPE */
    size_t max_piece;      /* longest token in bytes */
    int eos_id, pad_id;    /* from tokenizer_config.json eos_token / pad_token, -1 if absent */
} Tokenizer;

/* Size caps on the files read (format/file.h): Qwen3's tokenizer.json is
 * 11 MB, its tokenizer_config.json 10 KB. */
#define TOK_MAX_JSON (256u << 20)
#define TOK_MAX_CONFIG (16u << 20)

/* Loads dir/tokenizer.json (+ dir/tokenizer_config.json if present). Returns 0,
 * or -1 with one line in err naming the file and field, what was expected and
 * what was found; *t is then left empty (tok_free is safe but not needed). */
int tok_init(Tokenizer *t, const char *dir, char *err, size_t errlen);
/* The same from the files' text in memory: json[0 .. n) is tokenizer.json's,
 * cfg[0 .. cfg_n) tokenizer_config.json's or NULL; path and cfg_path name
 * them in error lines. */
int tok_load(Tokenizer *t, const char *json, size_t n, const char *path, const char *cfg, size_t cfg_n,
             const char *cfg_path, char *err, size_t errlen);
void tok_free(Tokenizer *t);

/* Encodes n bytes of UTF-8 text into at most cap ids; returns the count, or -1
 * when cap is too small or memory runs out. cap >= 3 * n always suffices
 * (NFC grows text at most 3x, see UNI_NFC_MAX_GROWTH, and each id covers >= 1 byte). */
int tok_encode(const Tokenizer *t, const char *text, size_t n, int *ids, int cap);

/* Bytes of token id (an added token's content, a vocab token's raw bytes),
 * not NUL-terminated, or NULL when no token has that id. */
const char *tok_piece(const Tokenizer *t, int id, size_t *len);
/* Highest id + 1 over vocab and added tokens. */
int tok_vocab_size(const Tokenizer *t);
/* Id of the added token with content token_text, else of the vocab entry
 * whose tokenizer.json key is token_text (byte-level form, e.g. "Ġthe"); -1 if none. */
int tok_find(const Tokenizer *t, const char *token_text);
/* Longest token in bytes: a tok_stream_put buffer of max_piece + 8 never fails. */
size_t tok_max_piece(const Tokenizer *t);

/* Streaming decoder state; zero-initialise it ({0}) before the first token. */
typedef struct { unsigned char pend[8]; int npend; } TokStream;
/* Appends the bytes of token id to out, holding back a trailing incomplete
 * (but so far valid) UTF-8 sequence until the next token completes it. Bytes
 * that can never form a character are passed through. Returns bytes written;
 * an unknown id writes nothing; when cap is too small nothing is written, the
 * state is unchanged and (size_t)-1 is returned. */
size_t tok_stream_put(const Tokenizer *t, TokStream *s, int id, char *out, size_t cap);
/* Writes the held bytes as they are (end of generation); returns bytes written
 * (at most 3, or (size_t)-1 with nothing written when cap is too small). */
size_t tok_stream_flush(TokStream *s, char *out, size_t cap);

#endif
