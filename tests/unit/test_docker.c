/* The docker backend, driven through sbx_backend_probe(), ops->build() and sbx_run_start()
 * against a stand-in for the docker client (tests/fixtures/docker-standin): no Docker
 * engine runs on our machines.  The stand-in records every call (one JSON line each), and
 * emulates `version`, `image inspect`, `run` (the command runs on the host, in its own
 * session like a container outside the client's process group, and the stand-in does not
 * proxy signals), `kill` and `rm -f` by container name.
 *
 * When the real docker client is installed, the argv the backend builds is also handed to
 * it (pointed at a socket where no engine listens): it must fail only for want of an
 * engine, never on a flag. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "sandbox/sandbox-internal.h"

#define SYSTEM_PYTHON "/usr/bin/python3"
#define DEFAULT_IMAGE "mcp-python-exec-sandbox:py3.12"
#define SECRET_ENV_VALUE "hunter2-host-secret"
#define NO_ENGINE_HOST "unix:///nonexistent/mps-test-docker.sock"
#define STANDIN_FIXTURE MPS_SOURCE_DIR "/tests/fixtures/docker-standin"

static struct {
  sbx_backend_t *backend; /* probed against the stand-in */
  cm_loop_t *loop;
  char *root;        /* every file this test makes lives here */
  char *standin_dir; /* the stand-in's state: calls.jsonl, switches, containers/ */
  char *standin;
  int seq;
} g;

/* ---------------------------------------------------------------- files and switches */

static void write_text(const char *path, const char *text, mode_t mode) {
  cm_error_t err = CM_ERROR_INIT;
  if (cm_write_file(path, text, strlen(text), mode, &err) < 0) fail_msg("%s", err.msg);
}

static char *read_text(const char *path) {
  char *data = NULL;
  size_t len = 0;
  cm_error_t err = CM_ERROR_INIT;
  if (cm_read_file(path, 1 << 24, &data, &len, &err) < 0) {
    cm_error_release(&err);
    return NULL;
  }
  return data;
}

/* A file in the stand-in's directory that changes what it emulates. */
static void set_switch(const char *name, const char *content) {
  cleanup_free char *path = xasprintf("%s/%s", g.standin_dir, name);
  write_text(path, content ? content : "", 0644);
}

static void clear_switch(const char *name) {
  cleanup_free char *path = xasprintf("%s/%s", g.standin_dir, name);
  unlink(path);
}

static char *new_dir(const char *what) {
  char *dir = xasprintf("%s/%s-%d", g.root, what, ++g.seq);
  assert_int_equal(mkdir(dir, 0700), 0);
  return dir;
}

/* ---------------------------------------------------------------- recorded calls */

/* Every call the stand-in recorded so far: an array of {"argv": [...], "env": [...]}. */
static json_t *read_calls(void) {
  cleanup_free char *path = xasprintf("%s/calls.jsonl", g.standin_dir);
  cleanup_free char *text = read_text(path);
  json_t *calls = json_array();
  for (char *line = text, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    json_error_t jerr;
    json_t *call = json_loads(line, 0, &jerr);
    if (!call) fail_msg("bad line in calls.jsonl: %s", jerr.text);
    json_array_append_new(calls, call);
  }
  return calls;
}

/* Does the call's argv start with words (NULL-terminated)? */
static bool call_matches(json_t *call, const char *const *words) {
  json_t *argv = json_object_get(call, "argv");
  for (size_t i = 0; words[i]; i++) {
    const char *s = json_string_value(json_array_get(argv, i));
    if (!s || strcmp(s, words[i]) != 0) return false;
  }
  return true;
}

static int count_calls(const char *const *words) {
  json_t *calls = read_calls();
  int n = 0;
  size_t i;
  json_t *call;
  json_array_foreach(calls, i, call) n += call_matches(call, words);
  json_decref(calls);
  return n;
}

/* Waits up to timeout_ms for a call starting with words to be recorded. */
static bool wait_call(const char *const *words, int timeout_ms) {
  uint64_t deadline = cm_now_ms() + (uint64_t)timeout_ms;
  do {
    if (count_calls(words) > 0) return true;
    usleep(20000);
  } while (cm_now_ms() < deadline);
  return false;
}

static void clear_calls(void) {
  cleanup_free char *path = xasprintf("%s/calls.jsonl", g.standin_dir);
  unlink(path);
}

/* The value of FLAG (say "--name") in the last `run` the stand-in saw. */
static char *last_run_flag(const char *flag) {
  json_t *calls = read_calls();
  char *value = NULL;
  size_t i;
  json_t *call;
  json_array_foreach(calls, i, call) {
    static const char *const run[] = {"run", NULL};
    if (!call_matches(call, run)) continue;
    json_t *argv = json_object_get(call, "argv");
    for (size_t j = 0; j + 1 < json_array_size(argv); j++) {
      if (strcmp(json_string_value(json_array_get(argv, j)), flag) == 0) {
        free(value);
        value = xstrdup(json_string_value(json_array_get(argv, j + 1)));
      }
    }
  }
  json_decref(calls);
  assert_non_null(value);
  return value;
}

/* The container name of the last `run` the stand-in saw. */
static char *last_run_name(void) {
  return last_run_flag("--name");
}

/* The --user of the last `run` the stand-in saw ("UID:GID"). */
static char *last_run_user(void) {
  return last_run_flag("--user");
}

/* Where the per-run uids of a root server lie (sandbox/uids.c). */
static bool is_run_uid(unsigned uid) {
  return uid >= 2000000000u && uid < 2000000000u + (1u << 27);
}

/* The client's environment may hold only what it needs to reach the engine. */
static bool cli_env_name_ok(const char *name) {
  static const char *const allowed[] = {"DOCKER_HOST",
                                        "DOCKER_CONTEXT",
                                        "DOCKER_CONFIG",
                                        "DOCKER_CERT_PATH",
                                        "DOCKER_TLS_VERIFY",
                                        "DOCKER_TLS",
                                        "DOCKER_API_VERSION",
                                        "HOME",
                                        "PATH",
                                        "XDG_RUNTIME_DIR"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(allowed); i++)
    if (strcmp(name, allowed[i]) == 0) return true;
  return false;
}

static void assert_recorded_env_clean(void) {
  json_t *calls = read_calls();
  assert_true(json_array_size(calls) > 0);
  size_t i, j;
  json_t *call, *name;
  json_array_foreach(calls, i, call) {
    bool saw_docker_host = false;
    json_array_foreach(json_object_get(call, "env"), j, name) {
      const char *n = json_string_value(name);
      /* The interpreter of the stand-in may add LC_CTYPE itself (PEP 538). */
      if (!cli_env_name_ok(n) && strcmp(n, "LC_CTYPE") != 0)
        fail_msg("the docker client got $%s", n);
      saw_docker_host |= strcmp(n, "DOCKER_HOST") == 0;
    }
    assert_true(saw_docker_host);
  }
  json_decref(calls);
}

/* ---------------------------------------------------------------- processes */

/* Alive and not a zombie. */
static bool proc_alive(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  cleanup_free char *stat = read_text(path);
  if (!stat) return false;
  const char *paren = strrchr(stat, ')');
  return paren && paren[2] != 'Z' && paren[2] != 'X';
}

