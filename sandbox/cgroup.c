/* Control groups for runs.  Each run gets a cgroup of its own under a directory of the
 * server instance's ("mps-<instance id>"), with the spec's limits on the whole process tree
 * (memory, processes, CPU bandwidth); at the end its peak memory, OOM kills, refused forks and CPU
 * time are read back, everything still in it is killed and the directory removed.
 *
 * cgroup v2 when the server's own cgroup (or --cgroup DIR) has the controllers delegated;
 * otherwise the cgroup v1 hierarchies of a hybrid host.  The rlimits stay in force either
 * way: the cgroup adds what an rlimit cannot do (one budget for a whole tree, also for
 * root, and a kill that reaches processes which left the process group). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "sandbox/sandbox-internal.h"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

enum { CG_MEMORY = 1u, CG_PIDS = 2u, CG_CPU = 4u, CG_CPUACCT = 8u, CG_FREEZER = 16u };
#define CG_MAX_HIER 6
#define CG_CPU_PERIOD_US 100000ull
#define CG_PROC_FILE_MAX (1u << 20)

static void closedirp(DIR **d) {
  if (*d) closedir(*d);
}
#define cleanup_closedir __attribute__((cleanup(closedirp)))

typedef struct cg_hier {
  char *parent;         /* the server's directory in this hierarchy: .../mps-<instance id> */
  unsigned controllers; /* CG_* in this hierarchy */
} cg_hier_t;

struct sbx_cgroups {
  int version; /* 2, 1, or 0: not used (see reason) */
  cg_hier_t hier[CG_MAX_HIER];
  size_t n_hier;
  unsigned controllers;
  char *reason;
  uint64_t seq;
  char **pending; /* run directories that were still busy when their run ended */
  size_t n_pending;
  cm_loop_t *loop; /* for retrying them */
  cm_timer_t *retry;
  unsigned retries;
};

struct sbx_cgroup_run {
  sbx_cgroups_t *cg;
  char *dirs[CG_MAX_HIER];
  unsigned controllers[CG_MAX_HIER]; /* CG_* of each directory */
  int join_fds[CG_MAX_HIER];
  int dir_fd; /* v2: the run's directory, for clone3(CLONE_INTO_CGROUP); else -1 */
  size_t n;
  bool killed; /* everything in it got SIGKILL after the run ended: nothing can fork since */
  bool frozen; /* sbx_cgroup_run_freeze(r, true) last */
};

static const struct {
  const char *name;
  unsigned bit;
} cg_names[] = {{"memory", CG_MEMORY},
                {"pids", CG_PIDS},
                {"cpu", CG_CPU},
                {"cpuacct", CG_CPUACCT},
                /* v1 only (v2 has cgroup.freeze in every cgroup): for runs that are frozen
                 * between uses (limits.freezable), not a directory for every run */
                {"freezer", CG_FREEZER}};

/* ---------------------------------------------------------------- parsing /proc */

/* Whether the comma-separated list [s, s+n) holds word. */
static bool list_has(const char *s, size_t n, const char *word) {
  size_t wl = strlen(word);
  const char *end = s + n;
  while (s < end) {
    const char *comma = memchr(s, ',', (size_t)(end - s));
    size_t len = (size_t)((comma ? comma : end) - s);
    if (len == wl && memcmp(s, word, wl) == 0) return true;
    s += len + 1;
  }
  return false;
}

char *sbx_cgroup_own_path(const char *buf, size_t len, const char *controller) {
  const char *p = buf, *end = buf + len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end;
    /* hierarchy-id:controller-list:path */
    const char *c1 = memchr(p, ':', (size_t)(le - p));
    const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(le - c1 - 1)) : NULL;
    if (c2 && c2 + 1 < le && c2[1] == '/') {
      bool match = controller ? list_has(c1 + 1, (size_t)(c2 - c1 - 1), controller)
                              : (c1 - p == 1 && *p == '0' && c2 == c1 + 1);
      if (match && !memchr(c2 + 1, '\0', (size_t)(le - c2 - 1)))
        return xstrndup(c2 + 1, (size_t)(le - c2 - 1));
    }
    p = le + 1;
  }
  return NULL;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static char *unescape_field(const char *s, size_t n) {
  char *out = xmalloc(n + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\\' && i + 3 < n && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' &&
        s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
      out[o++] = (char)((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out[o++] = s[i];
    }
  }
  out[o] = '\0';
  if (strlen(out) != o) { /* an escaped NUL: not a path we can use */
    free(out);
    return NULL;
  }
  return out;
}

/* Whether p is absolute and has no "." or ".." component: the kernel shows mount points
 * and cgroup paths canonical, so anything else in /proc text is not to be trusted. */
static bool path_is_clean(const char *p) {
  if (p[0] != '/') return false;
  for (const char *c = p + 1; *c;) {
    const char *slash = strchr(c, '/');
    size_t n = slash ? (size_t)(slash - c) : strlen(c);
    if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) return false;
    if (!slash) break;
    c = slash + 1;
  }
  return true;
}

