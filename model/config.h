/* config.h: the architectural numbers of a Qwen3 or Qwen3.5 checkpoint, read
 * from its config.json, and the generation defaults from
 * generation_config.json. Qwen3.5 (shared/specs/qwen35.md) keeps its text
 * model's keys in "text_config" (or at the top in text-only saves) and mixes
 * Gated DeltaNet layers with gated full-attention ones.
 *
 * Data flow: model_load reads these first; every tensor shape it then checks
 * and every buffer it sizes comes from here. Nothing is hard-coded: a field
 * the model needs and the file lacks is an error naming the field.
 */
#ifndef CONFIG_H
#define CONFIG_H

#include <stddef.h>

#define CFG_MAX_EOS 8
#define CFG_MAX_LAYERS 1024

typedef enum { ROPE_DEFAULT, ROPE_LINEAR, ROPE_YARN } RopeType;
typedef enum { ARCH_QWEN3, ARCH_QWEN35 } Arch;

typedef struct {
    Arch arch;
    int vocab_size, hidden, n_layers, n_heads, n_kv_heads, head_dim, ffn;
    int zero_centred;         /* RMSNorms are y = x^ (1 + w) (Qwen3.5), else x^ w */
    int attn_gate;            /* q_proj rows per head: [query hd | gate hd], output times sigmoid(gate) */
    int rot_dim;              /* leading dims of a head that RoPE rotates (head_dim, or a part of it) */
    /* Gated DeltaNet (Qwen3.5): gdn[i] = 1 for its layers, 0 for full attention */
    unsigned char gdn[CFG_MAX_LAYERS];
    int n_gdn;
    int lin_k_heads, lin_v_heads; /* Hk, Hv: value head j reads key head j / (Hv / Hk) */
    int lin_k_dim, lin_v_dim;     /* dk, dv */
    int conv_k;                   /* causal depthwise conv width K */
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
    int media_ids[2];         /* Qwen3.5 image_token_id, video_token_id (-1 if none): the vision
                               * tower's placeholders, refused in a text-only forward */
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
