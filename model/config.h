/* config.h: the architectural numbers of a Qwen3 checkpoint, read from its
 * config.json, and the generation defaults from generation_config.json.
 *
 * Data flow: model_load reads these first; every tensor shape it then checks
 * and every buffer it sizes comes from here. Nothing is hard-coded: a field
 * the model needs and the file lacks is an error naming the field.
 */
#ifndef CONFIG_H
#define CONFIG_H

#include <stddef.h>

#define CFG_MAX_EOS 8

typedef enum { ROPE_DEFAULT, ROPE_LINEAR, ROPE_YARN } RopeType;

typedef struct {
    int vocab_size, hidden, n_layers, n_heads, n_kv_heads, head_dim, ffn;
    int max_pos;
    double eps;
    double rope_theta;
    RopeType rope_type;
    double rope_factor;       /* linear / yarn */
    int rope_orig_max_pos;    /* yarn: original_max_position_embeddings */
    double yarn_beta_fast, yarn_beta_slow, yarn_attn_factor;
    int yarn_truncate;
    int tie_embeddings;
    int mtp_layers;           /* num_nextn_predict_layers / mtp_num_hidden_layers, 0 if none */
    int bos_id;               /* -1 if none */
    int eos_ids[CFG_MAX_EOS];
    int n_eos;
} Config;

typedef struct {
    int present;              /* generation_config.json was there */
    int do_sample;
    double temperature, top_p, min_p;
    int top_k;
} GenDefaults;

/* A config file bigger than this is not a config (Qwen3's are 1 KB). */
#define CFG_MAX_BYTES (4u << 20)

typedef struct Json Json;

/* config.json's parsed tree into c; path names it in error lines.
 * 0 ok, -1 with one line in err. */
int config_parse(Config *c, const Json *j, const char *path, char *err, size_t errlen);
/* generation_config.json's tree into g (g->present = 1), adding its eos
 * ids to c. 0 ok, -1 with one line in err. */
int config_parse_generation(Config *c, GenDefaults *g, const Json *j, const char *path, char *err, size_t errlen);

#endif
