/* engine.c: the server's scheduler (engine.h): admission, batched steps, sampling, stop rules. */
#include "serve/engine.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void job_free(Job *j) {
    request_free(&j->rq);
    free(j->ids);
    free(j->text);
    pthread_cond_destroy(&j->cond);
    free(j);
}

/* Drops one reference (the lock held); the last one frees the job. */
static void job_unref(Job *j) {
    if (--j->refs == 0) job_free(j);
}

/* Ends j (the lock held): its cache and sampler go back, the connection
 * is woken. finish NULL means failed, with why in err. */
static void job_end(Engine *e, Job *j, const char *finish, const char *why) {
    if (j->state == JOB_RUNNING) {
        for (int i = 0; i < e->o.parallel; i++)
            if (e->active[i] == j) e->active[i] = NULL;
        e->n_active--;
        e->used -= j->budget;
        kv_cache_free(&j->kv);
        sampler_free(&j->smp);
    }
    j->finish = finish;
    if (!finish) {
        snprintf(j->err, sizeof j->err, "%s", why);
        e->st.failed++;
    }
    j->ready = j->len;
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cond);
    job_unref(j);
}

/* Appends n bytes to j's text (the lock held); 0 ok, -1 out of memory. */
static int text_put(Job *j, const char *s, size_t n) {
    if (j->len + n + 1 > j->text_cap) {
        size_t cap = j->text_cap ? j->text_cap : 256;
        while (cap < j->len + n + 1) cap *= 2;
        char *t = realloc(j->text, cap);
        if (!t) return -1;
        j->text = t;
        j->text_cap = cap;
    }
    memcpy(j->text + j->len, s, n);
    j->len += n;
    return 0;
}

/* After text was added from byte `from` on: a stop string now in the text
 * ends it there (1); else ready moves up to what no stop string could
 * still take back, the longest tail that begins one being held (0). */
static int stop_check(Job *j, size_t from) {
    /* the earliest match of any stop string ends the text */
    size_t cut = j->len + 1, held = 0;
    for (int s = 0; s < j->rq.n_stop; s++) {
        const char *st = j->rq.stop[s];
        const size_t sl = strlen(st), start = from >= sl ? from - sl + 1 : 0;
        for (size_t p = start; p + sl <= j->len && p < cut; p++)
            if (memcmp(j->text + p, st, sl) == 0) cut = p;
    }
    if (cut <= j->len) {
        j->len = cut;
        return 1;
    }
    for (int s = 0; s < j->rq.n_stop; s++) {
        const char *st = j->rq.stop[s];
        const size_t sl = strlen(st);
        for (size_t k = sl - 1 < j->len ? sl - 1 : j->len; k > held; k--)
            if (memcmp(j->text + j->len - k, st, k) == 0) {
                held = k;
                break;
            }
    }
    j->ready = j->len - held;
    return 0;
}

/* Moves queued jobs into free slots while the budget allows, in arrival
 * order (the lock held). */
static void admit(Engine *e) {
    while (e->queue_head) {
        Job *j = e->queue_head;
        const double need = model_cache_bytes(e->m, &j->spec, j->cap);
        if (e->n_active == e->o.parallel || e->used + need > e->o.budget) return;
        e->queue_head = j->next_q;
        if (!e->queue_head) e->queue_tail = NULL;
        e->n_queued--;
        char err[512];
        if (model_kv_init(e->m, &j->kv, &j->spec, j->cap, 0, err, sizeof err)) {
            job_end(e, j, NULL, err);
            continue;
        }
        if (sampler_init(&j->smp, e->m->cfg.vocab_size, j->temperature, j->top_k, j->top_p, j->min_p, j->seed) ||
            sampler_set_penalties(&j->smp, j->last_n, j->rq.repetition, j->rq.frequency, j->rq.presence)) {
            kv_cache_free(&j->kv);
            sampler_free(&j->smp);
            job_end(e, j, NULL, "out of memory for the sampler");
            continue;
        }
        /* the prompt counts for the penalties, as in run.c */
        for (int i = 0; i < j->n_ids; i++) sampler_accept(&j->smp, j->ids[i]);
        j->budget = need;
        /* taken now, under the lock: /metrics never reads a cache the forward writes */
        j->bytes = (double)(kv_cache_bytes(&j->kv) + kv_cache_state_bytes(&j->kv));
        e->used += need;
        j->state = JOB_RUNNING;
        for (int i = 0; i < e->o.parallel; i++)
            if (!e->active[i]) { e->active[i] = j; break; }
        e->n_active++;
    }
}

