/* The artifact store: what runs left in outputs/, kept under <state>/runs/<run-id>/ (0700,
 * the server's) for --artifact-ttl seconds and served by resources/list and
 * resources/read as sandbox://runs/<run-id>/<path>.
 *
 * The index lives in memory: a run directory is only reachable through the process that
 * made it.  Every run has the same TTL, so creation order is expiry order and one timer,
 * set for the oldest run, expires them.  Every run belongs to a principal (the bearer
 * token's name, "local" or "stdio"): resources/list shows a principal only its own runs,
 * and resources/read and the download URL find a run only for its principal (another's
 * URI is not found, like one that never existed).  Run ids are 128 random bits on top.
 *
 * Bytes are shared out: a principal keeps at most --max-artifact-bytes-per-token (its own
 * oldest runs go first), and beyond --max-artifact-store-bytes runs go from the principal
 * holding the most, oldest first: the one most over its share.  The run just collected is
 * never dropped; a file being downloaded keeps its open fd when its run goes.  Directories
 * of earlier processes (a crash, another server sharing the state directory) are removed
 * once they are older than the TTL, at start-up and whenever the timer fires. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "server/files/files.h"

#define ART_URI_PREFIX "sandbox://runs/"
#define ART_ID_BYTES 16
/* The longest run id and its NUL: a route, a dot, the hex. */
#define ART_ID_MAX (SRV_ROUTE_MAX + 1 + 2 * ART_ID_BYTES + 1)
#define ART_PAGE_SIZE 100
/* resources/read refuses (as not found) artifacts larger than this in one message. */
#define ART_READ_MAX (256ull << 20)

typedef struct art_file {
  char *uri;
  char *path; /* relative to the run's work directory */
  char *host; /* the copy */
  const char *mime;
  uint64_t size;
  bool is_text;
} art_file_t;

typedef struct art_run {
  char id[ART_ID_MAX]; /* [<route>.]<hex> (--route), also its directory's name */
  char *dir;
  char *principal;
  uint64_t expires_ms; /* cm_now_ms() */
  art_file_t *files;
  size_t n_files;
  uint64_t bytes;
  struct art_run *next;
} art_run_t;

struct art_store {
  cm_loop_t *loop;
  const srv_config_t *cfg;
  char *runs_dir;
  art_run_t *head, *tail; /* oldest first */
  size_t n_files;
  uint64_t bytes;
  cm_timer_t *timer;
  uint64_t timer_at;
  uint64_t orphans_at; /* cm_now_ms() when the next foreign directory expires, or 0 */
};

static void run_free(art_run_t *r) {
  for (size_t i = 0; i < r->n_files; i++) {
    free(r->files[i].uri);
    free(r->files[i].path);
    free(r->files[i].host);
  }
  free(r->files);
  free(r->dir);
  free(r->principal);
  free(r);
}

/* Removes a run's directory and index entry; prev is the run before it (NULL: the head). */
static void drop_run(art_store_t *s, art_run_t *prev, art_run_t *r) {
  if (prev)
    prev->next = r->next;
  else
    s->head = r->next;
  if (s->tail == r) s->tail = prev;
  s->n_files -= r->n_files;
  s->bytes -= r->bytes;
  cm_error_t err = CM_ERROR_INIT;
  if (cm_rm_rf(r->dir, &err) < 0) cm_warn("removing artifacts: %s", cm_error_message(&err));
  cm_error_release(&err);
  run_free(r);
}

static void drop_head(art_store_t *s) {
  drop_run(s, NULL, s->head);
}

static uint64_t principal_bytes(const art_store_t *s, const char *principal, size_t *files) {
  uint64_t n = 0;
  if (files) *files = 0;
  for (const art_run_t *r = s->head; r; r = r->next) {
    if (strcmp(r->principal, principal) != 0) continue;
    n += r->bytes;
    if (files) *files += r->n_files;
  }
  return n;
}

