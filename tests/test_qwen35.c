/* test_qwen35.c: the hybrid Qwen3.5 architecture (Gated DeltaNet + gated
 * attention + MTP) against golden data from an independent float64
 * implementation cross-checked with llama.cpp (tests/data/golden/qwen35,
 * its README): logits, final hidden states and MTP logits at every
 * position; prefill and token-by-token decode giving the same bits, state
 * included; speculative decoding leaving the recurrent state exactly as
 * plain decoding does; every KV scheme on the full-attention layers; and
 * the loader's refusals. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "kernels/ops.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "speculative/speculative.h"
#include "tests/util.h"

#define FIX "tests/data/fixtures/qwen35"
#define GOLD "tests/data/golden/qwen35"

static void open_q35(Model *m, KVCache *kv, const char *scheme, int ctx) {
    char err[512];
    KVSpec spec;
    cr_assert_eq(model_load(m, FIX, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_spec_parse(scheme, &spec, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_kv_init(m, kv, &spec, ctx, 0, err, sizeof err), 0, "%s", err);
}

/* max-abs and relative L2 of got against want, and whether every row of
 * width w has the same argmax. */
static void compare(const float *got, const float *want, size_t n, int w, double tol, double rel, const char *what) {
    double worst = 0, dd = 0, ww = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        dd += d * d, ww += (double)want[i] * want[i];
        worst = d > worst ? d : worst;
    }
    cr_expect(worst <= tol, "%s: max-abs %g", what, worst);
    cr_expect(sqrt(dd / ww) <= rel, "%s: relative L2 %g", what, sqrt(dd / ww));
    for (size_t r = 0; w && r < n / (size_t)w; r++) {
        int a = 0, b = 0;
        for (int j = 1; j < w; j++) {
            if (got[r * w + j] > got[r * w + a]) a = j;
            if (want[r * w + j] > want[r * w + b]) b = j;
        }
        cr_expect_eq(a, b, "%s: row %zu argmax %d, golden %d", what, r, a, b);
    }
}

/* The config: hybrid layers, gated attention, partial RoPE, zero-centred norms. */
Test(qwen35, config_reads_the_hybrid) {
    Model m;
    KVCache kv;
    open_q35(&m, &kv, "f32", 64);
    const Config *c = &m.cfg;
    cr_expect_eq(c->arch, ARCH_QWEN35);
    cr_expect(c->n_layers == 6 && c->n_gdn == 5 && !c->gdn[3] && c->gdn[0] && c->gdn[5], "layer_types");
    cr_expect(c->head_dim == 256 && c->rot_dim == 64 && c->attn_gate && c->zero_centred, "attention");
    cr_expect(c->lin_k_heads == 2 && c->lin_v_heads == 4 && c->lin_k_dim == 128 && c->conv_k == 4, "GDN");
    cr_expect_str_eq(m.prefix, "model.language_model.");
    cr_expect(m.has_mtp && c->tie_embeddings, "MTP head, tied embedding");
    /* only the full layer caches K/V; the state is f32: 5 x (4 x 128 x 128 + 3 x 1024) floats */
    cr_expect_eq(kv.n_layers, 1);
    cr_expect_eq(kv_cache_state_bytes(&kv), (size_t)5 * (4 * 128 * 128 + 3 * 1024) * 4);
    kv_cache_free(&kv);
    model_free(&m);
}

/* Every position's logits and final hidden state in one prefill (f32 KV):
 * within the golden README's 1e-4 max-abs and 2e-5 relative L2, argmax
 * equal on every row. */
