/* server/toml.h: a TOML 1.0 decoder.
 *
 * toml_parse() decodes a whole document into a tree of toml_value_t nodes.  The tree is
 * read-only for callers: every accessor takes a const pointer and tolerates NULL (and a
 * node of the wrong type) by returning NULL / 0 / false, so lookups can be chained:
 *
 *   const toml_value_t *uv = toml_table_get(toml_table_get(root, "tool"), "uv");
 *
 * Tables keep their keys in insertion order (the order of first appearance in the
 * document), so a table can be passed on to another tool without reordering it.
 *
 * The decoder follows TOML 1.0.0 (https://toml.io/en/v1.0.0) and passes the toml-test
 * corpus for that version.  Implementation choices the spec leaves open:
 * - a leading UTF-8 byte order mark is skipped;
 * - CRLF inside multi-line strings is decoded as LF;
 * - seconds must be 00-59 (no leap seconds); fractional seconds beyond nanoseconds are
 *   truncated, as the spec asks;
 * - floats that overflow binary64 decode to +-inf, like Python's tomllib.
 */
#ifndef MPS_SERVER_TOML_H
#define MPS_SERVER_TOML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm.h"

/* Default limits.  Each is checked before the memory it guards is allocated; exceeding
 * one fails with CM_ERR_LIMIT. */
#define TOML_MAX_INPUT_BYTES ((size_t)1 << 20) /* document size */
#define TOML_MAX_DEPTH 64                      /* nesting of tables and arrays */
#define TOML_MAX_VALUES 100000                 /* table entries + array items, in total */

typedef enum toml_type {
  TOML_NONE = 0, /* returned for a NULL node only */
  TOML_STRING,
  TOML_INTEGER,
  TOML_FLOAT,
  TOML_BOOLEAN,
  TOML_OFFSET_DATETIME, /* 1979-05-27T07:32:00Z, 1979-05-27 07:32:00.5-07:00 */
  TOML_LOCAL_DATETIME,  /* 1979-05-27T07:32:00 */
  TOML_LOCAL_DATE,      /* 1979-05-27 */
  TOML_LOCAL_TIME,      /* 07:32:00.999 */
  TOML_ARRAY,
  TOML_TABLE,
} toml_type_t;

typedef struct toml_value toml_value_t;

typedef struct toml_options {
  size_t max_input_bytes; /* 0 = TOML_MAX_INPUT_BYTES */
  size_t max_depth;       /* 0 = TOML_MAX_DEPTH; the root table is depth 0; at most 1000 */
  size_t max_values;      /* 0 = TOML_MAX_VALUES */
  /* Where buf sits in a larger file, for error messages and toml_line(): the number of
   * buf's first line (0 = 1), and a number added to every column (e.g. 2 for content
   * that was un-commented by removing "# "). */
  size_t first_line;
  size_t column_offset;
} toml_options_t;

/* Decodes buf[0..len) (no terminator needed; NUL bytes are rejected like any other
 * control character).  options may be NULL for the defaults.  On success returns 0 and
 * stores the root table in *out (free it with toml_free()).  On failure returns -1,
 * leaves *out NULL and fills *err:
 *   CM_ERR_INVALID  malformed TOML; the message starts "line L, column C: " and says
 *                   what is wrong, e.g. `line 3, column 1: duplicate key "a"`;
 *   CM_ERR_LIMIT    the document exceeds one of the limits above. */
int toml_parse(const char *buf, size_t len, const toml_options_t *options, toml_value_t **out,
               cm_error_t *err);

/* Frees a whole tree (NULL is fine).  Only call it on a root returned by toml_parse(). */
void toml_free(toml_value_t *root);
/* Writes a table as TOML text that decodes to the same values: one `"key" = value` line per
 * entry, nested tables as inline tables (heap string).  Used to hand a script's [tool.uv]
 * table to uv as a configuration file. */
char *toml_write(const toml_value_t *table);
void toml_freep(toml_value_t **root);
#define cleanup_toml __attribute__((cleanup(toml_freep)))

/* ---------------------------------------------------------------- any node */

toml_type_t toml_type(const toml_value_t *v);
/* "string", "integer", "float", "boolean", "offset datetime", "local datetime",
 * "local date", "local time", "array", "table" (or "none"). */
const char *toml_type_name(toml_type_t type);
/* The line (numbered as in toml_options_t.first_line) where the value starts; for a
 * table, the line of the header, key or brace that created it.  0 for NULL. */
size_t toml_line(const toml_value_t *v);

/* ---------------------------------------------------------------- tables */

size_t toml_table_len(const toml_value_t *table);
/* The value under key (a C string), or NULL if absent or table is not a table. */
const toml_value_t *toml_table_get(const toml_value_t *table, const char *key);
/* Same for a key given as bytes (keys may contain NUL via "\u0000"). */
const toml_value_t *toml_table_getn(const toml_value_t *table, const char *key, size_t key_len);
/* The index-th entry in insertion order, or NULL if out of range.  key / key_len (each
 * may be NULL) receive the key: NUL-terminated, owned by the tree. */
const toml_value_t *toml_table_at(const toml_value_t *table, size_t index, const char **key,
                                  size_t *key_len);

/* ---------------------------------------------------------------- arrays */

size_t toml_array_len(const toml_value_t *array);
const toml_value_t *toml_array_at(const toml_value_t *array, size_t index);

/* ---------------------------------------------------------------- scalars */

/* The decoded string, NUL-terminated, owned by the tree; *len (if len is not NULL)
 * receives its length, which counts any embedded NUL.  NULL if v is not a string. */
const char *toml_string(const toml_value_t *v, size_t *len);
/* Each returns false (and leaves *out alone) if v is not of that type. */
bool toml_integer(const toml_value_t *v, int64_t *out);
bool toml_float(const toml_value_t *v, double *out);
bool toml_boolean(const toml_value_t *v, bool *out);

typedef struct toml_datetime {
  toml_type_t type;                     /* one of the four date/time types */
  int year, month, day;                 /* set for datetimes and dates */
  int hour, minute, second, nanosecond; /* set for datetimes and times */
  bool offset_z;                        /* offset written as Z/z */
  int offset_minutes;                   /* offset datetimes: east of UTC, -1439..1439 */
} toml_datetime_t;

bool toml_datetime(const toml_value_t *v, toml_datetime_t *out);
/* The normalised text of a date/time value, or NULL if v is not one: RFC 3339 with an
 * upper-case 'T' between date and time, fractional seconds as written (at most 9 digits),
 * and "Z" or "+HH:MM"/"-HH:MM" as written, e.g. "1979-05-27T07:32:00.5Z".  Owned by
 * the tree. */
const char *toml_datetime_text(const toml_value_t *v);

#endif