int sbx_cgroup_find_mount(const char *buf, size_t len, const char *controller, char **mountpoint,
                          char **root) {
  *mountpoint = *root = NULL;
  const char *p = buf, *end = buf + len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end;
    /* id parent maj:min root mountpoint options [optional...] - fstype source superoptions */
    const char *f[6];
    size_t fl[6], nf = 0;
    const char *q = p;
    while (q < le && nf < 6) {
      while (q < le && *q == ' ') q++;
      const char *s = q;
      while (q < le && *q != ' ') q++;
      if (q > s) f[nf] = s, fl[nf] = (size_t)(q - s), nf++;
    }
    const char *sep = NULL;
    for (const char *r = q; r + 2 < le; r++) {
      if (r[0] == ' ' && r[1] == '-' && r[2] == ' ') {
        sep = r + 3;
        break;
      }
    }
    if (nf == 6 && sep) {
      const char *t[3];
      size_t tl[3], nt = 0;
      q = sep;
      while (q < le && nt < 3) {
        while (q < le && *q == ' ') q++;
        const char *s = q;
        while (q < le && *q != ' ') q++;
        if (q > s) t[nt] = s, tl[nt] = (size_t)(q - s), nt++;
      }
      bool match = false;
      if (nt >= 1 && !controller) match = tl[0] == 7 && memcmp(t[0], "cgroup2", 7) == 0;
      if (nt == 3 && controller)
        match = tl[0] == 6 && memcmp(t[0], "cgroup", 6) == 0 && list_has(t[2], tl[2], controller);
      if (match) {
        *root = unescape_field(f[3], fl[3]);
        *mountpoint = unescape_field(f[4], fl[4]);
        if (*root && *mountpoint && path_is_clean(*root) && path_is_clean(*mountpoint)) return 0;
        free(*root);
        free(*mountpoint);
        *root = *mountpoint = NULL;
      }
    }
    p = le + 1;
  }
  return -1;
}

char *sbx_cgroup_dir(const char *mountpoint, const char *root, const char *own) {
  size_t rl = strlen(root);
  if (strcmp(root, "/") == 0) rl = 0;
  /* The server's cgroup must lie inside what the mount shows. */
  if (rl && (strncmp(own, root, rl) != 0 || (own[rl] != '/' && own[rl] != '\0'))) return NULL;
  const char *rel = own + rl;
  if (strstr(rel, "/../") || strstr(rel, "/./") ||
      (strlen(rel) >= 3 && strcmp(rel + strlen(rel) - 3, "/..") == 0))
    return NULL;
  char *dir = strcmp(rel, "/") == 0 || *rel == '\0'
                  ? xstrdup(mountpoint)
                  : xasprintf("%s%s", strcmp(mountpoint, "/") == 0 ? "" : mountpoint, rel);
  /* The final path, not only its parts: a mount point of its own can carry "..". */
  if (!path_is_clean(dir)) {
    free(dir);
    return NULL;
  }
  return dir;
}

/* ---------------------------------------------------------------- files */

static int cg_write(const char *dir, const char *file, const char *value, cm_error_t *err) {
  cleanup_free char *path = xasprintf("%s/%s", dir, file);
  cleanup_close int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "open %s", path);
  ssize_t n = write(fd, value, strlen(value));
  if (n != (ssize_t)strlen(value))
    return cm_error_set(err, n < 0 ? errno : EIO, CM_ERR_UNAVAILABLE, "writing \"%s\" to %s", value,
                        path);
  return 0;
}

/* Reads a small cgroup file into buf (NUL-terminated); -1 when it cannot be read. */
static ssize_t cg_read(const char *dir, const char *file, char *buf, size_t size) {
  cleanup_free char *path = xasprintf("%s/%s", dir, file);
  cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  size_t len = 0;
  while (len + 1 < size) {
    ssize_t n = read(fd, buf + len, size - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    len += (size_t)n;
  }
  buf[len] = '\0';
  return (ssize_t)len;
}

static bool cg_exists(const char *dir, const char *file) {
  cleanup_free char *path = xasprintf("%s/%s", dir, file);
  return access(path, F_OK) == 0;
}

/* "key value" lines (memory.events, pids.events, cpu.stat, memory.oom_control). */
static bool keyed_value(const char *text, const char *key, uint64_t *value) {
  size_t kl = strlen(key);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (strncmp(p, key, kl) == 0 && p[kl] == ' ') {
      char *end;
      errno = 0;
      unsigned long long v = strtoull(p + kl + 1, &end, 10);
      if (errno || end == p + kl + 1) return false;
      *value = v;
      return true;
    }
  }
  return false;
}