static bool wait_dead(pid_t pid, int timeout_ms) {
  uint64_t deadline = cm_now_ms() + (uint64_t)timeout_ms;
  while (proc_alive(pid)) {
    if (cm_now_ms() >= deadline) return false;
    usleep(10000);
  }
  return true;
}

/* Our children, zombies included. */
static int count_children(void) {
  DIR *d = opendir("/proc");
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    cleanup_free char *path = xasprintf("/proc/%s/stat", e->d_name);
    cleanup_free char *stat = read_text(path);
    const char *paren = stat ? strrchr(stat, ')') : NULL;
    if (!paren) continue;
    int ppid = 0;
    if (sscanf(paren + 4, "%d", &ppid) == 1 && ppid == (int)getpid()) n++;
  }
  closedir(d);
  return n;
}

/* The pid of the stand-in's "container" of that name, or -1 once it was removed. */
static pid_t container_pid(const char *name) {
  cleanup_free char *path = xasprintf("%s/containers/%s.pid", g.standin_dir, name);
  cleanup_free char *text = read_text(path);
  return text ? (pid_t)atoi(text) : -1;
}

/* Waits until the stand-in forgot the container (`rm -f` done, or --rm after its exit). */
static bool wait_removed(const char *name, int timeout_ms) {
  cleanup_free char *path = xasprintf("%s/containers/%s.pid", g.standin_dir, name);
  uint64_t deadline = cm_now_ms() + (uint64_t)timeout_ms;
  while (access(path, F_OK) == 0) {
    if (cm_now_ms() >= deadline) return false;
    usleep(10000);
  }
  return true;
}

/* The exit status the stand-in saw for its container (-1: it never saw one). */
static int container_exit(const char *name) {
  cleanup_free char *path = xasprintf("%s/containers/%s.exit", g.standin_dir, name);
  cleanup_free char *text = read_text(path);
  return text ? atoi(text) : -1;
}

/* Whether the graceful stop reached the container through the supervisor's channel (the
 * stand-in then SIGTERMs it and writes containers/<name>.term). */
static bool container_termed(const char *name) {
  cleanup_free char *path = xasprintf("%s/containers/%s.term", g.standin_dir, name);
  return access(path, F_OK) == 0;
}

/* ---------------------------------------------------------------- backends and argv */

static sbx_backend_t *probed_backend(void) {
  cm_error_t err = CM_ERROR_INIT;
  sbx_backend_t *b = sbx_backend_new("docker", &err);
  if (!b) fail_msg("%s", err.msg);
  /* The server's state directory, where the seccomp profile goes. */
  cleanup_free char *state = xasprintf("%s/state", g.root);
  (void)mkdir(state, 0700);
  sbx_backend_set_state_dir(b, state);
  sbx_backend_probe(b);
  return b;
}

static int argv_index(char *const *argv, const char *s) {
  for (int i = 0; argv[i]; i++)
    if (strcmp(argv[i], s) == 0) return i;
  return -1;
}

static bool has_pair(char *const *argv, const char *flag, const char *value) {
  for (size_t i = 0; argv[i] && argv[i + 1]; i++)
    if (strcmp(argv[i], flag) == 0 && strcmp(argv[i + 1], value) == 0) return true;
  return false;
}

static int count_of(char *const *argv, const char *s) {
  int n = 0;
  for (size_t i = 0; argv[i]; i++) n += strcmp(argv[i], s) == 0;
  return n;
}

static void dump_argv(char *const *argv) {
  for (size_t i = 0; argv[i]; i++) print_message("%s%s", i ? " " : "", argv[i]);
  print_message("\n");
}

#define assert_pair(argv, flag, value)                              \
  do {                                                              \
    if (!has_pair(argv, flag, value)) {                             \
      dump_argv(argv);                                              \
      fail_msg("expected `%s %s` in the docker argv", flag, value); \
    }                                                               \
  } while (0)

static const sbx_limits_t build_limits = {
    .timeout_ms = 30000,
    .grace_ms = 500,
    .memory_bytes = 512ULL << 20,
    .cpu_seconds = 30,
    .max_processes = 64,
    .file_size_bytes = 16ULL << 20,
    .open_files = 256,
    .tmp_bytes = 8ULL << 20,
    .cpu_millis = 1500,
};

/* Builds spec with b; returns the ops->build() result, launch filled on success. */
static int build(sbx_backend_t *b, const sbx_spec_t *spec, sbx_launch_t *launch, cm_error_t *err) {
#ifdef SBX_LAUNCH_INIT
  *launch = (sbx_launch_t)SBX_LAUNCH_INIT;
#else
  *launch = (sbx_launch_t){0};
  for (size_t i = 0; i < CM_ARRAY_SIZE(launch->pass_fds); i++) launch->pass_fds[i] = -1;
#endif
  return b->ops->build(b, spec, launch, err);
}

/* ---------------------------------------------------------------- runs */

typedef struct run_capture {
  cm_buf_t out, err;
  sbx_result_t result;
  bool done;
  bool cancel_fired;
  uint64_t cancelled_at, done_at; /* cm_now_ms() when the test cancelled, when it ended */
  const char *cancel_on;          /* cancel (or, with kill_client, SIGKILL the client) once
                                     stdout holds this: the script runs */
  bool kill_client;
  char *workdir;
  sbx_run_t *run;
} run_capture_t;

typedef struct run_opts {
  const sbx_limits_t *limits;
  const char *cancel_on; /* see run_capture_t */
} run_opts_t;

static const sbx_limits_t run_limits = {
    .timeout_ms = 20000,
    .grace_ms = 500,
    .memory_bytes = 1ULL << 30,
    .cpu_seconds = 20,
    .max_processes = 64,
    .file_size_bytes = 64ULL << 20,
    .open_files = 256,
    .tmp_bytes = 16ULL << 20,
};

static void on_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  run_capture_t *c = data;
  (void)cm_buf_append(stream == SBX_STDOUT ? &c->out : &c->err, buf, len);
  if (c->cancel_on && !c->cancel_fired && !c->done && c->out.data &&
      memmem(c->out.data, c->out.len, c->cancel_on, strlen(c->cancel_on))) {
    c->cancel_fired = true;
    c->cancelled_at = cm_now_ms();
    if (c->kill_client)
      kill(sbx_run_pid(c->run), SIGKILL);
    else
      sbx_run_cancel(c->run);
  }
}

static void on_exit_cb(void *data, const sbx_result_t *result) {
  run_capture_t *c = data;
  c->result = *result;
  c->done = true;
  c->done_at = cm_now_ms();
}

static void run_script(run_capture_t *c, const char *script, const run_opts_t *o) {
  static const run_opts_t no_opts = {0};
  if (!o) o = &no_opts;
  cm_buf_init(&c->out, 1 << 20);
  cm_buf_init(&c->err, 1 << 20);
  c->workdir = new_dir("run");
  cleanup_free char *script_path = xasprintf("%s/script.py", c->workdir);
  write_text(script_path, script, 0644);

  char *argv[] = {SYSTEM_PYTHON, "-I", "script.py", NULL};
  char *envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "MPS_IN_CONTAINER=yes",
                  NULL};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = envp,
      .workdir = c->workdir,
      .limits = o->limits ? *o->limits : run_limits,
  };
  sbx_run_callbacks_t cbs = {.on_output = on_output, .on_exit = on_exit_cb};
  cm_error_t err = CM_ERROR_INIT;
  if (sbx_run_start(g.loop, g.backend, &spec, &cbs, c, &c->run, &err) < 0)
    fail_msg("sbx_run_start: %s", err.msg);
  c->cancel_on = o->cancel_on;
  uint64_t give_up = cm_now_ms() + 60000;
  while (!c->done) {
    assert_int_equal(cm_loop_run_once(g.loop, 1000, &err), 0);
    if (cm_now_ms() > give_up) fail_msg("the run never ended");
  }
  sbx_run_free(c->run);
  c->run = NULL;
  assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0); /* runs the deferred free */
}

