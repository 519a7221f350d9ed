/* source.h: where a model's files come from: a folder or one packed file.
 *
 * Data flow: run.c opens the path the user gave here first; the tokenizer,
 * config.json and generation_config.json are then read through it, and
 * model_load_source takes the tensors from it. A model is
 *   - a folder, as Hugging Face publishes it: config.json,
 *     generation_config.json, model.safetensors (or shards and their
 *     index), tokenizer.json, tokenizer_config.json;
 *   - a .safetensors file inside such a folder: the folder is used;
 *   - a single-file model (`./run DIR -m pack -o model.bin`): a safetensors
 *     file whose metadata holds the folder's JSON files under their names,
 *     so every safetensors reader still reads its tensors:
 *       | u64 n | {"__metadata__": {"format": "pt", "config.json": "{...}",
 *       |        "tokenizer.json": "{...}", ...}, "model.norm.weight": ...} |
 *       | tensor data: 8-, 4-, 2-, then 1-byte types (F32 before BF16) |
 */
#ifndef SOURCE_H
#define SOURCE_H

#include <stddef.h>

#include "format/safetensors.h"
#include "model/config.h"

/* The JSON files a model may carry, by the names they have in a folder
 * (and in a single-file model's metadata). */
#define SOURCE_FILES {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}

typedef struct {
    char *path;       /* as given, for messages */
    char *dir;        /* the folder; NULL for a single-file model */
    struct Json *meta; /* single-file model: its header's metadata */
} ModelSource;

/* Opens path: a folder, a .safetensors file in one, or a single-file
 * model. 0 ok; -1 with one line in err saying what was expected. */
int source_open(ModelSource *src, const char *path, char *err, size_t errlen);
void source_free(ModelSource *src);
/* The text of the model's file name (one of SOURCE_FILES), at most max
 * bytes, NUL-terminated, malloc'd. NULL with *absent = 1 when the model has
 * no such file (no error), or NULL with err. */
char *source_read(const ModelSource *src, const char *name, size_t max, size_t *len, int *absent, char *err,
                  size_t errlen);
/* config.json into c (required). */
int source_config(const ModelSource *src, Config *c, char *err, size_t errlen);
/* generation_config.json into g (optional: g->present = 0 without it),
 * adding its eos ids to c. */
int source_generation(const ModelSource *src, Config *c, GenDefaults *g, char *err, size_t errlen);
/* Opens the model's tensors into ts. */
int source_tensors(const ModelSource *src, TensorStore *ts, char *err, size_t errlen);

#endif
