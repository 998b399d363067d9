/* The copy of a finished environment out of its build's space into a tree the server owns
 * (runs in a child: sbx_call). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>

#include "envstore/envstore-internal.h"

static int copy_charge(env_copy_t *c, uint64_t bytes, const char *rel, cm_error_t *err) {
  uint64_t rounded = (bytes + ENV_BLOCK - 1) / ENV_BLOCK * ENV_BLOCK;
  c->total += CM_MAX(rounded, ENV_BLOCK);
  if (c->total > c->max_bytes)
    return cm_error_set(err, 0, CM_ERR_LIMIT,
                        "the environment is larger than %llu bytes (--max-build-bytes) at %s",
                        (unsigned long long)c->max_bytes, rel);
  return 0;
}

/* Rewrites the build-time path of the environment into its final one in a small text file
 * of bin/ (console scripts' shebangs), when the backend runs installers at host paths. */
static char *relocated(const env_copy_t *c, const char *text, size_t len, size_t *out_len) {
  size_t from_len = strlen(c->reloc_from);
  if (memchr(text, '\0', len) || !memmem(text, len, c->reloc_from, from_len)) return NULL;
  cm_buf_t out;
  cm_buf_init(&out, 0);
  const char *cur = text, *end = text + len, *hit;
  while ((hit = memmem(cur, (size_t)(end - cur), c->reloc_from, from_len))) {
    cm_buf_append(&out, cur, (size_t)(hit - cur));
    cm_buf_appends(&out, c->reloc_to);
    cur = hit + from_len;
  }
  cm_buf_append(&out, cur, (size_t)(end - cur));
  *out_len = out.len;
  return cm_buf_steal(&out);
}

static int copy_file(env_copy_t *c, int src_dir, int dst_dir, const char *name,
                     const struct stat *lst, bool in_bin, const char *rel, cm_error_t *err) {
  struct stat st;
  cleanup_close int in =
      cm_open_regular_at(src_dir, name, O_RDONLY, CM_ANY_OWNER, c->max_bytes, &st, err);
  if (in < 0) return cm_error_wrap(err, "copying %s", rel);
  if (st.st_ino != lst->st_ino || st.st_dev != lst->st_dev)
    return cm_error_set(err, 0, CM_ERR_INVALID, "%s changed while it was copied", rel);
  if (copy_charge(c, (uint64_t)st.st_size, rel, err) < 0) return -1;
  mode_t mode = (st.st_mode & 0111) ? 0755 : 0644; /* readable by every run; no set-id bits */
  cleanup_close int out =
      openat(dst_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (out < 0) return cm_error_set(err, errno, CM_ERR_IO, "creating %s", rel);
  bool relocate = c->reloc_from && in_bin && (uint64_t)st.st_size <= ENV_RELOCATE_MAX;
  cm_buf_t whole;
  cm_buf_init(&whole, relocate ? ENV_RELOCATE_MAX + 1 : 0);
  char buf[65536];
  uint64_t copied = 0;
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      cm_buf_release(&whole);
      return cm_error_set(err, errno, CM_ERR_IO, "reading %s", rel);
    }
    if (n == 0) break;
    copied += (uint64_t)n;
    if (copied > (uint64_t)st.st_size) {
      cm_buf_release(&whole);
      return cm_error_set(err, 0, CM_ERR_INVALID, "%s grew while it was copied", rel);
    }
    if (relocate) {
      cm_buf_append(&whole, buf, (size_t)n);
    } else if (cm_write_all(out, buf, (size_t)n) < 0) {
      return cm_error_set(err, errno, CM_ERR_IO, "writing %s", rel);
    }
  }
  if (relocate) {
    size_t new_len = 0;
    cleanup_free char *moved = relocated(c, whole.data ? whole.data : "", whole.len, &new_len);
    int rc = moved ? cm_write_all(out, moved, new_len)
                   : cm_write_all(out, whole.data ? whole.data : "", whole.len);
    cm_buf_release(&whole);
    if (rc < 0) return cm_error_set(err, errno, CM_ERR_IO, "writing %s", rel);
  }
  if (fchmod(out, mode) < 0) return cm_error_set(err, errno, CM_ERR_IO, "chmod %s", rel);
  /* The installers' byte-code caches are checked against their sources' mtimes. */
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  (void)futimens(out, times);
  return 0;
}