static int is_stop_token(const Engine *e, int id) {
    for (int i = 0; i < e->n_stops; i++)
        if (e->stops[i] == id) return 1;
    return 0;
}

/* j's sampled token x (the lock held): the end of text, or its piece added
 * and the stop rules and limits applied. */
static void take_token(Engine *e, Job *j, int x) {
    if (j->n_gen == 0 && !j->t_first) {
        j->t_first = now_s();
        e->st.ttft_sum += j->t_first - j->t_submit;
        e->st.ttft_count++;
    }
    if (is_stop_token(e, x)) {
        size_t w = tok_stream_flush(&j->ts, e->piece, e->piece_cap), from = j->len;
        if (w != (size_t)-1 && text_put(j, e->piece, w)) { job_end(e, j, NULL, "out of memory for the text"); return; }
        stop_check(j, from);
        job_end(e, j, "stop", NULL);
        return;
    }
    j->n_gen++;
    e->st.generated_tokens++;
    sampler_accept(&j->smp, x);
    size_t w = tok_stream_put(e->tok, &j->ts, x, e->piece, e->piece_cap), from = j->len;
    if (w != (size_t)-1 && text_put(j, e->piece, w)) { job_end(e, j, NULL, "out of memory for the text"); return; }
    if (stop_check(j, from)) { job_end(e, j, "stop", NULL); return; }
    /* max_tokens was cut to the context at submission, so a job that may
     * go on always has a position for x */
    if (j->n_gen >= j->max_tokens) {
        w = tok_stream_flush(&j->ts, e->piece, e->piece_cap);
        from = j->len;
        if (w != (size_t)-1 && text_put(j, e->piece, w)) { job_end(e, j, NULL, "out of memory for the text"); return; }
        job_end(e, j, stop_check(j, from) ? "stop" : "length", NULL);
        return;
    }
    j->next = x;
    pthread_cond_broadcast(&j->cond);
}

static void warn_line(const char *w) {
    if (w[0]) fprintf(stderr, "warning: %s\n", w);
}

/* Jobs just admitted load what the prefix cache holds of their prompts
 * (the lock held on entry and exit, dropped around each load, which only
 * this thread's jobs and caches take part in). The prompt's last token
 * is always computed: its logits begin the reply. */
static void reuse(Engine *e) {
    for (int i = 0; e->prefix && i < e->o.parallel; i++) {
        Job *j = e->active[i];
        if (!j || j->looked) continue;
        j->looked = 1;
        char warn[1024];
        pthread_mutex_unlock(&e->mu);
        prefix_start(e->prefix, &j->spec, &j->pk);
        const int n = prefix_load(e->prefix, &j->kv, j->ids, j->n_ids - 1, &j->pk, warn, sizeof warn);
        warn_line(warn);
        pthread_mutex_lock(&e->mu);
        j->fed = j->reused = n;
        prefix_stats(e->prefix, &e->pst);
    }
}

/* A prompt slice from j->fed: at most n rows, ending at the next chunk's
 * end when chunks are kept (there the cache and a hybrid's state are the
 * chunk's to store). */
static int slice_rows(const Engine *e, const Job *j, int n) {
    if (j->n_ids - j->fed < n) n = j->n_ids - j->fed;
    if (e->prefix) {
        const int C = prefix_chunk(e->prefix), to_end = (j->fed / C + 1) * C - j->fed;
        if (to_end < n) n = to_end;
    }
    return n;
}

/* After a forward, a prompt that reached a chunk's end stores that chunk
 * (the engine thread, the lock not held). */