static bool read_u64(const char *dir, const char *file, uint64_t *value) {
  char buf[64];
  if (cg_read(dir, file, buf, sizeof buf) <= 0) return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(buf, &end, 10);
  if (errno || end == buf) return false;
  *value = v;
  return true;
}

static bool read_keyed(const char *dir, const char *file, const char *key, uint64_t *value) {
  char buf[1024];
  if (cg_read(dir, file, buf, sizeof buf) <= 0) return false;
  return keyed_value(buf, key, value);
}

/* Removes a run directory (and, for the server's own directory, its run directories). */
static bool remove_tree(const char *dir) {
  cleanup_closedir DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
      cleanup_free char *sub = xasprintf("%s/%s", dir, e->d_name);
      remove_tree(sub);
    }
  }
  return rmdir(dir) == 0 || errno == ENOENT;
}

/* Kills every process listed in dir's cgroup.procs, a few rounds (a process may fork
 * while we read); cgroup.kill does it atomically where the kernel has it. */
static void kill_members(const char *dir, int version) {
  if (version == 2 && cg_write(dir, "cgroup.kill", "1", NULL) == 0) return;
  for (int round = 0; round < 16; round++) {
    cleanup_free char *path = xasprintf("%s/cgroup.procs", dir);
    cleanup_free char *text = NULL;
    size_t len = 0;
    if (cm_read_file(path, CG_PROC_FILE_MAX, &text, &len, NULL) < 0 || len == 0) return;
    for (char *p = text; *p;) {
      char *end;
      long pid = strtol(p, &end, 10);
      if (end == p) break;
      if (pid > 1) kill((pid_t)pid, SIGKILL);
      p = end;
      while (*p == '\n') p++;
    }
  }
}

/* ---------------------------------------------------------------- set-up */

static unsigned controllers_in(const char *text) {
  unsigned set = 0;
  for (const char *p = text; *p;) {
    while (*p == ' ' || *p == '\n') p++;
    const char *s = p;
    while (*p && *p != ' ' && *p != '\n') p++;
    for (size_t i = 0; i < CM_ARRAY_SIZE(cg_names); i++) {
      if ((size_t)(p - s) == strlen(cg_names[i].name) &&
          memcmp(s, cg_names[i].name, (size_t)(p - s)) == 0)
        set |= cg_names[i].bit;
    }
  }
  return set;
}

static char *enable_string(unsigned set) {
  cm_buf_t b;
  cm_buf_init(&b, 0);
  for (size_t i = 0; i < CM_ARRAY_SIZE(cg_names); i++) {
    if (set & cg_names[i].bit) cm_buf_printf(&b, "%s+%s", b.len ? " " : "", cg_names[i].name);
  }
  return cm_buf_steal(&b);
}

/* kill_members for dir and every directory below it (a dead server's runs are below its
 * own directory). */
static void kill_members_below(const char *dir, int version) {
  cleanup_closedir DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
      cleanup_free char *sub = xasprintf("%s/%s", dir, e->d_name);
      kill_members_below(sub, version);
    }
  }
  kill_members(dir, version);
}

/* The instance id in "mps-<id>", or NULL. */
static const char *instance_of(const char *name) {
  return strncmp(name, "mps-", 4) == 0 && sbx_instance_id_valid(name + 4) ? name + 4 : NULL;
}

/* Whether "mps-<id>" names an instance provably gone (its record says so); a directory of
 * any other name, or of an instance without a record we can see, is not ours to touch. */
static bool stale_name(const char *name) {
  const char *id = instance_of(name);
  return id && sbx_instance_gone(id);
}

/* A dead server's frozen session kernels (cgroup v1 freezer) take no signal, not even their
 * parent-death SIGKILL, until thawed: they would outlive it for good, and every later start
 * would wait on their directories. */
static void thaw_below(const char *dir) {
  (void)cg_write(dir, "freezer.state", "THAWED", NULL);
  cleanup_closedir DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
    cleanup_free char *sub = xasprintf("%s/%s", dir, e->d_name);
    thaw_below(sub);
  }
}

static void thaw_stale(const char *dir) {
  cleanup_closedir DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!stale_name(e->d_name)) continue;
    cleanup_free char *sub = xasprintf("%s/%s", dir, e->d_name);
    thaw_below(sub);
  }
}

/* Ids of the instances whose directories were swept, to forget once every hierarchy is. */
static char **swept_ids;
static size_t n_swept_ids;

