/* Finding the start-up runner (profiles/runner.py). */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "server/srv.h"


/* ---------------------------------------------------------------- the runner */

#define FILES_RUNNER_NAME "runner.py"

static bool runner_safe(const char *path, char **why) {
  struct stat st;
  if (stat(path, &st) < 0 || !S_ISREG(st.st_mode)) {
    *why = xasprintf("%s is not a readable file", path);
    return false;
  }
  if (geteuid() != 0) return true;
  /* A root server hands this file to every script: whoever can change it can change
   * every run. */
  cleanup_free char *dir = xstrdup(path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  struct stat dst;
  if (st.st_uid != 0 || (st.st_mode & 022) || stat(*dir ? dir : "/", &dst) < 0 || dst.st_uid != 0 ||
      (dst.st_mode & 022)) {
    *why = xasprintf("%s and its directory must be owned by root and writable only by root", path);
    return false;
  }
  return true;
}

const char *files_runner_path(void) {
  static bool searched;
  static char *found;
  if (searched) return found;
  searched = true;
  cleanup_free char *why = NULL;
  const char *env = getenv("MPS_RUNNER");
  if (env && *env) {
    char *real = realpath(env, NULL);
    if (real && runner_safe(real, &why))
      found = real;
    else
      free(real);
    if (!found && !why) why = xasprintf("%s (MPS_RUNNER): %s", env, strerror(errno));
  } else {
    cleanup_free char *self = realpath("/proc/self/exe", NULL);
    char *slash = self ? strrchr(self, '/') : NULL;
    if (slash) *slash = '\0';
    const char *candidates[] = {
        "/mps-runner/" FILES_RUNNER_NAME,
        "/../share/mcp-python-exec-sandbox/runner/" FILES_RUNNER_NAME,
        "/../profiles/" FILES_RUNNER_NAME,
    };
    for (size_t i = 0; self && i < CM_ARRAY_SIZE(candidates) && !found && !why; i++) {
      cleanup_free char *c = xasprintf("%s%s", self, candidates[i]);
      char *real = realpath(c, NULL);
      if (real && runner_safe(real, &why))
        found = real;
      else
        free(real);
    }
    if (!found && !why)
      why = xasprintf("%s was not found next to %s (set MPS_RUNNER)",
                      "mps-runner/" FILES_RUNNER_NAME, self ? self : "the binary");
  }
  if (!found)
    cm_warn("the start-up runner is not used, so open matplotlib figures are not saved: %s", why);
  return found;
}