Test(qwen35, golden_logits_and_hidden) {
    const char *prompts[] = {"hello", "sentence"};
    for (int p = 0; p < 2; p++) {
        Model m;
        KVCache kv;
        char path[256], err[512];
        int ids[512];
        open_q35(&m, &kv, "f32", 512);
        snprintf(path, sizeof path, GOLD "/%s/tokens.txt", prompts[p]);
        const int n = read_tokens(path, ids, 512), V = m.cfg.vocab_size, H = m.cfg.hidden;
        float *lg = malloc((size_t)n * V * sizeof(float)), *hid = malloc((size_t)n * H * sizeof(float));
        cr_assert_eq(model_forward(&m, &kv, ids, n, lg, 1, hid, err, sizeof err), 0, "%s", err);
        snprintf(path, sizeof path, GOLD "/%s/logits.f32", prompts[p]);
        float *want = read_f32(path, (size_t)n * V);
        compare(lg, want, (size_t)n * V, V, 1e-4, 2e-5, prompts[p]);
        free(want);
        snprintf(path, sizeof path, GOLD "/%s/hidden.f32", prompts[p]);
        want = read_f32(path, (size_t)n * H);
        compare(hid, want, (size_t)n * H, 0, 1e-4, 2e-5, "hidden");
        free(want), free(lg), free(hid);
        kv_cache_free(&kv);
        model_free(&m);
    }
}

/* Prefill of n tokens against n - k then k single steps: the same bits in
 * every position's logits and in the recurrent state (the recurrence runs
 * one token at a time either way), for f32 and a compressed cache. */
Test(qwen35, prefill_and_decode_give_the_same_bits) {
    const char *schemes[] = {"f32", "tbq4", "kivi2:g32:r32"};
    for (int s = 0; s < 3; s++) {
        Model m;
        KVCache a, b;
        char err[512];
        int ids[64];
        const int n = read_tokens(GOLD "/sentence/tokens.txt", ids, 64), k = 9;
        open_q35(&m, &a, schemes[s], 64);
        KVSpec spec;
        kv_spec_parse(schemes[s], &spec, err, sizeof err);
        cr_assert_eq(model_kv_init(&m, &b, &spec, 64, 0, err, sizeof err), 0, "%s", err);
        const int V = m.cfg.vocab_size;
        float *la = malloc((size_t)n * V * sizeof(float)), *lb = malloc((size_t)n * V * sizeof(float));
        cr_assert_eq(model_forward(&m, &a, ids, n, la, 1, NULL, err, sizeof err), 0, "%s", err);
        cr_assert_eq(model_forward(&m, &b, ids, n - k, lb, 1, NULL, err, sizeof err), 0, "%s", err);
        for (int i = n - k; i < n; i++)
            cr_assert_eq(model_forward(&m, &b, ids + i, 1, lb + (size_t)i * V, 1, NULL, err, sizeof err), 0, "%s", err);
        cr_expect_eq(memcmp(la, lb, (size_t)n * V * sizeof(float)), 0, "%s: logits differ", schemes[s]);
        cr_expect_eq(memcmp(a.state, b.state, kv_cache_state_bytes(&a)), 0, "%s: state differs", schemes[s]);
        /* truncating to 0 starts the sequence again: state zero, same logits */
        kv_cache_truncate(&b, 0);
        cr_assert_eq(model_forward(&m, &b, ids, n, lb, 1, NULL, err, sizeof err), 0, "%s", err);
        cr_expect_eq(memcmp(la, lb, (size_t)n * V * sizeof(float)), 0, "%s: after truncate(0)", schemes[s]);
        free(la), free(lb);
        kv_cache_free(&a), kv_cache_free(&b);
        model_free(&m);
    }
}

/* Three sequences of the hybrid at lengths 0, 4 and 11 step together
 * through model_forward_batch, n = {5, 1, 3} then {1, 1, 1}: each one's
 * logits and recurrent state (S and the conv window of every Gated
 * DeltaNet layer) are the bits model_forward gives it alone on a cache of
 * its own. A journal (one sequence's record) refuses a batch of several. */