/* Removes directories "mps-<id>" under dir left by instances provably gone. */
static void sweep_stale(const char *dir) {
  cleanup_closedir DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_type != DT_DIR || !stale_name(e->d_name)) continue;
    cleanup_free char *sub = xasprintf("%s/%s", dir, e->d_name);
    kill_members_below(sub, 1);
    /* A server killed a moment ago still has processes dying in there (its children get
     * SIGKILL by the parent-death signal, and just now by us): a directory cannot go before
     * they are gone.  This runs once, at start-up, before anything is served; bounded (5 s:
     * 1 s was too short for a killed server's tree on a loaded machine; what is still busy
     * then is swept by the next start). */
    bool removed = false;
    for (int i = 0; i < 1000 && !(removed = remove_tree(sub)); i++) {
      if (errno != EBUSY) break;
      usleep(5000);
      kill_members_below(sub, 1);
    }
    if (!removed) {
      cm_warn("cgroup %s of a gone instance is still busy; the next start sweeps it", sub);
      continue;
    }
    swept_ids = xrealloc(swept_ids, (n_swept_ids + 1) * sizeof *swept_ids);
    swept_ids[n_swept_ids++] = xstrdup(instance_of(e->d_name));
  }
}

/* The records of the instances whose directories are all gone now. */
static void forget_swept(void) {
  for (size_t i = 0; i < n_swept_ids; i++) {
    sbx_instance_forget(swept_ids[i]);
    free(swept_ids[i]);
  }
  free(swept_ids);
  swept_ids = NULL;
  n_swept_ids = 0;
}

static char *make_parent(const char *dir, cm_error_t *err) {
  sweep_stale(dir);
  /* The id is random and ours alone: an existing directory of that name is not ours to
   * remove (never seen: 64 random bits). */
  char *parent = xasprintf("%s/mps-%s", dir, sbx_instance_id());
  if (mkdir(parent, 0755) < 0) {
    cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "cannot create %s", parent);
    free(parent);
    return NULL;
  }
  return parent;
}

/* Whether our process is the only one in dir (then it may move itself to a leaf). */
static bool alone_in(const char *dir) {
  cleanup_free char *path = xasprintf("%s/cgroup.procs", dir);
  cleanup_free char *text = NULL;
  if (cm_read_file(path, CG_PROC_FILE_MAX, &text, NULL, NULL) < 0) return false;
  char *end;
  long pid = strtol(text, &end, 10);
  while (*end == '\n') end++;
  return pid == (long)getpid() && *end == '\0';
}

/* cgroup v2 in dir: the wanted controllers enabled for children, the server's directory
 * made.  own: dir is the server's own cgroup, from which it may move itself to a leaf
 * (the "no internal processes" rule forbids enabling controllers in a cgroup that has
 * processes, except the root). */
static int setup_v2(sbx_cgroups_t *cg, const char *dir, bool own, cm_error_t *err) {
  char buf[512];
  if (cg_read(dir, "cgroup.controllers", buf, sizeof buf) < 0)
    return cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "%s is not a cgroup v2 directory", dir);
  unsigned want = controllers_in(buf) & (CG_MEMORY | CG_PIDS | CG_CPU);
  /* A directory given explicitly is used even without controllers: the runs' trees are
   * still tracked, measured (cpu.stat) and killed as a whole. */
  if (!want && own)
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                        "no memory, pids or cpu controller is delegated to %s", dir);
  cleanup_free char *enable = enable_string(want);
  if (want && (cg_read(dir, "cgroup.subtree_control", buf, sizeof buf) < 0 ||
               (controllers_in(buf) & want) != want)) {
    cm_error_t e = CM_ERROR_INIT;
    if (cg_write(dir, "cgroup.subtree_control", enable, &e) < 0) {
      if (!own || e.errnum != EBUSY || !alone_in(dir)) {
        cm_error_release(&e);
        return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                            "cannot enable %s in %s: it holds other processes or is not delegated",
                            enable, dir);
      }
      cm_error_release(&e);
      /* We are alone in our cgroup (a service with Delegate=yes): move to a leaf. */
      cleanup_free char *leaf = xasprintf("%s/mps-server", dir);
      if ((mkdir(leaf, 0755) < 0 && errno != EEXIST) ||
          cg_write(leaf, "cgroup.procs", "0", err) < 0 ||
          cg_write(dir, "cgroup.subtree_control", enable, err) < 0)
        return cm_error_wrap(err, "moving the server to %s", leaf);
    }
  }
  char *parent = make_parent(dir, err);
  if (!parent) return -1;
  if (want && cg_write(parent, "cgroup.subtree_control", enable, err) < 0) {
    rmdir(parent);
    free(parent);
    return -1;
  }
  cg->hier[0] = (cg_hier_t){.parent = parent, .controllers = want};
  cg->n_hier = 1;
  cg->controllers = want;
  cg->version = 2;
  return 0;
}

