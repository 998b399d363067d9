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
  json_t *item; /* what env_store_list shows of it: built, packages, python */
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
    json_decref(v[i].item);
  }
  free(v);
}

/* What a listing reads (the store's, or the background worker's own copy): envs/ and the
 * wheelhouse, and the manifests read by the last listing. */
typedef struct env_scan {
  int envs_fd, wheels_fd;
  const env_known_t *known; /* sorted by name */
  size_t n_known;
} env_scan_t;

static json_t *manifest_item(json_t *m) {
  json_t *o = json_object();
  json_t *created = json_object_get(m, "created");
  if (json_is_integer(created)) json_object_set(o, "built", created);
  json_t *pkgs = json_object_get(m, "packages");
  if (json_is_object(pkgs) || json_is_array(pkgs)) json_object_set(o, "packages", pkgs);
  json_t *py = json_object_get(json_object_get(m, "python"), "version");
  if (json_is_string(py)) json_object_set(o, "python", py);
  return o;
}

/* An environment's size and builder from its manifest: from what was read before when the
 * manifest is the same file (its status now, in st), else read and parsed.  false: not one
 * of ours.  *owner is allocated (NULL when no principal built it). */
static bool entry_size(const env_scan_t *sc, const char *name, struct stat *st, uint64_t *size,
                       char **owner, json_t **item) {
  *owner = NULL;
  *item = NULL;
  cm_error_t err = CM_ERROR_INIT;
  cleanup_close int dfd = cm_open_dir_at(sc->envs_fd, name, &err);
  cm_error_release(&err);
  if (dfd < 0 || fstatat(dfd, ENV_MANIFEST, st, AT_SYMLINK_NOFOLLOW) < 0) return false;
  const env_known_t *k =
      sc->known ? bsearch(name, sc->known, sc->n_known, sizeof *k, name_vs_known) : NULL;
  if (k && k->dev == st->st_dev && k->ino == st->st_ino && S_ISREG(st->st_mode) &&
      st->st_uid == geteuid()) {
    *size = k->size;
    *owner = k->owner ? xstrdup(k->owner) : NULL;
    *item = json_incref(k->item);
    return true;
  }
  json_t *m = env_manifest_read(sc->envs_fd, name, st, NULL);
  if (!m) return false;
  *size = (uint64_t)json_integer_value(json_object_get(m, "size"));
  const char *by = json_string_value(json_object_get(m, "built_by"));
  *owner = by ? xstrdup(by) : NULL;
  *item = manifest_item(m);
  json_decref(m);
  return true;
}

/* The finished environments (size from their manifests, last use from the manifests'
 * time) and the wheelhouse's wheels (their size on disk, last download). */
