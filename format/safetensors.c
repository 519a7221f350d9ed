/* safetensors.c: parse, validate and mmap safetensors files (see the header
 * for the format and what is checked).
 *
 * Data flow: beside the main chain (run.c -> model -> attn -> kv ->
 * kernels): model/source.c opens a checkpoint here, model/ looks tensors up
 * by name and uses their bytes in place; -m pack writes one (st_write).
 *
 *   | u64 LE header length N | N bytes of JSON header | data section ... |
 *
 * Format: https://github.com/huggingface/safetensors. */
#include "format/safetensors.h"
#include "format/file.h"
#include "format/json.h"
#include "format/quote.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header bigger than this is not a checkpoint header (real ones are
 * < 1 MB); the reference implementation's limit, so that every file this
 * reader takes or st_write makes, the others take too. */
#define ST_MAX_HEADER 100000000u
/* model.safetensors.index.json: about 100 bytes a tensor, so 64 MiB is
 * room for 600,000 tensors (a 235B checkpoint has under 20,000). */
#define ST_MAX_INDEX (64u << 20)

static size_t dtype_bytes(const char *dt) {
    static const struct { const char *name; size_t size; } table[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
        {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].name, dt) == 0) return table[i].size;
    return 0;
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static int add_tensor(TensorStore *ts, STensor *t, char *err, size_t errlen) {
    if (st_find(ts, t->name)) {
        char q[QUOTE_BUF];
        snprintf(err, errlen, "%s: tensor %s appears twice", ts->files[t->file].path, quote_str(t->name, q, sizeof q));
        return -1;
    }
    /* keep the table at most half full */
    if ((size_t)(ts->n_tensors + 1) * 2 > ts->n_buckets) {
        size_t nb = ts->n_buckets ? ts->n_buckets * 2 : 256;
        int *b = malloc(nb * sizeof(int));
        if (!b) { snprintf(err, errlen, "out of memory"); return -1; }
        for (size_t i = 0; i < nb; i++) b[i] = -1;
        for (int i = 0; i < ts->n_tensors; i++) {
            size_t k = hash_name(ts->tensors[i].name) & (nb - 1);
            while (b[k] >= 0) k = (k + 1) & (nb - 1);
            b[k] = i;
        }
        free(ts->buckets);
        ts->buckets = b;
        ts->n_buckets = nb;
    }
    STensor *nt = realloc(ts->tensors, (size_t)(ts->n_tensors + 1) * sizeof(STensor));
    if (!nt) { snprintf(err, errlen, "out of memory"); return -1; }
    ts->tensors = nt;
    ts->tensors[ts->n_tensors] = *t;
    size_t k = hash_name(t->name) & (ts->n_buckets - 1);
    while (ts->buckets[k] >= 0) k = (k + 1) & (ts->n_buckets - 1);
    ts->buckets[k] = ts->n_tensors++;
    return 0;
}

const STensor *st_find(const TensorStore *ts, const char *name) {
    if (!ts->n_buckets) return NULL;
    size_t k = hash_name(name) & (ts->n_buckets - 1);
    while (ts->buckets[k] >= 0) {
        const STensor *t = &ts->tensors[ts->buckets[k]];
        if (strcmp(t->name, name) == 0) return t;
        k = (k + 1) & (ts->n_buckets - 1);
    }
    return NULL;
}

typedef struct { size_t begin, end; const char *name; } Span;