/* cgroup v1: one directory per hierarchy that has a controller we use. */
static int setup_v1(sbx_cgroups_t *cg, const char *mountinfo, size_t mi_len, const char *self,
                    size_t self_len, cm_error_t *err) {
  cleanup_free char *why = NULL;
  {
    /* First: a dead server's frozen tasks thawed, so that the sweeps below can kill them. */
    cleanup_free char *mp = NULL, *root = NULL, *own = NULL, *dir = NULL;
    if (sbx_cgroup_find_mount(mountinfo, mi_len, "freezer", &mp, &root) == 0 &&
        (own = sbx_cgroup_own_path(self, self_len, "freezer")) &&
        (dir = sbx_cgroup_dir(mp, root, own)))
      thaw_stale(dir);
  }
  for (size_t i = 0; i < CM_ARRAY_SIZE(cg_names); i++) {
    cleanup_free char *mp = NULL, *root = NULL, *own = NULL, *dir = NULL;
    if (sbx_cgroup_find_mount(mountinfo, mi_len, cg_names[i].name, &mp, &root) < 0) continue;
    own = sbx_cgroup_own_path(self, self_len, cg_names[i].name);
    dir = own ? sbx_cgroup_dir(mp, root, own) : NULL;
    if (!dir) continue;
    size_t h;
    for (h = 0; h < cg->n_hier; h++) {
      if (strncmp(cg->hier[h].parent, dir, strlen(dir)) == 0 &&
          cg->hier[h].parent[strlen(dir)] == '/')
        break;
    }
    if (h < cg->n_hier) {
      cg->hier[h].controllers |= cg_names[i].bit;
    } else if (cg->n_hier < CG_MAX_HIER) {
      cm_error_t e = CM_ERROR_INIT;
      char *parent = make_parent(dir, &e);
      if (!parent) {
        free(why);
        why = xstrdup(cm_error_message(&e));
        cm_error_release(&e);
        continue;
      }
      cg->hier[cg->n_hier++] = (cg_hier_t){.parent = parent, .controllers = cg_names[i].bit};
    }
    cg->controllers |= cg_names[i].bit;
  }
  if (!(cg->controllers & (CG_MEMORY | CG_PIDS | CG_CPU)))
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "no writable memory, pids or cpu cgroup%s%s",
                        why ? ": " : "", why ? why : "");
  cg->version = 1;
  return 0;
}

static void cgroups_reset(sbx_cgroups_t *cg) {
  for (size_t i = 0; i < cg->n_hier; i++) {
    /* Left behind: the instance's record stays as the proof that a later sweep needs. */
    if (!remove_tree(cg->hier[i].parent)) sbx_instance_keep_record();
    free(cg->hier[i].parent);
  }
  cg->n_hier = 0;
  cg->controllers = 0;
  cg->version = 0;
}

static sbx_cgroups_t *cgroups_open(const char *setting, cm_error_t *err) {
  sbx_cgroups_t *cg = xcalloc(1, sizeof *cg);
  if (!setting || strcmp(setting, "off") == 0) {
    cg->reason = xstrdup("turned off (--cgroup off)");
    return cg;
  }
  if (strcmp(setting, "auto") != 0) {
    /* A directory the administrator delegated to us (cgroup v2 only): failing is fatal. */
    struct statfs sf;
    if (setting[0] != '/' || statfs(setting, &sf) < 0 || sf.f_type != CGROUP2_SUPER_MAGIC) {
      cm_error_set(err, 0, CM_ERR_INVALID,
                   "--cgroup %s: not a directory of a cgroup v2 file system", setting);
      sbx_cgroups_free(cg);
      return NULL;
    }
    if (setup_v2(cg, setting, false, err) < 0) {
      cm_error_wrap(err, "--cgroup %s", setting);
      sbx_cgroups_free(cg);
      return NULL;
    }
    return cg;
  }
  cleanup_free char *mountinfo = NULL, *self = NULL;
  size_t mi_len = 0, self_len = 0;
  if (cm_read_file("/proc/self/mountinfo", CG_PROC_FILE_MAX, &mountinfo, &mi_len, NULL) < 0 ||
      cm_read_file("/proc/self/cgroup", CG_PROC_FILE_MAX, &self, &self_len, NULL) < 0) {
    cg->reason = xstrdup("cannot read /proc/self/mountinfo or /proc/self/cgroup");
    return cg;
  }
  cm_error_t e2 = CM_ERROR_INIT, e1 = CM_ERROR_INIT;
  cleanup_free char *mp = NULL, *root = NULL, *own = NULL, *dir = NULL;
  if (sbx_cgroup_find_mount(mountinfo, mi_len, NULL, &mp, &root) == 0 &&
      (own = sbx_cgroup_own_path(self, self_len, NULL)) && (dir = sbx_cgroup_dir(mp, root, own))) {
    if (setup_v2(cg, dir, true, &e2) == 0) return cg;
    cgroups_reset(cg);
  } else {
    cm_error_set(&e2, 0, CM_ERR_UNAVAILABLE, "no cgroup v2 mount");
  }
  if (setup_v1(cg, mountinfo, mi_len, self, self_len, &e1) == 0) {
    cm_error_release(&e2);
    return cg;
  }
  cgroups_reset(cg);
  cg->reason = xasprintf("no delegated cgroup (v2: %s; v1: %s)", cm_error_message(&e2),
                         cm_error_message(&e1));
  cm_error_release(&e2);
  cm_error_release(&e1);
  return cg;
}

