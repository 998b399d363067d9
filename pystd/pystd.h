/* pystd/: the Python packaging standards the server reads, and a JSON depth scanner.
 *
 * TOML 1.0 (the decoder of PEP 723 blocks and of sandbox profiles), PEP 723 inline script
 * metadata, PEP 508 dependency specifiers and markers, PEP 440 versions and specifiers, and
 * srv_json_depth (the nesting of a JSON text, checked before jansson parses it; its srv_
 * prefix is older than this room).  Pure parsers: each takes (buf, len), trusts no
 * terminator, caps every input-controlled size before allocating, and has a fuzz target.
 *
 * May use: common/ only. */
#ifndef MPS_PYSTD_PYSTD_H
#define MPS_PYSTD_PYSTD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm.h"

/* ================================================================ pep440 */

/* PEP 440: Python package versions and version specifiers.
 *
 * Parsers take (buf, len) and never read past len nor rely on a terminator.  On
 * malformed input they fail with CM_ERR_INVALID and a message that quotes a sanitised
 * excerpt of the input and points at the offending column, e.g.
 *   invalid version "1.0x": unexpected character 'x' at column 4
 * Inputs over the limits below fail with CM_ERR_LIMIT before anything is allocated.
 *
 * The semantics follow the PyPA "version specifiers" specification (and, where it is
 * silent, the behaviour of the `packaging` library that pip and uv agree with). */

/* ---------------------------------------------------------------- limits */

#define PEP440_MAX_VERSION_LEN 256    /* bytes of one version string */
#define PEP440_MAX_RELEASE_PARTS 32   /* numbers in a release segment (1.2.3 has 3) */
#define PEP440_MAX_CLAUSES 32         /* comma-separated clauses in a specifier set */
#define PEP440_MAX_SPECIFIER_LEN 4096 /* bytes of a specifier set given on its own */
/* Every number (epoch, release, pre, post, dev) must fit in a uint64_t; larger numbers
 * fail with CM_ERR_LIMIT. */

/* ---------------------------------------------------------------- versions */

typedef enum pep440_pre_kind {
  PEP440_PRE_NONE = 0,
  PEP440_PRE_A,  /* a, alpha */
  PEP440_PRE_B,  /* b, beta */
  PEP440_PRE_RC, /* rc, c, pre, preview */
} pep440_pre_kind_t;

/* A parsed version.  Owns `release` and `local`; release it with
 * pep440_version_release().  A zeroed struct (PEP440_VERSION_INIT) holds no version and
 * may be released. */
typedef struct pep440_version {
  uint64_t epoch;
  uint64_t *release; /* release_len >= 1 numbers, as written (trailing zeros kept) */
  size_t release_len;
  pep440_pre_kind_t pre_kind;
  uint64_t pre; /* meaningful when pre_kind != PEP440_PRE_NONE */
  bool has_post;
  uint64_t post;
  bool has_dev;
  uint64_t dev;
  /* Normalised local label without the '+' (lower case, '.'-separated, numeric
   * segments without leading zeros), or NULL. */
  char *local;
} pep440_version_t;

#define PEP440_VERSION_INIT \
  { 0 }

/* Parses and normalises a version: surrounding whitespace, a leading 'v', any case,
 * '-', '_' or '.' (or nothing) between segments, alpha->a, beta->b,
 * c/pre/preview->rc, rev/r->post, implicit post ("1.0-1" is 1.0.post1), implicit
 * numbers ("1.0a" is 1.0a0).  On success fills *out (which the caller releases); on
 * failure *out is left zeroed. */
int pep440_version_parse(const char *buf, size_t len, pep440_version_t *out, cm_error_t *err);
void pep440_version_release(pep440_version_t *v);
/* Deep copy into *out (which must not hold a version). */
void pep440_version_copy(pep440_version_t *out, const pep440_version_t *v);