static int cmp_span(const void *a, const void *b) {
    const Span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Parses one header entry into t (name already set); data is the start of the data section. */
static int parse_entry(const char *path, const char *name, const Json *e, const uint8_t *data, size_t data_size,
                       STensor *t, size_t *b_out, char *err, size_t errlen) {
    char qn[QUOTE_BUF], qd[QUOTE_BUF];
    const char *dt = json_get_str(e, "dtype");
    /* every line below names the tensor as the header spells it, quoted */
    name = quote_str(name, qn, sizeof qn);
    const Json *shape = json_get(e, "shape"), *offs = json_get(e, "data_offsets");
    if (!dt || !shape || shape->type != JSON_ARRAY || !offs || offs->type != JSON_ARRAY || offs->len != 2) {
        snprintf(err, errlen, "%s: tensor %s: expected {dtype, shape, data_offsets[2]} in the header", path, name);
        return -1;
    }
    size_t es = dtype_bytes(dt);
    if (!es || strlen(dt) >= sizeof t->dtype) {
        snprintf(err, errlen, "%s: tensor %s: unknown dtype %s", path, name, quote_str(dt, qd, sizeof qd));
        return -1;
    }
    strcpy(t->dtype, dt);
    if (shape->len > ST_MAX_DIMS) {
        snprintf(err, errlen, "%s: tensor %s: expected at most %d dims, found %zu", path, name, ST_MAX_DIMS,
                 shape->len);
        return -1;
    }
    t->ndim = (int)shape->len;
    size_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        const Json *s = json_at(shape, (size_t)i);
        if (s->type != JSON_NUMBER || s->number < 0 || s->number > 1e15 || s->number != (double)(int64_t)s->number) {
            snprintf(err, errlen, "%s: tensor %s: shape[%d] is not a non-negative integer", path, name, i);
            return -1;
        }
        t->shape[i] = (int64_t)s->number;
        if (t->shape[i] && numel > SIZE_MAX / (size_t)t->shape[i]) {
            snprintf(err, errlen, "%s: tensor %s: shape overflows", path, name);
            return -1;
        }
        numel *= (size_t)t->shape[i];
    }
    double b = json_at(offs, 0)->type == JSON_NUMBER ? json_at(offs, 0)->number : -1;
    double en = json_at(offs, 1)->type == JSON_NUMBER ? json_at(offs, 1)->number : -1;
    if (b < 0 || en < b || en > (double)data_size || b != (double)(size_t)b || en != (double)(size_t)en) {
        snprintf(err, errlen, "%s: tensor %s: data_offsets [%.0f, %.0f) outside the data section of %zu bytes "
                 "(truncated file?)", path, name, b, en, data_size);
        return -1;
    }
    t->nbytes = (size_t)en - (size_t)b;
    if (numel > SIZE_MAX / es || t->nbytes != numel * es) {
        snprintf(err, errlen, "%s: tensor %s: expected %zu bytes for its shape and dtype, data_offsets give %zu",
                 path, name, numel * es, t->nbytes);
        return -1;
    }
    t->data = data + (size_t)b;
    *b_out = (size_t)b;
    return 0;
}

/* The format's rule (the reference implementation's validate()): sorted
 * by offset, each tensor begins exactly where the one before it ended, the
 * first at 0 and the last ending at the end of the data section. So no two
 * tensors share a byte, an empty tensor sits between two others and never
 * inside one (it cannot hide an overlap), and no byte belongs to no tensor
 * (a file cannot carry data that only another reader would see). */
static int check_coverage(const char *path, Span *spans, int ns, size_t data_size, char *err, size_t errlen) {
    qsort(spans, (size_t)ns, sizeof(Span), cmp_span);
    size_t at = 0;
    const char *prev = NULL; /* the last tensor with bytes, which ends at `at` */
    for (int i = 0; i < ns; i++) {
        if (spans[i].begin < at) {
            char q1[QUOTE_BUF], q2[QUOTE_BUF];
            snprintf(err, errlen, "%s: tensors %s and %s overlap in the data section", path,
                     quote_str(prev, q1, sizeof q1), quote_str(spans[i].name, q2, sizeof q2));
            return -1;
        }
        if (spans[i].begin > at) {
            snprintf(err, errlen, "%s: bytes [%zu, %zu) of the data section belong to no tensor (expected tensors "
                     "to cover it without gaps)", path, at, spans[i].begin);
            return -1;
        }
        if (spans[i].end > at) prev = spans[i].name;
        at = spans[i].end;
    }
    if (at != data_size) {
        snprintf(err, errlen, "%s: bytes [%zu, %zu) at the end of the data section belong to no tensor (expected "
                 "tensors to cover it without gaps)", path, at, data_size);
        return -1;
    }
    return 0;
}

/* Moves a header's "__metadata__" (m, inside the header tree) into *out
 * after checking it maps strings to strings; m is left a null the tree can
 * still free. */
static int take_metadata(const char *path, Json *m, Json **out, char *err, size_t errlen) {
    char q[QUOTE_BUF];
    if (m->type != JSON_OBJECT) {
        snprintf(err, errlen, "%s: __metadata__: expected an object of strings, found %s", path,
                 json_type_name(m->type));
        return -1;
    }
    for (size_t i = 0; i < m->len; i++)
        if (m->items[i].type != JSON_STRING) {
            snprintf(err, errlen, "%s: __metadata__[%s]: expected a string, found %s", path,
                     quote(m->keys[i], m->key_lens[i], q, sizeof q), json_type_name(m->items[i].type));
            return -1;
        }
    if (*out) {
        snprintf(err, errlen, "%s: __metadata__ appears twice", path);
        return -1;
    }
    *out = malloc(sizeof **out);
    if (!*out) { snprintf(err, errlen, "out of memory"); return -1; }
    **out = *m;
    memset(m, 0, sizeof *m);
    m->type = JSON_NULL;
    return 0;
}