sbx_cgroups_t *sbx_cgroups_open(const char *setting, cm_error_t *err) {
  sbx_cgroups_t *cg = cgroups_open(setting, err);
  forget_swept();
  return cg;
}

bool sbx_cgroups_active(const sbx_cgroups_t *cg) {
  return cg && cg->version != 0;
}

char *sbx_cgroups_describe(const sbx_cgroups_t *cg) {
  if (!sbx_cgroups_active(cg))
    return xasprintf("not used: %s", cg && cg->reason ? cg->reason : "not set up");
  cm_buf_t b;
  cm_buf_init(&b, 0);
  cm_buf_printf(&b, "cgroup v%d (", cg->version);
  bool first = true;
  for (size_t i = 0; i < CM_ARRAY_SIZE(cg_names); i++) {
    if (!(cg->controllers & cg_names[i].bit)) continue;
    cm_buf_printf(&b, "%s%s", first ? "" : ", ", cg_names[i].name);
    first = false;
  }
  if (first) cm_buf_appends(&b, "no controllers: the tree is tracked and killed, not limited");
  cm_buf_printf(&b, ") under %s", cg->hier[0].parent);
  for (size_t i = 1; i < cg->n_hier; i++) cm_buf_printf(&b, ", %s", cg->hier[i].parent);
  return cm_buf_steal(&b);
}

bool sbx_cgroups_has(const sbx_cgroups_t *cg, const char *controller) {
  if (!sbx_cgroups_active(cg)) return false;
  for (size_t i = 0; i < CM_ARRAY_SIZE(cg_names); i++) {
    if (strcmp(cg_names[i].name, controller) == 0) return (cg->controllers & cg_names[i].bit) != 0;
  }
  return false;
}

static void retry_pending(sbx_cgroups_t *cg) {
  size_t kept = 0;
  for (size_t i = 0; i < cg->n_pending; i++) {
    if (rmdir(cg->pending[i]) == 0 || errno == ENOENT)
      free(cg->pending[i]);
    else
      cg->pending[kept++] = cg->pending[i];
  }
  cg->n_pending = kept;
}

void sbx_cgroups_set_loop(sbx_cgroups_t *cg, cm_loop_t *loop) {
  cg->loop = loop;
}

size_t sbx_cgroups_pending(const sbx_cgroups_t *cg) {
  return cg ? cg->n_pending : 0;
}

/* Killed processes take a moment to leave their cgroup (a pid namespace is torn down after
 * its init is reaped): retry the removal a few times a second for up to 10 s. */
static void on_retry(cm_loop_t *loop, cm_timer_t *t, void *data) {
  sbx_cgroups_t *cg = data;
  cg->retry = NULL;
  retry_pending(cg);
  if (!cg->n_pending) {
    cg->retries = 0;
    return;
  }
  if (++cg->retries < 500) {
    cg->retry = cm_loop_timer(loop, 20, on_retry, cg);
  } else {
    cm_warn("%zu run cgroups stay busy; leaving them", cg->n_pending);
    for (size_t i = 0; i < cg->n_pending; i++) free(cg->pending[i]);
    cg->n_pending = 0;
    cg->retries = 0;
  }
}

void sbx_cgroups_free(sbx_cgroups_t *cg) {
  if (!cg) return;
  cm_bg_flush(); /* the runs' directories, removed in the background, go first */
  cm_timer_cancel(cg->retry);
  /* Processes killed at the end of their runs may take a moment to leave. */
  for (int i = 0; i < 100 && cg->n_pending; i++) {
    retry_pending(cg);
    if (cg->n_pending) usleep(10000);
  }
  for (size_t i = 0; i < cg->n_pending; i++) free(cg->pending[i]);
  free(cg->pending);
  cgroups_reset(cg);
  free(cg->reason);
  free(cg);
}

/* ---------------------------------------------------------------- runs */

