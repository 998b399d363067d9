/* Files in and out of a run, and the artifact store that keeps what a run produced.
 *
 * In: the `files` argument of execute_python, checked (files_check_path), decoded and
 * written into the fresh work directory before the script starts (files_write_inputs),
 * never through a symlink.
 *
 * Out: after the run, whatever the script left under outputs/ is collected
 * (files_collect): regular files only, never following a symlink, never opening a FIFO or
 * a device, with caps on entries, bytes and depth.  Each collected file is copied into
 * the artifact store (<state>/runs/<run-id>/, 0700) and returned as MCP content: small
 * images inline (`image`), small UTF-8 texts embedded (`resource`), the rest as a
 * `resource_link` to sandbox://runs/<run-id>/<path> that resources/read serves until the
 * artifact's TTL expires.
 *
 * The pure functions (path checks, MIME sniffing, base64, URI escaping) take (buf, len)
 * and trust no terminator, so a fuzz target calls them directly.
 *
 * Files: inputs.c (files in), mime.c, base64.c, collect.c (outputs/), content.c (a
 * collection as a result), artifacts.c (the store, resources/list and resources/read).
 *
 * May use: server/config/ (the limits), common/. */
#ifndef MPS_SERVER_FILES_FILES_H
#define MPS_SERVER_FILES_FILES_H

#include <jansson.h>

#include "server/config/config.h"

/* Input paths: at most this many bytes, components and bytes per component. */
#define FILES_MAX_PATH_BYTES 1024
#define FILES_MAX_PATH_DEPTH 16
#define FILES_MAX_NAME_BYTES 255
/* The directory the script writes what it wants returned into, and how deep collection
 * descends below it. */
#define FILES_OUTPUTS_DIR "outputs"
#define FILES_MAX_OUTPUT_DEPTH 8
/* Inline content of one result, all files together: at most this many times
 * --max-inline-bytes (the rest become resource links). */
#define FILES_INLINE_TOTAL_FACTOR 4

/* ---------------------------------------------------------------- pure functions */

/* Checks a relative input path: valid UTF-8, no NUL or control character, no backslash,
 * not absolute, no empty, "." or ".." component, within the limits above, and not the
 * script itself ("script.py").  Returns the path as written (heap), or NULL with a
 * message a model can act on in err (CM_ERR_INVALID, or CM_ERR_LIMIT for the sizes). */
char *files_check_path(const char *path, size_t len, cm_error_t *err);

/* The MIME type of an image from its first bytes: "image/png", "image/jpeg", "image/gif",
 * "image/webp", "image/svg+xml" (UTF-8 text whose first element, after an optional BOM,
 * XML declaration, comments and doctype, is <svg>), or NULL.  Never trusts a name. */
const char *files_sniff_image(const void *head, size_t len);
/* The MIME type of a file: an image type from its bytes, else for text (is_text) one from
 * the name's extension (text/csv, application/json, ...; "text/plain" by default), else a
 * few binary formats from their bytes (PDF, ZIP, gzip), else application/octet-stream.
 * name may be NULL. */
const char *files_sniff_mime(const void *head, size_t len, const char *name, bool is_text);
/* Valid UTF-8 without NUL: what is returned as text. */
bool files_is_text(const void *buf, size_t len);

/* Standard base64 with padding (heap, NUL-terminated). */
char *files_base64_encode(const void *buf, size_t len, size_t *out_len);
/* Decodes standard base64 (padding optional, ASCII whitespace ignored).  Fails with
 * CM_ERR_INVALID on any other character or a bad length, and with CM_ERR_LIMIT (before
 * allocating) when the result would exceed max bytes.  *out is heap (NUL-terminated). */
int files_base64_decode(const char *in, size_t len, size_t max, char **out, size_t *out_len,
                        cm_error_t *err);

/* A relative path with every byte outside [A-Za-z0-9._~/-] percent-encoded (heap), for
 * the path part of a sandbox:// URI. */
char *files_uri_escape(const char *path, size_t len);

/* ---------------------------------------------------------------- inputs */

typedef struct files_input {
  char *path; /* checked by files_check_path */
  char *data;
  size_t len;
} files_input_t;

typedef struct files_inputs {
  files_input_t *v;
  size_t n;
} files_inputs_t;

/* Parses the `files` argument ([{path, content, encoding?}], encoding "utf-8" (default)
 * or "base64") within the server's limits.  NULL or JSON null is no files.  On failure
 * returns -1 with a message for a tool error in err. */
int files_inputs_parse(json_t *files, const srv_config_t *cfg, files_inputs_t *out,
                       cm_error_t *err);
void files_inputs_release(files_inputs_t *in);
/* Writes the inputs under the directory dirfd, creating parent directories (0755), files
 * 0644, never following a symlink and never replacing an existing entry. */
int files_write_inputs(int dirfd, const files_inputs_t *in, cm_error_t *err);
/* The same into a directory that already holds files another process writes (a session's
 * work directory, its kernel alive and hostile): a file of the same name is replaced (a new
 * file renamed over it, so a symlink there is replaced, never followed; a directory there
 * is an error), and what is made gets the owner of dirfd (the kernel's uid may write it). */