static void keep_chunk(Engine *e, Job *j) {
    const int len = kv_cache_len(&j->kv), C = e->prefix ? prefix_chunk(e->prefix) : 0;
    if (!C || len % C || len > j->n_ids || len != j->pk.t + C) return;
    char warn[1024];
    prefix_store(e->prefix, &j->kv, j->ids, &j->pk, warn, sizeof warn);
    warn_line(warn);
}

/* One step (the lock held on entry and exit, dropped around the forward
 * and the samplers): decoding jobs first, one row each, then prompt
 * slices in slot order with the rows left. */
static void step(Engine *e) {
    const int V = e->m->cfg.vocab_size, cap = model_batch_rows(e->m);
    int ns = 0, rows = 0, nl = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < e->o.parallel && rows < cap; i++) {
            Job *j = e->active[i];
            if (!j || (j->fed < j->n_ids) != pass) continue;
            const int n = pass ? slice_rows(e, j, cap - rows) : 1;
            /* a prompt slice that does not end its prompt needs no logits; the
             * rows that do lie back to back, which model_forward_batch fills in place */
            float *lg = pass && j->fed + n < j->n_ids ? NULL : e->logits + (size_t)nl++ * V;
            e->seqs[ns] = (ModelSeq){&j->kv, pass ? j->ids + j->fed : &j->next, n, lg, 0};
            e->in_step[ns++] = j;
            rows += n;
        }
    if (!ns) return;
    e->st.steps++;
    e->st.step_rows += rows;
    pthread_mutex_unlock(&e->mu);
    char err[1024];
    int rc = model_forward_batch(e->m, e->seqs, ns, err, sizeof err), some = 0;
    /* non-finite outputs end only the sequences that had them (the others'
     * rows are good); any other failure leaves the caches part-written, and
     * every job in the step ends */
    for (int i = 0; rc && i < ns; i++) some |= e->seqs[i].failed;
    int *tok = (int *)malloc((size_t)ns * sizeof(int));
    for (int i = 0; (!rc || some) && tok && i < ns; i++) {
        Job *j = e->in_step[i];
        /* a prompt slice that does not end the prompt samples nothing */
        tok[i] = e->seqs[i].logits && !e->seqs[i].failed ? sampler_sample(&j->smp, e->seqs[i].logits) : -1;
        if (e->seqs[i].tokens != &j->next && !e->seqs[i].failed) keep_chunk(e, j);
    }
    pthread_mutex_lock(&e->mu);
    if (e->prefix) prefix_stats(e->prefix, &e->pst);
    for (int i = 0; i < ns; i++) {
        Job *j = e->in_step[i];
        if ((rc && (!some || e->seqs[i].failed)) || !tok) {
            job_end(e, j, NULL, !tok ? "out of memory" : err);
            continue;
        }
        if (e->seqs[i].tokens != &j->next) {
            j->fed += e->seqs[i].n;
            e->st.prompt_tokens += e->seqs[i].n;
        }
        if (tok[i] >= 0) take_token(e, j, tok[i]);
    }
    free(tok);
}

static void *engine_main(void *arg) {
    Engine *e = arg;
    omp_set_num_threads(e->o.threads);
    /* its matmul buffers, grown now as the loader's were (engine_init waits
     * for the outcome); without them a forward would allocate them */
    pthread_mutex_lock(&e->mu);
    e->ready = model_thread_init(e->m) == 0 ? 1 : -1;
    pthread_cond_broadcast(&e->work);
    if (e->ready < 0) e->stopping = 1;
    for (;;) {
        while (!e->stopping && !e->n_active && !e->n_queued) pthread_cond_wait(&e->work, &e->mu);
        if (e->stopping) break;
        admit(e);
        for (int i = 0; i < e->o.parallel; i++)
            if (e->active[i] && e->active[i]->cancelled) job_end(e, e->active[i], "stop", NULL);
        reuse(e);
        step(e);
    }
    /* stopping: every job ends, so that no connection waits on it */
    for (int i = 0; i < e->o.parallel; i++)
        if (e->active[i]) job_end(e, e->active[i], NULL, "the server is stopping");
    while (e->queue_head) {
        Job *j = e->queue_head;
        e->queue_head = j->next_q;
        e->n_queued--;
        job_end(e, j, NULL, "the server is stopping");
    }
    e->queue_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    model_thread_free();
    return NULL;
}