static int apply_limits(const sbx_cgroups_t *cg, const char *dir, unsigned controllers,
                        const sbx_limits_t *l, cm_error_t *err) {
  char v[64];
  if ((controllers & CG_MEMORY) && l->memory_bytes) {
    snprintf(v, sizeof v, "%llu", (unsigned long long)l->memory_bytes);
    if (cg->version == 2) {
      if (cg_write(dir, "memory.max", v, err) < 0) return -1;
      /* No swap: the limit is the memory the tree may use, not a hint. */
      if (cg_exists(dir, "memory.swap.max") && cg_write(dir, "memory.swap.max", "0", err) < 0)
        return -1;
    } else {
      if (cg_write(dir, "memory.limit_in_bytes", v, err) < 0) return -1;
      if (cg_exists(dir, "memory.memsw.limit_in_bytes") &&
          cg_write(dir, "memory.memsw.limit_in_bytes", v, err) < 0)
        return -1;
    }
  }
  if ((controllers & CG_PIDS) && l->max_processes) {
    snprintf(v, sizeof v, "%llu", (unsigned long long)l->max_processes);
    if (cg_write(dir, "pids.max", v, err) < 0) return -1;
  }
  if ((controllers & CG_CPU) && l->cpu_millis) {
    unsigned long long quota = (unsigned long long)l->cpu_millis * CG_CPU_PERIOD_US / 1000;
    if (quota < 1000) quota = 1000; /* the kernel's minimum is 1 ms */
    if (cg->version == 2) {
      snprintf(v, sizeof v, "%llu %llu", quota, CG_CPU_PERIOD_US);
      if (cg_write(dir, "cpu.max", v, err) < 0) return -1;
    } else {
      snprintf(v, sizeof v, "%llu", CG_CPU_PERIOD_US);
      if (cg_write(dir, "cpu.cfs_period_us", v, err) < 0) return -1;
      snprintf(v, sizeof v, "%llu", quota);
      if (cg_write(dir, "cpu.cfs_quota_us", v, err) < 0) return -1;
    }
  }
  return 0;
}

int sbx_cgroup_run_new(sbx_cgroups_t *cg, const sbx_limits_t *limits, sbx_cgroup_run_t **out,
                       cm_error_t *err) {
  *out = NULL;
  retry_pending(cg);
  sbx_cgroup_run_t *r = xcalloc(1, sizeof *r);
  r->cg = cg;
  r->dir_fd = -1;
  uint64_t seq = ++cg->seq;
  for (size_t i = 0; i < CG_MAX_HIER; i++) r->join_fds[i] = -1;
  for (size_t i = 0; i < cg->n_hier; i++) {
    unsigned ctl = cg->hier[i].controllers;
    /* v1: a CPU hierarchy with no CPU limit to set would only cost a directory and a
     * migration per run. */
    if (cg->version == 1 && !(ctl & (CG_MEMORY | CG_PIDS)) &&
        !((ctl & CG_CPU) && limits->cpu_millis) && !((ctl & CG_FREEZER) && limits->freezable))
      continue;
    size_t k = r->n++;
    r->controllers[k] = ctl;
    r->dirs[k] = xasprintf("%s/run-%llu", cg->hier[i].parent, (unsigned long long)seq);
    if (mkdir(r->dirs[k], 0755) < 0) {
      cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "cannot create the run's cgroup %s", r->dirs[k]);
      free(r->dirs[k]);
      r->n--;
      goto fail;
    }
    if (apply_limits(cg, r->dirs[k], ctl, limits, err) < 0) goto fail;
    cleanup_free char *procs = xasprintf("%s/cgroup.procs", r->dirs[k]);
    r->join_fds[k] = open(procs, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (r->join_fds[k] < 0) {
      cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "open %s", procs);
      goto fail;
    }
  }
  if (cg->version == 2) {
    r->dir_fd = open(r->dirs[0], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (r->dir_fd < 0) {
      cm_error_set(err, errno, CM_ERR_UNAVAILABLE, "open %s", r->dirs[0]);
      goto fail;
    }
  }
  *out = r;
  return 0;
fail:
  cm_error_wrap(err, "setting up the run's cgroup");
  sbx_cgroup_run_free(r);
  return -1;
}

size_t sbx_cgroup_run_join_fds(const sbx_cgroup_run_t *r, const int **fds, int *dir_fd) {
  *fds = r->join_fds;
  *dir_fd = r->dir_fd;
  return r->n;
}

void sbx_cgroup_run_spawned(sbx_cgroup_run_t *r) {
  if (!r) return;
  if (r->dir_fd >= 0) close(r->dir_fd);
  r->dir_fd = -1;
  for (size_t i = 0; i < r->n; i++) {
    if (r->join_fds[i] >= 0) close(r->join_fds[i]);
    r->join_fds[i] = -1;
  }
}

static const char *dir_with(const sbx_cgroup_run_t *r, unsigned bit) {
  for (size_t i = 0; i < r->n; i++) {
    if (r->controllers[i] & bit) return r->dirs[i];
  }
  return NULL;
}

void sbx_cgroup_run_kill(sbx_cgroup_run_t *r) {
  if (!r || r->killed) return;
  /* Every hierarchy holds every process of the run: one is enough. */
  if (r->n) kill_members(r->dirs[0], r->cg->version);
  r->killed = true;
  /* A v1 frozen task takes its SIGKILL only once thawed. */
  if (r->frozen) sbx_cgroup_run_freeze(r, false, NULL);
}

