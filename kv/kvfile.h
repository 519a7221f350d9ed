/* kvfile.h: a saved run of a KV cache's positions, on disk.
 *
 * Data flow: kv_cache_save hands out the stored form of positions
 * [t0, t1) (kv.h); kvfile_write puts it in a file with what it belongs to,
 * kvfile_read checks a file and hands the bytes back for kv_cache_load.
 * The server's prefix chunks spilled to --cache-dir (kv/prefix.c) and
 * chat sessions (run.c, -m chat --session) are such files.
 *
 *   | magic "RUNKVC\0\0" | u32 version | u32 parts | u64 model | char spec[64] |
 *   | u32 t0 | u32 t1 | u64 key[2] | u64 part bytes [parts] | u64 check |
 *   | i32 tokens [t1 - t0] | part 0 | part 1 | ...
 *
 * Little-endian, as the machines that write and read them. model is
 * model_identity (the config, the tensor table and the kernels: a file
 * from another model or build is refused); spec the cache's scheme
 * (kv_spec_name); key what a prefix chunk is found by (0 for a session);
 * check a hash of everything before it and after it, so that a truncated
 * or damaged file is refused, never loaded. A file is written to a
 * temporary name beside it, flushed to the disk, then renamed over the
 * old one: a reader sees the old file or the new one, whole.
 */
#ifndef KVFILE_H
#define KVFILE_H

#include <stddef.h>
#include <stdint.h>

#define KVFILE_VERSION 1
#define KVFILE_MAX_PARTS 8
/* A file claiming more tokens than this is not one of ours. */
#define KVFILE_MAX_TOKENS (1 << 24)

typedef struct {
    uint64_t model;
    char spec[64];
    int t0, t1;
    uint64_t key[2];
} KVFileHead;

/* A 64-bit hash of n bytes (not cryptographic: it finds damage and keys
 * chunks, where a 128-bit pair of these keeps collisions out of reach). */
uint64_t kv_hash64(const void *p, size_t n, uint64_t seed);

/* Writes path atomically: tokens [t1 - t0], then n_parts parts. 0 ok, -1
 * with one line in err naming the file (a full disk, no permission), the
 * old file, if any, untouched. */
int kvfile_write(const char *path, const KVFileHead *h, const int *tokens, int n_parts, const void *const *parts,
                 const size_t *sizes, char *err, size_t errlen);
/* Reads path whole and checks it (magic, version, sizes against the
 * file's, the hash). 0 ok with *tokens [h->t1 - h->t0] and parts[i] of
 * sizes[i] bytes, i < *n_parts, malloc'd; the caller checks h against
 * what it expects. -1 with one line in err naming the file and what was
 * wrong (absent, truncated, damaged, not ours), nothing allocated. */
int kvfile_read(const char *path, KVFileHead *h, int **tokens, int max_parts, void **parts, size_t *sizes,
                int *n_parts, char *err, size_t errlen);
/* The checks of kvfile_read on a file's bytes b [size] (name for the
 * error line), and the same copies out: the fuzzer's way in. */
int kvfile_parse(const uint8_t *b, size_t size, const char *name, KVFileHead *h, int **tokens, int max_parts,
                 void **parts, size_t *sizes, int *n_parts, char *err, size_t errlen);

#endif
