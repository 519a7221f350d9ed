/* file.h: reading the files a model folder holds, which may be hostile.
 *
 * Data flow: every loader (config, tokenizer, safetensors) opens its files
 * here, so one place decides what a file must be before a byte is read:
 *   - a regular file (a FIFO would block forever, /dev/zero never ends, a
 *     directory or a socket cannot be read as data);
 *   - at most a cap of bytes, chosen per kind of file by the caller.
 * Opening uses O_NONBLOCK, so even opening a FIFO with no writer returns at
 * once and the type check after it (on the open descriptor: no race with a
 * rename) refuses it. Prompts (-f) may come from pipes: file_read_any reads
 * those too, still bounded by its cap.
 */
#ifndef FILE_H
#define FILE_H

#include <stddef.h>

/* Opens path read-only if it is a regular file of at most max bytes.
 * Returns the descriptor (blocking mode again) and its size in *size, or -1
 * with one line in err: "PATH: expected a regular file, found a FIFO". */
int file_open_regular(const char *path, size_t max, size_t *size, char *err, size_t errlen);

/* The whole of a regular file of at most max bytes, NUL-terminated (the NUL
 * not counted in *len). Returns a malloc'd buffer, or NULL with err. */
char *file_read(const char *path, size_t max, size_t *len, char *err, size_t errlen);

/* The same for any readable file (a pipe, /dev/stdin, a terminal): reads
 * until end of file, and refuses more than max bytes instead of growing. */
char *file_read_any(const char *path, size_t max, size_t *len, char *err, size_t errlen);

/* "a FIFO", "a directory", ... for a st_mode, for error lines. */
const char *file_kind(unsigned mode);

#endif