/* The normalised form, e.g. "1!2.0rc1.post2.dev3+ubuntu.1".  Heap string. */
char *pep440_version_render(const pep440_version_t *v);
/* Parses buf and returns its normalised form in *out (heap string). */
int pep440_normalize(const char *buf, size_t len, char **out, cm_error_t *err);

/* Total order of PEP 440: epoch, then release (trailing zeros ignored, so 1.0 == 1),
 * then dev-only < pre-releases (a < b < rc) < final < post-releases, dev releases
 * before what they are dev releases of, and a version without a local label before
 * the same version with one (local labels compare segment by segment, numbers above
 * strings).  Returns <0, 0 or >0. */
int pep440_version_compare(const pep440_version_t *a, const pep440_version_t *b);
/* A pre-release has a pre or a dev segment. */
bool pep440_version_is_prerelease(const pep440_version_t *v);
bool pep440_version_is_postrelease(const pep440_version_t *v);

/* ---------------------------------------------------------------- specifiers */

typedef enum pep440_op {
  PEP440_OP_COMPATIBLE = 0, /* ~= */
  PEP440_OP_EQ,             /* == */
  PEP440_OP_NE,             /* != */
  PEP440_OP_LE,             /* <= */
  PEP440_OP_GE,             /* >= */
  PEP440_OP_LT,             /* < */
  PEP440_OP_GT,             /* > */
  PEP440_OP_ARBITRARY,      /* === */
} pep440_op_t;

/* "~=", "==", ... (static string). */
const char *pep440_op_string(pep440_op_t op);

/* One clause, e.g. ">=1.0" or "==1.2.*".  Owns version and text. */
typedef struct pep440_clause {
  pep440_op_t op;
  bool wildcard;            /* == or != with a trailing ".*"; version is the prefix */
  bool has_version;         /* false only for === whose text is not a PEP 440 version */
  pep440_version_t version; /* the parsed version (the prefix for wildcards) */
  char *text;               /* the version text as written, without the operator */
} pep440_clause_t;

/* A conjunction of clauses; an empty set matches every final release. */
typedef struct pep440_specifier_set {
  pep440_clause_t *clauses;
  size_t len;
} pep440_specifier_set_t;

/* Parses a comma-separated specifier set such as ">=3.9, <4" (whitespace around
 * clauses allowed; an empty or blank string gives the empty set).  Rules per operator:
 * a trailing ".*" only with == and != and only after a release segment ("==1.2.*");
 * a local label ("+abc") only with == and !=; ~= needs at least two release numbers.
 * === takes any text.  Limits: PEP440_MAX_SPECIFIER_LEN bytes and PEP440_MAX_CLAUSES
 * clauses (CM_ERR_LIMIT).  *out is a heap set for pep440_specifier_set_free(). */
int pep440_specifier_set_parse(const char *buf, size_t len, pep440_specifier_set_t **out,
                               cm_error_t *err);
void pep440_specifier_set_free(pep440_specifier_set_t *set);
/* Clauses in their written order with normalised versions, joined by ",", e.g.
 * ">=2.8.1,==2.8.*" ("" for the empty set).  Heap string. */
char *pep440_specifier_set_render(const pep440_specifier_set_t *set);

/* Does the version satisfy every clause?  Pre-releases (and dev releases) are
 * accepted when allow_prereleases is true; when false they are accepted only if one
 * of the set's inclusive clauses (==, ~=, <=, >=, ===) itself names a pre-release,
 * as in ">=1.0b1".  Per the specification: "<V" excludes pre-releases of V unless V
 * is one, ">V" excludes post-releases of V unless V is one and local versions of V;
 * "==V" without a local label ignores the candidate's local label, "==V.*" and
 * "~=V" match by prefix. */
bool pep440_specifier_contains(const pep440_specifier_set_t *set, const pep440_version_t *v,
                               bool allow_prereleases);

