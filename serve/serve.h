/* serve.h: ./run MODEL -m serve, an OpenAI-compatible HTTP server.
 *
 * Data flow: run.c loads the model and tokenizer and calls serve_run;
 * serve/http.c answers HTTP with libmicrohttpd (a thread per connection),
 * reads requests (serve/request.c), and hands jobs to serve/engine.c, whose
 * one thread runs every active sequence in one batched forward per step
 * (model_forward_batch) and hands text back to the connections.
 *
 *   client --HTTP--> http.c --Job--> engine.c --model_forward_batch--> model/
 *          <--JSON or server-sent events-- text
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions (stream or
 * not), GET /v1/models, GET /health, GET /metrics (Prometheus text). With
 * an API key, /v1/ answers only requests carrying it (else 401); /health
 * and /metrics stay open, for probes and scrapers.
 */
#ifndef SERVE_H
#define SERVE_H

#include <signal.h>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *host;        /* address to listen on */
    int port;                /* 0: any free port (the line on stderr names it) */
    int parallel;            /* sequences computed at once */
    int queue;               /* requests waiting at most; past it 503 */
    double budget;           /* bytes all sequences' caches may take */
    int ctx;                 /* positions per sequence at most */
    int n_predict;           /* max_tokens when a request gives none; -1: to the context */
    KVSpec spec;             /* the cache's scheme when a request names none */
    const char *spec_name;
    float temperature, top_p, min_p; /* sampling when a request gives none */
    int top_k;
    float repeat, frequency, presence; /* penalties when a request gives none */
    int last_n;              /* the penalties' window of tokens */
    int has_seed;            /* requests without a seed draw from seed (else from the clock) */
    unsigned long long seed;
    int think;               /* chat: enable_thinking when a request does not say */
    const char *model_name;  /* what /v1/models lists */
    const char *api_key;     /* /v1/ requests must send Authorization: Bearer api_key; NULL: open */
    double cache_bytes;      /* the prefix cache's memory; 0: no prefix reuse */
    int cache_chunk;         /* positions per chunk */
    const char *cache_dir;   /* the folder chunks spill to and persist in, or NULL */
    volatile sig_atomic_t *stop; /* set (by a signal handler) to stop serving */
} ServeOpts;

/* Serves until *o->stop is set. 0 then; -1 with one line in err when the
 * server cannot start (the address taken, say). */
int serve_run(const ServeOpts *o, Model *m, const Tokenizer *tok, char *err, size_t errlen);

#endif
