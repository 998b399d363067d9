/* The start-up runner (profiles/runner.py): finding it, and its bytecode cache. */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "server/exec/exec-internal.h"

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

char *exec_find_runner(char **why) {
  *why = NULL;
  char *found = NULL;
  const char *env = getenv("MPS_RUNNER");
  if (env && *env) {
    char *real = realpath(env, NULL);
    if (real && runner_safe(real, why))
      found = real;
    else
      free(real);
    if (!found && !*why) *why = xasprintf("%s (MPS_RUNNER): %s", env, strerror(errno));
    return found;
  }
  cleanup_free char *self = realpath("/proc/self/exe", NULL);
  char *slash = self ? strrchr(self, '/') : NULL;
  if (slash) *slash = '\0';
  /* Installed first (relative to the binary, so the tree can move), then a build directory,
   * then the source tree of one. */
  const char *candidates[] = {
      "/" MPS_REL_DATADIR "/runner/" FILES_RUNNER_NAME,
      "/mps-runner/" FILES_RUNNER_NAME,
      "/../profiles/" FILES_RUNNER_NAME,
  };
  for (size_t i = 0; self && i < CM_ARRAY_SIZE(candidates) && !found && !*why; i++) {
    cleanup_free char *c = xasprintf("%s%s", self, candidates[i]);
    char *real = realpath(c, NULL);
    if (real && runner_safe(real, why))
      found = real;
    else
      free(real);
  }
  if (!found && !*why)
    *why = xasprintf("%s was not found next to %s (set MPS_RUNNER)",
                     "mps-runner/" FILES_RUNNER_NAME, self ? self : "the binary");
  return found;
}

const char *exec_runner_path(exec_state_t *x) {
  if (x->runner_searched) return x->runner;
  x->runner_searched = true;
  cleanup_free char *why = NULL;
  char *found = exec_find_runner(&why);
  if (!found)
    cm_warn("the start-up runner is not used, so open matplotlib figures are not saved: %s", why);
  x->runner = found;
  return found;
}

/* ---------------------------------------------------------------- the runner's bytecode */

/* A run starts through the start-up runner (profiles/runner.py), and compiling it costs
 * every call about a millisecond.  So each interpreter compiles it once, in the background
 * (py_compile, run by that interpreter on the host backend), into <state>/runner/, which
 * runs then mount in its place and start as a .pyc.  Until that is done, or if it fails,
 * runs use runner.py itself.  The name carries the interpreter and the runner's size and
 * mtime, so an upgrade of either compiles anew. */
struct runner_pyc {
  runner_pyc_t *next;
  exec_state_t *exec;
  char *name; /* runner-<implementation>-<version>-<size>-<mtime>.pyc */
  bool ready, failed;
  sbx_run_t *run; /* compiling */
};

char *exec_runner_pyc_dir(exec_state_t *x) {
  return xasprintf("%s/runner", srv_server_state_dir(x->server));
}

static void runner_pyc_done(void *data, const sbx_result_t *res) {
  runner_pyc_t *rp = data;
  sbx_run_free(rp->run);
  rp->run = NULL;
  cleanup_free char *dir = exec_runner_pyc_dir(rp->exec);
  cleanup_free char *tmp = xasprintf("%s/.%s.tmp", dir, rp->name);
  cleanup_free char *dst = xasprintf("%s/%s", dir, rp->name);
  if (res->exit_code == 0 && !res->timed_out && chmod(tmp, 0644) == 0 && rename(tmp, dst) == 0) {
    rp->ready = true;
    return;
  }
  cm_debug("compiling the start-up runner for %s failed (exit %d); runs use runner.py", rp->name,
           res->exit_code);
  unlink(tmp);
  rp->failed = true;
}

static void runner_pyc_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {}

const char *exec_runner_pyc_for(exec_state_t *x, const py_interp_t *py, const char *runner) {
  srv_server_t *s = x->server;
  struct stat st;
  if (!runner || stat(runner, &st) < 0) return NULL;
  cleanup_free char *name = xasprintf("runner-%s-%s-%lld-%lld.pyc", py->implementation, py->version,
                                      (long long)st.st_size, (long long)st.st_mtime);
  for (char *c = name; *c; c++)
    if (*c == '/') *c = '_';
  runner_pyc_t *rp;
  for (rp = x->runner_pycs; rp; rp = rp->next) {
    if (strcmp(rp->name, name) == 0) break;
  }
  if (rp) return rp->ready ? rp->name : NULL;
  rp = xcalloc(1, sizeof *rp);
  rp->exec = x;
  rp->name = steal_pointer(&name);
  rp->next = x->runner_pycs;
  x->runner_pycs = rp;
  cleanup_free char *dir = exec_runner_pyc_dir(x);
  cleanup_free char *dst = xasprintf("%s/%s", dir, rp->name);
  cm_error_t err = CM_ERROR_INIT;
  if (cm_mkdir_p(dir, 0755, &err) < 0 || chmod(dir, 0755) < 0) {
    cm_error_release(&err);
    rp->failed = true;
    return NULL;
  }
  if (stat(dst, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
    rp->ready = true; /* compiled by an earlier server */
    return rp->name;
  }
  cleanup_free char *tmp = xasprintf("%s/.%s.tmp", dir, rp->name);
  cleanup_free char *src = xstrdup(runner);
  char *argv[] = {py->executable,
                  "-I",
                  "-c",
                  "import py_compile, sys\n"
                  "py_compile.compile(sys.argv[1], cfile=sys.argv[2], dfile='" EXEC_RUNNER_TARGET
                  "/runner.py', "
                  "doraise=True)",
                  src,
                  tmp,
                  NULL};
  char *envp[] = {"PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8", NULL};
  sbx_spec_t spec = {.argv = argv,
                     .envp = envp,
                     .workdir = dir,
                     .limits = {.timeout_ms = 60000, .grace_ms = 1000}};
  sbx_run_callbacks_t cbs = {.on_output = runner_pyc_output, .on_exit = runner_pyc_done};
  if (sbx_run_start(srv_server_loop(s), srv_server_host_backend(s), &spec, &cbs, rp, &rp->run,
                    &err) < 0) {
    cm_debug("compiling the start-up runner: %s", cm_error_message(&err));
    cm_error_release(&err);
    rp->failed = true;
  }
  return NULL;
}

void exec_runner_release(exec_state_t *x) {
  while (x->runner_pycs) {
    runner_pyc_t *rp = x->runner_pycs;
    x->runner_pycs = rp->next;
    if (rp->run) sbx_run_free(rp->run);
    free(rp->name);
    free(rp);
  }
  free(x->runner);
  x->runner = NULL;
  x->runner_searched = false;
}