/* Could an interpreter of this version satisfy the set (e.g. a requires-python
 * value)?  python_version is "major.minor" or "major.minor.micro" (any PEP 440
 * version is accepted).  For "major.minor" the answer is true if at least one
 * "major.minor.N" satisfies the set, so ">=3.11.4" allows "3.11"; a fuller version
 * is tested as is, pre-releases allowed (an installed interpreter is what it is).
 * Fails only when python_version does not parse. */
int pep440_specifier_allows_python(const pep440_specifier_set_t *set, const char *python_version,
                                   size_t len, bool *out, cm_error_t *err);

/* ---------------------------------------------------------------- single clauses */

/* Builds the clause "<op><buf>", applying the per-operator rules above (buf is the
 * version text without the operator).  err may be NULL.  Release with
 * pep440_clause_release(). */
int pep440_clause_init(pep440_clause_t *out, pep440_op_t op, const char *buf, size_t len,
                       cm_error_t *err);
void pep440_clause_release(pep440_clause_t *c);
/* As pep440_specifier_contains() for a set holding only this clause. */
bool pep440_clause_contains(const pep440_clause_t *c, const pep440_version_t *v,
                            bool allow_prereleases);

/* ---------------------------------------------------------------- for embedding parsers */

/* Used by the PEP 508 parser, which embeds specifier sets in a larger string.
 *
 * Parses `clause (wsp* ',' wsp* clause)*` (wsp = space or tab) starting at *pos in
 * buf[0, len), leading spaces allowed; at least one clause is required.  A clause's
 * version is the longest run of letters, digits and "-_.*+!".  Stops after the last
 * clause (before any trailing blanks) and sets *pos there.  Errors name `what` and
 * count columns in the whole buf, e.g. `invalid requirement "foo>=": expected a
 * version after ">=" at column 6`. */
int pep440_specifier_set_parse_at(const char *buf, size_t len, size_t *pos, const char *what,
                                  pep440_specifier_set_t **out, cm_error_t *err);

/* Sets *err to `invalid <what> "<excerpt of buf>": <reason> at column <offset + 1>`
 * for CM_ERR_INVALID, or `<what> "<excerpt>": <reason>` for other kinds; the excerpt
 * is shortened and escapes quotes, backslashes and non-printable bytes.  Returns -1.
 * err may be NULL. */