static void capture_release(run_capture_t *c) {
  cm_buf_release(&c->out);
  cm_buf_release(&c->err);
  free(c->workdir);
  c->workdir = NULL;
}

static void dump(const run_capture_t *c) {
  print_message(
      "--- stdout ---\n%s\n--- stderr ---\n%s\n--- exit %d signal %d timed_out %d cancelled %d\n",
      c->out.data ? c->out.data : "", c->err.data ? c->err.data : "", c->result.exit_code,
      c->result.term_signal, c->result.timed_out, c->result.cancelled);
}

static bool has(const cm_buf_t *b, const char *needle) {
  return b->data && strstr(b->data, needle);
}

#define assert_has(buf, s)                      \
  do {                                          \
    if (!has(buf, s)) {                         \
      dump(c);                                  \
      fail_msg("expected \"%s\" in output", s); \
    }                                           \
  } while (0)

/* ---------------------------------------------------------------- probe */

static void test_probe_succeeds(void **state) {
  assert_true(g.backend->available);
  assert_true(sbx_backend_maps_paths(g.backend));
  assert_string_equal(sbx_backend_name(g.backend), "docker");
  cleanup_free char *d = sbx_backend_describe(g.backend);
  assert_non_null(strstr(d, "docker engine 27.5.1-standin"));
  assert_non_null(strstr(d, DEFAULT_IMAGE));
  assert_non_null(strstr(d, "sha256:5ca1ab1e5ca1"));

  clear_calls();
  sbx_backend_t *b = probed_backend();
  assert_true(b->available);
  static const char *const version[] = {"version", "--format", "{{.Server.Version}}", NULL};
  static const char *const inspect[] = {"image", "inspect", "--format", NULL};
  assert_int_equal(count_calls(version), 1);
  assert_int_equal(count_calls(inspect), 1);
  json_t *calls = read_calls();
  json_t *argv = json_object_get(json_array_get(calls, 1), "argv");
  assert_string_equal(json_string_value(json_array_get(argv, json_array_size(argv) - 1)),
                      DEFAULT_IMAGE);
  json_decref(calls);
  /* The probe never pulls, and the client sees none of the server's other variables. */
  static const char *const pull[] = {"pull", NULL};
  assert_int_equal(count_calls(pull), 0);
  assert_recorded_env_clean();
  sbx_backend_free(b);
}

static void test_probe_engine_down(void **state) {
  set_switch("engine-down", NULL);
  sbx_backend_t *b = probed_backend();
  clear_switch("engine-down");
  assert_false(b->available);
  assert_non_null(strstr(b->unavailable, "docker engine is not reachable"));
  assert_non_null(strstr(b->unavailable, "Cannot connect to the Docker daemon"));
  cleanup_free char *d = sbx_backend_describe(b);
  assert_non_null(strstr(d, "unavailable"));
  /* Nothing starts on an unavailable backend. */
  cleanup_free char *workdir = new_dir("unavailable");
  char *argv[] = {SYSTEM_PYTHON, "-c", "pass", NULL};
  char *envp[] = {NULL};
  sbx_spec_t spec = {.argv = argv, .envp = envp, .workdir = workdir, .limits = run_limits};
  sbx_run_callbacks_t cbs = {.on_exit = on_exit_cb};
  sbx_run_t *run = NULL;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(sbx_run_start(g.loop, b, &spec, &cbs, NULL, &run, &err), -1);
  assert_int_equal(err.kind, CM_ERR_UNAVAILABLE);
  cm_error_release(&err);
  sbx_backend_free(b);
}

static void test_probe_image_missing(void **state) {
  set_switch("image-missing", NULL);
  clear_calls();
  sbx_backend_t *b = probed_backend();
  clear_switch("image-missing");
  assert_false(b->available);
  assert_non_null(
      strstr(b->unavailable, "image " DEFAULT_IMAGE " is not in the local docker engine"));
  assert_non_null(strstr(b->unavailable, "docker build -t " DEFAULT_IMAGE " profiles/"));
  assert_non_null(strstr(b->unavailable, "docker pull " DEFAULT_IMAGE));
  assert_non_null(strstr(b->unavailable, "No such image"));
  static const char *const pull[] = {"pull", NULL};
  assert_int_equal(count_calls(pull), 0);
  sbx_backend_free(b);
}

static void test_probe_client_missing(void **state) {
  cleanup_free char *saved = xstrdup(getenv("MPS_DOCKER"));
  setenv("MPS_DOCKER", "/nonexistent/docker", 1);
  sbx_backend_t *b = probed_backend();
  setenv("MPS_DOCKER", saved, 1);
  assert_false(b->available);
  assert_non_null(strstr(b->unavailable, "docker client (/nonexistent/docker) was not found"));
  sbx_backend_free(b);
}

static void test_probe_image_name(void **state) {
  setenv("MPS_DOCKER_IMAGE", "registry.example/sandbox:py3.13", 1);
  clear_calls();
  sbx_backend_t *b = probed_backend();
  assert_true(b->available);
  static const char *const inspect[] = {"image", "inspect", "--format", NULL};
  assert_int_equal(count_calls(inspect), 1);
  cleanup_free char *d = sbx_backend_describe(b);
  assert_non_null(strstr(d, "registry.example/sandbox:py3.13"));
  sbx_backend_free(b);

  /* An image reference that would read as a flag is refused before any call. */
  setenv("MPS_DOCKER_IMAGE", "--privileged", 1);
  b = probed_backend();
  unsetenv("MPS_DOCKER_IMAGE");
  assert_false(b->available);
  assert_non_null(strstr(b->unavailable, "is not an image reference"));
  sbx_backend_free(b);
}

static void test_probe_is_bounded(void **state) {
  set_switch("engine-hangs", NULL);
  uint64_t t0 = cm_now_ms();
  sbx_backend_t *b = probed_backend();
  uint64_t took = cm_now_ms() - t0;
  clear_switch("engine-hangs");
  assert_false(b->available);
  assert_non_null(strstr(b->unavailable, "did not finish within 5000 ms"));
  assert_true(took < 20000);
  sbx_backend_free(b);
}

/* ---------------------------------------------------------------- argv */