static void scan_entries(const env_scan_t *sc, entry_list_t *l, bool wheels,
                         env_known_t **known_out, size_t *n_known_out) {
  DIR *d = env_list_dir(sc->envs_fd);
  struct dirent *e;
  env_known_t *known = NULL;
  size_t n_known = 0, cap_known = 0;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.' || strchr(e->d_name, '.')) continue;
    struct stat st;
    uint64_t size;
    char *owner;
    json_t *item;
    if (!entry_size(sc, e->d_name, &st, &size, &owner, &item)) continue;
    entry_add(l, e->d_name, owner, false, size, (int64_t)st.st_mtim.tv_sec);
    if (n_known == cap_known) {
      cap_known = cap_known ? cap_known * 2 : 16;
      known = xrealloc(known, cap_known * sizeof *known);
    }
    known[n_known++] = (env_known_t){xstrdup(e->d_name), st.st_dev, st.st_ino, size, owner, item};
  }
  if (d) closedir(d);
  /* What is gone is forgotten with the old list. */
  if (n_known) qsort(known, n_known, sizeof *known, by_known_name);
  *known_out = known;
  *n_known_out = n_known;
  if (!wheels || sc->wheels_fd < 0) return;
  d = env_list_dir(sc->wheels_fd);
  while (d && (e = readdir(d))) {
    struct stat st;
    if (!env_wheel_name_ok(e->d_name) ||
        fstatat(sc->wheels_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
      continue;
    entry_add(l, e->d_name, NULL, true, (uint64_t)st.st_blocks * 512, (int64_t)st.st_mtim.tv_sec);
  }
  if (d) closedir(d);
}

static void list_entries(env_store_t *s, entry_list_t *l, bool wheels) {
  env_scan_t sc = {s->envs_fd, s->wheels_fd, s->known, s->n_known};
  env_known_t *known;
  size_t n_known;
  scan_entries(&sc, l, wheels, &known, &n_known);
  env_known_release(s->known, s->n_known);
  s->known = known;
  s->n_known = n_known;
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

/* A listing made by the background worker: its own descriptors and copy of the known
 * manifests in, a listing and the new known manifests out.  Shared by the store and the
 * worker until both let go (refs, atomic); `done` (atomic) says the worker's part is over. */
typedef struct env_lister {
  int refs;
  bool done;
  unsigned gen; /* the store's listing_gen when it began */
  env_scan_t scan;
  env_known_t *known; /* in: a copy of the store's; out: the new ones */
  size_t n_known;
  entry_list_t *listing; /* out */
  uint64_t at_ms;
} env_lister_t;

static void lister_unref(env_lister_t *j) {
  if (__atomic_sub_fetch(&j->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  if (j->scan.envs_fd >= 0) close(j->scan.envs_fd);
  if (j->scan.wheels_fd >= 0) close(j->scan.wheels_fd);
  env_known_release(j->known, j->n_known);
  if (j->listing) entries_release(j->listing);
  free(j->listing);
  free(j);
}

/* In the worker's thread: touches nothing but the job. */
static void lister_run(void *data) {
  env_lister_t *j = data;
  j->scan.known = j->known;
  j->scan.n_known = j->n_known;
  j->listing = xcalloc(1, sizeof *j->listing);
  env_known_t *known;
  size_t n_known;
  scan_entries(&j->scan, j->listing, true, &known, &n_known);
  env_known_release(j->known, j->n_known);
  j->known = known;
  j->n_known = n_known;
  j->at_ms = cm_now_ms();
  __atomic_store_n(&j->done, true, __ATOMIC_RELEASE);
  lister_unref(j);
}

/* Takes a finished background listing, unless this process changed envs/ since it began. */
static void lister_adopt(env_store_t *s) {
  env_lister_t *j = s->lister;
  if (!j || !__atomic_load_n(&j->done, __ATOMIC_ACQUIRE)) return;
  s->lister = NULL;
  if (j->gen == s->listing_gen) {
    if (s->listing) entries_release(s->listing);
    free(s->listing);
    s->listing = steal_pointer(&j->listing);
    s->listing_at_ms = j->at_ms;
    s->listing_wheels = true;
    env_known_release(s->known, s->n_known);
    s->known = steal_pointer(&j->known);
    s->n_known = j->n_known;
    j->n_known = 0;
  }
  lister_unref(j);
}

/* Queues a background listing unless one is on its way; false: none could be (the worker's
 * queue is full or it has no thread), the caller lists itself. */
static bool lister_start(env_store_t *s) {
  if (s->lister) return true;
  if (s->envs_fd < 0) return false;
  env_lister_t *j = xcalloc(1, sizeof *j);
  j->refs = 2;
  j->gen = s->listing_gen;
  j->scan.envs_fd = fcntl(s->envs_fd, F_DUPFD_CLOEXEC, 0);
  j->scan.wheels_fd = s->wheels_fd >= 0 ? fcntl(s->wheels_fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (j->scan.envs_fd < 0 || (s->wheels_fd >= 0 && j->scan.wheels_fd < 0)) {
    j->refs = 1;
    lister_unref(j);
    return false;
  }
  j->known = s->n_known ? xcalloc(s->n_known, sizeof *j->known) : NULL;
  for (size_t i = 0; i < s->n_known; i++) {
    const env_known_t *k = &s->known[i];
    j->known[i] = (env_known_t){
        xstrdup(k->name),    k->dev, k->ino, k->size, k->owner ? xstrdup(k->owner) : NULL,
        json_incref(k->item)};
  }
  j->n_known = s->n_known;
  if (!cm_bg_run(lister_run, j)) {
    j->refs = 1;
    lister_unref(j);
    return false;
  }
  s->lister = j;
  return true;
}

void env_listing_prime(env_store_t *s) {
  (void)lister_start(s);
}

void env_listing_changed(env_store_t *s) {
  s->listing_at_ms = 0;
  s->listing_gen++;
}

void env_listing_free(env_store_t *s) {
  if (s->lister) {
    lister_unref(s->lister); /* the worker frees it, if it has not run yet */
    s->lister = NULL;
  }
  if (!s->listing) return;
  entries_release(s->listing);
  free(s->listing);
  s->listing = NULL;
  s->listing_at_ms = 0;
}

/* The kept listing when it is recent enough (and has the wheels if asked); when it is older,
 * the same while the background worker makes a new one; else (none yet, or this process
 * changed envs/: what it did counts at once) a new one, here. */
static const entry_list_t *listing(env_store_t *s, bool wheels) {
  uint64_t now = cm_now_ms();
  lister_adopt(s);
  bool usable = s->listing && s->listing_at_ms && (s->listing_wheels || !wheels);
  if (usable && now - s->listing_at_ms < ENV_LISTING_MS) return s->listing;
  if (usable && lister_start(s)) return s->listing;
  if (s->listing) entries_release(s->listing);
  free(s->listing);
  s->listing = NULL;
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
  env_listing_changed(s); /* (a build was published, and environments may go) */
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
    /* From the manifest as the listing read it (a published manifest never changes). */
    const env_known_t *kn =
        s->known ? bsearch(en->name, s->known, s->n_known, sizeof *kn, name_vs_known) : NULL;
    if (kn && kn->item) json_object_update(o, kn->item);
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
  env_listing_changed(s);
  entries_release(&l);
  return rc;
}
