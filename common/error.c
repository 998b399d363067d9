#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include "common/cm.h"

int cm_error_set(cm_error_t *err, int errnum, cm_error_kind_t kind, const char *fmt, ...) {
  if (err == NULL) return -1;
  va_list ap;
  va_start(ap, fmt);
  char *msg = xvasprintf(fmt, ap);
  va_end(ap);
  if (errnum != 0) {
    char *full = xasprintf("%s: %s", msg, strerror(errnum));
    free(msg);
    msg = full;
  }
  free(err->msg);
  err->msg = msg;
  err->errnum = errnum;
  err->kind = kind == CM_ERR_NONE ? CM_ERR_INTERNAL : kind;
  return -1;
}

int cm_error_wrap(cm_error_t *err, const char *fmt, ...) {
  if (err == NULL) return -1;
  va_list ap;
  va_start(ap, fmt);
  char *ctx = xvasprintf(fmt, ap);
  va_end(ap);
  char *full = xasprintf("%s: %s", ctx, err->msg ? err->msg : "unknown error");
  free(ctx);
  free(err->msg);
  err->msg = full;
  if (err->kind == CM_ERR_NONE) err->kind = CM_ERR_INTERNAL;
  return -1;
}

void cm_error_release(cm_error_t *err) {
  if (err == NULL) return;
  free(err->msg);
  err->msg = NULL;
  err->errnum = 0;
  err->kind = CM_ERR_NONE;
}

const char *cm_error_message(const cm_error_t *err) {
  if (err == NULL || err->msg == NULL) return "unknown error";
  return err->msg;
}

void cm_cleanup_error(cm_error_t *err) {
  cm_error_release(err);
}

void cm_cleanup_pidp(int *pid) {
  if (*pid <= 0) return;
  kill(-*pid, SIGKILL);
  kill(*pid, SIGKILL);
  while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR) {
  }
  *pid = -1;
}

void cm_cleanup_freep(void *p) {
  void **pp = (void **)p;
  free(*pp);
  *pp = NULL;
}

void cm_cleanup_closep(int *fd) {
  if (*fd >= 0) {
    int saved = errno;
    close(*fd);
    errno = saved;
  }
  *fd = -1;
}

void cm_cleanup_fclosep(void *p) {
  FILE **f = (FILE **)p;
  if (*f) fclose(*f);
  *f = NULL;
}

void cm_cleanup_strvp(void *p) {
  char ***v = (char ***)p;
  cm_strv_free(*v);
  *v = NULL;
}
