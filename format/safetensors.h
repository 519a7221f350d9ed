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
/* Opens a single .safetensors file (used by tests and tools). */
int st_open_file(TensorStore *ts, const char *path, char *err, size_t errlen);
/* Moves every file's bytes into anonymous memory that asks for transparent
 * huge pages (2 MB; madvise) and drops the file mappings; tensor pointers
 * follow. Decode streams all weights once per token, and with 4 KB pages
 * every 4 KB of them costs a TLB miss: on a 1.2 GB checkpoint the copy made
 * the matmuls of a decoded token 6-9% faster. Files stay mapped when
 * together they exceed half the physical memory, or when the memory cannot
 * be had. Returns how many files are now copies. */
int st_to_memory(TensorStore *ts);
/* Whether the n bytes at p lie in a copy st_to_memory made, which the
 * loader may rewrite (relay weights) between st_copies_writable(ts, 1)
 * and st_copies_writable(ts, 0); copies are read-only otherwise.
 * st_copies_writable returns 0, or -1 when the protection of a copy could
 * not be changed. */
int st_in_copy(const TensorStore *ts, const void *p, size_t n);
int st_copies_writable(TensorStore *ts, int writable);
const STensor *st_find(const TensorStore *ts, const char *name);
void st_close(TensorStore *ts);

#endif