static void test_argv_has_every_flag(void **state) {
  cleanup_free char *workdir = new_dir("argv");
  cleanup_free char *env_dir = new_dir("env");
  cleanup_free char *cache_dir = new_dir("cache");
  cleanup_free char *data_dir = new_dir("data");
  cleanup_free char *prefix = new_dir("pyprefix");
  cleanup_free char *python = xasprintf("%s/bin/python3.12", prefix);
  char *argv[] = {python, "-s", "script.py", NULL};
  char *envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1",
                  "EMPTY=", NULL};
  /* The interpreter's prefix and /usr are the image's business; data_dir is bound. */
  char *binds[] = {prefix, "/usr", data_dir, NULL};
  sbx_mount_t mounts[] = {{env_dir, "/env", false}, {cache_dir, "/cache", true}};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = envp,
      .workdir = workdir,
      .ro_binds = binds,
      .mounts = mounts,
      .n_mounts = 2,
      .limits = build_limits,
  };
  sbx_launch_t l;
  cm_error_t err = CM_ERROR_INIT;
  if (build(g.backend, &spec, &l, &err) < 0) fail_msg("build: %s", err.msg);
  /* The client runs under the host side of the supervisor (drop.c, "Containers"), with the
   * channel's two pipe ends passed to it. */
  assert_string_equal(l.argv[0], getenv("MPS_CONTAINER_INIT"));
  assert_string_equal(l.argv[1], "--container-host");
  assert_true(l.status_fd >= 0 && l.control_fd >= 0);
  assert_true(l.pass_fds[0] >= 0 && l.pass_fds[1] >= 0 && l.pass_fds[2] == -1);
  cleanup_free char *status_fd = xasprintf("%d", l.pass_fds[0]);
  cleanup_free char *control_fd = xasprintf("%d", l.pass_fds[1]);
  assert_pair(l.argv, "--status-fd", status_fd);
  assert_pair(l.argv, "--control-fd", control_fd);
  int sep = argv_index(l.argv, "--");
  assert_true(sep > 0);
  char **a = l.argv + sep + 1;
  assert_string_equal(a[0], g.standin);
  assert_string_equal(a[1], "run");
  assert_int_equal(count_of(a, "--rm"), 1);
  assert_int_equal(count_of(a, "--interactive=false"), 1);
  assert_int_equal(count_of(a, "--read-only"), 1);
  /* The supervisor is pid 1, bind-mounted read-only with its channel directory. */
  assert_int_equal(count_of(a, "--init"), 0);
  assert_pair(a, "--entrypoint", "/.mps-drop");
  cleanup_free char *drop_volume = xasprintf("%s:/.mps-drop:ro", getenv("MPS_CONTAINER_INIT"));
  assert_pair(a, "-v", drop_volume);
  cleanup_free char *chan_volume = xasprintf("%s/runs/%s:/.mps-channel:ro", g.root, l.kill_name);
  assert_pair(a, "-v", chan_volume);
  assert_pair(a, "--pull", "never");
  assert_pair(a, "--network", "none");
  assert_pair(a, "--cap-drop", "ALL");
  assert_pair(a, "--security-opt", "no-new-privileges");
  /* The native policy, rendered for OCI into a file of ours (0600, in a 0700 directory). */
  assert_int_equal(count_of(a, "--security-opt"), 2);
  const char *profile = NULL;
  for (size_t i = 0; a[i] && a[i + 1]; i++)
    if (strcmp(a[i], "--security-opt") == 0 && strncmp(a[i + 1], "seccomp=", 8) == 0)
      profile = a[i + 1] + 8;
  assert_non_null(profile);
  cleanup_free char *profile_dir = xasprintf("%s/state/sandbox/seccomp-", g.root);
  assert_memory_equal(profile, profile_dir, strlen(profile_dir));
  struct stat st;
  assert_int_equal(lstat(profile, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(st.st_uid, geteuid());
  cleanup_free char *profile_text = read_text(profile);
  cm_error_t perr = CM_ERROR_INIT;
  cleanup_free char *expected = sbx_seccomp_oci_json(&perr);
  assert_non_null(expected);
  assert_string_equal(profile_text, expected);
  assert_pair(a, "--memory", "536870912");
  assert_pair(a, "--memory-swap", "536870912");
  assert_pair(a, "--cpus", "1.500");
  assert_pair(a, "--pids-limit", "64");
  assert_pair(a, "--ulimit", "nofile=256:256");
  assert_pair(a, "--ulimit", "fsize=16777216:16777216");
  assert_pair(a, "--ulimit", "cpu=30:31");
  assert_pair(a, "--ulimit", "core=0:0");
  assert_pair(a, "--tmpfs", "/tmp:rw,nosuid,nodev,size=8388608");
  assert_pair(a, "--log-driver", "none");
  assert_pair(a, "-w", "/work");
  cleanup_free char *work_volume = xasprintf("%s:/work:rw", workdir);
  cleanup_free char *env_volume = xasprintf("%s:/env:ro", env_dir);
  cleanup_free char *cache_volume = xasprintf("%s:/cache:rw", cache_dir);
  cleanup_free char *data_volume = xasprintf("%s:%s:ro", data_dir, data_dir);
  assert_pair(a, "-v", work_volume);
  assert_pair(a, "-v", env_volume);
  assert_pair(a, "-v", cache_volume);
  assert_pair(a, "-v", data_volume);
  /* Not the prefix, not /usr; the drop and its channel, /etc/passwd, /etc/group, /etc/hosts
   * and /etc/resolv.conf (ours: no network here). */
  assert_int_equal(count_of(a, "-v"), 10);
  const char *passwd = NULL;
  for (size_t i = 0; a[i] && a[i + 1]; i++)
    if (strcmp(a[i], "-v") == 0 && strstr(a[i + 1], ":/etc/passwd:ro")) passwd = a[i + 1];
  assert_non_null(passwd);
  cleanup_free char *passwd_file = xstrndup(passwd, strcspn(passwd, ":"));
  assert_int_equal(lstat(passwd_file, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0644);
  cleanup_free char *passwd_text = read_text(passwd_file);
  assert_non_null(passwd_text);
  assert_memory_equal(passwd_text, "root:x:0:0:", 11);

  /* A non-root user: a uid of its own per run when the server is root (as bwrap's runs), else
   * the server's own uid. */
  int u = argv_index(a, "--user");
  assert_true(u > 0);
  unsigned uid = 0, gid = 0;
  assert_int_equal(sscanf(a[u + 1], "%u:%u", &uid, &gid), 2);
  assert_int_not_equal(uid, 0);
  assert_int_not_equal(gid, 0);
  /* getpwuid() knows it, as the name bubblewrap's runs have. */
  cleanup_free char *entry = xasprintf("\nsandbox:x:%u:%u:sandbox:/work:", uid, gid);
  assert_non_null(strstr(passwd_text, entry));
  if (geteuid() == 0) {
    assert_true(is_run_uid(uid));
    assert_int_equal(gid, uid);
    assert_true(l.uid_slot >= 0);
    /* The next run gets another; a build's identity keeps one for all its steps. */
    sbx_launch_t next, step1, step2;
    if (build(g.backend, &spec, &next, &err) < 0) fail_msg("build: %s", err.msg);
    unsigned next_uid = 0;
    assert_int_equal(sscanf(next.argv[argv_index(next.argv, "--user") + 1], "%u:", &next_uid), 1);
    assert_true(is_run_uid(next_uid));
    assert_int_not_equal(next_uid, uid);
    sbx_identity_t *id = sbx_identity_new(g.backend);
    sbx_spec_t step = spec;
    step.identity = id;
    if (build(g.backend, &step, &step1, &err) < 0) fail_msg("build: %s", err.msg);
    if (build(g.backend, &step, &step2, &err) < 0) fail_msg("build: %s", err.msg);
    cleanup_free char *id_user = xasprintf("%u:%u", (unsigned)id->uid, (unsigned)id->uid);
    assert_true(is_run_uid(id->uid));
    assert_int_not_equal(id->uid, uid);
    assert_int_not_equal(id->uid, next_uid);
    assert_pair(step1.argv, "--user", id_user);
    assert_pair(step2.argv, "--user", id_user);
    assert_int_equal(step1.uid_slot, -1); /* the identity's, not the run's */
    sbx_identity_free(id);
    sbx_launch_close_channel(&next);
    sbx_launch_release(&next);
    sbx_launch_close_channel(&step1);
    sbx_launch_release(&step1);
    sbx_launch_close_channel(&step2);
    sbx_launch_release(&step2);
  }

  /* A unique name, and the kill name is it. */
  int n = argv_index(a, "--name");
  assert_true(n > 0);
  assert_int_equal(strlen(a[n + 1]), 4 + 16);
  assert_memory_equal(a[n + 1], "mps-", 4);
  assert_int_equal(strspn(a[n + 1] + 4, "0123456789abcdef"), 16);
  assert_string_equal(l.kill_name, a[n + 1]);

  /* --env: exactly the spec's entries, in order; nothing of the host. */
  size_t e = 0;
  for (size_t i = 0; a[i]; i++) {
    assert_string_not_equal(a[i], "-e");
    if (strcmp(a[i], "--env") != 0) continue;
    assert_non_null(envp[e]);
    assert_string_equal(a[i + 1], envp[e]);
    e++;
  }
  assert_null(envp[e]);
  for (size_t i = 0; a[i]; i++) assert_null(strstr(a[i], SECRET_ENV_VALUE));

  /* The image, the supervisor's arguments, then the interpreter mapped into it, then the
   * rest of the command. */
  int img = argv_index(a, DEFAULT_IMAGE);
  assert_true(img > 0);
  assert_string_equal(a[img + 1], "--connect");
  assert_string_equal(a[img + 2], "/.mps-channel/channel");
  assert_string_equal(a[img + 3], "--");
  assert_string_equal(a[img + 4], "/usr/local/bin/python3.12");
  assert_string_equal(a[img + 5], "-s");
  assert_string_equal(a[img + 6], "script.py");
  assert_null(a[img + 7]);

  /* The client's own environment, and no rlimits on it. */
  assert_false(l.set_rlimits);
  bool docker_host = false;
  for (char **v = l.envp; *v; v++) {
    cleanup_free char *name = xstrndup(*v, strcspn(*v, "="));
    if (!cli_env_name_ok(name)) fail_msg("the docker client would get $%s", name);
    docker_host |= strcmp(name, "DOCKER_HOST") == 0;
  }
  assert_true(docker_host);

  /* With network: the default bridge.  Every build gets a new name. */
  spec.network = true;
  sbx_launch_t l2;
  if (build(g.backend, &spec, &l2, &err) < 0) fail_msg("build: %s", err.msg);
  assert_pair(l2.argv, "--network", "bridge");
  assert_int_equal(count_of(l2.argv, "--network"), 1);
  assert_string_not_equal(l.kill_name, l2.kill_name);

  /* With egress: no network but the forwarder's, which gets the egress fd over the channel
   * and listens on the port. */
  int sp[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp), 0);
  sbx_egress_t egress = {.fd = sp[0], .port = 3128};
  spec.egress = &egress;
  sbx_launch_t l3;
  if (build(g.backend, &spec, &l3, &err) < 0) fail_msg("build: %s", err.msg);
  assert_pair(l3.argv, "--network", "none");
  assert_pair(l3.argv, "--egress-port", "3128");
  int ef = argv_index(l3.argv, "--egress-fd");
  assert_true(ef > 0 && ef < argv_index(l3.argv, "--"));
  assert_true(l3.pass_fds[2] >= 0);
  close(sp[0]);
  close(sp[1]);
  sbx_launch_release(&l);
  sbx_launch_release(&l2);
  sbx_launch_release(&l3);
}

static void test_argv_without_limits(void **state) {
  cleanup_free char *workdir = new_dir("nolimits");
  char *argv[] = {SYSTEM_PYTHON, "script.py", NULL};
  char *envp[] = {NULL};
  sbx_spec_t spec = {.argv = argv, .envp = envp, .workdir = workdir};
  sbx_launch_t l;
  cm_error_t err = CM_ERROR_INIT;
  if (build(g.backend, &spec, &l, &err) < 0) fail_msg("build: %s", err.msg);
  assert_int_equal(count_of(l.argv, "--memory"), 0);
  assert_int_equal(count_of(l.argv, "--pids-limit"), 0);
  assert_int_equal(count_of(l.argv, "--env"), 0);
  /* /tmp is RAM: capped even when the spec says nothing. */
  assert_pair(l.argv, "--tmpfs", "/tmp:rw,nosuid,nodev,size=104857600");
  assert_pair(l.argv, "--network", "none");
  sbx_launch_release(&l);
}

/* The command in the image for a host command (and the image's declared Pythons). */
static char *mapped(sbx_backend_t *b, const char *command, const char *workdir, cm_error_t *err) {
  cleanup_free char *cmd = xstrdup(command);
  char *argv[] = {cmd, NULL};
  char *envp[] = {NULL};
  sbx_mount_t mounts[] = {{g.root, "/env", false}};
  sbx_spec_t spec = {
      .argv = argv, .envp = envp, .workdir = workdir, .mounts = mounts, .n_mounts = 1};
  sbx_launch_t l;
  if (build(b, &spec, &l, err) < 0) return NULL;
  int img = argv_index(l.argv, DEFAULT_IMAGE);
  assert_true(img > 0);
  int sep = argv_index(l.argv + img, "--");
  assert_true(sep > 0);
  char *out = xstrdup(l.argv[img + sep + 1]);
  sbx_launch_release(&l);
  return out;
}

static void test_interpreter_mapping(void **state) {
  cleanup_free char *workdir = new_dir("map");
  cm_error_t err = CM_ERROR_INIT;
  static const struct {
    const char *host, *image;
  } cases[] = {
      /* The stand-in's image: python3 is /usr/local/bin/python3.12, and it has uv. */
      {"/usr/bin/python3.12", "/usr/local/bin/python3.12"},
      {"/usr/bin/python3.11", "/usr/local/bin/python3.12"}, /* not in the image: its python3 */
      {"/opt/py/bin/python3", "/usr/local/bin/python3.12"},
      {"/opt/py/bin/python", "/usr/local/bin/python3.12"},
      {"/root/.local/bin/uv", "/usr/local/bin/uv"},
      {"/env/bin/python", "/env/bin/python"}, /* already the path inside (an environment's) */
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    cleanup_free char *m = mapped(g.backend, cases[i].host, workdir, &err);
    if (!m) fail_msg("%s: %s", cases[i].host, err.msg);
    assert_string_equal(m, cases[i].image);
  }
  /* Under the work directory or a mount: its path in the container. */
  cleanup_free char *in_work = xasprintf("%s/bin/tool", workdir);
  cleanup_free char *m1 = mapped(g.backend, in_work, workdir, &err);
  assert_string_equal(m1, "/work/bin/tool");
  cleanup_free char *in_mount = xasprintf("%s/bin/python", g.root);
  cleanup_free char *m2 = mapped(g.backend, in_mount, workdir, &err);
  assert_string_equal(m2, "/env/bin/python");
  /* Anything else means nothing in the image. */
  assert_null(mapped(g.backend, "/usr/bin/perl", workdir, &err));
  assert_int_equal(err.kind, CM_ERR_UNSUPPORTED);
  cm_error_release(&err);

  /* An image that declares 3.11 too. */
  set_switch("image-pythons", "3.11 3.12");
  sbx_backend_t *b = probed_backend();
  clear_switch("image-pythons");
  assert_true(b->available);
  cleanup_free char *m3 = mapped(b, "/usr/bin/python3.11", workdir, &err);
  assert_string_equal(m3, "/usr/local/bin/python3.11");
  cleanup_free char *m4 = mapped(b, "/usr/bin/python3.1", workdir, &err);
  assert_string_equal(m4, "/usr/local/bin/python3.12");
  /* The result names the interpreter that ran. */
  sbx_interp_t in = {0};
  assert_true(sbx_backend_interpreter(b, "/root/.pyenv/versions/3.13.0/bin/python3.13", &in));
  assert_string_equal(in.version, "3.12.7");
  assert_string_equal(in.path, "/usr/local/bin/python3.12");
  assert_string_equal(in.implementation, "cpython");
  assert_true(sbx_backend_interpreter(b, "/usr/bin/python3.11", &in));
  assert_string_equal(in.version, "3.11");
  assert_string_equal(in.path, "/usr/local/bin/python3.11");
  sbx_backend_free(b);

  /* An image without uv: a command that needs it is refused, python still runs. */
  set_switch("image-no-uv", "");
  b = probed_backend();
  clear_switch("image-no-uv");
  assert_true(b->available);
  assert_null(mapped(b, "/root/.local/bin/uv", workdir, &err));
  assert_int_equal(err.kind, CM_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "has no uv"));
  cm_error_release(&err);
  cleanup_free char *m5 = mapped(b, "/usr/bin/python3", workdir, &err);
  assert_string_equal(m5, "/usr/local/bin/python3.12");
  sbx_backend_free(b);
}

