/* Files out: the collection of outputs/ after a run, never following a symlink. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include "server/files/files-internal.h"

#define FILES_COPY_CHUNK 65536
/* Entries examined (directories included) per listed entry before collection stops. */
#define FILES_SCAN_FACTOR 4
#define FILES_SCAN_MIN 64

/* ---------------------------------------------------------------- collection */

typedef struct walk {
  const files_collect_limits_t *lim;
  files_collection_t *out;
  const char *dest_dir;
  int dest_fd;
  size_t scanned, scan_max;
  uint64_t inline_used;
  bool stop;
  char *chunk;
  cm_error_t *err;
  int rc;
} walk_t;

static files_output_t *add_entry(walk_t *w, const char *rel) {
  files_collection_t *c = w->out;
  if (c->n == c->cap) {
    c->cap = c->cap ? c->cap * 2 : 16;
    c->v = xrealloc(c->v, c->cap * sizeof *c->v);
  }
  files_output_t *e = &c->v[c->n++];
  memset(e, 0, sizeof *e);
  size_t len;
  /* A name the script chose: shown in results, link names and the MCP App, never raw. */
  e->path = cm_utf8_display(rel, strlen(rel), &len);
  return e;
}

static void skip_entry(walk_t *w, const char *rel, uint64_t size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void skip_entry(walk_t *w, const char *rel, uint64_t size, const char *fmt, ...) {
  files_output_t *e = add_entry(w, rel);
  e->how = FILES_SKIPPED;
  e->size = size;
  va_list ap;
  va_start(ap, fmt);
  cleanup_free char *reason = xvasprintf(fmt, ap);
  va_end(ap);
  e->reason = cm_utf8_display(reason, strlen(reason), NULL); /* (it may quote a name) */
}

static void set_note(walk_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_note(walk_t *w, const char *fmt, ...) {
  if (w->out->note) return;
  va_list ap;
  va_start(ap, fmt);
  w->out->note = xvasprintf(fmt, ap);
  va_end(ap);
}

static const char *kind_name(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

static bool name_ok(const char *name) {
  size_t n = strlen(name);
  if (!cm_utf8_valid(name, n)) return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) return false;
  return true;
}

static int dest_open(walk_t *w) {
  if (w->dest_fd >= 0) return 0;
  if (mkdir(w->dest_dir, 0700) < 0 && errno != EEXIST)
    return cm_error_set(w->err, errno, CM_ERR_IO, "creating %s", w->dest_dir);
  w->dest_fd = open(w->dest_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (w->dest_fd < 0) return cm_error_set(w->err, errno, CM_ERR_IO, "opening %s", w->dest_dir);
  return 0;
}

/* Copies one regular file into the store and decides how it is returned. */
static void collect_file(walk_t *w, int dfd, const char *name, const char *rel,
                         const struct stat *seen) {
  const files_collect_limits_t *lim = w->lim;
  files_collection_t *c = w->out;
  uint64_t room = lim->max_bytes > c->stored_bytes ? lim->max_bytes - c->stored_bytes : 0;
  if ((uint64_t)seen->st_size > room) {
    skip_entry(w, rel, (uint64_t)seen->st_size,
               "%llu bytes is more than what is left of this run's output budget (%llu of %llu "
               "bytes)",
               (unsigned long long)seen->st_size, (unsigned long long)room,
               (unsigned long long)lim->max_bytes);
    return;
  }
  cleanup_close int fd =
      openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    skip_entry(w, rel, (uint64_t)seen->st_size, "could not be opened: %s", strerror(errno));
    return;
  }
  if (!S_ISREG(st.st_mode) || st.st_ino != seen->st_ino || st.st_dev != seen->st_dev) {
    skip_entry(w, rel, 0, "changed while it was being collected");
    return;
  }
  if (dest_open(w) < 0) {
    w->rc = -1;
    w->stop = true;
    return;
  }
  char stored[32];
  snprintf(stored, sizeof stored, "%zu", c->stored_files);
  cleanup_close int out =
      openat(w->dest_fd, stored, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (out < 0) {
    cm_error_set(w->err, errno, CM_ERR_IO, "creating %s/%s", w->dest_dir, stored);
    w->rc = -1;
    w->stop = true;
    return;
  }
  /* Copy at most the size seen (a file that grows is cut there), keeping the head for
   * sniffing and the whole file when it is small enough to be inlined. */
  uint64_t limit = CM_MIN((uint64_t)st.st_size, room);
  uint64_t keep_max = CM_MAX(lim->inline_bytes, lim->inline_text_bytes);
  bool keep = limit <= keep_max;
  cm_buf_t data;
  cm_buf_init(&data, 0);
  char head[FILES_SNIFF_BYTES];
  size_t head_len = 0;
  uint64_t copied = 0;
  int read_errno = 0;
  while (copied < limit) {
    size_t want = (size_t)CM_MIN((uint64_t)FILES_COPY_CHUNK, limit - copied);
    ssize_t n = read(fd, w->chunk, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) read_errno = errno;
    if (n <= 0) break;
    if (head_len < sizeof head) {
      size_t h = CM_MIN(sizeof head - head_len, (size_t)n);
      memcpy(head + head_len, w->chunk, h);
      head_len += h;
    }
    if (keep) cm_buf_append(&data, w->chunk, (size_t)n);
    if (cm_write_all(out, w->chunk, (size_t)n) < 0) {
      int e = errno;
      cm_buf_release(&data);
      unlinkat(w->dest_fd, stored, 0);
      cm_error_set(w->err, e, CM_ERR_IO, "writing %s/%s", w->dest_dir, stored);
      w->rc = -1;
      w->stop = true;
      return;
    }
    copied += (uint64_t)n;
  }
  if (read_errno) {
    cm_buf_release(&data);
    unlinkat(w->dest_fd, stored, 0);
    skip_entry(w, rel, copied, "could not be read: %s", strerror(read_errno));
    return;
  }
  files_output_t *e = add_entry(w, rel);
  e->size = copied;
  e->stored = xstrdup(stored);
  c->stored_files++;
  c->stored_bytes += copied;
  e->is_text =
      keep ? files_is_text(data.data, data.len) : files_is_text(head, cm_utf8_clip(head, head_len));
  const char *base = strrchr(rel, '/');
  e->mime = files_sniff_mime(head, head_len, base ? base + 1 : rel, e->is_text);
  uint64_t inline_left =
      lim->inline_total > w->inline_used ? lim->inline_total - w->inline_used : 0;
  if (keep && copied <= inline_left && files_mime_is_image(e->mime) &&
      copied <= lim->inline_bytes) {
    e->how = FILES_IMAGE;
  } else if (keep && copied <= inline_left && e->is_text && copied <= lim->inline_text_bytes) {
    e->how = FILES_RESOURCE;
  } else {
    e->how = FILES_RESOURCE_LINK;
  }
  if (e->how != FILES_RESOURCE_LINK) {
    w->inline_used += copied;
    e->len = data.len;
    e->data = cm_buf_steal(&data);
  }
  cm_buf_release(&data);
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void walk_dir(walk_t *w, int dfd, const char *rel, unsigned depth) {
  const files_collect_limits_t *lim = w->lim;
  int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    skip_entry(w, rel, 0, "the directory could not be read: %s", strerror(errno));
    return;
  }
  /* Read no more names than could still be listed or examined (plus one, to know there
   * are more): a directory of 100 000 files costs a few hundred readdir entries. */
  size_t list_left = lim->max_entries > w->out->n ? lim->max_entries - w->out->n : 0;
  size_t scan_left = w->scan_max > w->scanned ? w->scan_max - w->scanned : 0;
  size_t want = CM_MIN(list_left, scan_left) + 1;
  char **names = NULL;
  size_t n = 0, cap = 0;
  bool more = false;
  struct dirent *ent;
  errno = 0;
  while ((ent = readdir(d))) {
    if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) continue;
    if (n == want) {
      more = true;
      break;
    }
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      names = xrealloc(names, cap * sizeof *names);
    }
    names[n++] = xstrdup(ent->d_name);
  }
  /* An empty directory leaves names NULL, which qsort must not be given. */
  if (n > 1) qsort(names, n, sizeof *names, cmp_names);
  for (size_t i = 0; i < n && !w->stop; i++) {
    const char *name = names[i];
    if (w->out->n >= lim->max_entries || w->scanned >= w->scan_max) {
      more = true;
      break;
    }
    w->scanned++;
    cleanup_free char *child = xasprintf("%s/%s", rel, name);
    if (!name_ok(name)) {
      skip_entry(w, child, 0, "the name is not valid UTF-8 or contains a control character");
      continue;
    }
    struct stat st;
    if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      skip_entry(w, child, 0, "could not be examined: %s", strerror(errno));
      continue;
    }
    if (S_ISLNK(st.st_mode)) {
      skip_entry(w, child, 0, "a symbolic link (links are never followed)");
    } else if (S_ISDIR(st.st_mode)) {
      if (depth + 1 > lim->max_depth) {
        skip_entry(w, child, 0, "a directory more than %u levels below %s/ (not collected)",
                   lim->max_depth, FILES_OUTPUTS_DIR);
        continue;
      }
      cleanup_close int sub =
          openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (sub < 0) {
        skip_entry(w, child, 0, "the directory could not be opened: %s", strerror(errno));
        continue;
      }
      walk_dir(w, sub, child, depth + 1);
    } else if (S_ISREG(st.st_mode)) {
      collect_file(w, dirfd(d), name, child, &st);
    } else {
      skip_entry(w, child, 0, "%s, not a regular file", kind_name(st.st_mode));
    }
  }
  if (more && !w->stop) {
    w->stop = true;
    set_note(w,
             "%s/ holds more than %zu entries; collection stopped there and the rest was skipped",
             FILES_OUTPUTS_DIR, lim->max_entries);
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  closedir(d);
}

int files_collect(int workdir_fd, const char *dest_dir, const files_collect_limits_t *lim,
                  files_collection_t *out, cm_error_t *err) {
  memset(out, 0, sizeof *out);
  cleanup_close int fd = openat(workdir_fd, FILES_OUTPUTS_DIR,
                                O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    walk_t w = {.out = out};
    if (errno == ELOOP || errno == ENOTDIR)
      skip_entry(&w, FILES_OUTPUTS_DIR, 0,
                 "not a directory (a symbolic link or a file); nothing was collected");
    else
      skip_entry(&w, FILES_OUTPUTS_DIR, 0, "could not be opened: %s", strerror(errno));
    return 0;
  }
  walk_t w = {
      .lim = lim,
      .out = out,
      .dest_dir = dest_dir,
      .dest_fd = -1,
      .scan_max = CM_MAX(lim->max_entries * FILES_SCAN_FACTOR, (size_t)FILES_SCAN_MIN),
      .chunk = xmalloc(FILES_COPY_CHUNK),
      .err = err,
  };
  walk_dir(&w, fd, FILES_OUTPUTS_DIR, 0);
  free(w.chunk);
  if (w.dest_fd >= 0) close(w.dest_fd);
  return w.rc;
}

void files_collection_release(files_collection_t *c) {
  for (size_t i = 0; i < c->n; i++) {
    files_output_t *e = &c->v[i];
    free(e->path);
    free(e->reason);
    free(e->data);
    free(e->stored);
    free(e->uri);
  }
  free(c->v);
  free(c->note);
  memset(c, 0, sizeof *c);
}
