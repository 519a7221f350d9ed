/* json.h: a small, strict JSON reader for config.json, tokenizer.json and
 * safetensors headers.
 *
 * Data flow: file bytes -> json_parse -> a tree of Json nodes that the
 * loaders walk with json_get / json_at. Every input is treated as hostile:
 * lengths are explicit (no NUL terminator needed), nesting depth is capped,
 * and every error names the byte offset where parsing stopped.
 *
 * Strings are decoded to UTF-8 (\uXXXX escapes, surrogate pairs joined) and
 * carry their length, so strings with embedded NULs survive. Objects keep
 * their keys in file order (tokenizer.json's vocab order is not relied on,
 * but error messages and index.json walks read better that way). RFC 8259.
 */
#ifndef JSON_H
#define JSON_H

#include <stddef.h>
#include <stdio.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct Json Json;
struct Json {
    JsonType type;
    int boolean;        /* JSON_BOOL */
    double number;      /* JSON_NUMBER */
    char *str;          /* JSON_STRING: UTF-8, NUL-terminated for convenience */
    size_t len;         /* JSON_STRING: byte length; ARRAY/OBJECT: element count */
    Json *items;        /* ARRAY/OBJECT: len elements */
    char **keys;        /* OBJECT: len keys (NUL-terminated UTF-8) */
    size_t *key_lens;   /* OBJECT: byte length of each key */
};

/* Parses n bytes. Returns NULL on error and writes one line to err. */
Json *json_parse(const char *text, size_t n, char *err, size_t errlen);
/* Reads and parses a whole file: a regular file of at most max bytes
 * (format/file.h); errors name the path. */
Json *json_parse_file(const char *path, size_t max, char *err, size_t errlen);
void json_free(Json *j);

/* Object member by key, the last one where a key repeats (as Python's json
 * reads it); NULL when absent or when o is not an object. */
const Json *json_get(const Json *o, const char *key);
/* Array element i, or NULL when out of range or not an array. */
const Json *json_at(const Json *a, size_t i);
/* Convenience: member as integer / number / string / bool. They return 1 when
 * the member exists with the right type (and, for ints, an exact integer value
 * within [lo, hi]), else 0 and leave *out untouched. */
int json_get_int(const Json *o, const char *key, long lo, long hi, long *out);
int json_get_num(const Json *o, const char *key, double *out);
int json_get_bool(const Json *o, const char *key, int *out);
const char *json_get_str(const Json *o, const char *key);
const char *json_type_name(JsonType t);
/* Writes s[0 .. n) to f as a JSON string literal: quotes, backslashes and
 * control characters escaped, other bytes as they are (so s must be UTF-8
 * for the result to be JSON). */
void json_write_str(FILE *f, const char *s, size_t n);

#endif