static void test_spec_validation(void **state) {
  cleanup_free char *workdir = new_dir("valid");
  cleanup_free char *colon = xasprintf("%s/a:b", g.root);
  assert_int_equal(mkdir(colon, 0700), 0);
  char *argv[] = {SYSTEM_PYTHON, NULL};
  char *envp[] = {"A=1", NULL};
  char *bad_envp[] = {"HOME", NULL};
  char *bad_bind[] = {"/etc", NULL};
  sbx_mount_t bad_target[] = {{g.root, "/proc/x", false}};
  sbx_mount_t bad_source[] = {{colon, "/env", false}};
  sbx_mount_t dot_target[] = {{g.root, "/env/../etc", false}};
  const struct {
    sbx_spec_t spec;
    const char *why;
  } cases[] = {
      {{.argv = argv, .envp = envp, .workdir = colon}, "work directory with ':'"},
      {{.argv = argv, .envp = envp, .workdir = "relative"}, "relative work directory"},
      {{.argv = argv, .envp = bad_envp, .workdir = workdir},
       "env entry without '=' (docker would copy the host's)"},
      {{.argv = argv, .envp = envp, .workdir = workdir, .ro_binds = bad_bind}, "bind over /etc"},
      {{.argv = argv, .envp = envp, .workdir = workdir, .mounts = bad_target, .n_mounts = 1},
       "mount on /proc"},
      {{.argv = argv, .envp = envp, .workdir = workdir, .mounts = bad_source, .n_mounts = 1},
       "mount source with ':'"},
      {{.argv = argv, .envp = envp, .workdir = workdir, .mounts = dot_target, .n_mounts = 1},
       "mount target with '..'"},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    sbx_launch_t l;
    cm_error_t err = CM_ERROR_INIT;
    if (build(g.backend, &cases[i].spec, &l, &err) == 0) fail_msg("accepted: %s", cases[i].why);
    assert_int_equal(err.kind, CM_ERR_INVALID);
    cm_error_release(&err);
    sbx_launch_release(&l);
  }
}