/* Drops the oldest run of principal (never `keep`); false if it has no other. */
static bool drop_oldest_of(art_store_t *s, const char *principal, const art_run_t *keep) {
  art_run_t *prev = NULL;
  for (art_run_t *r = s->head; r; prev = r, r = r->next) {
    if (r == keep || strcmp(r->principal, principal) != 0) continue;
    drop_run(s, prev, r);
    return true;
  }
  return false;
}

/* Over the store's cap: the oldest run of the principal holding the most bytes goes, `keep`
 * (the run just collected) counted with its principal but never dropped.  False when that
 * principal has nothing but `keep`: then the store stays over its cap by that one run (at
 * most --max-artifact-bytes) rather than take from a principal who holds less; the next
 * collection takes from it first. */
static bool drop_fairly(art_store_t *s, const art_run_t *keep) {
  const char *victim = NULL;
  uint64_t most = 0;
  for (const art_run_t *r = s->head; r; r = r->next) {
    if (victim && strcmp(r->principal, victim) == 0) continue;
    uint64_t b = principal_bytes(s, r->principal, NULL);
    if (!victim || b > most) {
      victim = r->principal;
      most = b;
    }
  }
  return victim && drop_oldest_of(s, victim, keep);
}

/* "<hex>" or "<route>.<hex>" (the run directories of a replica started with --route). */
static bool is_run_id(const char *name) {
  const char *dot = strchr(name, '.');
  if (dot) {
    if (dot == name || dot - name > SRV_ROUTE_MAX) return false;
    for (const char *p = name; p < dot; p++)
      if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z'))) return false;
    name = dot + 1;
  }
  if (strlen(name) != 2 * ART_ID_BYTES) return false;
  for (const char *p = name; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return false;
  return true;
}

static bool is_ours(art_store_t *s, const char *id) {
  for (art_run_t *r = s->head; r; r = r->next)
    if (strcmp(r->id, id) == 0) return true;
  return false;
}

/* Removes run directories of other processes older than the TTL; remembers when the next
 * one expires. */
static void sweep_orphans(art_store_t *s) {
  s->orphans_at = 0;
  DIR *d = opendir(s->runs_dir);
  if (!d) return;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  uint64_t ttl_s = (s->cfg->artifact_ttl_ms + 999) / 1000;
  uint64_t next_s = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!is_run_id(e->d_name) || is_ours(s, e->d_name)) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    uint64_t expires = (uint64_t)st.st_mtime + ttl_s;
    if (expires <= (uint64_t)now.tv_sec) {
      cleanup_free char *path = xasprintf("%s/%s", s->runs_dir, e->d_name);
      cm_error_t err = CM_ERROR_INIT;
      if (cm_rm_rf(path, &err) < 0) cm_warn("removing old artifacts: %s", cm_error_message(&err));
      cm_error_release(&err);
    } else if (!next_s || expires < next_s) {
      next_s = expires;
    }
  }
  closedir(d);
  if (next_s) s->orphans_at = cm_now_ms() + (next_s - (uint64_t)now.tv_sec) * 1000 + 1000;
}

static void schedule(art_store_t *s);

static void expire(art_store_t *s) {
  uint64_t now = cm_now_ms();
  while (s->head && s->head->expires_ms <= now) drop_head(s);
  if (s->orphans_at && s->orphans_at <= now) sweep_orphans(s);
}

static void on_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  art_store_t *s = data;
  s->timer = NULL;
  expire(s);
  schedule(s);
}

/* Keeps one timer set for the earliest of the oldest run's expiry and the next foreign
 * directory's. */
static void schedule(art_store_t *s) {
  uint64_t at = s->head ? s->head->expires_ms : 0;
  if (s->orphans_at && (!at || s->orphans_at < at)) at = s->orphans_at;
  if (s->timer && s->timer_at == at) return;
  cm_timer_cancel(s->timer);
  s->timer = NULL;
  if (!at) return;
  uint64_t now = cm_now_ms();
  s->timer_at = at;
  s->timer = cm_loop_timer(s->loop, at > now ? at - now : 0, on_timer, s);
}

