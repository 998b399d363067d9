/* Eviction, within --max-cache-bytes and each principal's --max-cache-bytes-per-token:
 * environments are charged to the principal that built them (the manifest's built_by), the
 * wheelhouse's wheels to the server.  Past a principal's cap its own least recently used
 * environments go; past the total, the least recently used of the principal holding the
 * most (so one tenant building a lot evicts its own environments, not another's). */
#include <fcntl.h>
#include <sys/file.h>

#include "envstore/envstore-internal.h"

/* ---------------------------------------------------------------- eviction */

typedef struct env_entry {
  char *name;
  char *owner; /* built_by; NULL: the server's (wheels, builds of no principal) */
  bool wheel;
  bool tried; /* in this pass: tried for eviction (and evicted, or in use) */
  uint64_t size;
  int64_t used;
} env_entry_t;

static int by_use(const void *a, const void *b) {
  const env_entry_t *x = a, *y = b;
  return x->used < y->used ? -1 : x->used > y->used;
}

typedef struct entry_list {
  env_entry_t *v;
  size_t n, cap;
  uint64_t total;
} entry_list_t;

static void entry_add(entry_list_t *l, const char *name, const char *owner, bool wheel,
                      uint64_t size, int64_t used) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 16;
    l->v = xrealloc(l->v, l->cap * sizeof *l->v);
  }
  l->v[l->n++] =
      (env_entry_t){xstrdup(name), owner ? xstrdup(owner) : NULL, wheel, false, size, used};
  l->total += size;
}

typedef struct env_known {
  char *name;
  dev_t dev;
  ino_t ino;
  uint64_t size;
  char *owner;
} env_known_t;

static int by_known_name(const void *a, const void *b) {
  return strcmp(((const env_known_t *)a)->name, ((const env_known_t *)b)->name);
}

static int name_vs_known(const void *name, const void *k) {
  return strcmp(name, ((const env_known_t *)k)->name);
}

void env_known_release(env_known_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(v[i].name);
    free(v[i].owner);
  }
  free(v);
}

/* An environment's size and builder from its manifest: from what was read before when the
 * manifest is the same file (its status now, in st), else read and parsed.  false: not one
 * of ours.  *owner is allocated (NULL when no principal built it). */
static bool entry_size(env_store_t *s, const char *name, struct stat *st, uint64_t *size,
                       char **owner) {
  *owner = NULL;
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int dfd = cm_open_dir_at(s->envs_fd, name, &err);
  cm_error_release(&err);
  if (dfd < 0 || fstatat(dfd, ENV_MANIFEST, st, AT_SYMLINK_NOFOLLOW) < 0) return false;
  env_known_t *k = s->known ? bsearch(name, s->known, s->n_known, sizeof *k, name_vs_known) : NULL;
  if (k && k->dev == st->st_dev && k->ino == st->st_ino && S_ISREG(st->st_mode) &&
      st->st_uid == geteuid()) {
    *size = k->size;
    *owner = k->owner ? xstrdup(k->owner) : NULL;
    return true;
  }
  json_t *m = env_load_manifest(s, name, true, false, st);
  if (!m) return false;
  *size = (uint64_t)json_integer_value(json_object_get(m, "size"));
  const char *by = json_string_value(json_object_get(m, "built_by"));
  *owner = by ? xstrdup(by) : NULL;
  json_decref(m);
  return true;
}

/* The finished environments (size from their manifests, last use from the manifests'
 * time) and the wheelhouse's wheels (their size on disk, last download). */
static void list_entries(env_store_t *s, entry_list_t *l, bool wheels) {
  DIR *d = env_list_dir(s->envs_fd);
  struct dirent *e;
  env_known_t *known = NULL;
  size_t n_known = 0, cap_known = 0;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.' || strchr(e->d_name, '.')) continue;
    struct stat st;
    uint64_t size;
    char *owner;
    if (!entry_size(s, e->d_name, &st, &size, &owner)) continue;
    entry_add(l, e->d_name, owner, false, size, (int64_t)st.st_mtim.tv_sec);
    if (n_known == cap_known) {
      cap_known = cap_known ? cap_known * 2 : 16;
      known = xrealloc(known, cap_known * sizeof *known);
    }
    known[n_known++] = (env_known_t){xstrdup(e->d_name), st.st_dev, st.st_ino, size, owner};
  }
  if (d) closedir(d);
  /* What is gone is forgotten with the old list. */
  if (n_known) qsort(known, n_known, sizeof *known, by_known_name);
  env_known_release(s->known, s->n_known);
  s->known = known;
  s->n_known = n_known;
  if (!wheels || s->wheels_fd < 0) return;
  d = env_list_dir(s->wheels_fd);
  while (d && (e = readdir(d))) {
    struct stat st;
    if (!env_wheel_name_ok(e->d_name) ||
        fstatat(s->wheels_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
      continue;
    entry_add(l, e->d_name, NULL, true, (uint64_t)st.st_blocks * 512, (int64_t)st.st_mtim.tv_sec);
  }
  if (d) closedir(d);
}

static void entries_release(entry_list_t *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].name);
    free(l->v[i].owner);
  }
  free(l->v);
}

