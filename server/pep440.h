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
#ifndef MPS_SERVER_PEP440_H
#define MPS_SERVER_PEP440_H

#include "common/cm.h"

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

#endif
