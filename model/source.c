/* source.c: a model folder or a single-file model behind one interface
 * (see source.h).
 *
 * Data flow: run.c -> source_open here -> config.json, the tokenizer files
 * and the tensors (format/safetensors.c) for model/ and tokenizer/. A
 * single-file model is safetensors whose "__metadata__" carries the
 * folder's JSON files as strings:
 *
 *   | u64 n | {"__metadata__": {"config.json": "{...}", ...}, tensors ...} | data |
 */
#include "model/source.h"
#include "format/file.h"
#include "format/json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int source_open(ModelSource *src, const char *path, char *err, size_t errlen) {
    memset(src, 0, sizeof *src);
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: cannot open the model: %s", path, strerror(errno));
        return -1;
    }
    const char *expected = "expected a model folder, a .safetensors file in one, or a single-file model "
                           "(made by ./run FOLDER -m pack -o FILE)";
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: %s, found %s", path, expected, file_kind(st.st_mode));
        return -1;
    }
    src->path = strdup(path);
    if (!src->path) { snprintf(err, errlen, "out of memory"); return -1; }
    if (S_ISDIR(st.st_mode)) {
        src->dir = strdup(path);
        if (!src->dir) { snprintf(err, errlen, "out of memory"); goto fail; }
        return 0;
    }
    char why[512];
    if (st_read_metadata(path, &src->meta, why, sizeof why)) {
        /* why starts with the path too */
        size_t pl = strlen(path);
        const char *w = strncmp(why, path, pl) == 0 && why[pl] == ':' ? why + pl + 2 : why;
        snprintf(err, errlen, "%s: %s, found a file that is not safetensors (%s)", path, expected, w);
        goto fail;
    }
    if (json_get(src->meta, "config.json")) return 0;
    /* the metadata of -m pack without its config: a damaged single file,
     * not a checkpoint whose folder holds the rest */
    if (json_get(src->meta, "tokenizer.json")) {
        snprintf(err, errlen, "%s: a single-file model: expected config.json in its metadata, found none", path);
        goto fail;
    }
    /* a checkpoint file: its folder holds the rest */
    json_free(src->meta);
    src->meta = NULL;
    const char *slash = strrchr(path, '/');
    src->dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    if (!src->dir) { snprintf(err, errlen, "out of memory"); goto fail; }
    return 0;
fail:
    source_free(src);
    return -1;
}

void source_free(ModelSource *src) {
    free(src->path);
    free(src->dir);
    json_free(src->meta);
    memset(src, 0, sizeof *src);
}

char *source_read(const ModelSource *src, const char *name, size_t max, size_t *len, int *absent, char *err,
                  size_t errlen) {
    *absent = 0;
    if (src->meta) {
        const Json *v = json_get(src->meta, name);
        if (!v) { *absent = 1; return NULL; }
        if (v->len > max) {
            snprintf(err, errlen, "%s: metadata %s: expected at most %zu bytes, found %zu", src->path, name, max,
                     v->len);
            return NULL;
        }
        char *s = malloc(v->len + 1);
        if (!s) { snprintf(err, errlen, "out of memory"); return NULL; }
        memcpy(s, v->str, v->len + 1);
        *len = v->len;
        return s;
    }
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", src->dir, name) >= sizeof path) {
        snprintf(err, errlen, "%.200s...: expected a shorter folder name", src->dir);
        return NULL;
    }
    /* absent is fine for optional files; anything else there must be a good file */
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) { *absent = 1; return NULL; }
    return file_read(path, max, len, err, errlen);
}

/* The parsed JSON of the model's file name; NULL with *absent or err. */
static Json *read_json(const ModelSource *src, const char *name, size_t max, int *absent, char *where, size_t wlen,
                       char *err, size_t errlen) {
    size_t n;
    char *text = source_read(src, name, max, &n, absent, err, errlen);
    if (src->meta) snprintf(where, wlen, "%s[%s]", src->path, name);
    else snprintf(where, wlen, "%s/%s", src->dir, name);
    if (!text) return NULL;
    char perr[200];
    Json *j = json_parse(text, n, perr, sizeof perr);
    free(text);
    if (!j) snprintf(err, errlen, "%s: malformed JSON: %s", where, perr);
    return j;
}

int source_config(const ModelSource *src, Config *c, char *err, size_t errlen) {
    char where[4200];
    int absent;
    Json *j = read_json(src, "config.json", CFG_MAX_BYTES, &absent, where, sizeof where, err, errlen);
    if (!j && absent) snprintf(err, errlen, "%s: missing (every model has one)", where);
    if (!j) return -1;
    int rc = config_parse(c, j, where, err, errlen);
    json_free(j);
    return rc;
}

int source_generation(const ModelSource *src, Config *c, GenDefaults *g, char *err, size_t errlen) {
    char where[4200];
    int absent;
    memset(g, 0, sizeof *g);
    Json *j = read_json(src, "generation_config.json", CFG_MAX_BYTES, &absent, where, sizeof where, err, errlen);
    if (!j) return absent ? 0 : -1;
    int rc = config_parse_generation(c, g, j, where, err, errlen);
    json_free(j);
    return rc;
}

int source_tensors(const ModelSource *src, TensorStore *ts, char *err, size_t errlen) {
    if (src->meta) return st_open_file(ts, src->path, err, errlen);
    if (st_open_dir(ts, src->dir, err, errlen)) return -1;
    /* a checkpoint file named on its own stands for its folder, whose
     * weights are what loads: so it must be one of the files they come
     * from, not a file beside them that would go unread */
    struct stat named, st;
    if (strcmp(src->path, src->dir) == 0 || stat(src->path, &named) != 0) return 0;
    for (int i = 0; i < ts->n_files; i++)
        if (stat(ts->files[i].path, &st) == 0 && st.st_dev == named.st_dev && st.st_ino == named.st_ino) return 0;
    snprintf(err, errlen, "%s: expected one of its folder's checkpoint files (%s/model.safetensors or the shards "
             "its index names), found a file the folder's model does not read: name the folder, or a single-file "
             "model (./run FOLDER -m pack -o FILE)", src->path, src->dir);
    st_close(ts);
    return -1;
}