int engine_init(Engine *e, Model *m, const Tokenizer *tok, const EngineOpts *o, char *err, size_t errlen) {
    memset(e, 0, sizeof *e);
    e->m = m;
    e->tok = tok;
    e->o = *o;
    for (int i = 0; i < m->cfg.n_eos; i++) e->stops[e->n_stops++] = m->cfg.eos_ids[i];
    const int im_end = tok_find(tok, "<|im_end|>");
    if (im_end >= 0) e->stops[e->n_stops++] = im_end;
    e->piece_cap = tok_max_piece(tok) + 16;
    e->active = calloc((size_t)o->parallel, sizeof *e->active);
    e->seqs = calloc((size_t)o->parallel, sizeof *e->seqs);
    e->in_step = calloc((size_t)o->parallel, sizeof *e->in_step);
    e->logits = malloc((size_t)o->parallel * m->cfg.vocab_size * sizeof(float));
    e->piece = malloc(e->piece_cap);
    if (!e->active || !e->seqs || !e->in_step || !e->logits || !e->piece) {
        snprintf(err, errlen, "out of memory for %d parallel sequences' logits", o->parallel);
        engine_free(e);
        return -1;
    }
    if (o->cache_bytes > 0) {
        if (prefix_init(&e->prefix, (size_t)o->cache_bytes, o->cache_chunk, o->cache_dir, model_identity(m), err,
                        errlen)) {
            engine_free(e);
            return -1;
        }
        prefix_stats(e->prefix, &e->pst);
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    int rc = pthread_create(&e->thread, NULL, engine_main, e);
    if (rc) {
        snprintf(err, errlen, "cannot start the engine's thread: %s", strerror(rc));
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->work);
        engine_free(e);
        return -1;
    }
    e->started = 1;
    pthread_mutex_lock(&e->mu);
    while (!e->ready) pthread_cond_wait(&e->work, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (e->ready < 0) {
        snprintf(err, errlen, "out of memory for the engine thread's matmul buffers");
        engine_free(e);
        return -1;
    }
    return 0;
}

void engine_stop(Engine *e) {
    if (!e->started || e->stopped) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->stopped = 1;
}

void engine_free(Engine *e) {
    if (e->started) {
        engine_stop(e);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->work);
    }
    free(e->active);
    free(e->seqs);
    free(e->in_step);
    free(e->logits);
    free(e->piece);
    char warn[1024];
    if (prefix_free(e->prefix, warn, sizeof warn)) fprintf(stderr, "warning: %s\n", warn);
    memset(e, 0, sizeof *e);
}

/* The job's condition variable, on the monotonic clock (engine_wait's
 * timeouts do not stretch when the wall clock jumps). */
static void job_cond_init(Job *j) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cond, &a);
    pthread_condattr_destroy(&a);
}

void engine_job_done(Job *j, const char *finish) {
    job_cond_init(j);
    j->finish = finish;
    j->state = JOB_DONE;
    j->refs = 1;
}