static void test_workdir_handed_to_container_uid(void **state) {
  if (geteuid() != 0) {
    skip(); /* not root: the container runs as the server's uid, which owns the work directory */
    return;
  }
  cleanup_free char *workdir = new_dir("handover");
  cleanup_free char *sub = xasprintf("%s/sub", workdir);
  cleanup_free char *file = xasprintf("%s/sub/file.txt", workdir);
  cleanup_free char *outside = xasprintf("%s/outside.txt", g.root);
  cleanup_free char *link = xasprintf("%s/link", workdir);
  assert_int_equal(mkdir(sub, 0700), 0);
  write_text(file, "x", 0600);
  write_text(outside, "host file", 0600);
  assert_int_equal(symlink(outside, link), 0);
  char *argv[] = {SYSTEM_PYTHON, "script.py", NULL};
  char *envp[] = {NULL};
  sbx_spec_t spec = {.argv = argv, .envp = envp, .workdir = workdir};
  sbx_launch_t l;
  cm_error_t err = CM_ERROR_INIT;
  if (build(g.backend, &spec, &l, &err) < 0) fail_msg("build: %s", err.msg);
  unsigned uid = 0, gid = 0;
  assert_int_equal(sscanf(l.argv[argv_index(l.argv, "--user") + 1], "%u:%u", &uid, &gid), 2);
  assert_true(is_run_uid(uid));
  sbx_launch_close_channel(&l);
  sbx_launch_release(&l);
  struct stat st;
  const char *mine[] = {workdir, sub, file, link};
  for (size_t i = 0; i < CM_ARRAY_SIZE(mine); i++) {
    assert_int_equal(lstat(mine[i], &st), 0);
    assert_int_equal(st.st_uid, uid);
    assert_int_equal(st.st_gid, gid);
  }
  /* The symlink itself changed owner, never what it points to. */
  assert_int_equal(stat(outside, &st), 0);
  assert_int_equal(st.st_uid, 0);
}

/* ---------------------------------------------------------------- the real client */

/* Runs argv to completion; returns the exit status and stderr. */
static int run_blocking(char *const *argv, char *const *envp, char **errout) {
  sbx_spawn_opts_t opts = {.argv = argv, .envp = envp, .capture_output = true};
  sbx_child_t child;
  cm_error_t err = CM_ERROR_INIT;
  if (sbx_spawn(&opts, &child, &err) < 0) fail_msg("spawn %s: %s", argv[0], err.msg);
  cm_set_nonblock(child.stderr_fd, false);
  cm_set_nonblock(child.stdout_fd, false);
  cm_buf_t b;
  cm_buf_init(&b, 1 << 20);
  char buf[4096];
  for (ssize_t n; (n = read(child.stderr_fd, buf, sizeof buf)) > 0;)
    (void)cm_buf_append(&b, buf, (size_t)n);
  int st = 0;
  while (waitpid(child.pid, &st, 0) < 0 && errno == EINTR) {
  }
  sbx_child_close(&child);
  *errout = cm_buf_steal(&b);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *real_docker(void) {
  char *path = cm_find_executable("docker");
  if (!path) return NULL;
  /* Only the real client: a Go binary, not a script. */
  char magic[4] = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, magic, 4) != 4 || memcmp(magic, "\177ELF", 4) != 0) {
    if (fd >= 0) close(fd);
    free(path);
    return NULL;
  }
  close(fd);
  return path;
}