int files_write_inputs_over(int dirfd, const files_inputs_t *in, cm_error_t *err);

/* ---------------------------------------------------------------- outputs */

typedef enum files_how {
  FILES_SKIPPED = 0,
  FILES_IMAGE,         /* inline image content */
  FILES_RESOURCE,      /* embedded text resource */
  FILES_RESOURCE_LINK, /* resource_link, read with resources/read */
} files_how_t;

typedef struct files_output {
  char *path;       /* relative to the work directory ("outputs/plot.png"); valid UTF-8 */
  uint64_t size;    /* bytes (as copied; for skipped files as seen, or 0) */
  const char *mime; /* static; NULL for skipped entries that are not files */
  files_how_t how;
  char *reason; /* why it was skipped */
  char *data;   /* the bytes, when inlined */
  size_t len;
  char *stored; /* the artifact's file name in the run directory, or NULL */
  char *uri;    /* sandbox://runs/<id>/<path>, once stored */
  bool is_text;
} files_output_t;

typedef struct files_collect_limits {
  size_t max_entries;         /* entries listed (files, and skipped entries) */
  uint64_t max_bytes;         /* bytes copied into the store for this run */
  uint64_t inline_bytes;      /* largest image inlined */
  uint64_t inline_text_bytes; /* largest text embedded */
  uint64_t inline_total;      /* all inlined files together */
  unsigned max_depth;         /* directory levels below outputs/ */
} files_collect_limits_t;

typedef struct files_collection {
  files_output_t *v;
  size_t n, cap;
  uint64_t stored_bytes;
  size_t stored_files;
  char *note; /* why collection stopped early, or NULL */
} files_collection_t;

/* Collects the regular files under <workdir>/outputs/ (opened through workdir_fd) in name
 * order, copying each into dest_dir (created 0700 on the first copy; file names "0",
 * "1", ...).  Never follows a symlink, never opens anything but a regular file, stops at
 * the limits and says so.  Problems with single entries become skipped entries; only a
 * failure to create or write dest_dir is an error (what was collected so far stays). */
int files_collect(int workdir_fd, const char *dest_dir, const files_collect_limits_t *lim,
                  files_collection_t *out, cm_error_t *err);
void files_collection_release(files_collection_t *c);

/* Appends the collection to a tool result: one text line per file (or a summary) to text,
 * content blocks after the existing ones, and structuredContent.files. */
void files_result_append(const files_collection_t *c, cm_buf_t *text, json_t *content,
                         json_t *structured);

/* The JSON Schema of structuredContent.files (new reference). */
json_t *files_output_schema(void);

/* ---------------------------------------------------------------- the artifact store */

typedef struct art_store art_store_t;

/* Creates <state>/runs (0700) and removes run directories older than the TTL left by
 * earlier processes. */
art_store_t *art_store_new(cm_loop_t *loop, const srv_config_t *cfg, const char *state_dir,
                           cm_error_t *err);
/* Deletes this process's runs (their index dies with it) and frees the store. */
void art_store_free(art_store_t *s);

/* Collects a finished run's outputs/ into the store for principal (who ran it) and fills
 * out (see files_collect), within --max-artifact-bytes, --max-artifact-bytes-per-token and
 * --max-artifact-store-bytes (making room as the top of artifacts.c says; a note in out
 * says when older runs of the principal went for its cap).  Never fails: problems become
 * skipped entries or out->note. */
void art_store_collect(art_store_t *s, const char *principal, const char *workdir,
                       files_collection_t *out);
/* Files and bytes principal keeps in the store. */
void art_store_usage(art_store_t *s, const char *principal, size_t *files, uint64_t *bytes);

/* resources/list for principal: {resources:[...], nextCursor?}.  An unknown cursor fails
 * with CM_ERR_INVALID. */
int art_store_list(art_store_t *s, const char *principal, const char *cursor, json_t **result,
                   cm_error_t *err);
/* resources/read for principal: {contents:[{uri, mimeType, text|blob}]}.  An unknown or
 * expired URI, or one of another principal's, fails alike with CM_ERR_NOT_FOUND; a file
 * whose answer would be larger than max_answer bytes (0: no such bound) with CM_ERR_LIMIT,
 * before it is read. */
int art_store_read(art_store_t *s, const char *principal, const char *uri, size_t max_answer,
                   json_t **result, cm_error_t *err);
/* For a transport that serves artifacts itself (the HTTP download URL): opens the
 * artifact behind uri for principal read-only (*fd close-on-exec, the caller's), with its
 * type and size.  Unknown, expired or another principal's: CM_ERR_NOT_FOUND. */
int art_store_open(art_store_t *s, const char *principal, const char *uri, int *fd,
                   const char **mime, uint64_t *size, cm_error_t *err);
/* resources/templates/list: {resourceTemplates:[...]}. */
json_t *art_store_templates(void);
/* Number of live artifacts and their bytes. */
void art_store_stats(art_store_t *s, size_t *count, uint64_t *bytes);

#endif