int sbx_cgroup_run_freeze(sbx_cgroup_run_t *r, bool frozen, cm_error_t *err) {
  if (!r || !r->n) return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "the run has no cgroup of ours");
  int rc;
  if (r->cg->version == 2) {
    rc = cg_write(r->dirs[0], "cgroup.freeze", frozen ? "1" : "0", err);
  } else {
    const char *dir = dir_with(r, CG_FREEZER);
    if (!dir)
      return cm_error_set(err, 0, CM_ERR_UNAVAILABLE,
                          "no cgroup v1 freezer hierarchy the server can write");
    rc = cg_write(dir, "freezer.state", frozen ? "FROZEN" : "THAWED", err);
  }
  if (rc == 0) r->frozen = frozen;
  return rc;
}

void sbx_cgroup_run_collect(const sbx_cgroup_run_t *r, sbx_result_t *res) {
  if (!r) return;
  res->cgroup = true;
  const char *mem = dir_with(r, CG_MEMORY), *pids = dir_with(r, CG_PIDS);
  uint64_t v = 0;
  if (r->cg->version == 2) {
    if (mem && read_u64(mem, "memory.peak", &v)) res->memory_peak_bytes = v;
    if (mem && read_keyed(mem, "memory.events", "oom_kill", &v) && v > 0) res->memory_limit = true;
    if (r->n && read_keyed(r->dirs[0], "cpu.stat", "usage_usec", &v)) res->cgroup_cpu_us = v;
  } else {
    const char *acct = dir_with(r, CG_CPUACCT);
    if (mem && read_u64(mem, "memory.max_usage_in_bytes", &v)) res->memory_peak_bytes = v;
    if (mem && read_keyed(mem, "memory.oom_control", "oom_kill", &v) && v > 0)
      res->memory_limit = true;
    if (acct && read_u64(acct, "cpuacct.usage", &v)) res->cgroup_cpu_us = v / 1000;
  }
  if (pids && read_keyed(pids, "pids.events", "max", &v) && v > 0) res->process_limit = true;
}

void sbx_cgroup_run_events(const sbx_cgroup_run_t *r, sbx_run_events_t *ev) {
  *ev = (sbx_run_events_t){0};
  if (!r) return;
  const char *mem = dir_with(r, CG_MEMORY), *pids = dir_with(r, CG_PIDS);
  uint64_t v = 0;
  ev->known = true;
  if (mem &&
      read_keyed(mem, r->cg->version == 2 ? "memory.events" : "memory.oom_control", "oom_kill", &v))
    ev->oom_kills = v;
  if (pids && read_keyed(pids, "pids.events", "max", &v)) ev->forks_refused = v;
}

/* The background job that removes a finished run's directories (see cm_bg_run): a cgroup
 * v1 rmdir waits for an RCU grace period.  Killed processes may take a moment to leave. */
typedef struct cg_rmdir_job {
  char *dirs[CG_MAX_HIER];
  size_t n;
} cg_rmdir_job_t;

static void cg_rmdir_job(void *data) {
  cg_rmdir_job_t *j = data;
  for (size_t i = 0; i < j->n; i++) {
    int tries = 0;
    while (rmdir(j->dirs[i]) < 0 && errno == EBUSY && ++tries < 200) usleep(10000);
    if (tries == 200) cm_warn("cgroup %s is still busy; leaving it", j->dirs[i]);
    free(j->dirs[i]);
  }
  free(j);
}

void sbx_cgroup_run_free(sbx_cgroup_run_t *r) {
  if (!r) return;
  sbx_cgroup_run_kill(r);
  if (r->dir_fd >= 0) close(r->dir_fd);
  for (size_t i = 0; i < r->n; i++)
    if (r->join_fds[i] >= 0) close(r->join_fds[i]);
  cg_rmdir_job_t *job = xcalloc(1, sizeof *job);
  memcpy(job->dirs, r->dirs, r->n * sizeof *r->dirs);
  job->n = r->n;
  if (cm_bg_run(cg_rmdir_job, job)) {
    free(r);
    return;
  }
  free(job);
  for (size_t i = 0; i < r->n; i++) {
    if (rmdir(r->dirs[i]) == 0 || errno == ENOENT) {
      free(r->dirs[i]);
      continue;
    }
    /* Killed processes still leaving: removed later (a bounded list; beyond it, the
     * directory stays until the server exits or the next server sweeps it). */
    if (r->cg->n_pending >= 1024) {
      cm_warn("cgroup %s is still busy; leaving it", r->dirs[i]);
      free(r->dirs[i]);
      continue;
    }
    r->cg->pending = xrealloc(r->cg->pending, (r->cg->n_pending + 1) * sizeof *r->cg->pending);
    r->cg->pending[r->cg->n_pending++] = r->dirs[i];
  }
  if (r->cg->n_pending && !r->cg->retry && r->cg->loop)
    r->cg->retry = cm_loop_timer(r->cg->loop, 5, on_retry, r->cg);
  free(r);
}
