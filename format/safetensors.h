/* safetensors.h: mmap'd, validated access to a checkpoint's tensors.
 *
 * Data flow: model/ opens a model directory here, then asks for each tensor
 * by name; the data pointer points into the mapping (weights are used in
 * place, or in one copy per file: st_to_memory), except for tensors whose
 * bytes are not aligned to their element size, which are copied once so
 * that 16/32-bit loads stay legal C.
 *
 * File format (https://github.com/huggingface/safetensors):
 *   | u64 LE header length N | N bytes of JSON header | data ... |
 *   header: { name: {dtype, shape, data_offsets [begin, end)}, "__metadata__": {...} }
 *   offsets are relative to the start of the data section.
 * A directory holds model.safetensors, or shards listed by
 * model.safetensors.index.json ({"weight_map": {tensor: file}}).
 * Everything is checked before use: header length within the file, offsets
 * within the data section, sizes equal to shape x dtype size, no two tensors
 * overlapping, no duplicate names, shards named by the index present.
 * "__metadata__" must map strings to strings (the format's rule); a
 * single-file model (model/source.h) keeps its JSON files there.
 */
#ifndef SAFETENSORS_H
#define SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

typedef struct {
    char *name;
    char dtype[16];  /* as written: "BF16", "F16", "F32", "I8", ... */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
    int file;        /* index into TensorStore.files */
} STensor;

typedef struct {
    char *path;
    void *map;      /* the file's bytes: its mapping, or a copy (st_to_memory) */
    size_t size;
    void *region;   /* the copy's anonymous mapping, NULL while map is the file's */
    size_t region_len;
    struct Json *meta; /* the header's "__metadata__" object (string values), or NULL */
} STFile;

typedef struct {
    STFile *files;
    int n_files;
    STensor *tensors;
    int n_tensors;
    void **copies;   /* aligned copies of unaligned tensors, freed on close */
    int n_copies;
    int *buckets;    /* name hash table: tensor index or -1 */
    size_t n_buckets;
} TensorStore;

/* Opens dir/model.safetensors or the shards of dir/model.safetensors.index.json.
 * 0 ok; -1 with one line in err naming the file and what was wrong. */
int st_open_dir(TensorStore *ts, const char *dir, char *err, size_t errlen);
/* Opens a single .safetensors file. */
int st_open_file(TensorStore *ts, const char *path, char *err, size_t errlen);
/* Reads only the header of the safetensors file at path and hands over
 * its "__metadata__" object in *meta (NULL when it has none; json_free it).
 * 0 ok; -1 with one line in err (not a regular file, not safetensors). */
int st_read_metadata(const char *path, struct Json **meta, char *err, size_t errlen);
/* Moves every file's bytes into anonymous memory that asks for transparent
 * huge pages (2 MB; madvise) and drops the file mappings; tensor pointers
 * follow. Decode streams all weights once per token, and with 4 KB pages
 * every 4 KB of them costs a TLB miss, so the copy makes the matmuls of a
 * decoded token faster (docs/kernel-notes.md#huge-pages). Files stay
 * mapped when together they exceed half the physical memory, or when the
 * memory cannot be had. Returns how many files are now copies. */
int st_to_memory(TensorStore *ts);
/* Whether the n bytes at p lie in a copy st_to_memory made, which the
 * loader may rewrite (relay weights) between st_copies_writable(ts, 1)
 * and st_copies_writable(ts, 0); copies are read-only otherwise.
 * st_copies_writable returns 0, or -1 when the protection of a copy could
 * not be changed. */
int st_in_copy(const TensorStore *ts, const void *p, size_t n);
int st_copies_writable(TensorStore *ts, int writable);
const STensor *st_find(const TensorStore *ts, const char *name);
/* The string the first file's "__metadata__" holds under key (len bytes,
 * NUL-terminated), or NULL. */
const char *st_metadata(const TensorStore *ts, const char *key, size_t *len);
void st_close(TensorStore *ts);

/* Writes one safetensors file holding every tensor of ts (largest
 * elements first: 8-byte types, then F32 and the other 4-byte ones, then
 * the 2-byte types, then the rest, so each tensor stays aligned to its
 * element size) and n_meta string pairs in "__metadata__" (values must be
 * UTF-8). Written to path.tmp, then renamed: a failed write leaves no file.
 * 0 ok, -1 with one line in err. */
int st_write(const char *path, const TensorStore *ts, const char *const *keys, const char *const *vals,
             const size_t *val_lens, int n_meta, char *err, size_t errlen);

#endif