art_store_t *art_store_new(cm_loop_t *loop, const srv_config_t *cfg, const char *state_dir,
                           cm_error_t *err) {
  cleanup_free char *runs = xasprintf("%s/runs", state_dir);
  if (cm_mkdir_p(runs, 0700, err) < 0) {
    cm_error_wrap(err, "creating the artifact directory");
    return NULL;
  }
  if (chmod(runs, 0700) < 0) {
    cm_error_set(err, errno, CM_ERR_IO, "chmod %s", runs);
    return NULL;
  }
  art_store_t *s = xcalloc(1, sizeof *s);
  s->loop = loop;
  s->cfg = cfg;
  s->runs_dir = steal_pointer(&runs);
  sweep_orphans(s);
  schedule(s);
  return s;
}

void art_store_free(art_store_t *s) {
  if (!s) return;
  cm_timer_cancel(s->timer);
  while (s->head) drop_head(s);
  free(s->runs_dir);
  free(s);
}

static void new_run_id(const srv_config_t *cfg, char out[ART_ID_MAX]) {
  if (cfg->route) out += snprintf(out, SRV_ROUTE_MAX + 2, "%s.", cfg->route);
  unsigned char raw[ART_ID_BYTES];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      /* getrandom cannot fail on a kernel we run on; an unguessable id is a must. */
      cm_err("getrandom failed: %s", strerror(errno));
      abort();
    }
    got += (size_t)n;
  }
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof raw; i++) {
    out[2 * i] = hex[raw[i] >> 4];
    out[2 * i + 1] = hex[raw[i] & 15];
  }
  out[2 * ART_ID_BYTES] = '\0';
}

