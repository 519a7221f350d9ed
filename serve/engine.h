/* engine.h: the server's scheduler: many sequences, one batched forward per step.
 *
 * Data flow: serve/http.c turns a request into a Job (prompt ids and
 * settings) and submits it; the engine's one thread admits queued jobs
 * into free slots while the memory budget for caches allows, opens each a
 * KV cache in its own scheme, and runs steps: one model_forward_batch over
 * every active job's next rows (a decoding job's last token, a prefilling
 * job's next prompt slice), then samples each job's next token from its
 * own logits with its own sampler. Text goes to the job's buffer as it is
 * made; http.c's connection threads wait on the job for it. Because a
 * row's result does not depend on the batch it is in, a job's tokens are
 * those it would get alone.
 *
 *   queue --admit--> slots [parallel] --step--> model_forward_batch --> samplers --> job text
 *
 * With a prefix cache (kv/prefix.h), a job just admitted first loads the
 * chunks of its prompt that an earlier job computed, and its prompt
 * slices end at chunk ends, where the cache's new chunk is stored.
 */
#ifndef ENGINE_H
#define ENGINE_H

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#include "kv/prefix.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "serve/request.h"
#include "tokenizer/tokenizer.h"

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE } JobState;

typedef struct Job {
    /* set by the submitter, read-only after engine_submit */
    Request rq;
    int *ids, n_ids;      /* the prompt's tokens */
    int max_tokens;       /* tokens to generate at most */
    int cap;              /* the cache's positions: prompt + max_tokens, within the context */
    KVSpec spec;          /* the cache's scheme */
    float temperature, top_p, min_p;
    int top_k, last_n;    /* last_n: the penalties' window */
    unsigned long long seed;
    /* the engine's own while the job runs */
    KVCache kv;
    Sampler smp;
    TokStream ts;
    double budget;        /* bytes of the memory budget the cache holds */
    double bytes;         /* bytes the cache (and a hybrid's state) took when opened, for /metrics */
    int fed;              /* prompt tokens in the cache */
    int reused;           /* of which loaded from the prefix cache */
    int looked;           /* the prefix cache was asked */
    PrefixKey pk;         /* the prefix key of its cache's chunks so far */
    int next;             /* a decoding job's sampled token, not yet in the cache */
    /* shared, under the engine's lock */
    JobState state;
    char *text;           /* [len] generated text so far (cap: text_cap) */
    size_t len, text_cap;
    size_t ready;         /* bytes of text that no stop string can take back */
    int n_gen;            /* tokens generated */
    const char *finish;   /* "stop" or "length" once done; NULL with err on failure */
    char err[512];
    int cancelled;        /* the client went away while it ran */
    int refs;             /* the engine's and the connection's */
    double t_submit, t_first; /* when queued, when its first token came */
    pthread_cond_t cond;  /* signalled when text, or the end, comes */
    struct Job *next_q;
} Job;

typedef struct {
    int parallel;         /* sequences at once */
    int queue;            /* jobs waiting at most */
    double budget;        /* bytes all caches may take together */
    int threads;          /* OpenMP threads of the forward (a new thread does not inherit -T) */
    double cache_bytes;   /* the prefix cache's memory; 0: no prefix reuse */
    int cache_chunk;      /* positions per chunk */
    const char *cache_dir; /* where chunks spill and persist, or NULL */
} EngineOpts;

/* Counters for GET /metrics, under the engine's lock. */
typedef struct {
    long requests, rejected, failed;
    long prompt_tokens, generated_tokens;
    double ttft_sum;      /* seconds from submit to first token, summed */
    long ttft_count;
    long steps, step_rows;
} EngineStats;

typedef struct {
    Model *m;
    const Tokenizer *tok;
    EngineOpts o;
    int stops[CFG_MAX_EOS + 1], n_stops; /* end-of-text tokens */
    pthread_mutex_t mu;
    pthread_cond_t work;  /* a job came, or the engine is to stop */
    pthread_t thread;
    int started, stopping, stopped;
    int ready;            /* the thread's buffers: 0 not yet, 1 made, -1 out of memory */
    Job *queue_head, *queue_tail;
    int n_queued;
    Job **active;         /* [parallel] NULL where free */
    int n_active;
    double used;          /* bytes of the budget held */
    EngineStats st;
    PrefixCache *prefix;  /* NULL without prefix reuse; the engine thread's */
    PrefixStats pst;      /* its counters, copied under the lock */
    /* step scratch */
    ModelSeq *seqs;       /* [parallel] */
    Job **in_step;        /* [parallel] */
    float *logits;        /* [parallel, V] */
    char *piece;          /* [tok_max_piece + 16] */
    size_t piece_cap;
} Engine;

/* Starts the engine's thread (and opens the prefix cache). 0 ok, -1 with
 * one line in err. */
int engine_init(Engine *e, Model *m, const Tokenizer *tok, const EngineOpts *o, char *err, size_t errlen);
/* Stops the thread and ends every job (err "the server is stopping");
 * later submissions are refused. Connections may still wait on and
 * release their jobs until engine_free. */
void engine_stop(Engine *e);
/* Stops the engine if it runs, and frees it; the prefix cache's chunks
 * go to its folder first (a chunk that cannot be written is named on
 * stderr). */
void engine_free(Engine *e);
/* Queues j (its fields above "the engine's own" set; refs is set here to
 * 2). 0 queued; -1 the queue is full, -2 the engine is stopping (j
 * untouched then, the caller still owns it). */
int engine_submit(Engine *e, Job *j);
/* Makes j a job done before it starts (max_tokens 0), never submitted:
 * engine_wait returns at once, engine_release frees it. */
void engine_job_done(Job *j, const char *finish);
/* Drops the caller's reference to j (the last one frees it). A job not
 * done is cancelled: a queued one leaves the queue now, a running one is
 * ended before the engine's next step. */
void engine_release(Engine *e, Job *j);
/* Waits until j has text past *sent or is done, up to timeout seconds.
 * Copies the new ready text into a malloc'd *out (*n bytes, NULL when
 * none) and advances *sent; returns 1 when j is done (its text all sent
 * once *out is consumed), else 0. */
int engine_wait(Engine *e, Job *j, size_t *sent, char **out, size_t *n, double timeout);
/* A consistent copy of the counters, with the active and queued counts
 * and each scheme's cache bytes written to f in Prometheus text format. */
void engine_metrics(Engine *e, FILE *f);

#endif