Test(qwen35, batched_sequences_match_single_runs) {
    const char *schemes[] = {"f32", "tbq4"};
    for (int s = 0; s < 2; s++) {
        Model m;
        KVCache a[3];
        char err[512];
        int ids[64], at[3];
        const int n = read_tokens(GOLD "/sentence/tokens.txt", ids, 64);
        const int pre[3] = {0, 4, 11}, step[2][3] = {{5, 1, 3}, {1, 1, 1}}, off[3] = {0, 9, 20};
        cr_assert(n >= off[2] + pre[2] + 4);
        open_q35(&m, &a[0], schemes[s], 64);
        check_batch_vs_alone(&m, a, 64, ids, off, pre, step, schemes[s], at);
        float journal[1];
        m.journal = journal, m.journal_cap = 1;
        ModelSeq seqs[3];
        for (int i = 0; i < 3; i++) seqs[i] = (ModelSeq){.kv = &a[i], .tokens = ids + off[i] + at[i], .n = 1};
        cr_expect_eq(model_forward_batch(&m, seqs, 3, err, sizeof err), -1);
        cr_expect(strstr(err, "journal") != NULL, "%s", err);
        m.journal = NULL, m.journal_cap = 0;
        for (int i = 0; i < 3; i++) kv_cache_free(&a[i]);
        model_free(&m);
    }
}

/* The journal a verify pass keeps: after a recorded forward of 6 tokens,
 * replaying its first n (0..6) from the snapshot leaves the state a
 * forward of just those n tokens does, to the byte (conv window included:
 * n < 3 reaches back into the window from before the pass). */
Test(qwen35, state_replay_from_the_journal) {
    Model m;
    KVCache a, b;
    char err[512];
    int ids[64];
    const int n = read_tokens(GOLD "/sentence/tokens.txt", ids, 64), P = 8, N = 6;
    cr_assert(n >= P + N);
    KVSpec spec;
    open_q35(&m, &a, "f32", 64);
    kv_spec_parse("f32", &spec, err, sizeof err);
    cr_assert_eq(model_kv_init(&m, &b, &spec, 64, 0, err, sizeof err), 0, "%s", err);
    const size_t bytes = kv_cache_state_bytes(&a);
    float *snap = malloc(bytes), *journal = malloc(model_journal_floats(&m, N) * sizeof(float));
    cr_assert(snap && journal);
    for (int k = 0; k <= N; k++) {
        kv_cache_truncate(&a, 0), kv_cache_truncate(&b, 0);
        cr_assert_eq(model_forward(&m, &a, ids, P, NULL, 0, NULL, err, sizeof err), 0, "%s", err);
        memcpy(snap, a.state, bytes);
        m.journal = journal, m.journal_cap = N;
        cr_assert_eq(model_forward(&m, &a, ids + P, N, NULL, 0, NULL, err, sizeof err), 0, "%s", err);
        m.journal = NULL, m.journal_cap = 0;
        model_state_replay(&m, &a, snap, journal, N, k);
        cr_assert_eq(model_forward(&m, &b, ids, P + k, NULL, 0, NULL, err, sizeof err), 0, "%s", err);
        cr_expect_eq(memcmp(a.state, b.state, bytes), 0, "replay of %d tokens: state differs", k);
    }
    free(snap), free(journal);
    kv_cache_free(&a), kv_cache_free(&b);
    model_free(&m);
}

/* The MTP head in vLLM's layout: row p takes (h_p, x_{p+1}) at position p,
 * the last row the greedy next token; then the 3-step chain from the last
 * row (README: "MTP"). */