int pep440_error_at(cm_error_t *err, cm_error_kind_t kind, const char *what, const char *buf,
                    size_t len, size_t offset, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* ================================================================ pep508 */

/* PEP 508: dependency specifiers ("requests[socks]>=2.8; python_version < '3.12'"),
 * environment markers, and the merge rule for a script's dependency list.
 *
 * Parsers take (buf, len) and never read past len nor rely on a terminator.  Malformed
 * input fails with CM_ERR_INVALID and a message quoting the input and pointing at the
 * column, e.g. `invalid requirement "foo>=": expected a version after ">=" at column 6`.
 * Inputs over the limits below fail with CM_ERR_LIMIT before anything is allocated.
 * Versions and specifiers are PEP 440 (above). */

/* ---------------------------------------------------------------- limits */

#define PEP508_MAX_REQUIREMENT_LEN 4096 /* bytes of one requirement (or marker) string */
#define PEP508_MAX_EXTRAS 64            /* names inside [...] */
#define PEP508_MAX_MARKER_DEPTH 32      /* nested parentheses in a marker */
#define PEP508_MAX_DEPENDENCIES 1024    /* entries given to pep508_merge_dependencies() */
/* Version clauses: PEP440_MAX_CLAUSES. */

/* ---------------------------------------------------------------- names */

/* Is buf a valid distribution (or extra) name: ASCII letters and digits, with '.', '-'
 * or '_' inside, starting and ending with a letter or digit? */
bool pep508_name_is_valid(const char *buf, size_t len);
/* PEP 503 normalisation: lower case, each run of '-', '_' and '.' becomes one '-'.
 * Does not validate.  Heap string. */
char *pep508_normalize_name(const char *buf, size_t len);

/* ---------------------------------------------------------------- markers */

typedef enum pep508_var {
  PEP508_VAR_IMPLEMENTATION_NAME = 0,
  PEP508_VAR_IMPLEMENTATION_VERSION,
  PEP508_VAR_OS_NAME,
  PEP508_VAR_PLATFORM_MACHINE,
  PEP508_VAR_PLATFORM_PYTHON_IMPLEMENTATION,
  PEP508_VAR_PLATFORM_RELEASE,
  PEP508_VAR_PLATFORM_SYSTEM,
  PEP508_VAR_PLATFORM_VERSION,
  PEP508_VAR_PYTHON_FULL_VERSION,
  PEP508_VAR_PYTHON_VERSION,
  PEP508_VAR_SYS_PLATFORM,
  PEP508_VAR_EXTRA,
} pep508_var_t;

/* The marker variable's name, e.g. "python_version" (static string). */
const char *pep508_var_name(pep508_var_t var);

/* The values markers are evaluated against.  NULL fields count as "".  Strings are
 * borrowed.  `extra` is the extra being installed, if any (compared normalised). */
typedef struct pep508_env {
  const char *implementation_name;            /* "cpython" */
  const char *implementation_version;         /* "3.12.1" */
  const char *os_name;                        /* "posix" */
  const char *platform_machine;               /* "x86_64" */
  const char *platform_python_implementation; /* "CPython" */
  const char *platform_release;               /* "6.1.0-18-amd64" */
  const char *platform_system;                /* "Linux" */
  const char *platform_version;               /* "#1 SMP PREEMPT_DYNAMIC ..." */
  const char *python_full_version;            /* "3.12.1" */
  const char *python_version;                 /* "3.12" */
  const char *sys_platform;                   /* "linux" */
  const char *extra;                          /* "" */
} pep508_env_t;

typedef enum pep508_marker_op {
  PEP508_OP_LT = 0,     /* < */
  PEP508_OP_LE,         /* <= */
  PEP508_OP_NE,         /* != */
  PEP508_OP_EQ,         /* == */
  PEP508_OP_GE,         /* >= */
  PEP508_OP_GT,         /* > */
  PEP508_OP_COMPATIBLE, /* ~= */
  PEP508_OP_ARBITRARY,  /* === */
  PEP508_OP_IN,         /* in */
  PEP508_OP_NOT_IN,     /* not in */
} pep508_marker_op_t;

/* "<", "not in", ... (static string). */
const char *pep508_marker_op_string(pep508_marker_op_t op);

/* One side of a comparison: a variable or a string literal. */
typedef struct pep508_marker_value {
  bool is_var;
  pep508_var_t var; /* when is_var */
  char *str;        /* when !is_var: the literal (owned); normalised if compared to extra */
} pep508_marker_value_t;

typedef enum pep508_marker_kind {
  PEP508_MARKER_COMPARE = 0,
  PEP508_MARKER_AND,
  PEP508_MARKER_OR,
} pep508_marker_kind_t;

/* A marker expression tree.  `and` binds tighter than `or`; a chain "a and b and c" is
 * one AND node with three children.  Parentheses leave no node of their own. */
typedef struct pep508_marker {
  pep508_marker_kind_t kind;
  /* PEP508_MARKER_AND / OR: two or more children, owned. */
  struct pep508_marker **children;
  size_t nchildren;
  /* PEP508_MARKER_COMPARE */
  pep508_marker_op_t op;
  pep508_marker_value_t lhs, rhs;
} pep508_marker_t;

/* Parses a marker such as `python_version >= "3.8" and (os_name == 'posix' or extra ==
 * "test")`.  Legacy spellings (os.name, sys.platform, platform.machine,
 * platform.version, platform.python_implementation, python_implementation) are
 * accepted and stored as the standard variables.  A ~= against a literal must name a
 * valid ~= version.  Limits: PEP508_MAX_REQUIREMENT_LEN bytes, PEP508_MAX_MARKER_DEPTH
 * levels of parentheses.  *out is freed with pep508_marker_free(). */
int pep508_marker_parse(const char *buf, size_t len, pep508_marker_t **out, cm_error_t *err);
void pep508_marker_free(pep508_marker_t *marker);
/* Canonical text: single spaces around operators, double quotes (single quotes when
 * the literal holds a double quote), parentheses only where needed.  Heap string. */
char *pep508_marker_render(const pep508_marker_t *marker);

/* Evaluates the marker (NULL is true).  Comparisons use PEP 440 when the right side
 * forms a valid specifier with the operator and the left side is a version
 * (pre-releases allowed); otherwise <, <=, ==, !=, >=, > compare the strings
 * bytewise, === compares them case-insensitively, "in" / "not in" test for a
 * substring of the right side, and ~= is false.  Comparisons with `extra` compare
 * normalised names.  Total: never fails. */
bool pep508_marker_evaluate(const pep508_marker_t *marker, const pep508_env_t *env);

/* ---------------------------------------------------------------- requirements */

typedef struct pep508_requirement {
  char *name;            /* as written */
  char *normalized_name; /* PEP 503 */
  /* Normalised extras, sorted, without duplicates; NULL-terminated (never NULL). */
  char **extras;
  size_t extras_len;
  pep440_specifier_set_t *specifiers; /* never NULL; empty for none (or with a URL) */
  char *url;                          /* "name @ URL" form, else NULL */
  pep508_marker_t *marker;            /* after ';', else NULL */
} pep508_requirement_t;

/* Parses one dependency specifier: `name [extras] (versionspec | @ URL) [; marker]`,
 * with or without parentheses around the version specifier.  A URL must look like
 * scheme://... and hold printable ASCII only (no whitespace, quotes, <>\^`{|});
 * a marker after a URL needs whitespace before its ';'.  Limits:
 * PEP508_MAX_REQUIREMENT_LEN bytes, PEP508_MAX_EXTRAS extras, PEP440_MAX_CLAUSES
 * clauses, PEP508_MAX_MARKER_DEPTH.  *out is freed with pep508_requirement_free(). */
int pep508_requirement_parse(const char *buf, size_t len, pep508_requirement_t **out,
                             cm_error_t *err);
void pep508_requirement_free(pep508_requirement_t *req);
/* Canonical text: normalised name, sorted normalised extras, clauses with normalised
 * versions in written order, e.g. `requests[security,socks]>=2.8.1,==2.8.*;
 * python_version < "2.7"` or `name @ https://example.com/x.whl ; os_name == "posix"`.
 * It parses back to an equivalent requirement.  Heap string. */
char *pep508_requirement_render(const pep508_requirement_t *req);

/* ---------------------------------------------------------------- merging */

/* Merges a script's dependencies with extra ones: existing then extra, de-duplicated by
 * normalised name, where the last entry for a name wins but takes the position of the
 * first.  ["requests>=2.28", "Requests_X", "requests>=2.30"] gives
 * ["requests>=2.30", "Requests_X"].  Entries are copied as written, not re-rendered.
 * Either array may be NULL when its count is 0.  Fails (CM_ERR_INVALID, naming the
 * entry) if an entry does not parse, CM_ERR_LIMIT for more than PEP508_MAX_DEPENDENCIES
 * entries in total.  *out is a NULL-terminated vector for cm_strv_free(). */
int pep508_merge_dependencies(const char *const *existing, size_t existing_len,
                              const char *const *extra, size_t extra_len, char ***out,
                              cm_error_t *err);

/* ================================================================ toml */

/* A TOML 1.0 decoder.
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

/* ================================================================ pep723 */

/* PEP 723 inline script metadata (`# /// script` blocks).
 *
 * Blocks are found as the specification describes them
 * (https://packaging.python.org/specifications/inline-script-metadata/): an opening line
 * that is exactly "# /// TYPE" (TYPE: ASCII letters, digits, '-'), content lines that are
 * "#" alone or "#" + " " + text, and a closing line that is exactly "# ///".  The block
 * closes at the last "# ///" line before the first line that is not a content line (so
 * "# ///" may appear inside the content), which is what the reference regular expression
 *   (?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$
 * matches.  Blocks may be anywhere in the file; a block of another TYPE is skipped whole
 * (a "# /// script" line inside it is its content, not an opening).
 *
 * Where this deliberately differs from the regex or the text:
 * - CRLF line endings are accepted: a '\r' before '\n' ends the line, it is not content.
 *   Lines end only at '\n' (the reference implementation's splitlines() also splits the
 *   content at other characters such as U+2028; we do not).
 * - An empty block ("# /// script" directly followed by "# ///") is accepted and has
 *   empty content (the text allows it; the regex needs one content line).
 * - A "# /// script" line with no closing line is an error naming its line, where the
 *   specification says to ignore an unclosed block: silently running a script without
 *   the dependencies its author declared only fails later and less clearly.  A line
 *   such as "#x" (no space after '#') is not a content line, so it ends the block: if
 *   no "# ///" came before it, the block is unclosed.
 * - Two "script" blocks are an error (the specification requires one).
 *
 * The script itself is never modified. */

/* More entries in `dependencies` fail with CM_ERR_LIMIT. */
#define PEP723_MAX_DEPENDENCIES 1000

typedef struct pep723_block {
  char *content;      /* un-commented TOML with "\n" line endings, NUL-terminated, owned */
  size_t content_len; /* bytes in content, without the NUL */
  size_t first_line;  /* the "# /// script" line, 1-based */
  size_t last_line;   /* the closing "# ///" line */
} pep723_block_t;

/* Finds the script block in buf[0..len) (no terminator needed).  Returns 1 and fills
 * *block (release it with pep723_block_release()) if there is one, 0 and zeroes *block
 * if there is none, or -1 with CM_ERR_INVALID for two script blocks or an unclosed one
 * (the message names the lines). */
int pep723_extract(const char *buf, size_t len, pep723_block_t *block, cm_error_t *err);
void pep723_block_release(pep723_block_t *block);

typedef struct pep723_metadata {
  bool present;      /* a script block was found (even an empty one) */
  size_t first_line; /* lines of the block, 0 when absent */
  size_t last_line;
  char **dependencies; /* NULL-terminated vector of heap strings; NULL when the
                        * block has no `dependencies` key, empty when it is [] */
  size_t n_dependencies;
  char *requires_python;    /* heap string, or NULL when absent */
  toml_value_t *document;   /* the whole decoded block (owned), NULL when absent; it
                             * keeps any other keys for later use */
  const toml_value_t *tool; /* the `tool` table inside document, or NULL */
} pep723_metadata_t;

/* Extracts the script block, decodes it as TOML and checks the fields PEP 723 defines:
 * `dependencies` must be an array of strings, `requires-python` a string, `tool` a
 * table; neither string may contain NUL.  Other keys are kept in document and not
 * checked.  No block is not an error: *meta is then empty (present == false).
 * Returns 0, or -1 with *meta empty and *err set:
 *   CM_ERR_INVALID  block structure ("script metadata (line 12): ..."), malformed TOML
 *                   ("malformed TOML in script metadata: line 4, column 7: ..."; lines
 *                   and columns are those of the script), or a bad field
 *                   ("script metadata (line 3): dependencies must be an array of strings");
 *   CM_ERR_LIMIT    the TOML limits (toml.h) or PEP723_MAX_DEPENDENCIES. */
int pep723_parse_metadata(const char *buf, size_t len, pep723_metadata_t *meta, cm_error_t *err);
void pep723_metadata_release(pep723_metadata_t *meta);

/* ================================================================ jsonscan */

/* Returns the deepest nesting of arrays/objects in buf (strings are skipped, escapes
 * honoured), stopping early once it exceeds max_depth (then returns max_depth + 1).
 * Does not validate the JSON; jansson does that afterwards.  Never reads past len. */
int srv_json_depth(const char *buf, size_t len, int max_depth);

#endif