static void test_real_client_accepts_argv(void **state) {
  cleanup_free char *docker = real_docker();
  if (!docker) {
    print_message("skipped: no real docker client installed\n");
    skip();
    return;
  }
  cleanup_free char *workdir = new_dir("real");
  cleanup_free char *env_dir = new_dir("realenv");
  char *argv[] = {SYSTEM_PYTHON, "-s", "script.py", NULL};
  char *envp[] = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8", NULL};
  sbx_mount_t mounts[] = {{env_dir, "/env", false}};
  sbx_spec_t spec = {.argv = argv,
                     .envp = envp,
                     .workdir = workdir,
                     .mounts = mounts,
                     .n_mounts = 1,
                     .network = true,
                     .limits = build_limits};
  sbx_launch_t l;
  cm_error_t err = CM_ERROR_INIT;
  if (build(g.backend, &spec, &l, &err) < 0) fail_msg("build: %s", err.msg);
  /* The client's part of the argv, after the supervisor's host side. */
  char **client = l.argv + argv_index(l.argv, "--") + 1;
  free(client[0]);
  client[0] = xstrdup(docker);
  cleanup_free char *home = xasprintf("HOME=%s", g.root);
  char *cli_env[] = {"DOCKER_HOST=" NO_ENGINE_HOST, home, "PATH=/usr/bin:/bin", NULL};
  char *kill_argv[] = {docker, "kill", "--signal", "TERM", l.kill_name, NULL};
  char *rm_argv[] = {docker, "rm", "-f", l.kill_name, NULL};
  char *const *commands[] = {client, kill_argv, rm_argv};
  for (size_t i = 0; i < CM_ARRAY_SIZE(commands); i++) {
    cleanup_free char *errout = NULL;
    int rc = run_blocking(commands[i], cli_env, &errout);
    if (!strstr(errout, "Cannot connect to the Docker daemon") || strstr(errout, "unknown flag") ||
        strstr(errout, "invalid argument")) {
      dump_argv(commands[i]);
      fail_msg("docker %s: exit %d: %s", commands[i][1], rc, errout);
    }
    assert_int_not_equal(rc, 0);
  }
  sbx_launch_release(&l);

  /* And the probe with the real client and no engine says so. */
  cleanup_free char *saved = xstrdup(getenv("MPS_DOCKER"));
  setenv("MPS_DOCKER", docker, 1);
  sbx_backend_t *b = probed_backend();
  setenv("MPS_DOCKER", saved, 1);
  assert_false(b->available);
  assert_non_null(strstr(b->unavailable, "docker engine is not reachable"));
  assert_non_null(strstr(b->unavailable, "Cannot connect to the Docker daemon"));
  sbx_backend_free(b);
}

/* ---------------------------------------------------------------- runs */

static void test_run_output_and_exit_code(void **state) {
  run_capture_t cap = {0}, *c = &cap;
  clear_calls();
  run_script(c,
             "import os, sys\n"
             "print('hello from the container')\n"
             "print('UID=%d' % os.getuid())\n"
             "print('CWD=' + os.getcwd())\n"
             "print('ENV=' + ','.join(sorted(os.environ)))\n"
             "open('out.txt', 'w').write('written by the script')\n"
             "sys.stderr.write('to stderr\\n')\n"
             "sys.exit(3)\n",
             NULL);
  assert_int_equal(c->result.exit_code, 3);
  assert_false(c->result.timed_out);
  assert_has(&c->out, "hello from the container\n");
  assert_has(&c->err, "to stderr\n");
  /* Exactly the spec's environment, in the work directory, as the container's uid. */
  assert_has(&c->out, "ENV=LANG,MPS_IN_CONTAINER,PATH\n");
  cleanup_free char *cwd = xasprintf("CWD=%s\n", c->workdir);
  assert_has(&c->out, cwd);
  cleanup_free char *user = last_run_user();
  unsigned run_uid = 0;
  assert_int_equal(sscanf(user, "%u:", &run_uid), 1);
  if (geteuid() == 0)
    assert_true(is_run_uid(run_uid));
  else
    assert_int_equal(run_uid, getuid());
  cleanup_free char *uid = xasprintf("UID=%u\n", run_uid);
  assert_has(&c->out, uid);
  cleanup_free char *out_path = xasprintf("%s/out.txt", c->workdir);
  cleanup_free char *written = read_text(out_path);
  assert_non_null(written);
  assert_string_equal(written, "written by the script");

  /* After the client exited, the container is removed by name in case --rm did not. */
  cleanup_free char *name = last_run_name();
  const char *rm[] = {"rm", "-f", name, NULL};
  assert_true(wait_call(rm, 10000));
  const char *kill_term[] = {"kill", NULL};
  assert_int_equal(count_calls(kill_term), 0);
  assert_int_equal(container_exit(name), 3);
  assert_recorded_env_clean();
  capture_release(c);

  /* A second run gets another name. */
  run_capture_t cap2 = {0};
  run_script(&cap2, "print('again')\n", NULL);
  assert_int_equal(cap2.result.exit_code, 0);
  cleanup_free char *name2 = last_run_name();
  assert_string_not_equal(name, name2);
  capture_release(&cap2);
}

static void test_timeout_kills_container_by_name(void **state) {
  run_capture_t cap = {0}, *c = &cap;
  sbx_limits_t limits = run_limits;
  limits.timeout_ms = 5000;
  limits.grace_ms = 3000;
  run_opts_t o = {.limits = &limits};
  clear_calls();
  run_script(c, "import time\nprint('started', flush=True)\ntime.sleep(60)\n", &o);
  if (!c->result.timed_out) dump(c);
  assert_true(c->result.timed_out);
  assert_has(&c->out, "started\n");
  assert_true(c->result.duration_ms < limits.timeout_ms + limits.grace_ms + 3000);
  cleanup_free char *name = last_run_name();
  /* The graceful half goes through the supervisor's channel, not `docker kill` (pid 1 of
   * a container ignores a SIGTERM it has no handler for). */
  const char *kill_term[] = {"kill", "--signal", "TERM", name, NULL};
  assert_int_equal(count_calls(kill_term), 0);
  assert_true(container_termed(name));
  /* The container died of that SIGTERM (the stand-in client ignores signals), before the
   * grace period ran out. */
  assert_int_equal(container_exit(name), 128 + SIGTERM);
  assert_true(c->result.duration_ms < limits.timeout_ms + limits.grace_ms);
  const char *rm[] = {"rm", "-f", name, NULL};
  assert_true(wait_call(rm, 10000));
  capture_release(c);
}

static void test_term_ignored_killed_after_grace(void **state) {
  run_capture_t cap = {0}, *c = &cap;
  sbx_limits_t limits = run_limits;
  limits.timeout_ms = 5000;
  limits.grace_ms = 500;
  run_opts_t o = {.limits = &limits};
  clear_calls();
  run_script(c,
             "import signal, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "print('ignoring SIGTERM', flush=True)\n"
             "time.sleep(60)\n",
             &o);
  assert_true(c->result.timed_out);
  assert_has(&c->out, "ignoring SIGTERM\n");
  /* timeout + grace, plus the drain of the pipes the container still held. */
  assert_true(c->result.duration_ms < limits.timeout_ms + limits.grace_ms + 3000);
  cleanup_free char *name = last_run_name();
  const char *kill_term[] = {"kill", "--signal", "TERM", name, NULL};
  const char *rm[] = {"rm", "-f", name, NULL};
  assert_int_equal(count_calls(kill_term), 0);
  assert_true(container_termed(name));
  assert_true(wait_call(rm, 10000));
  /* Killing the client did not stop the container; `rm -f` by name did. */
  assert_true(wait_removed(name, 10000));
  capture_release(c);
}