Test(qwen35, golden_mtp_logits_and_chain) {
    Model m;
    KVCache kv, mkv;
    char err[512];
    int ids[64];
    open_q35(&m, &kv, "f32", 64);
    KVSpec spec;
    kv_spec_parse("f32", &spec, err, sizeof err);
    cr_assert_eq(model_kv_init(&m, &mkv, &spec, 64, 1, err, sizeof err), 0, "%s", err);
    const int n = read_tokens(GOLD "/sentence/tokens.txt", ids, 64), V = m.cfg.vocab_size, H = m.cfg.hidden;
    float *lg = malloc((size_t)n * V * sizeof(float)), *hid = malloc((size_t)n * H * sizeof(float));
    float *mlg = malloc((size_t)n * V * sizeof(float)), *hm = malloc((size_t)n * H * sizeof(float));
    cr_assert_eq(model_forward(&m, &kv, ids, n, lg, 1, hid, err, sizeof err), 0, "%s", err);
    int next[64];
    for (int p = 0; p + 1 < n; p++) next[p] = ids[p + 1];
    next[n - 1] = argmax(lg + (size_t)(n - 1) * V, V);
    cr_expect_eq(next[n - 1], 2489, "x_T of mtp_chain.json");
    cr_assert_eq(model_mtp_forward(&m, &mkv, hid, next, n, mlg, 1, hm, err, sizeof err), 0, "%s", err);
    float *want = read_f32(GOLD "/sentence/mtp_logits.f32", (size_t)n * V);
    compare(mlg, want, (size_t)n * V, V, 1e-4, 2e-5, "mtp_logits");
    free(want);
    /* the chain: step k + 1 feeds (hm of step k, its draft) at the next position */
    float chain[3 * 4160], h[256];
    int tok = argmax(mlg + (size_t)(n - 1) * V, V);
    memcpy(chain, mlg + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
    memcpy(h, hm + (size_t)(n - 1) * H, (size_t)H * sizeof(float));
    cr_expect_eq(tok, 43, "first draft of mtp_chain.json");
    for (int k = 1; k < 3; k++) {
        cr_assert_eq(model_mtp_forward(&m, &mkv, h, &tok, 1, chain + (size_t)k * V, 0, h, err, sizeof err), 0, "%s",
                     err);
        tok = argmax(chain + (size_t)k * V, V);
    }
    cr_expect_eq(tok, 2708, "last draft of mtp_chain.json");
    want = read_f32(GOLD "/sentence/mtp_chain_logits.f32", (size_t)3 * V);
    compare(chain, want, (size_t)3 * V, V, 1e-4, 2e-5, "mtp_chain_logits");
    free(want), free(lg), free(hid), free(mlg), free(hm);
    kv_cache_free(&kv), kv_cache_free(&mkv);
    model_free(&m);
}

/* Speculative decoding rolls the recurrent state back: a sampled run
 * (temperature 1.5, so drafts are accepted at every depth and rejected at
 * every depth) ends with the cache and the state plain decoding of the same
 * tokens leaves, byte for byte. */
Test(qwen35, speculative_decoding_restores_the_state) {
    Model m;
    KVCache kv, mkv, plain;
    Sampler smp;
    Spec sp;
    char err[512];
    int ids[256];
    open_q35(&m, &kv, "f16", 256);
    KVSpec spec;
    kv_spec_parse("f16", &spec, err, sizeof err);
    cr_assert_eq(model_kv_init(&m, &mkv, &spec, 256, 1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_kv_init(&m, &plain, &spec, 256, 0, err, sizeof err), 0, "%s", err);
    const int n = read_tokens(GOLD "/sentence/tokens.txt", ids, 64), V = m.cfg.vocab_size, H = m.cfg.hidden;
    cr_assert_eq(sampler_init(&smp, V, 1.5f, 0, 1, 0, 7), 0);
    cr_assert_eq(spec_init(&sp, &m, &kv, &mkv, &smp, 3, err, sizeof err), 0, "%s", err);
    float *lg = malloc((size_t)V * sizeof(float)), *hid = malloc((size_t)n * H * sizeof(float));
    cr_assert_eq(model_forward(&m, &kv, ids, n, lg, 0, hid, err, sizeof err), 0, "%s", err);
    cr_assert_eq(spec_prefill(&sp, hid, ids, n, err, sizeof err), 0, "%s", err);
    int len = n, x = sampler_sample(&smp, lg), out[SPEC_MAX + 1];
    ids[len++] = x;
    while (len + 5 < 200) {
        int got = spec_step(&sp, x, out, err, sizeof err);
        cr_assert(got > 0, "%s", err);
        memcpy(ids + len, out, (size_t)got * sizeof(int));
        len += got;
        x = out[got - 1];
    }
    /* a stop inside accepted drafts: back one position */
    cr_assert_eq(spec_rewind(&sp, kv_cache_len(&kv) - 1), 0);
    len -= 1;
    cr_expect(spec_accepted(&sp) > 0 && spec_accepted(&sp) < sp.drafted, "accepted %ld of %ld", spec_accepted(&sp),
              sp.drafted);
    /* plain decoding of every token but the last: what the cache holds */
    cr_assert_eq(model_forward(&m, &plain, ids, len - 1, NULL, 0, NULL, err, sizeof err), 0, "%s", err);
    cr_expect_eq(kv_cache_len(&plain), kv_cache_len(&kv));
    cr_expect_eq(memcmp(plain.state, kv.state, kv_cache_state_bytes(&kv)), 0, "the state differs from plain decoding's");
    free(lg), free(hid);
    spec_free(&sp);
    sampler_free(&smp);
    kv_cache_free(&kv), kv_cache_free(&mkv), kv_cache_free(&plain);
    model_free(&m);
}

/* Runs the binary; returns its exit code and stdout. */
static int run_bin(const char *args, char **out) {
    const char *bin = getenv("RUN_BIN") ? getenv("RUN_BIN") : "./run";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout 120 %s %s 2>/tmp/run_q35_err.%d </dev/null", bin, args, (int)getpid());
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t cap = 1 << 16, n = 0, r;
    char *b = malloc(cap);
    while ((r = fread(b + n, 1, cap - 1 - n, p)) > 0) n += r;
    b[n] = 0;
    int st = pclose(p);
    *out = b;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Greedy output with drafts is plain greedy output, on every cache the
 * issue names; every scheme runs on the full-attention layers; compare
 * takes a hybrid model. */
Test(qwen35, greedy_speculation_and_every_scheme) {
    const char *schemes[] = {"f32", "tbq4", "kivi2"};
    for (int s = 0; s < 3; s++) {
        char a[256], *want, *got;
        snprintf(a, sizeof a, FIX " -f " GOLD "/sentence/prompt.txt -n 48 -t 0 -kv %s -spec 0", schemes[s]);
        cr_assert_eq(run_bin(a, &want), 0);
        snprintf(a, sizeof a, FIX " -f " GOLD "/sentence/prompt.txt -n 48 -t 0 -kv %s -spec 3", schemes[s]);
        cr_assert_eq(run_bin(a, &got), 0);
        cr_expect_str_eq(got, want, "-kv %s: -spec 3 differs from -spec 0", schemes[s]);
        free(want), free(got);
    }
    char *out;
    cr_assert_eq(run_bin(FIX " -m compare -f " GOLD "/sentence/prompt.txt -n 4", &out), 0);
    for (int i = 0; i < kv_n_schemes; i++) {
        char row[64];
        snprintf(row, sizeof row, "| %s | stored |", kv_schemes[i]->name);
        cr_expect(strstr(out, row) != NULL, "compare lacks %s:\n%s", kv_schemes[i]->name, out);
    }
    free(out);
    char ep[64];
    snprintf(ep, sizeof ep, "/tmp/run_q35_err.%d", (int)getpid());
    remove(ep);
}

/* A copy of the fixture with config.json edited (sed expression) or a
 * tensor renamed in the header (same length: the offsets stay valid);
 * expects exit 1 and the fragment on stderr. */
static void expect_refusal(const char *sed, const char *from, const char *to, const char *frag) {
    char dir[] = "/tmp/run_q35_XXXXXX", cmd[2048];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp " FIX "/* %s/ && chmod u+w %s/*", dir, dir);
    cr_assert_eq(system(cmd), 0);
    if (sed) {
        snprintf(cmd, sizeof cmd, "sed -i -e '%s' %s/config.json", sed, dir);
        cr_assert_eq(system(cmd), 0);
    }
    if (from) {
        /* both the header and the index name the tensor */
        snprintf(cmd, sizeof cmd, "sed -i 's/%s/%s/' %s/model.safetensors.index.json && "
                 "perl -pi -e 's/\\Q%s\\E/%s/' %s/model.safetensors-00001-of-00001.safetensors", from, to, dir, from,
                 to, dir);
        cr_assert_eq(system(cmd), 0);
    }
    snprintf(cmd, sizeof cmd, "%s -i hi -n 1", dir);
    char *out;
    int rc = run_bin(cmd, &out);
    free(out);
    char ep[64];
    snprintf(ep, sizeof ep, "/tmp/run_q35_err.%d", (int)getpid());
    char *err = slurp(ep, NULL);
    remove(ep);
    cr_expect_eq(rc, 1, "%s: exit %d: %s", frag, rc, err);
    cr_expect(strstr(err, frag) != NULL, "expected '%s' in: %s", frag, err);
    free(err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(qwen35, bad_input_names_the_field_or_tensor) {
    expect_refusal("s/\"linear_num_value_heads\": 4/\"linear_num_value_heads\": 3/", NULL, NULL,
                   "linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2");
    expect_refusal("0,/\"linear_attention\",/s//\"mamba\",/", NULL, NULL,
                   "'text_config.layer_types[0]': expected linear_attention or full_attention, found the string "
                   "\"mamba\"");
    expect_refusal("0,/\"linear_attention\",/s///", NULL, NULL,
                   "'text_config.layer_types': expected a list of 6 layer types");
    expect_refusal("s/\"mlp_only_layers\": \\[\\],/\"num_experts\": 8,/", NULL, NULL, "mixture-of-experts");
    expect_refusal("s/\"linear_key_head_dim\": 128/\"linear_key_head_dim\": 64/", NULL, NULL,
                   "linear_attn.in_proj_qkv.weight': expected shape [768, 256]");
    expect_refusal(NULL, "layers.4.linear_attn.A_log", "layers.4.linear_attn.A_lag",
                   "missing tensor 'model.language_model.layers.4.linear_attn.A_log'");
    expect_refusal(NULL, "mtp.layers.0.self_attn.o_proj", "mtp.layers.0.self_attn.o_prij",
                   "missing tensor 'mtp.layers.0.self_attn.o_proj.weight'");
    expect_refusal("s/\"mamba_ssm_dtype\": \"float32\"/\"mamba_ssm_dtype\": 7/", NULL, NULL,
                   "'text_config.mamba_ssm_dtype': expected \"float32\" (the state is kept in f32), found 7");
    expect_refusal("s/\"mtp_num_hidden_layers\": 1/\"mtp_num_hidden_layers\": 2/", NULL, NULL,
                   "'text_config.mtp_num_hidden_layers': expected an integer in 0..1, found 2");
    expect_refusal("s/\"mtp_num_hidden_layers\": 1/\"mtp_num_hidden_layers\": 1, \"num_nextn_predict_layers\": 0/",
                   NULL, NULL,
                   "fields 'text_config.num_nextn_predict_layers' (0) and 'text_config.mtp_num_hidden_layers' (1): "
                   "expected the same MTP layer count");
}

/* The vision tower is not loaded, so its placeholders (image_token_id 4108,
 * video_token_id 4109 in the fixture's config) are refused by name in a
 * prompt, as ids or from the tokenizer; the forward itself takes them (a
 * sampled token may be one). */
Test(qwen35, image_and_video_placeholders_are_refused) {
    Model m;
    KVCache kv;
    char err[512];
    open_q35(&m, &kv, "f32", 64);
    cr_expect(m.cfg.media_ids[0] == 4108 && m.cfg.media_ids[1] == 4109);
    int toks[3] = {1707, 4109, 11};
    cr_expect_eq(model_check_input(&m, toks, 3, err, sizeof err), -1);
    cr_expect(strstr(err, "token id 4109 at position 1 is the video placeholder (video_token_id)"), "%s", err);
    /* generated tokens are not checked: a sampled placeholder is only a token */
    cr_expect_eq(model_forward(&m, &kv, toks, 3, NULL, 0, NULL, err, sizeof err), 0, "%s", err);
    kv_cache_free(&kv);
    model_free(&m);
    char *out, ep[64];
    cr_expect_eq(run_bin(FIX " -i 'Look: <|image_pad|>' -n 4", &out), 1);
    free(out);
    snprintf(ep, sizeof ep, "/tmp/run_q35_err.%d", (int)getpid());
    char *e = slurp(ep, NULL);
    cr_expect(e && strstr(e, "is the image placeholder (image_token_id): images and video are not supported"), "%s",
              e ? e : "(no stderr)");
    free(e);
    remove(ep);
}

/* partial_rotary_factor may be left out (transformers' default for Qwen3.5
 * is a quarter of each head) or sit in rope_scaling (older saves): the same
 * logits either way. */
Test(qwen35, partial_rotary_factor_default_and_rope_scaling) {
    /* perl -0: the key and the comma before it span two lines */
    const char *edits[] = {"s/,\\s*\"partial_rotary_factor\": 0.25//",
                           "s/,\\s*\"partial_rotary_factor\": 0.25//; s/\"mamba_ssm_dtype\"/\"rope_scaling\": "
                           "{\"partial_rotary_factor\": 0.25}, \"mamba_ssm_dtype\"/"};
    for (int e = 0; e < 2; e++) {
        char dir[] = "/tmp/run_q35_XXXXXX", cmd[1024], err[512];
        cr_assert(mkdtemp(dir));
        snprintf(cmd, sizeof cmd, "cp " FIX "/* %s/ && chmod u+w %s/* && perl -0pi -e '%s' %s/config.json && "
                 "[ $(grep -c partial_rotary_factor %s/config.json) = %d ]", dir, dir, edits[e], dir, dir, e);
        cr_assert_eq(system(cmd), 0);
        Model m;
        KVCache kv;
        KVSpec spec;
        int ids[64];
        cr_assert_eq(model_load(&m, dir, 0, err, sizeof err), 0, "%s", err);
        cr_expect_eq(m.cfg.rot_dim, 64, "edit %d", e);
        kv_spec_parse("f32", &spec, err, sizeof err);
        cr_assert_eq(model_kv_init(&m, &kv, &spec, 64, 0, err, sizeof err), 0, "%s", err);
        const int n = read_tokens(GOLD "/sentence/tokens.txt", ids, 64), V = m.cfg.vocab_size;
        float *lg = malloc((size_t)n * V * sizeof(float)), *want = read_f32(GOLD "/sentence/logits.f32", (size_t)n * V);
        cr_assert_eq(model_forward(&m, &kv, ids, n, lg, 1, NULL, err, sizeof err), 0, "%s", err);
        compare(lg, want, (size_t)n * V, V, 1e-4, 2e-5, "edited config");
        free(lg), free(want);
        kv_cache_free(&kv);
        model_free(&m);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_expect_eq(system(cmd), 0);
    }
}

/* A checkpoint whose config announces an MTP head it does not carry (some
 * conversions strip mtp.*) runs without drafts, saying so in one line. */
Test(qwen35, missing_mtp_head_runs_without_drafts) {
    char dir[] = "/tmp/run_q35_XXXXXX", cmd[1024];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp " FIX "/* %s/ && chmod u+w %s/* && sed -i 's/\"mtp\\./\"xtp./g' "
             "%s/model.safetensors.index.json && perl -pi -e 's/\"mtp\\./\"xtp./g' "
             "%s/model.safetensors-00001-of-00001.safetensors", dir, dir, dir, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s -i hi -n 3 -t 0 -spec 3", dir);
    char *out;
    cr_expect_eq(run_bin(cmd, &out), 0, "-spec 3 asked of a model without its head");
    free(out);
    snprintf(cmd, sizeof cmd, "grep -q 'announces an MTP head' /tmp/run_q35_err.%d", (int)getpid());
    cr_expect_eq(system(cmd), 0, "no warning about the missing head");
    snprintf(cmd, sizeof cmd, "/tmp/run_q35_err.%d", (int)getpid());
    remove(cmd);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}
