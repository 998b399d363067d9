/* File operations inside directories a sandboxed process could have written (see cm.h:
 * "files a sandbox could have written").  The rules are the same everywhere: one path
 * component relative to a directory fd, never a symlink followed, never a blocking open
 * (O_NONBLOCK: a FIFO opens at once and is then refused, before any read or write), every
 * fd close-on-exec, and a file's type, owner and size checked on the open fd. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include "common/cm.h"

static bool name_ok(const char *name) {
  return name && *name && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static const char *type_name(mode_t m) {
  return S_ISDIR(m)                 ? "a directory"
         : S_ISLNK(m)               ? "a symlink"
         : S_ISFIFO(m)              ? "a FIFO"
         : S_ISSOCK(m)              ? "a socket"
         : S_ISCHR(m) || S_ISBLK(m) ? "a device"
                                    : "not a regular file";
}

int cm_open_dir_at(int dirfd, const char *name, cm_error_t *err) {
  if (!name_ok(name))
    return cm_error_set(err, EINVAL, CM_ERR_INVALID, "bad name '%s'", name ? name : "");
  /* O_DIRECTORY fails with ENOTDIR before a FIFO or device would be opened. */
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return cm_error_set(err, errno, errno == ENOENT ? CM_ERR_NOT_FOUND : CM_ERR_IO,
                        "open directory %s", name);
  return fd;
}

int cm_open_regular_at(int dirfd, const char *name, int flags, uid_t owner, uint64_t max_size,
                       struct stat *st, cm_error_t *err) {
  if (!name_ok(name))
    return cm_error_set(err, EINVAL, CM_ERR_INVALID, "bad name '%s'", name ? name : "");
  int fd = openat(dirfd, name, (flags & ~O_CREAT) | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    /* ELOOP: the name is a symlink (O_NOFOLLOW); ENXIO: a FIFO without a reader, opened
     * for writing. */
    if (e == ELOOP) return cm_error_set(err, 0, CM_ERR_INVALID, "%s is a symlink", name);
    if (e == ENXIO) return cm_error_set(err, 0, CM_ERR_INVALID, "%s is a FIFO or a socket", name);
    return cm_error_set(err, e, e == ENOENT ? CM_ERR_NOT_FOUND : CM_ERR_IO, "open %s", name);
  }
  struct stat sb;
  if (fstat(fd, &sb) < 0) {
    int e = errno;
    close(fd);
    return cm_error_set(err, e, CM_ERR_IO, "fstat %s", name);
  }
  const char *why = !S_ISREG(sb.st_mode)                          ? type_name(sb.st_mode)
                    : owner != CM_ANY_OWNER && sb.st_uid != owner ? "owned by someone else"
                    : (uint64_t)sb.st_size > max_size             ? "too large"
                                                                  : NULL;
  if (why) {
    close(fd);
    return cm_error_set(err, 0, CM_ERR_INVALID, "%s is %s", name, why);
  }
  /* Reads and writes of a regular file never block on O_NONBLOCK anyway; clear it so that
   * short writes cannot surprise a caller. */
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  if (st) *st = sb;
  return fd;
}

int cm_read_file_at(int dirfd, const char *name, uid_t owner, size_t max, char **out,
                    size_t *out_len, cm_error_t *err) {
  struct stat st;
  cleanup_close int fd = cm_open_regular_at(dirfd, name, O_RDONLY, owner, max, &st, err);
  if (fd < 0) return -1;
  char *buf = xmalloc((size_t)st.st_size + 1);
  size_t len = 0;
  while (len <= (size_t)st.st_size) {
    /* One byte more than fstat said, to notice a file that grew meanwhile. */
    ssize_t n = read(fd, buf + len, (size_t)st.st_size + 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      free(buf);
      return cm_error_set(err, e, CM_ERR_IO, "read %s", name);
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  if (len > (size_t)st.st_size) {
    free(buf);
    return cm_error_set(err, 0, CM_ERR_INVALID, "%s changed while it was read", name);
  }
  buf[len] = '\0';
  *out = buf;
  if (out_len) *out_len = len;
  return 0;
}

int cm_create_file_at(int dirfd, const char *name, const void *data, size_t len, mode_t mode,
                      cm_error_t *err) {
  if (!name_ok(name))
    return cm_error_set(err, EINVAL, CM_ERR_INVALID, "bad name '%s'", name ? name : "");
  /* O_EXCL: never an existing file, and (with O_CREAT) never through a symlink. */
  cleanup_close int fd =
      openat(dirfd, name,
             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, mode);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "create %s", name);
  if (cm_write_all(fd, data, len) < 0) {
    int e = errno;
    unlinkat(dirfd, name, 0);
    return cm_error_set(err, e, CM_ERR_IO, "write %s", name);
  }
  if (fchmod(fd, mode) < 0) return cm_error_set(err, errno, CM_ERR_IO, "chmod %s", name);
  return 0;
}

static int rm_tree_at(int parent_fd, const char *name, int depth) {
  if (depth > 512) return -1;
  if (unlinkat(parent_fd, name, 0) == 0 || errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) return -1;
  int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == EACCES && cm_chmod_dir_at(parent_fd, name, 0700) == 0)
    fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? 0 : -1;
  /* A directory a sandboxed process made unwritable or unsearchable must still go. */
  (void)fchmod(fd, 0700);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (rm_tree_at(dirfd(d), e->d_name, depth + 1) < 0) rc = -1;
  }
  closedir(d);
  if (unlinkat(parent_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT) rc = -1;
  return rc;
}

int cm_chmod_dir_at(int dirfd, const char *name, mode_t mode) {
  /* An O_PATH fd needs no permission on the directory itself (an unreadable one: opening it
   * to fchmod would fail), and chmod through its /proc link changes exactly that inode. */
  int fd = openat(dirfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int rc = chmod(path, mode);
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}

int cm_rm_rf_at(int dirfd, const char *name, cm_error_t *err) {
  if (!name_ok(name))
    return cm_error_set(err, EINVAL, CM_ERR_INVALID, "bad name '%s'", name ? name : "");
  if (rm_tree_at(dirfd, name, 0) < 0) return cm_error_set(err, errno, CM_ERR_IO, "remove %s", name);
  return 0;
}

/* The same removal from a path (not a directory a sandbox could have swapped under us: the
 * server's own), and the scope guard made of it.  Here rather than in util.c so that the
 * file operations call down into util.c and error.c, never back. */
int cm_rm_rf(const char *path, cm_error_t *err) {
  if (rm_tree_at(AT_FDCWD, path, 0) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "remove %s", path);
  return 0;
}

void cm_cleanup_rmtreep(void *p) {
  char **dir = (char **)p;
  if (!*dir) return;
  cm_error_t err = CM_ERROR_INIT;
  if (cm_rm_rf(*dir, &err) < 0) cm_warn("cleaning up: %s", cm_error_message(&err));
  cm_error_release(&err);
  free(*dir);
  *dir = NULL;
}