static int copy_tree(env_copy_t *c, int src, int dst, int depth, const char *rel, cm_error_t *err) {
  if (depth > ENV_COPY_DEPTH_MAX)
    return cm_error_set(err, 0, CM_ERR_LIMIT,
                        "the environment is nested deeper than %d directories at %s",
                        ENV_COPY_DEPTH_MAX, rel);
  DIR *d = env_list_dir(src);
  if (!d) return cm_error_set(err, errno, CM_ERR_IO, "listing %s", rel);
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    cleanup_free char *path = xasprintf("%s/%s", rel, e->d_name);
    if (depth == 0 && strcmp(e->d_name, ENV_MANIFEST) == 0) {
      rc = cm_error_set(err, 0, CM_ERR_INVALID,
                        "the build made %s itself (a name the server keeps for its own)", path);
      break;
    }
    struct stat st;
    if (fstatat(src, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      rc = cm_error_set(err, errno, CM_ERR_IO, "stat %s", path);
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      if ((rc = copy_charge(c, 0, path, err)) < 0) break;
      if (mkdirat(dst, e->d_name, 0700) < 0) {
        rc = cm_error_set(err, errno, CM_ERR_IO, "creating %s", path);
        break;
      }
      cleanup_close int sub_src = cm_open_dir_at(src, e->d_name, err);
      cleanup_close int sub_dst = sub_src < 0 ? -1 : cm_open_dir_at(dst, e->d_name, err);
      if (sub_dst < 0) {
        rc = cm_error_wrap(err, "copying %s", path);
        break;
      }
      rc = copy_tree(c, sub_src, sub_dst, depth + 1, path, err);
      if (rc == 0 && fchmod(sub_dst, 0755) < 0)
        rc = cm_error_set(err, errno, CM_ERR_IO, "chmod %s", path);
      if (rc == 0) {
        struct timespec times[2] = {st.st_atim, st.st_mtim};
        (void)futimens(sub_dst, times);
      }
    } else if (S_ISREG(st.st_mode)) {
      rc = copy_file(c, src, dst, e->d_name, &st, depth == 1 && strcmp(rel, "./bin") == 0, path,
                     err);
    } else if (S_ISLNK(st.st_mode)) {
      /* Copied as it is, never followed: a run resolves it inside its own sandbox. */
      char target[PATH_MAX];
      ssize_t n = readlinkat(src, e->d_name, target, sizeof target);
      if (n < 0 || (size_t)n >= sizeof target) {
        rc = cm_error_set(err, n < 0 ? errno : ENAMETOOLONG, CM_ERR_IO, "reading the symlink %s",
                          path);
        break;
      }
      target[n] = '\0';
      if ((rc = copy_charge(c, (uint64_t)n, path, err)) < 0) break;
      if (symlinkat(target, dst, e->d_name) < 0)
        rc = cm_error_set(err, errno, CM_ERR_IO, "creating %s", path);
    } else {
      rc = cm_error_set(
          err, 0, CM_ERR_INVALID,
          "the build left %s at %s: a FIFO, socket or device is never part of an environment",
          S_ISFIFO(st.st_mode)   ? "a FIFO"
          : S_ISSOCK(st.st_mode) ? "a socket"
                                 : "a device node",
          path);
    }
  }
  closedir(d);
  return rc;
}

/* Runs in a child: the environment out of the space into a new directory of the server's. */
int env_copy_run(void *arg, cm_buf_t *out, cm_error_t *err) {
  env_copy_t *c = arg;
  struct stat st;
  if (fstatat(c->src_fd, ENV_MANIFEST, &st, AT_SYMLINK_NOFOLLOW) == 0)
    return cm_error_set(err, 0, CM_ERR_INVALID,
                        "the build made %s itself (%s; the name is the server's own)", ENV_MANIFEST,
                        S_ISLNK(st.st_mode)    ? "a symlink"
                        : S_ISFIFO(st.st_mode) ? "a FIFO"
                        : S_ISREG(st.st_mode)  ? "a file"
                                               : "not a regular file");
  if (mkdirat(c->dst_parent_fd, c->dst_name, 0700) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "creating %s", c->dst_name);
  int rc = -1;
  int dst = cm_open_dir_at(c->dst_parent_fd, c->dst_name, err);
  if (dst >= 0) {
    rc = copy_tree(c, c->src_fd, dst, 0, ".", err);
    if (rc == 0 && fchmod(dst, 0755) < 0)
      rc = cm_error_set(err, errno, CM_ERR_IO, "chmod %s", c->dst_name);
    close(dst);
  }
  if (rc < 0) {
    cm_error_t rm = CM_ERROR_INIT;
    cm_rm_rf_at(c->dst_parent_fd, c->dst_name, &rm);
    cm_error_release(&rm);
    return -1;
  }
  cm_buf_printf(out, "%llu", (unsigned long long)c->total);
  return 0;
}