/* The header of the file of size bytes at bytes: its JSON tree, checked to
 * be an object (*hlen its length), or NULL with err. */
static Json *parse_header(const char *path, const uint8_t *bytes, size_t size, uint64_t *hlen, char *err,
                          size_t errlen) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | bytes[i];
    if (n > size - 8) {
        snprintf(err, errlen, "%s: header length %llu exceeds the file (%zu bytes)", path, (unsigned long long)n,
                 size);
        return NULL;
    }
    if (n > ST_MAX_HEADER) {
        snprintf(err, errlen, "%s: header length %llu: expected at most %u bytes", path, (unsigned long long)n,
                 ST_MAX_HEADER);
        return NULL;
    }
    char perr[200];
    Json *h = json_parse((const char *)bytes + 8, (size_t)n, perr, sizeof perr);
    if (!h) { snprintf(err, errlen, "%s: malformed JSON header: %s", path, perr); return NULL; }
    if (h->type != JSON_OBJECT) {
        snprintf(err, errlen, "%s: expected a JSON object header, found %s", path, json_type_name(h->type));
        json_free(h);
        return NULL;
    }
    *hlen = n;
    return h;
}

int st_read_metadata(const char *path, Json **meta, char *err, size_t errlen) {
    size_t size;
    *meta = NULL;
    int fd = file_open_regular(path, SIZE_MAX, &size, err, errlen);
    if (fd < 0) return -1;
    uint8_t len[8];
    if (size < 8 || pread(fd, len, 8, 0) != 8) {
        close(fd);
        snprintf(err, errlen, "%s: expected at least 8 bytes (header length), found %zu", path, size);
        return -1;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | len[i];
    /* the header alone is read: a checkpoint's data may be gigabytes */
    size_t want = n > size - 8 || n > ST_MAX_HEADER ? 0 : (size_t)n;
    uint8_t *b = malloc(8 + want);
    int rc = -1;
    if (!b) snprintf(err, errlen, "out of memory");
    else if (want && pread(fd, b + 8, want, 8) != (ssize_t)want) snprintf(err, errlen, "%s: read failed", path);
    else {
        memcpy(b, len, 8);
        uint64_t hl;
        Json *h = parse_header(path, b, want ? 8 + want : size, &hl, err, errlen);
        const Json *m = json_get(h, "__metadata__");
        rc = h ? 0 : -1;
        if (m) rc = take_metadata(path, (Json *)m, meta, err, errlen);
        json_free(h);
    }
    free(b);
    close(fd);
    return rc;
}

static int open_one(TensorStore *ts, const char *path, char *err, size_t errlen) {
    size_t size;
    int fd = file_open_regular(path, SIZE_MAX, &size, err, errlen);
    if (fd < 0) return -1;
    if (size < 8) {
        close(fd);
        snprintf(err, errlen, "%s: expected at least 8 bytes (header length), found %zu", path, size);
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) { snprintf(err, errlen, "%s: mmap failed: %s", path, strerror(errno)); return -1; }
    STFile *nf = realloc(ts->files, (size_t)(ts->n_files + 1) * sizeof(STFile));
    if (!nf) { munmap(map, size); snprintf(err, errlen, "out of memory"); return -1; }
    ts->files = nf;
    int fi = ts->n_files++;
    ts->files[fi] = (STFile){.path = strdup(path), .map = map, .size = size};
    if (!ts->files[fi].path) { snprintf(err, errlen, "out of memory"); return -1; }

    const uint8_t *bytes = map;
    uint64_t hlen;
    Json *h = parse_header(path, bytes, size, &hlen, err, errlen);
    if (!h) return -1;
    const uint8_t *data = bytes + 8 + hlen;
    size_t data_size = size - 8 - (size_t)hlen;
    Span *spans = calloc(h->len + 1, sizeof(Span));
    if (!spans) {
        snprintf(err, errlen, "%s: out of memory", path);
        json_free(h);
        return -1;
    }
    int ns = 0, rc = 0;
    for (size_t i = 0; i < h->len && rc == 0; i++) {
        if (h->key_lens[i] == 12 && memcmp(h->keys[i], "__metadata__", 12) == 0) {
            if ((rc = take_metadata(path, &h->items[i], &ts->files[fi].meta, err, errlen))) break;
            continue;
        }
        STensor t = {0};
        size_t b;
        t.file = fi;
        if (h->items[i].type != JSON_OBJECT || strlen(h->keys[i]) != h->key_lens[i]) {
            char q[QUOTE_BUF];
            snprintf(err, errlen, "%s: header entry %s is not a tensor description", path,
                     quote(h->keys[i], h->key_lens[i], q, sizeof q));
            rc = -1;
            break;
        }
        rc = parse_entry(path, h->keys[i], &h->items[i], data, data_size, &t, &b, err, errlen);
        if (rc) break;
        t.name = strdup(h->keys[i]);
        if (!t.name) { snprintf(err, errlen, "out of memory"); rc = -1; break; }
        /* Unaligned data would make 16/32-bit loads undefined: copy those once. */
        size_t es = dtype_bytes(t.dtype);
        if (((uintptr_t)t.data % es) != 0 && t.nbytes) {
            void *c = aligned_alloc(64, (t.nbytes + 63) & ~(size_t)63);
            void **nc = realloc(ts->copies, (size_t)(ts->n_copies + 1) * sizeof(void *));
            if (nc) ts->copies = nc;
            if (!c || !nc) { free(c); free(t.name); snprintf(err, errlen, "out of memory"); rc = -1; break; }
            memcpy(c, t.data, t.nbytes);
            ts->copies[ts->n_copies++] = c;
            t.data = c;
        }
        spans[ns++] = (Span){b, b + t.nbytes, t.name};
        if ((rc = add_tensor(ts, &t, err, errlen))) { free(t.name); ns--; }
    }
    if (rc == 0) rc = check_coverage(path, spans, ns, data_size, err, errlen);
    free(spans);
    json_free(h);
    return rc;
}

int st_open_file(TensorStore *ts, const char *path, char *err, size_t errlen) {
    memset(ts, 0, sizeof *ts);
    if (open_one(ts, path, err, errlen)) { st_close(ts); return -1; }
    return 0;
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int open_index(TensorStore *ts, const char *dir, const char *index_path, char *err, size_t errlen) {
    char q1[QUOTE_BUF], q2[QUOTE_BUF];
    Json *idx = json_parse_file(index_path, ST_MAX_INDEX, err, errlen);
    if (!idx) return -1;
    const Json *wm = json_get(idx, "weight_map");
    int rc = 0;
    if (!wm || wm->type != JSON_OBJECT || wm->len == 0) {
        snprintf(err, errlen, "%s: expected a non-empty object 'weight_map'", index_path);
        rc = -1;
    }
    /* open every distinct shard once, in order of first mention */
    for (size_t i = 0; rc == 0 && i < wm->len; i++) {
        const Json *f = &wm->items[i];
        if (f->type != JSON_STRING || f->len == 0 || strchr(f->str, '/') || strlen(f->str) != f->len) {
            snprintf(err, errlen, "%s: weight_map[%s]: expected a file name in the same directory", index_path,
                     quote(wm->keys[i], wm->key_lens[i], q1, sizeof q1));
            rc = -1;
            break;
        }
        int seen = 0;
        for (int k = 0; k < ts->n_files && !seen; k++) {
            const char *base = strrchr(ts->files[k].path, '/');
            seen = strcmp(base ? base + 1 : ts->files[k].path, f->str) == 0;
        }
        if (seen) continue;
        char *path = join(dir, f->str);
        struct stat st;
        if (stat(path, &st) != 0) {
            snprintf(err, errlen, "%s: names shard %s, which is missing", index_path,
                     quote(f->str, f->len, q1, sizeof q1));
            rc = -1;
        } else
            rc = open_one(ts, path, err, errlen);
        free(path);
    }
    /* every mapped tensor must be where the index says */
    for (size_t i = 0; rc == 0 && i < wm->len; i++) {
        const STensor *t = st_find(ts, wm->keys[i]);
        const char *base = t ? strrchr(ts->files[t->file].path, '/') : NULL;
        if (!t || strcmp(base ? base + 1 : ts->files[t->file].path, wm->items[i].str) != 0) {
            snprintf(err, errlen, "%s: tensor %s should be in %s but is not there", index_path,
                     quote(wm->keys[i], wm->key_lens[i], q1, sizeof q1), quote(wm->items[i].str, wm->items[i].len, q2,
                                                                               sizeof q2));
            rc = -1;
        }
    }
    json_free(idx);
    return rc;
}

int st_open_dir(TensorStore *ts, const char *dir, char *err, size_t errlen) {
    memset(ts, 0, sizeof *ts);
    struct stat st;
    if (stat(dir, &st) != 0) {
        snprintf(err, errlen, "%s: cannot open model directory: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: expected a model directory, found a file", dir);
        return -1;
    }
    char *single = join(dir, "model.safetensors"), *index = join(dir, "model.safetensors.index.json");
    int rc;
    if (stat(index, &st) == 0) rc = open_index(ts, dir, index, err, errlen);
    else if (stat(single, &st) == 0) rc = open_one(ts, single, err, errlen);
    else {
        snprintf(err, errlen, "%s: expected model.safetensors or model.safetensors.index.json, found neither", dir);
        rc = -1;
    }
    free(single);
    free(index);
    if (rc) st_close(ts);
    return rc;
}

/* The first size bytes of path into dst: 0, or -1 (not the regular file
 * of that size it was when opened, or a short or failed read). */
static int read_all(const char *path, uint8_t *dst, size_t size) {
    char err[16];
    size_t now;
    int fd = file_open_regular(path, size, &now, err, sizeof err);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t r = pread(fd, dst + done, size - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        done += (size_t)r;
    }
    close(fd);
    return done == size ? 0 : -1;
}

int st_to_memory(TensorStore *ts) {
    const size_t huge = (size_t)2 << 20;
    size_t total = 0;
    for (int f = 0; f < ts->n_files; f++) total += ts->files[f].size;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int moved = 0;
    for (int f = 0; f < ts->n_files; f++) moved += ts->files[f].region != NULL;
    if (pages > 0 && page > 0 && total > (size_t)pages / 2 * (size_t)page) return moved;
    for (int f = 0; f < ts->n_files; f++) {
        STFile *F = &ts->files[f];
        if (F->region) continue;
        /* one huge page more than the file, so the copy can start on a
         * huge-page boundary */
        const size_t len = F->size + huge;
        void *region = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED) return moved;
        uint8_t *dst = (uint8_t *)(((uintptr_t)region + huge - 1) & ~(uintptr_t)(huge - 1));
        madvise(dst, F->size, MADV_HUGEPAGE); /* advice: 4 KB pages still work */
        /* read(), not a copy from the mapping: no page faults on the source
         * (docs/kernel-notes.md#huge-pages) */
        if (read_all(F->path, dst, F->size)) {
            munmap(region, len);
            continue;
        }
        mprotect(region, len, PROT_READ);
        const uint8_t *old = F->map;
        for (int i = 0; i < ts->n_tensors; i++) {
            STensor *t = &ts->tensors[i];
            const uint8_t *d = t->data;
            /* tensors copied for alignment live elsewhere and stay */
            if (t->file == f && d >= old && d <= old + F->size) t->data = dst + (d - old);
        }
        munmap(F->map, F->size);
        F->map = dst, F->region = region, F->region_len = len;
        moved++;
    }
    return moved;
}

int st_in_copy(const TensorStore *ts, const void *p, size_t n) {
    const uint8_t *b = p;
    for (int f = 0; f < ts->n_files; f++) {
        const STFile *F = &ts->files[f];
        const uint8_t *m = F->map;
        if (F->region && b >= m && n <= F->size && (size_t)(b - m) <= F->size - n) return 1;
    }
    return 0;
}

int st_copies_writable(TensorStore *ts, int writable) {
    int rc = 0;
    for (int f = 0; f < ts->n_files; f++)
        if (ts->files[f].region &&
            mprotect(ts->files[f].region, ts->files[f].region_len, writable ? PROT_READ | PROT_WRITE : PROT_READ))
            rc = -1;
    return rc;
}

const char *st_metadata(const TensorStore *ts, const char *key, size_t *len) {
    const Json *v = ts->n_files ? json_get(ts->files[0].meta, key) : NULL;
    if (!v) return NULL;
    *len = v->len;
    return v->str;
}

/* Write order: 8-byte types, F32 and the other 4-byte ones, then 2-byte
 * types, then the rest (largest elements first); names within one. */
static int elem_order(const STensor *t) {
    size_t es = dtype_bytes(t->dtype);
    return es >= 8 ? 0 : es == 4 ? 1 : es == 2 ? 2 : 3;
}

static const TensorStore *g_ts; /* qsort has no context argument */
static int by_write_order(const void *a, const void *b) {
    const STensor *x = &g_ts->tensors[*(const int *)a], *y = &g_ts->tensors[*(const int *)b];
    int ox = elem_order(x), oy = elem_order(y);
    return ox != oy ? ox - oy : strcmp(x->name, y->name);
}

int st_write(const char *path, const TensorStore *ts, const char *const *keys, const char *const *vals,
             const size_t *val_lens, int n_meta, char *err, size_t errlen) {
    /* a name of our own beside path, created anew (never another file, or
     * through a link someone left under that name) */
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid()) >= sizeof tmp) {
        snprintf(err, errlen, "%.200s: expected a shorter path", path);
        return -1;
    }
    for (int i = 0; i < n_meta; i++)
        if (!utf8_valid(vals[i], val_lens[i])) {
            char q[QUOTE_BUF];
            snprintf(err, errlen, "%s: metadata %s is not UTF-8, which safetensors headers must be", path,
                     quote_str(keys[i], q, sizeof q));
            return -1;
        }
    int *order = malloc(((size_t)ts->n_tensors + 1) * sizeof *order);
    if (!order) { snprintf(err, errlen, "out of memory"); return -1; }
    for (int i = 0; i < ts->n_tensors; i++) order[i] = i;
    g_ts = ts;
    qsort(order, (size_t)ts->n_tensors, sizeof *order, by_write_order);
    /* the header goes to memory first: its length comes before it */
    char *hdr = NULL;
    size_t hlen = 0;
    FILE *h = open_memstream(&hdr, &hlen);
    if (!h) { free(order); snprintf(err, errlen, "out of memory"); return -1; }
    fputs("{\"__metadata__\":{\"format\":\"pt\"", h);
    for (int i = 0; i < n_meta; i++) {
        fputc(',', h);
        json_write_str(h, keys[i], strlen(keys[i]));
        fputc(':', h);
        json_write_str(h, vals[i], val_lens[i]);
    }
    fputc('}', h);
    size_t off = 0;
    for (int k = 0; k < ts->n_tensors; k++) {
        const STensor *t = &ts->tensors[order[k]];
        fputc(',', h);
        json_write_str(h, t->name, strlen(t->name));
        fprintf(h, ":{\"dtype\":\"%s\",\"shape\":[", t->dtype);
        for (int d = 0; d < t->ndim; d++) fprintf(h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        fprintf(h, "],\"data_offsets\":[%zu,%zu]}", off, off + t->nbytes);
        off += t->nbytes;
    }
    fputc('}', h);
    /* spaces pad the header so the data section starts on 64 bytes */
    while ((8 + ftell(h)) % 64) fputc(' ', h);
    if (fclose(h) || hlen > ST_MAX_HEADER) {
        snprintf(err, errlen, "%s: a header of %zu bytes: expected at most %u (smaller metadata)", path, hlen,
                 ST_MAX_HEADER);
        free(hdr);
        free(order);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644), e = errno;
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    int rc = f ? 0 : -1, made = fd >= 0;
    if (!f && fd >= 0) e = errno, close(fd);
    if (f) {
        for (int i = 0; i < 8; i++) fputc((int)((unsigned long long)hlen >> (8 * i)) & 0xFF, f);
        rc |= fwrite(hdr, 1, hlen, f) != hlen;
        for (int k = 0; k < ts->n_tensors && !rc; k++) {
            const STensor *t = &ts->tensors[order[k]];
            rc |= t->nbytes && fwrite(t->data, 1, t->nbytes, f) != t->nbytes;
        }
        if (rc) e = errno;
        if (fclose(f) != 0 && !rc) rc = -1, e = errno;
    }
    if (!rc && rename(tmp, path) != 0) rc = -1, e = errno;
    free(hdr);
    free(order);
    if (rc) {
        snprintf(err, errlen, "%s: cannot write: %s", made ? path : tmp, strerror(e));
        if (made) unlink(tmp);
        return -1;
    }
    return 0;
}

void st_close(TensorStore *ts) {
    for (int i = 0; i < ts->n_tensors; i++) free(ts->tensors[i].name);
    for (int i = 0; i < ts->n_files; i++) {
        if (ts->files[i].region) munmap(ts->files[i].region, ts->files[i].region_len);
        else munmap(ts->files[i].map, ts->files[i].size);
        free(ts->files[i].path);
        json_free(ts->files[i].meta);
    }
    for (int i = 0; i < ts->n_copies; i++) free(ts->copies[i]);
    free(ts->tensors);
    free(ts->files);
    free(ts->copies);
    free(ts->buckets);
    memset(ts, 0, sizeof *ts);
}
