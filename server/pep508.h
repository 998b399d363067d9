/* PEP 508: dependency specifiers ("requests[socks]>=2.8; python_version < '3.12'"),
 * environment markers, and the merge rule for a script's dependency list.
 *
 * Parsers take (buf, len) and never read past len nor rely on a terminator.  Malformed
 * input fails with CM_ERR_INVALID and a message quoting the input and pointing at the
 * column, e.g. `invalid requirement "foo>=": expected a version after ">=" at column 6`.
 * Inputs over the limits below fail with CM_ERR_LIMIT before anything is allocated.
 * Versions and specifiers are PEP 440 (server/pep440.h). */
#ifndef MPS_SERVER_PEP508_H
#define MPS_SERVER_PEP508_H

#include "common/cm.h"
#include "server/pep440.h"

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

#endif