/* How long a listing serves the readers (envstore-internal.h): a tenant that calls
 * check_environment in a loop costs one listing of envs/ (a directory read and an fstatat
 * per environment, on the event loop) per this, not one per call. */
#define ENV_LISTING_MS 2000

void env_listing_free(env_store_t *s) {
  if (!s->listing) return;
  entries_release(s->listing);
  free(s->listing);
  s->listing = NULL;
  s->listing_at_ms = 0;
}

/* The kept listing when it is recent enough (and has the wheels if asked), else a new one. */
static const entry_list_t *listing(env_store_t *s, bool wheels) {
  uint64_t now = cm_now_ms();
  if (s->listing && s->listing_at_ms && now - s->listing_at_ms < ENV_LISTING_MS &&
      (s->listing_wheels || !wheels))
    return s->listing;
  env_listing_free(s);
  s->listing = xcalloc(1, sizeof *s->listing);
  list_entries(s, s->listing, wheels);
  s->listing_at_ms = now;
  s->listing_wheels = wheels;
  return s->listing;
}

static bool same_owner(const char *a, const char *b) {
  return a == b || (a && b && strcmp(a, b) == 0);
}

/* What one principal holds of the entries still there, and where its next candidate is in
 * the list (sorted by last use: the first untried of its entries is its oldest). */
typedef struct env_holder {
  const char *owner;
  uint64_t bytes;
  size_t next;
} env_holder_t;

typedef struct holder_list {
  env_holder_t *v;
  size_t n;
} holder_list_t;

static env_holder_t *holder_of(holder_list_t *h, const char *owner) {
  for (size_t i = 0; i < h->n; i++)
    if (same_owner(h->v[i].owner, owner)) return &h->v[i];
  return NULL;
}

/* One holder per principal (and one for the server), their bytes counted. */
static void holders_count(const entry_list_t *l, holder_list_t *h) {
  h->v = xcalloc(l->n ? l->n : 1, sizeof *h->v);
  h->n = 0;
  for (size_t i = 0; i < l->n; i++) {
    env_holder_t *o = holder_of(h, l->v[i].owner);
    if (!o) {
      o = &h->v[h->n++];
      *o = (env_holder_t){l->v[i].owner, 0, i};
    }
    o->bytes += l->v[i].size;
  }
}

/* The holder's oldest entry not yet tried, or NULL. */
static env_entry_t *holder_next(entry_list_t *l, env_holder_t *o) {
  for (; o->next < l->n; o->next++) {
    env_entry_t *en = &l->v[o->next];
    if (!en->tried && same_owner(en->owner, o->owner)) return en;
  }
  return NULL;
}

/* Removes one entry unless it is in use (here or in another server: its lock is held
 * shared) or being built; one that could not go is not tried again in this pass.  Returns
 * whether it went. */
static bool evict_one(env_store_t *s, env_entry_t *en, bool wheels_ok) {
  en->tried = true;
  if (en->wheel) {
    if (!wheels_ok || unlinkat(s->wheels_fd, en->name, 0) < 0) return false;
    cm_info("evicted wheel %s (%llu bytes)", en->name, (unsigned long long)en->size);
    return true;
  }
  cleanup_free char *lock = xasprintf("%s/%s.lock", s->envs_dir, en->name);
  cleanup_close int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) < 0) { /* in use or building */
    cm_debug("environment %s is in use: not evicted", en->name);
    return false;
  }
  cleanup_free char *trash = xasprintf(".evicted-%s-%d-%u", en->name, (int)getpid(), s->serial++);
  if (renameat(s->envs_fd, en->name, s->envs_fd, trash) < 0) return false;
  env_remove_later(s, s->envs_fd, trash);
  s->counters.evictions++;
  s->counters.evicted_bytes += en->size;
  cm_info("evicted environment %s (%llu bytes, built by %s)", en->name,
          (unsigned long long)en->size, en->owner ? en->owner : "the server");
  return true;
}

/* Brings every principal within --max-cache-bytes-per-token (its own least recently used
 * first), then the store within --max-cache-bytes (the least recently used of the principal
 * holding the most, and only of that one).  An environment in use or being built is never touched,
 * and no wheel goes while an installer of ours may be reading the wheelhouse. */