static void test_cancel_kills_container_by_name(void **state) {
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.cancel_on = "started\n"};
  clear_calls();
  run_script(c, "import time\nprint('started', flush=True)\ntime.sleep(60)\n", &o);
  assert_true(c->cancel_fired);
  assert_true(c->result.cancelled);
  assert_false(c->result.timed_out);
  cleanup_free char *name = last_run_name();
  const char *kill_term[] = {"kill", "--signal", "TERM", name, NULL};
  assert_int_equal(count_calls(kill_term), 0);
  assert_true(container_termed(name));
  assert_int_equal(container_exit(name), 128 + SIGTERM);
  /* Ended within the grace of the cancellation (and a loaded machine's margin). */
  assert_true(c->done_at - c->cancelled_at < run_limits.grace_ms + 3000);
  const char *rm[] = {"rm", "-f", name, NULL};
  assert_true(wait_call(rm, 10000));
  capture_release(c);
}

/* A container that outlives its client (here: the client is killed from outside once the
 * script runs) is still removed by name once the client's exit is seen. */
static void test_client_dies_container_removed(void **state) {
  run_capture_t cap = {0}, *c = &cap;
  cm_buf_init(&c->out, 1 << 20);
  cm_buf_init(&c->err, 1 << 20);
  c->workdir = new_dir("orphan");
  cleanup_free char *script_path = xasprintf("%s/script.py", c->workdir);
  write_text(script_path, "import time\nprint('started', flush=True)\ntime.sleep(60)\n", 0644);
  char *argv[] = {SYSTEM_PYTHON, "-I", "script.py", NULL};
  char *envp[] = {"PATH=/usr/bin:/bin", NULL};
  sbx_spec_t spec = {.argv = argv, .envp = envp, .workdir = c->workdir, .limits = run_limits};
  sbx_run_callbacks_t cbs = {.on_output = on_output, .on_exit = on_exit_cb};
  cm_error_t err = CM_ERROR_INIT;
  clear_calls();
  c->cancel_on = "started\n";
  c->kill_client = true;
  if (sbx_run_start(g.loop, g.backend, &spec, &cbs, c, &c->run, &err) < 0) fail_msg("%s", err.msg);
  while (!c->done) assert_int_equal(cm_loop_run_once(g.loop, 1000, &err), 0);
  sbx_run_free(c->run);
  assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0);
  assert_int_equal(c->result.term_signal, SIGKILL);
  cleanup_free char *name = last_run_name();
  const char *rm[] = {"rm", "-f", name, NULL};
  assert_true(wait_call(rm, 10000));
  assert_true(wait_removed(name, 10000));
  capture_release(c);
}

static void test_nothing_left_behind(void **state) {
  /* Freeing the backend waits for its kill/rm helpers: no zombie, no stray container. */
  sbx_backend_free(g.backend);
  g.backend = NULL;
  assert_int_equal(count_children(), 0);
  cleanup_free char *dir = xasprintf("%s/containers", g.standin_dir);
  DIR *d = opendir(dir);
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".pid") != 0) continue;
    cleanup_free char *name = xstrndup(e->d_name, n - 4);
    pid_t pid = container_pid(name);
    if (pid > 0 && !wait_dead(pid, 2000))
      fail_msg("container %s (pid %d) still runs", name, (int)pid);
  }
  closedir(d);
}

/* ---------------------------------------------------------------- main */

static int group_setup(void **state) {
  const char *tmp = getenv("TMPDIR");
  g.root = xasprintf("%s/mps-docker-test-XXXXXX", tmp && tmp[0] == '/' ? tmp : "/tmp");
  if (!mkdtemp(g.root)) return -1;
  chmod(g.root, 0755);
  g.standin_dir = xasprintf("%s/standin", g.root);
  if (mkdir(g.standin_dir, 0755) < 0) return -1;
  g.standin = xasprintf("%s/docker-standin", g.standin_dir);
  cleanup_free char *text = read_text(STANDIN_FIXTURE);
  if (!text) return -1;
  write_text(g.standin, text, 0755);
  setenv("MPS_DOCKER", g.standin, 1);
  unsetenv("MPS_DOCKER_IMAGE");
  /* The supervisor the backend starts the client under (drop.c, "Containers"), and where
   * the runs' channel directories go. */
  setenv("MPS_CONTAINER_INIT", MPS_BINARY_DIR "/mps-container-init", 1);
  cleanup_free char *run_dir = xasprintf("%s/runs", g.root);
  setenv("MPS_DOCKER_RUN_DIR", run_dir, 1);
  cm_error_t err = CM_ERROR_INIT;
  g.loop = cm_loop_new(&err);
  g.backend = probed_backend();
  if (!g.backend->available) {
    fprintf(stderr, "the docker backend is unavailable with the stand-in: %s\n",
            g.backend->unavailable);
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  sbx_backend_free(g.backend);
  cm_loop_free(g.loop);
  /* Leftover stand-in containers (a failed test) must not outlive the test. */
  cleanup_free char *dir = xasprintf("%s/containers", g.standin_dir);
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".pid") != 0) continue;
    cleanup_free char *name = xstrndup(e->d_name, n - 4);
    pid_t pid = container_pid(name);
    if (pid > 0) kill(pid, SIGKILL);
  }
  if (d) closedir(d);
  cm_error_t err = CM_ERROR_INIT;
  cm_rm_rf(g.root, &err);
  cm_error_release(&err);
  free(g.root);
  free(g.standin_dir);
  free(g.standin);
  return 0;
}

int main(void) {
  if (access(SYSTEM_PYTHON, X_OK) < 0) {
    printf("skipped: the stand-in docker client needs %s\n", SYSTEM_PYTHON);
    return 77;
  }
  /* A secret in the server's environment that neither the container nor the client may see,
   * and an engine address that leads nowhere, should a real client ever be reached. */
  setenv("MPS_TEST_SECRET", SECRET_ENV_VALUE, 1);
  setenv("DOCKER_HOST", NO_ENGINE_HOST, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_probe_succeeds),
      cmocka_unit_test(test_probe_engine_down),
      cmocka_unit_test(test_probe_image_missing),
      cmocka_unit_test(test_probe_client_missing),
      cmocka_unit_test(test_probe_image_name),
      cmocka_unit_test(test_probe_is_bounded),
      cmocka_unit_test(test_argv_has_every_flag),
      cmocka_unit_test(test_argv_without_limits),
      cmocka_unit_test(test_interpreter_mapping),
      cmocka_unit_test(test_spec_validation),
      cmocka_unit_test(test_workdir_handed_to_container_uid),
      cmocka_unit_test(test_real_client_accepts_argv),
      cmocka_unit_test(test_run_output_and_exit_code),
      cmocka_unit_test(test_timeout_kills_container_by_name),
      cmocka_unit_test(test_term_ignored_killed_after_grace),
      cmocka_unit_test(test_cancel_kills_container_by_name),
      cmocka_unit_test(test_client_dies_container_removed),
      cmocka_unit_test(test_nothing_left_behind),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