int engine_submit(Engine *e, Job *j) {
    pthread_mutex_lock(&e->mu);
    e->st.requests++;
    /* a free slot takes the job at once: it waits only behind full slots */
    const int rc = e->stopping ? -2 : e->n_queued >= e->o.queue + (e->o.parallel - e->n_active) ? -1 : 0;
    if (rc) {
        e->st.rejected += rc == -1;
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    job_cond_init(j);
    j->state = JOB_QUEUED;
    j->refs = 2;
    j->t_submit = now_s();
    j->next_q = NULL;
    if (e->queue_tail) e->queue_tail->next_q = j;
    else e->queue_head = j;
    e->queue_tail = j;
    e->n_queued++;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void engine_release(Engine *e, Job *j) {
    pthread_mutex_lock(&e->mu);
    if (j->state == JOB_QUEUED) {
        /* still waiting: it leaves the queue now, so that it holds no place there */
        Job **p = &e->queue_head, *prev = NULL;
        while (*p != j) prev = *p, p = &(*p)->next_q;
        *p = j->next_q;
        if (e->queue_tail == j) e->queue_tail = prev;
        e->n_queued--;
        job_end(e, j, "stop", NULL);
    } else if (j->state == JOB_RUNNING) {
        /* in a slot: the engine ends it before its next step */
        j->cancelled = 1;
        pthread_cond_signal(&e->work);
    }
    job_unref(j);
    pthread_mutex_unlock(&e->mu);
}

int engine_wait(Engine *e, Job *j, size_t *sent, char **out, size_t *n, double timeout) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    const double t = until.tv_nsec * 1e-9 + timeout;
    until.tv_sec += (time_t)floor(t);
    until.tv_nsec = (long)((t - floor(t)) * 1e9);
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&e->mu);
    while (j->ready <= *sent && j->state != JOB_DONE)
        if (pthread_cond_timedwait(&j->cond, &e->mu, &until) == ETIMEDOUT) break;
    if (j->ready > *sent && (*out = malloc(j->ready - *sent))) {
        *n = j->ready - *sent;
        memcpy(*out, j->text + *sent, *n);
        *sent = j->ready;
    }
    const int done = j->state == JOB_DONE && *sent == j->ready;
    pthread_mutex_unlock(&e->mu);
    return done;
}