void env_evict(env_store_t *s) {
  s->listing_at_ms = 0; /* (a build was published, and environments may go) */
  bool installing = s->resolving > 0;
  for (env_build_t *b = s->builds; b; b = b->next) installing |= b->run != NULL;
  entry_list_t l = {0};
  list_entries(s, &l, !installing);
  if (l.n) qsort(l.v, l.n, sizeof *l.v, by_use);
  holder_list_t h;
  holders_count(&l, &h);
  uint64_t total = l.total, cap = s->opts.max_cache_bytes_per_owner;
  for (size_t i = 0; cap && i < h.n; i++) {
    env_holder_t *o = &h.v[i];
    env_entry_t *en;
    while (o->owner && o->bytes > cap && (en = holder_next(&l, o)))
      if (evict_one(s, en, !installing)) {
        o->bytes -= en->size;
        total -= CM_MIN(total, en->size);
      }
    o->next = 0;
  }
  /* Only the principal holding the most gives way.  When everything it holds is in use (or
   * being built), the store stays over its cap until its next pass: taking from one holding
   * less would make that one pay for the other's use. */
  while (total > s->opts.max_cache_bytes) {
    env_holder_t *victim = NULL;
    for (size_t i = 0; i < h.n; i++)
      if (h.v[i].bytes && (!victim || h.v[i].bytes > victim->bytes)) victim = &h.v[i];
    env_entry_t *en = victim ? holder_next(&l, victim) : NULL;
    if (!en) break;
    if (evict_one(s, en, !installing)) {
      victim->bytes -= en->size;
      total -= CM_MIN(total, en->size);
    }
  }
  free(h.v);
  entries_release(&l);
}

void env_store_usage(env_store_t *s, const char *owner, size_t *count, uint64_t *bytes) {
  *count = 0;
  *bytes = 0;
  if (s->envs_fd < 0) return;
  const entry_list_t *l = listing(s, false);
  for (size_t i = 0; i < l->n; i++)
    if (!l->v[i].wheel && same_owner(l->v[i].owner, owner)) {
      (*count)++;
      *bytes += l->v[i].size;
    }
}

void env_store_counters(env_store_t *s, env_counters_t *out) {
  *out = s->counters;
}

void env_store_stats(env_store_t *s, size_t *count, uint64_t *bytes) {
  *count = 0;
  *bytes = 0;
  if (s->envs_fd < 0) return;
  const entry_list_t *l = listing(s, true);
  for (size_t i = 0; i < l->n; i++) *count += !l->v[i].wheel;
  *bytes = l->total;
}

/* ---------------------------------------------------------------- one principal's */

json_t *env_store_list(env_store_t *s, const char *owner) {
  json_t *out = json_array();
  if (s->envs_fd < 0) return out;
  const entry_list_t *l = listing(s, false);
  /* No time of use, and no order by it: an environment is shared by whoever needs the same
   * requirements, so its last use may be another principal's (and tell its builder so).
   * When it was built is the builder's own. */
  for (size_t k = 0; k < l->n; k++) {
    const env_entry_t *en = &l->v[k];
    if (en->wheel || !same_owner(en->owner, owner)) continue;
    json_t *o = json_pack("{s:s, s:I}", "key", en->name, "bytes", (json_int_t)en->size);
    json_t *m = env_load_manifest(s, en->name, true, false, NULL);
    json_t *created = m ? json_object_get(m, "created") : NULL;
    if (json_is_integer(created)) json_object_set(o, "built", created);
    json_t *pkgs = m ? json_object_get(m, "packages") : NULL;
    if (json_is_object(pkgs) || json_is_array(pkgs)) json_object_set(o, "packages", pkgs);
    json_t *py = m ? json_object_get(json_object_get(m, "python"), "version") : NULL;
    if (json_is_string(py)) json_object_set(o, "python", py);
    json_decref(m);
    json_array_append_new(out, o);
  }
  return out;
}

int env_store_evict_owned(env_store_t *s, const char *owner, const char *key, cm_error_t *err) {
  entry_list_t l = {0};
  if (s->envs_fd >= 0) list_entries(s, &l, false);
  env_entry_t *en = NULL;
  for (size_t i = 0; i < l.n && !en; i++)
    if (strcmp(l.v[i].name, key) == 0 && same_owner(l.v[i].owner, owner)) en = &l.v[i];
  int rc = 0;
  if (!en) /* Another principal's is no such environment, as for every lookup across tenants. */
    rc = cm_error_set(err, 0, CM_ERR_NOT_FOUND, "no such environment of yours");
  else if (!evict_one(s, en, false))
    rc = cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "the environment is in use or being built");
  s->listing_at_ms = 0;
  entries_release(&l);
  return rc;
}