void art_store_collect(art_store_t *s, const char *principal, const char *workdir,
                       files_collection_t *out) {
  memset(out, 0, sizeof *out);
  const srv_config_t *cfg = s->cfg;
  expire(s);
  art_run_t *r = xcalloc(1, sizeof *r);
  new_run_id(cfg, r->id);
  r->dir = xasprintf("%s/%s", s->runs_dir, r->id);
  r->principal = xstrdup(principal);
  uint64_t max_bytes = CM_MIN(cfg->max_artifact_bytes, cfg->max_artifact_store_bytes);
  if (cfg->max_artifact_bytes_per_token)
    max_bytes = CM_MIN(max_bytes, cfg->max_artifact_bytes_per_token);
  files_collect_limits_t lim = {
      .max_entries = (size_t)cfg->max_output_files,
      .max_bytes = max_bytes,
      .inline_bytes = cfg->max_inline_bytes,
      .inline_text_bytes = cfg->max_inline_text_bytes,
      .inline_total = cfg->max_inline_bytes * FILES_INLINE_TOTAL_FACTOR,
      .max_depth = FILES_MAX_OUTPUT_DEPTH,
  };
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int wfd = open(workdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int rc = wfd < 0 ? cm_error_set(&err, errno, CM_ERR_IO, "opening the work directory")
                   : files_collect(wfd, r->dir, &lim, out, &err);
  if (rc < 0) {
    cm_warn("collecting output files: %s", cm_error_message(&err));
    if (!out->note)
      out->note = xasprintf("output files could not all be kept: %s", cm_error_message(&err));
    cm_error_release(&err);
  }
  if (out->stored_files == 0) {
    if (rc < 0) {
      cm_error_t rerr = CM_ERROR_INIT;
      cm_rm_rf(r->dir, &rerr);
      cm_error_release(&rerr);
    }
    run_free(r);
    return;
  }
  r->files = xcalloc(out->stored_files, sizeof *r->files);
  for (size_t i = 0; i < out->n; i++) {
    files_output_t *e = &out->v[i];
    if (!e->stored) continue;
    cleanup_free char *escaped = files_uri_escape(e->path, strlen(e->path));
    e->uri = xasprintf(ART_URI_PREFIX "%s/%s", r->id, escaped);
    art_file_t *f = &r->files[r->n_files++];
    f->uri = xstrdup(e->uri);
    f->path = xstrdup(e->path);
    f->host = xasprintf("%s/%s", r->dir, e->stored);
    f->mime = e->mime;
    f->size = e->size;
    f->is_text = e->is_text;
    r->bytes += e->size;
  }
  r->expires_ms = cm_now_ms() + cfg->artifact_ttl_ms;
  if (s->tail)
    s->tail->next = r;
  else
    s->head = r;
  s->tail = r;
  s->n_files += r->n_files;
  s->bytes += r->bytes;
  /* The principal's own cap: its oldest runs go first (never the one just made). */
  size_t own_dropped = 0;
  while (cfg->max_artifact_bytes_per_token &&
         principal_bytes(s, principal, NULL) > cfg->max_artifact_bytes_per_token &&
         drop_oldest_of(s, principal, r))
    own_dropped++;
  /* The store's cap: from whoever holds the most. */
  while (s->bytes > cfg->max_artifact_store_bytes && drop_fairly(s, r)) {
  }
  if (own_dropped && !out->note)
    out->note = xasprintf(
        "%zu older run%s of this token dropped to keep its output files within "
        "--max-artifact-bytes-per-token (%llu bytes)",
        own_dropped, own_dropped == 1 ? "'s outputs were" : "s' outputs were",
        (unsigned long long)cfg->max_artifact_bytes_per_token);
  schedule(s);
}

void art_store_usage(art_store_t *s, const char *principal, size_t *files, uint64_t *bytes) {
  expire(s);
  *bytes = principal_bytes(s, principal, files);
}

void art_store_stats(art_store_t *s, size_t *count, uint64_t *bytes) {
  expire(s);
  *count = s->n_files;
  *bytes = s->bytes;
}

static json_t *describe_file(const art_run_t *r, const art_file_t *f) {
  uint64_t now = cm_now_ms();
  uint64_t left_s = r->expires_ms > now ? (r->expires_ms - now + 999) / 1000 : 0;
  cleanup_free char *desc =
      xasprintf("Output file of an execute_python run; kept for about %llu more seconds.",
                (unsigned long long)left_s);
  return json_pack("{s:s, s:s, s:s, s:s, s:I}", "uri", f->uri, "name", f->path, "description", desc,
                   "mimeType", f->mime, "size", (json_int_t)f->size);
}

/* A listing cursor names where the next page starts: one of the principal's runs and a
 * file in it ("<run-id>:<index>"), nothing that counts what others stored.  A principal's
 * runs go oldest first (expiry, its own cap, the store's cap), so when the cursor's run is
 * gone so are all its older ones, and the listing goes on from its oldest run left; a run
 * id of another principal's is no different from one that is gone. */
int art_store_list(art_store_t *s, const char *principal, const char *cursor, json_t **result,
                   cm_error_t *err) {
  *result = NULL;
  expire(s);
  const art_run_t *from = NULL;
  uint64_t from_i = 0;
  if (cursor) {
    char id[ART_ID_MAX];
    const char *colon = strchr(cursor, ':');
    size_t n = colon ? (size_t)(colon - cursor) : 0;
    if (!n || n >= sizeof id || cm_parse_u64(colon + 1, UINT32_MAX, &from_i) < 0)
      return cm_error_set(err, 0, CM_ERR_INVALID, "unknown cursor");
    memcpy(id, cursor, n);
    id[n] = '\0';
    if (!is_run_id(id)) return cm_error_set(err, 0, CM_ERR_INVALID, "unknown cursor");
    for (const art_run_t *r = s->head; r && !from; r = r->next)
      if (strcmp(r->principal, principal) == 0 && strcmp(r->id, id) == 0) from = r;
    if (!from) from_i = 0;
  }
  json_t *list = json_array();
  const art_run_t *next_run = NULL;
  size_t next_i = 0;
  bool started = !from;
  for (const art_run_t *r = s->head; r && !next_run; r = r->next) {
    if (r == from) started = true;
    if (!started || strcmp(r->principal, principal) != 0) continue;
    for (size_t i = r == from ? (size_t)from_i : 0; i < r->n_files; i++) {
      if (json_array_size(list) == ART_PAGE_SIZE) {
        next_run = r;
        next_i = i;
        break;
      }
      json_array_append_new(list, describe_file(r, &r->files[i]));
    }
  }
  *result = json_pack("{s:o}", "resources", list);
  if (next_run) {
    char next[ART_ID_MAX + 24];
    snprintf(next, sizeof next, "%s:%zu", next_run->id, next_i);
    json_object_set_new(*result, "nextCursor", json_string(next));
  }
  return 0;
}

/* The file behind uri, if its run belongs to principal: another's is not found. */
static const art_file_t *find(art_store_t *s, const char *principal, const char *uri) {
  expire(s);
  if (strncmp(uri, ART_URI_PREFIX, strlen(ART_URI_PREFIX)) != 0) return NULL;
  const char *id = uri + strlen(ART_URI_PREFIX);
  for (art_run_t *r = s->head; r; r = r->next) {
    size_t n = strlen(r->id);
    if (strncmp(id, r->id, n) != 0 || id[n] != '/' || strcmp(r->principal, principal) != 0)
      continue;
    for (size_t i = 0; i < r->n_files; i++)
      if (strcmp(r->files[i].uri, uri) == 0) return &r->files[i];
  }
  return NULL;
}

/* CM_ERR_NOT_FOUND for a uri find() does not find: whose run it names when another replica
 * made it (--route), else that no run of the principal's holds it (any more). */
static int not_found(art_store_t *s, const char *uri, cm_error_t *err) {
  char id[ART_ID_MAX] = "";
  if (strncmp(uri, ART_URI_PREFIX, strlen(ART_URI_PREFIX)) == 0) {
    const char *p = uri + strlen(ART_URI_PREFIX);
    size_t n = strcspn(p, "/");
    if (n < sizeof id) {
      memcpy(id, p, n);
      id[n] = '\0';
    }
  }
  cleanup_free char *why = srv_route_unknown(s->cfg, "run", id);
  return cm_error_set(err, 0, CM_ERR_NOT_FOUND, "%s", why);
}

int art_store_read(art_store_t *s, const char *principal, const char *uri, size_t max_answer,
                   json_t **result, cm_error_t *err) {
  *result = NULL;
  const art_file_t *f = find(s, principal, uri);
  if (!f) return not_found(s, uri, err);
  /* As base64, the smaller of the two forms a binary file can take. */
  if (f->size > ART_READ_MAX || (max_answer && (f->size + 2) / 3 * 4 > max_answer))
    return cm_error_set(err, 0, CM_ERR_LIMIT, "the resource is too large to read in one message");
  cleanup_free char *data = NULL;
  size_t len = 0;
  if (cm_read_file(f->host, (size_t)f->size, &data, &len, err) < 0) {
    cm_error_wrap(err, "reading an artifact");
    return -1;
  }
  json_t *content;
  if (f->is_text && files_is_text(data, len)) {
    content = json_pack("{s:s, s:s, s:s%}", "uri", f->uri, "mimeType", f->mime, "text", data, len);
  } else {
    cleanup_free char *b64 = files_base64_encode(data, len, NULL);
    content = json_pack("{s:s, s:s, s:s}", "uri", f->uri, "mimeType", f->mime, "blob", b64);
  }
  *result = json_pack("{s:[o]}", "contents", content);
  return 0;
}

int art_store_open(art_store_t *s, const char *principal, const char *uri, int *fd,
                   const char **mime, uint64_t *size, cm_error_t *err) {
  *fd = -1;
  const art_file_t *f = find(s, principal, uri);
  if (!f) return not_found(s, uri, err);
  *fd = open(f->host, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
  if (*fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "opening an artifact");
  *mime = f->mime;
  *size = f->size;
  return 0;
}

json_t *art_store_templates(void) {
  return json_pack("{s:[{s:s, s:s, s:s, s:s}]}", "resourceTemplates", "uriTemplate",
                   ART_URI_PREFIX "{run_id}/{+path}", "name", "run-output", "title",
                   "Output file of a run", "description",
                   "A file an execute_python run wrote under outputs/ (path relative to its "
                   "working directory, e.g. outputs/data.csv), kept for a while after the run. "
                   "The exact URIs come back in execute_python results.");
}