void engine_metrics(Engine *e, FILE *f) {
    pthread_mutex_lock(&e->mu);
    const EngineStats s = e->st;
    const PrefixStats ps = e->pst;
    const int active = e->n_active, queued = e->n_queued, has_prefix = e->prefix != NULL;
    const double used = e->used;
    /* each scheme's cache bytes over the active jobs */
    char names[64][64];
    double bytes[64];
    int nn = 0;
    for (int i = 0; i < e->o.parallel; i++) {
        const Job *j = e->active[i];
        if (!j) continue;
        char name[64];
        kv_spec_name(&j->spec, name, sizeof name);
        int k = 0;
        while (k < nn && strcmp(names[k], name)) k++;
        if (k == nn && nn < 64) { snprintf(names[nn], sizeof names[nn], "%s", name); bytes[nn++] = 0; }
        if (k < nn) bytes[k] += j->bytes;
    }
    pthread_mutex_unlock(&e->mu);
    fprintf(f, "# HELP run_requests_total Generation requests received.\n# TYPE run_requests_total counter\n"
               "run_requests_total %ld\n", s.requests);
    fprintf(f, "# HELP run_requests_rejected_total Requests refused because the queue was full.\n"
               "# TYPE run_requests_rejected_total counter\nrun_requests_rejected_total %ld\n", s.rejected);
    fprintf(f, "# HELP run_requests_failed_total Requests that ended with an error.\n"
               "# TYPE run_requests_failed_total counter\nrun_requests_failed_total %ld\n", s.failed);
    fprintf(f, "# HELP run_prompt_tokens_total Prompt tokens computed.\n# TYPE run_prompt_tokens_total counter\n"
               "run_prompt_tokens_total %ld\n", s.prompt_tokens);
    fprintf(f, "# HELP run_generated_tokens_total Tokens generated.\n# TYPE run_generated_tokens_total counter\n"
               "run_generated_tokens_total %ld\n", s.generated_tokens);
    fprintf(f, "# HELP run_time_to_first_token_seconds From a request's arrival to its first token.\n"
               "# TYPE run_time_to_first_token_seconds summary\nrun_time_to_first_token_seconds_sum %.6f\n"
               "run_time_to_first_token_seconds_count %ld\n", s.ttft_sum, s.ttft_count);
    fprintf(f, "# HELP run_steps_total Batched forward steps.\n# TYPE run_steps_total counter\nrun_steps_total %ld\n"
               "# HELP run_step_rows_total Rows (tokens) over all steps.\n# TYPE run_step_rows_total counter\n"
               "run_step_rows_total %ld\n", s.steps, s.step_rows);
    fprintf(f, "# HELP run_sequences_active Sequences being computed.\n# TYPE run_sequences_active gauge\n"
               "run_sequences_active %d\n# HELP run_requests_queued Requests waiting for a slot.\n"
               "# TYPE run_requests_queued gauge\nrun_requests_queued %d\n", active, queued);
    fprintf(f, "# HELP run_kv_budget_bytes The memory budget for all caches (--kv-mb).\n"
               "# TYPE run_kv_budget_bytes gauge\nrun_kv_budget_bytes %.0f\n"
               "# HELP run_kv_budget_used_bytes What the admitted sequences hold of the budget.\n"
               "# TYPE run_kv_budget_used_bytes gauge\nrun_kv_budget_used_bytes %.0f\n", e->o.budget, used);
    fprintf(f, "# HELP run_kv_cache_bytes Bytes of the active sequences' caches, per scheme.\n"
               "# TYPE run_kv_cache_bytes gauge\n");
    for (int k = 0; k < nn; k++) fprintf(f, "run_kv_cache_bytes{scheme=\"%s\"} %.0f\n", names[k], bytes[k]);
    if (!has_prefix) return;
    /* prompt tokens are those computed; the reused ones were loaded instead */
    const double all = (double)ps.reused + (double)s.prompt_tokens;
    fprintf(f, "# HELP run_prefix_reused_tokens_total Prompt tokens loaded from the prefix cache, not computed.\n"
               "# TYPE run_prefix_reused_tokens_total counter\nrun_prefix_reused_tokens_total %ld\n"
               "# HELP run_prefix_reuse_ratio Reused prompt tokens over all prompt tokens.\n"
               "# TYPE run_prefix_reuse_ratio gauge\nrun_prefix_reuse_ratio %.6f\n", ps.reused, all > 0 ? ps.reused / all : 0);
    fprintf(f, "# HELP run_prefix_chunk_hits_total Chunk lookups that found one.\n"
               "# TYPE run_prefix_chunk_hits_total counter\nrun_prefix_chunk_hits_total %ld\n"
               "# HELP run_prefix_chunk_misses_total Chunk lookups that did not.\n"
               "# TYPE run_prefix_chunk_misses_total counter\nrun_prefix_chunk_misses_total %ld\n", ps.hits, ps.misses);
    fprintf(f, "# HELP run_prefix_chunks_stored_total Chunks put in memory.\n"
               "# TYPE run_prefix_chunks_stored_total counter\nrun_prefix_chunks_stored_total %ld\n"
               "# HELP run_prefix_evictions_total Chunks pushed out of memory (to the folder when there is one).\n"
               "# TYPE run_prefix_evictions_total counter\nrun_prefix_evictions_total %ld\n", ps.stored, ps.evicted);
    fprintf(f, "# HELP run_prefix_disk_reads_total Chunks read from --cache-dir.\n"
               "# TYPE run_prefix_disk_reads_total counter\nrun_prefix_disk_reads_total %ld\n"
               "# HELP run_prefix_disk_writes_total Chunks written to --cache-dir.\n"
               "# TYPE run_prefix_disk_writes_total counter\nrun_prefix_disk_writes_total %ld\n"
               "# HELP run_prefix_disk_errors_total Chunk files that could not be written or used.\n"
               "# TYPE run_prefix_disk_errors_total counter\nrun_prefix_disk_errors_total %ld\n", ps.disk_reads,
            ps.disk_writes, ps.disk_errors);
    fprintf(f, "# HELP run_prefix_chunk_size Positions per chunk (--cache-chunk).\n"
               "# TYPE run_prefix_chunk_size gauge\nrun_prefix_chunk_size %d\n", e->o.cache_chunk);
    fprintf(f, "# HELP run_prefix_budget_bytes The prefix cache's memory (--cache-mb).\n"
               "# TYPE run_prefix_budget_bytes gauge\nrun_prefix_budget_bytes %zu\n"
               "# HELP run_prefix_cache_bytes Bytes of chunks held in memory, per scheme.\n"
               "# TYPE run_prefix_cache_bytes gauge\n", ps.budget);
    for (int k = 0; k < ps.n_schemes; k++)
        fprintf(f, "run_prefix_cache_bytes{scheme=\"%s\"} %zu\n", ps.scheme[k], ps.scheme_bytes[k]);
}
