/* The bwrap backend, driven for real through sbx_run_start() on a cm_loop_t: every test
 * runs a (mostly hostile) Python script in a real sandbox and checks that it is contained.
 *
 * Needs bubblewrap and the drop helper (built with this test).  Exits 77 when bwrap cannot
 * create a sandbox on this machine at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "sandbox/sandbox-internal.h"

#ifndef MPS_SANDBOX_DROP_PATH
#define MPS_SANDBOX_DROP_PATH MPS_BINARY_DIR "/mps-sandbox-drop"
#endif

#define UNUSED __attribute__((unused))
#define SYSTEM_PYTHON "/usr/bin/python3"
#define UID_BASE 2000000000u
/* The 4096 uids the backend hands out in this process (its instance's block: other
 * instances get others). */
static uid_t our_uid_first(void) {
  unsigned count;
  uid_t first = sbx_uid_block(&count);
  assert_int_equal(count, 4096);
  assert_true(first >= UID_BASE && (first - UID_BASE) % 4096 == 0);
  return first;
}
#define OUR_UID_FIRST our_uid_first()
#define OUR_UID_END (OUR_UID_FIRST + 4096)
#define SECRET_ENV_VALUE "hunter2-host-secret"

static struct {
  sbx_backend_t *backend;
  sbx_backend_t *none;
  cm_loop_t *loop;
  char *root;  /* every file this test makes lives here */
  char *state; /* a stand-in for the server's state directory */
  char *pyenv_python, *pyenv_prefix;
  int seq;
} g;

/* ---------------------------------------------------------------- running scripts */

typedef struct run_capture run_capture_t;

typedef struct run_opts {
  sbx_backend_t *backend; /* default g.backend */
  char *python;           /* default SYSTEM_PYTHON */
  char *const *argv;      /* overrides python + script */
  char *ro_bind;          /* one extra read-only bind */
  const sbx_mount_t *mounts;
  size_t n_mounts;
  const sbx_identity_t *identity;
  bool network;
  const sbx_egress_t *egress;
  bool hold; /* start held; c->user is then a callback run before the release */
  const sbx_limits_t *limits;
  void (*on_chunk)(run_capture_t *c); /* after each piece of output */
} run_opts_t;

struct run_capture {
  cm_buf_t out, err;
  sbx_result_t result;
  bool done;
  char *workdir;
  void *user;
  void (*on_chunk)(run_capture_t *c);
};

static const sbx_limits_t default_limits = {
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
  if (c->on_chunk) c->on_chunk(c);
}

static void on_exit_cb(void *data, const sbx_result_t *result) {
  run_capture_t *c = data;
  c->result = *result;
  c->done = true;
}

static char *new_workdir(void) {
  char *dir = xasprintf("%s/runs/run-%d", g.root, ++g.seq);
  assert_int_equal(mkdir(dir, 0700), 0);
  return dir;
}

static void write_file(const char *dir, const char *name, const char *text, mode_t mode) {
  cleanup_free char *path = xasprintf("%s/%s", dir, name);
  cm_error_t err = CM_ERROR_INIT;
  if (cm_write_file(path, text, strlen(text), mode, &err) < 0) fail_msg("%s", err.msg);
}

/* Runs script (in a fresh work directory unless c->workdir is set) to completion. */
static void run_script(run_capture_t *c, const char *script, const run_opts_t *o) {
  static const run_opts_t no_opts = {0};
  if (!o) o = &no_opts;
  cm_buf_init(&c->out, 1 << 20);
  cm_buf_init(&c->err, 1 << 20);
  c->on_chunk = o->on_chunk;
  if (!c->workdir) c->workdir = new_workdir();
  if (script) write_file(c->workdir, "script.py", script, 0600);

  char *default_argv[] = {o->python ? o->python : SYSTEM_PYTHON, "-I", "script.py", NULL};
  char *envp[] = {"PATH=/usr/bin:/bin", "HOME=/work", "LANG=C.UTF-8", NULL};
  char *binds[] = {o->ro_bind, NULL};
  sbx_spec_t spec = {
      .argv = o->argv ? o->argv : default_argv,
      .envp = envp,
      .workdir = c->workdir,
      .ro_binds = binds,
      .mounts = o->mounts,
      .n_mounts = o->n_mounts,
      .identity = o->identity,
      .network = o->network,
      .egress = o->egress,
      .hold = o->hold,
      .limits = o->limits ? *o->limits : default_limits,
  };
  sbx_run_callbacks_t cbs = {.on_output = on_output, .on_exit = on_exit_cb};
  sbx_run_t *run = NULL;
  cm_error_t err = CM_ERROR_INIT;
  if (sbx_run_start(g.loop, o->backend ? o->backend : g.backend, &spec, &cbs, c, &run, &err) < 0)
    fail_msg("sbx_run_start: %s", err.msg);
  if (o->hold) {
    uint64_t until = cm_now_ms() + 300; /* set up, and the supervisor waits */
    while (cm_now_ms() < until) assert_int_equal(cm_loop_run_once(g.loop, 50, &err), 0);
    if (c->user) ((void (*)(void))c->user)();
    if (sbx_run_release(run, &cbs, c, default_limits.timeout_ms, &err) < 0)
      fail_msg("release: %s", err.msg);
  }
  while (!c->done) assert_int_equal(cm_loop_run_once(g.loop, 1000, &err), 0);
  sbx_run_free(run);
  assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0); /* runs the deferred free */
}

static void capture_release(run_capture_t *c) {
  cm_buf_release(&c->out);
  cm_buf_release(&c->err);
  free(c->workdir);
  c->workdir = NULL;
}

static bool has(const cm_buf_t *b, const char *needle) {
  return b->data && strstr(b->data, needle);
}

static void dump(const run_capture_t *c) {
  print_message(
      "--- stdout ---\n%s\n--- stderr ---\n%s\n--- exit %d signal %d timed_out %d "
      "status_unknown %d\n",
      c->out.data ? c->out.data : "", c->err.data ? c->err.data : "", c->result.exit_code,
      c->result.term_signal, c->result.timed_out, c->result.status_unknown);
}

#define assert_has(buf, s)                      \
  do {                                          \
    if (!has(buf, s)) {                         \
      dump(c);                                  \
      fail_msg("expected \"%s\" in output", s); \
    }                                           \
  } while (0)
#define assert_lacks(buf, s)                      \
  do {                                            \
    if (has(buf, s)) {                            \
      dump(c);                                    \
      fail_msg("unexpected \"%s\" in output", s); \
    }                                             \
  } while (0)

/* "UID=<n>" as the script printed it. */
static uid_t script_uid(const run_capture_t *c) {
  const char *p = c->out.data ? strstr(c->out.data, "UID=") : NULL;
  assert_non_null(p);
  return (uid_t)strtoul(p + 4, NULL, 10);
}

/* ---------------------------------------------------------------- host-side /proc */

typedef struct proc_info {
  pid_t pid;
  uid_t uid;
  char state;
  char status[4096];
} proc_info_t;

static bool read_proc(pid_t pid, proc_info_t *pi) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, pi->status, sizeof pi->status - 1);
  close(fd);
  if (n <= 0) return false;
  pi->status[n] = '\0';
  pi->pid = pid;
  const char *s = strstr(pi->status, "\nState:\t");
  const char *u = strstr(pi->status, "\nUid:\t");
  if (!s || !u) return false;
  pi->state = s[8];
  pi->uid = (uid_t)strtoul(u + 6, NULL, 10);
  return true;
}

/* Live (non-zombie) host processes whose real uid is in [lo, hi). */
static int count_procs(uid_t lo, uid_t hi, proc_info_t *first) {
  DIR *d = opendir("/proc");
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    proc_info_t pi;
    if (!read_proc(atoi(e->d_name), &pi) || pi.state == 'Z') continue;
    if (pi.uid < lo || pi.uid >= hi) continue;
    if (n++ == 0 && first) *first = pi;
  }
  closedir(d);
  return n;
}

/* Live processes of uid, waiting up to a second for teardown that is in flight. */
static int procs_left(uid_t uid) {
  int n = 0;
  for (int i = 0; i < 100; i++) {
    n = count_procs(uid, uid + 1, NULL);
    if (n == 0) break;
    usleep(10000);
  }
  return n;
}

static const char *status_field(const proc_info_t *pi, const char *name, char *out, size_t max) {
  cleanup_free char *key = xasprintf("\n%s:\t", name);
  const char *p = strstr(pi->status, key);
  if (!p) return NULL;
  p += strlen(key);
  size_t n = strcspn(p, "\n");
  snprintf(out, max, "%.*s", (int)CM_MIN(n, max - 1), p);
  return out;
}

/* ---------------------------------------------------------------- the probe */

static void test_probe_succeeds(void **state UNUSED) {
  assert_true(g.backend->available);
  cleanup_free char *d = sbx_backend_describe(g.backend);
  print_message("backend: %s\n", d);
  assert_non_null(strstr(d, "bubblewrap "));
  assert_non_null(strstr(d, "seccomp"));
  assert_null(strstr(d, "unavailable"));
}

static void test_probe_bogus_bwrap(void **state UNUSED) {
  cm_error_t err = CM_ERROR_INIT;
  sbx_backend_t *b = sbx_backend_new("bwrap", &err);
  assert_non_null(b);
  sbx_bwrap_set_paths(b, "/nonexistent/bin/bwrap", MPS_SANDBOX_DROP_PATH);
  sbx_backend_probe(b);
  assert_false(b->available);
  print_message("bogus path: %s\n", b->unavailable);
  assert_non_null(strstr(b->unavailable, "/nonexistent/bin/bwrap"));
  cleanup_free char *d = sbx_backend_describe(b);
  assert_non_null(strstr(d, "unavailable"));
  /* And a run on it is refused, not run unsandboxed. */
  run_capture_t c = {0};
  char *argv[] = {SYSTEM_PYTHON, "-c", "pass", NULL};
  char *envp[] = {NULL};
  cleanup_free char *wd = new_workdir();
  sbx_spec_t spec = {.argv = argv, .envp = envp, .workdir = wd, .limits = default_limits};
  sbx_run_callbacks_t cbs = {.on_output = on_output, .on_exit = on_exit_cb};
  sbx_run_t *run = NULL;
  assert_int_equal(sbx_run_start(g.loop, b, &spec, &cbs, &c, &run, &err), -1);
  assert_int_equal(err.kind, CM_ERR_UNAVAILABLE);
  cm_error_release(&err);
  sbx_run_reap_detached();
  sbx_backend_free(b);

  /* A bwrap that runs but cannot make namespaces (as under a userns-restricting LSM). */
  cleanup_free char *fake = xasprintf("%s/fake-bwrap", g.root);
  write_file(g.root, "fake-bwrap",
             "#!/bin/sh\n"
             "if [ \"$1\" = --version ]; then echo 'bubblewrap 0.8.0'; exit 0; fi\n"
             "echo 'bwrap: No permissions to create new namespace' >&2\n"
             "exit 1\n",
             0755);
  b = sbx_backend_new("bwrap", &err);
  sbx_bwrap_set_paths(b, fake, MPS_SANDBOX_DROP_PATH);
  sbx_backend_probe(b);
  assert_false(b->available);
  print_message("no namespaces: %s\n", b->unavailable);
  assert_non_null(strstr(b->unavailable, "bwrap cannot create the sandbox"));
  assert_non_null(strstr(b->unavailable, "No permissions to create new namespace"));
  sbx_run_reap_detached();
  sbx_backend_free(b);
}

/* The probe on a loop: it returns at once, the loop keeps running while the probe's
 * command waits (a stand-in for bwrap holds `--version` until a FIFO gets a line), the
 * outcome comes by callback exactly once, never from inside the start.  Cancelling a probe
 * in flight kills and reaps its command and never calls back. */
typedef struct {
  int calls;
  bool ticked;
} probe_seen_t;

static void on_probe_done(void *data, sbx_backend_t *b) {
  ((probe_seen_t *)data)->calls++;
}
static void on_tick(cm_loop_t *loop, cm_timer_t *t, void *data) {
  *(bool *)data = true;
}

static pid_t child_running(const char *marker) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  pid_t found = 0;
  while (d && (e = readdir(d)) && !found) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], buf[4096];
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) continue;
    for (ssize_t i = 0; i < n; i++)
      if (!buf[i]) buf[i] = ' ';
    buf[n] = '\0';
    if (strstr(buf, marker) && strstr(buf, "--version")) found = (pid_t)atoi(e->d_name);
  }
  if (d) closedir(d);
  return found;
}

static void test_probe_is_asynchronous(void **state UNUSED) {
  cm_error_t err = CM_ERROR_INIT;
  cleanup_free char *gate = xasprintf("%s/probe-gate", g.root);
  assert_int_equal(mkfifo(gate, 0600), 0);
  cleanup_free char *bwrap_path = cm_find_executable("bwrap");
  cleanup_free char *script =
      xasprintf("#!/bin/sh\nif [ \"$1\" = --version ]; then read line < %s; fi\nexec %s \"$@\"\n",
                gate, bwrap_path);
  write_file(g.root, "held-bwrap", script, 0755);
  cleanup_free char *fake = xasprintf("%s/held-bwrap", g.root);

  for (int cancel = 0; cancel < 2; cancel++) {
    sbx_backend_t *b = sbx_backend_new("bwrap", &err);
    sbx_bwrap_set_paths(b, fake, MPS_SANDBOX_DROP_PATH);
    probe_seen_t seen = {0};
    sbx_probe_t *probe = sbx_backend_probe_start(b, g.loop, on_probe_done, &seen);
    assert_non_null(probe);
    assert_true(sbx_backend_probing(b));
    assert_int_equal(seen.calls, 0);
    /* The loop runs while the command is held. */
    cm_loop_timer(g.loop, 10, on_tick, &seen.ticked);
    while (!seen.ticked) assert_int_equal(cm_loop_run_once(g.loop, 1000, &err), 0);
    uint64_t until = cm_now_ms() + 5000;
    pid_t held = 0;
    while (!(held = child_running(fake)) && cm_now_ms() < until)
      assert_int_equal(cm_loop_run_once(g.loop, 20, &err), 0);
    assert_true(held > 0);
    assert_int_equal(seen.calls, 0);
    assert_true(sbx_backend_probing(b));
    if (cancel) {
      sbx_probe_cancel(probe);
      assert_false(sbx_backend_probing(b));
      assert_int_equal(kill(held, 0), -1); /* killed and reaped */
      for (int i = 0; i < 5; i++) assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0);
      assert_int_equal(seen.calls, 0);
    } else {
      int fd = open(gate, O_WRONLY | O_CLOEXEC);
      assert_true(fd >= 0);
      assert_int_equal(write(fd, "go\n", 3), 3);
      close(fd);
      until = cm_now_ms() + 30000;
      while (seen.calls == 0 && cm_now_ms() < until)
        assert_int_equal(cm_loop_run_once(g.loop, 100, &err), 0);
      assert_int_equal(seen.calls, 1);
      assert_false(sbx_backend_probing(b));
      assert_true(b->available);
      for (int i = 0; i < 5; i++) assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0);
      assert_int_equal(seen.calls, 1);
    }
    sbx_run_reap_detached();
    sbx_backend_free(b);
  }
  unlink(gate);
}

/* A probe that fails before running anything still answers from the loop, not from
 * inside the start. */
static void test_probe_failure_is_deferred(void **state UNUSED) {
  cm_error_t err = CM_ERROR_INIT;
  sbx_backend_t *b = sbx_backend_new("bwrap", &err);
  sbx_bwrap_set_paths(b, "/nonexistent/bin/bwrap", MPS_SANDBOX_DROP_PATH);
  probe_seen_t seen = {0};
  sbx_backend_probe_start(b, g.loop, on_probe_done, &seen);
  assert_int_equal(seen.calls, 0);
  assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0);
  assert_int_equal(seen.calls, 1);
  assert_false(b->available);
  assert_non_null(strstr(b->unavailable, "/nonexistent/bin/bwrap"));
  sbx_run_reap_detached();
  sbx_backend_free(b);
}

/* ---------------------------------------------------------------- it works */

static void test_runs_python(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  run_script(c,
             "import os, sys, pwd, socket, ssl, threading, subprocess\n"
             "print('UID=%d' % os.getuid(), 'GID=%d' % os.getgid(), os.getgroups())\n"
             "print('CWD=' + os.getcwd(), sys.argv, pwd.getpwuid(os.getuid()).pw_name)\n"
             "print('HOST=' + socket.gethostname())\n"
             "t = threading.Thread(target=lambda: print('THREAD'), daemon=True); t.start(); "
             "t.join()\n"
             "print(subprocess.run(['/bin/echo', 'SUBPROCESS'], capture_output=True, "
             "text=True).stdout.strip())\n"
             "open('out.txt', 'w').write('artifact')\n"
             "print('ENV=' + ','.join(sorted(os.environ)))\n",
             NULL);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  uid_t uid = script_uid(c);
  assert_true(uid >= OUR_UID_FIRST && uid < OUR_UID_END);
  assert_has(&c->out, "[]"); /* no supplementary groups */
  assert_has(&c->out, "CWD=/work ['script.py'] sandbox");
  assert_has(&c->out, "HOST=sandbox");
  assert_has(&c->out, "THREAD");
  assert_has(&c->out, "SUBPROCESS");
  /* Exactly the spec's environment, plus PWD, which bwrap sets to the --chdir directory. */
  assert_has(&c->out, "ENV=HOME,LANG,PATH,PWD\n");
  /* Output files land in the host work directory. */
  cleanup_free char *out = xasprintf("%s/out.txt", c->workdir);
  struct stat st;
  assert_int_equal(stat(out, &st), 0);
  assert_int_equal(st.st_uid, uid);
  capture_release(c);
}

static void test_runs_pyenv_python(void **state UNUSED) {
  if (!g.pyenv_python) {
    print_message("no pyenv interpreter under /root/.pyenv/versions; skipped\n");
    skip();
  }
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.python = g.pyenv_python, .ro_bind = g.pyenv_prefix};
  run_script(c,
             "import os, sys\n"
             "print('PREFIX=' + sys.prefix)\n"
             "print('ROOT=' + ','.join(sorted(os.listdir('/root'))))\n"
             "print('VERSIONS=' + ','.join(os.listdir('/root/.pyenv/versions')))\n"
             "for p in ['/root/.bashrc', '/root/.profile', '/root/.cache', '/root/.ssh']:\n"
             "    print(('LEAK ' if os.path.exists(p) else 'hidden ') + p)\n",
             &o);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  cleanup_free char *prefix = xasprintf("PREFIX=%s\n", g.pyenv_prefix);
  assert_has(&c->out, prefix);
  assert_has(&c->out, "ROOT=.pyenv\n");
  cleanup_free char *versions = xasprintf("VERSIONS=%s\n", strrchr(g.pyenv_prefix, '/') + 1);
  assert_has(&c->out, versions);
  assert_lacks(&c->out, "LEAK");
  capture_release(c);
}

/* ---------------------------------------------------------------- reading and writing */

static void test_host_files_hidden(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  c->workdir = new_workdir();
  /* Paths the script must not see: the server's state, another run's directory, homes. */
  cleanup_free char *other = xasprintf("%s/runs/run-1/script.py", g.root);
  cleanup_free char *paths =
      xasprintf("%s\n%s/secret.txt\n%s\n%s\n", g.state, g.state, other, g.root);
  write_file(c->workdir, "paths.txt", paths, 0644);
  run_script(c,
             "import os\n"
             "probe = [l for l in open('paths.txt').read().splitlines() if l]\n"
             "probe += ['/etc/shadow', '/etc/gshadow', '/etc/sudoers', '/etc/ssl/private',\n"
             "          '/root', '/root/.bashrc', '/home', '/var', '/opt', '/srv', '/mnt',\n"
             "          '/sys', '/boot', '/lost+found', '/root/.pyenv',\n"
             "          '/root/.cache/pip', '/root/.cache/uv', '/var/run/docker.sock']\n"
             "for p in probe:\n"
             "    try:\n"
             "        if os.path.isdir(p): os.listdir(p)\n"
             "        else: open(p, 'rb').read(1)\n"
             "        print('LEAK', p)\n"
             "    except OSError as e:\n"
             "        print('denied', p, e.errno)\n"
             "print('ETC=' + ','.join(sorted(os.listdir('/etc'))))\n"
             "print('PASSWD=' + open('/etc/passwd').read().replace('\\n', '|'))\n",
             NULL);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_lacks(&c->out, "LEAK");
  assert_has(&c->out, "denied /etc/shadow");
  {
    /* /etc holds the loader's and the time zone's files, and what libraries under /usr
     * resolve through where the host has them (alternatives, fontconfig, matplotlibrc). */
    cm_buf_t want;
    cm_buf_init(&want, 0);
    cm_buf_appends(&want, "ETC=");
    if (access("/etc/alternatives", F_OK) == 0) cm_buf_appends(&want, "alternatives,");
    if (access("/etc/fonts", F_OK) == 0) cm_buf_appends(&want, "fonts,");
    cm_buf_appends(&want, "group,hosts,ld.so.cache,localtime,");
    if (access("/etc/matplotlibrc", F_OK) == 0) cm_buf_appends(&want, "matplotlibrc,");
    /* resolv.conf: the sandbox's own, naming nothing of the host (every sandbox but one on
     * the host's network gets it, as hosts). */
    cm_buf_appends(&want, "passwd,resolv.conf\n");
    assert_has(&c->out, want.data);
    cm_buf_release(&want);
  }
  assert_lacks(&c->out, "shadow,");
  {
    uid_t uid = 0;
    const char *p = strstr(c->out.data, "PASSWD=");
    assert_non_null(p);
    assert_int_equal(strncmp(p, "PASSWD=root:x:0:0:", 18), 0);
    const char *s = strstr(p, "|sandbox:x:");
    assert_non_null(s);
    uid = (uid_t)strtoul(s + 11, NULL, 10);
    assert_true(uid >= OUR_UID_FIRST && uid < OUR_UID_END);
    assert_non_null(strstr(s, ":/work:/usr/sbin/nologin|\n"));
  }
  capture_release(c);
}

static void test_writes_confined(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  run_script(c,
             "import os\n"
             "for d in ['/', '/etc', '/usr', '/usr/lib', '/usr/bin', '/bin', '/run', '/root',\n"
             "          '/dev', '/proc', '/etc/ssl/certs', '/dev/pts']:\n"
             "    try:\n"
             "        open(os.path.join(d, 'x'), 'w').write('x')\n"
             "        print('WROTE', d)\n"
             "    except OSError as e:\n"
             "        print('refused', d, e.errno)\n"
             "for f in ['/etc/passwd', '/etc/hosts', '/proc/sys/kernel/hostname',\n"
             "          '/proc/sysrq-trigger', '/run/mps-sandbox-drop']:\n"
             "    try:\n"
             "        open(f, 'a').write('x')\n"
             "        print('WROTE', f)\n"
             "    except OSError as e:\n"
             "        print('refused', f, e.errno)\n"
             "open('/work/ok', 'w').write('x'); print('OKWORK')\n"
             "open('/tmp/ok', 'w').write('x'); print('OKTMP')\n"
             "open('/dev/shm/ok', 'w').write('x'); print('OKSHM')\n",
             NULL);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_lacks(&c->out, "WROTE");
  assert_has(&c->out, "OKWORK");
  assert_has(&c->out, "OKTMP");
  assert_has(&c->out, "OKSHM");
  capture_release(c);
}

static void test_symlink_escape(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  c->workdir = new_workdir();
  cleanup_free char *secret = xasprintf("%s/secret.txt", g.state);
  cleanup_free char *l1 = xasprintf("%s/to_shadow", c->workdir);
  cleanup_free char *l2 = xasprintf("%s/to_state", c->workdir);
  cleanup_free char *l3 = xasprintf("%s/to_root", c->workdir);
  assert_int_equal(symlink("/etc/shadow", l1), 0);
  assert_int_equal(symlink(secret, l2), 0);
  assert_int_equal(symlink("/root/.bashrc", l3), 0);
  run_script(c,
             "for p in ['to_shadow', 'to_state', 'to_root']:\n"
             "    try:\n"
             "        print('READ', p, open(p).read()[:20])\n"
             "    except OSError as e:\n"
             "        print('blocked', p, e.errno)\n",
             NULL);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_lacks(&c->out, "READ");
  assert_has(&c->out, "blocked to_state");
  capture_release(c);
}

static void test_environment_is_clean(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  run_script(c,
             "import os, glob\n"
             "secret = '" SECRET_ENV_VALUE
             "'\n"
             "if any(secret in v for v in os.environ.values()): print('SECRET in os.environ')\n"
             "for p in ['/proc/self/environ', '/proc/1/environ'] + glob.glob('/proc/*/environ'):\n"
             "    try:\n"
             "        data = open(p, 'rb').read()\n"
             "        print('read', p, len(data))\n"
             "        if secret.encode() in data: print('SECRET in', p)\n"
             "    except OSError as e:\n"
             "        print('unreadable', p, e.errno)\n"
             "print('PIDS=' + ','.join(sorted(d for d in os.listdir('/proc') if d.isdigit())))\n",
             NULL);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_lacks(&c->out, "SECRET");
  assert_has(&c->out, "read /proc/self/environ");
  /* Only the supervisor (1) and the script (2) exist in its pid namespace. */
  assert_has(&c->out, "PIDS=1,2\n");
  capture_release(c);
}

/* ---------------------------------------------------------------- the kernel surface */

static void test_seccomp_and_privileges(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  run_script(
      c,
      "import ctypes, errno, os\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "L = ctypes.c_long\n"
      "def sc(nr, *a):\n"
      "    r = libc.syscall(L(nr), *[L(x) for x in a])\n"
      "    return errno.errorcode.get(ctypes.get_errno(), '?') if r == -1 else 'OK'\n"
      "checks = [('ptrace_attach', sc(101, 16, 1, 0, 0)), ('ptrace_traceme', sc(101, 0)),\n"
      "  ('process_vm_readv', sc(310, 1, 0, 0, 0, 0, 0)), ('mount', sc(165, 0, 0, 0, 0, 0)),\n"
      "  ('umount2', sc(166, 0, 0)), ('pivot_root', sc(155, 0, 0)), ('chroot', sc(161, 0)),\n"
      "  ('unshare_user', sc(272, 0x10000000)), ('unshare_ns', sc(272, 0x20000)),\n"
      "  ('setns', sc(308, 0, 0)), ('keyctl', sc(250, 0, 0)), ('add_key', sc(248, 0, 0, 0, 0, "
      "0)),\n"
      "  ('bpf', sc(321, 0, 0, 0)), ('perf_event_open', sc(298, 0, 0, 0, 0, 0)),\n"
      "  ('userfaultfd', sc(323, 0)), ('io_uring_setup', sc(425, 1, 0)),\n"
      "  ('io_uring_enter', sc(426, 0, 0, 0, 0, 0, 0)), ('io_uring_register', sc(427, 0, 0, 0, "
      "0)),\n"
      "  ('request_key', sc(249, 0, 0, 0, 0)), ('inotify_init', sc(253)),\n"
      "  ('inotify_init1', sc(294, 0)), ('inotify_add_watch', sc(254, 0, 0, 0)),\n"
      "  ('fanotify_init', sc(300, 0, 0)),\n"
      "  ('open_by_handle_at', sc(304, 0, 0, 0)), ('kexec_load', sc(246, 0, 0, 0, 0)),\n"
      "  ('init_module', sc(175, 0, 0, 0)), ('personality_norandom', sc(135, 0x40000)),\n"
      "  ('clone_newuser', sc(56, 0x10000000 | 17, 0, 0, 0, 0)),\n"
      "  ('clone_newnet', sc(56, 0x40000000 | 17, 0, 0, 0, 0)),\n"
      "  ('ioctl_tiocsti', sc(16, 0, 0x5412, 0)), ('ioctl_tiocsti_hi', sc(16, 0, 0x100005412, "
      "0)),\n"
      "  ('setuid_root', sc(105, 0)), ('setgroups', sc(116, 0, 0))]\n"
      "for name, res in checks: print('SC', name, res)\n"
      "print('SC clone3', sc(435, 0, 0))\n"
      "try:\n"
      "    os.open('/dev/tty', os.O_RDWR); print('TTY open')\n"
      "except OSError as e:\n"
      "    print('TTY', errno.errorcode.get(e.errno))\n"
      "print('SC personality_query', 'OK' if libc.personality(L(0xffffffff)) >= 0 else 'ERR')\n"
      "pid = os.fork()\n"
      "if pid == 0: os._exit(7)\n"
      "print('FORK', os.waitpid(pid, 0)[1] >> 8)\n"
      "s = open('/proc/self/status').read()\n"
      "for k in ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp']:\n"
      "    print('ST', [l for l in s.splitlines() if l.startswith(k + ':')][0].replace('\\t', ' "
      "'))\n",
      NULL);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  static const char *const eperm[] = {
      "ptrace_attach",
      "ptrace_traceme",
      "process_vm_readv",
      "mount",
      "umount2",
      "pivot_root",
      "chroot",
      "unshare_user",
      "unshare_ns",
      "setns",
      "keyctl",
      "add_key",
      "bpf",
      "perf_event_open",
      "userfaultfd",
      "io_uring_setup",
      "io_uring_enter",
      "io_uring_register",
      "request_key",
      "inotify_init",
      "inotify_init1",
      "inotify_add_watch",
      "fanotify_init",
      "open_by_handle_at",
      "kexec_load",
      "init_module",
      "personality_norandom",
      "clone_newuser",
      "clone_newnet",
      "ioctl_tiocsti",
      "ioctl_tiocsti_hi",
      "setuid_root",
      "setgroups",
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(eperm); i++) {
    cleanup_free char *line = xasprintf("SC %s EPERM\n", eperm[i]);
    assert_has(&c->out, line);
  }
  assert_has(&c->out, "SC clone3 ENOSYS\n");
  assert_has(&c->out, "SC personality_query OK\n");
  assert_has(&c->out, "TTY ENXIO\n"); /* no controlling terminal to push input into */
  assert_has(&c->out, "FORK 7\n");
  assert_has(&c->out, "ST CapInh: 0000000000000000\n");
  assert_has(&c->out, "ST CapPrm: 0000000000000000\n");
  assert_has(&c->out, "ST CapEff: 0000000000000000\n");
  assert_has(&c->out, "ST CapBnd: 0000000000000000\n");
  assert_has(&c->out, "ST CapAmb: 0000000000000000\n");
  assert_has(&c->out, "ST NoNewPrivs: 1\n");
  assert_has(&c->out, "ST Seccomp: 2\n");
  capture_release(c);
}

/* While the script runs, look at it from the host. */
typedef struct host_view {
  bool seen;
  proc_info_t pi;
  int n;
} host_view_t;

static void look_from_host(run_capture_t *c) {
  host_view_t *hv = c->user;
  if (hv->seen || !has(&c->out, "READY")) return;
  hv->seen = true;
  uid_t uid = script_uid(c);
  hv->n = count_procs(uid, uid + 1, &hv->pi);
  write_file(c->workdir, "go", "", 0644);
}

static void test_host_view_of_script(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  host_view_t hv = {0};
  c->user = &hv;
  run_opts_t o = {.on_chunk = look_from_host};
  run_script(c,
             "import os, time\n"
             "print('UID=%d' % os.getuid())\n"
             "print('READY', flush=True)\n"
             "for _ in range(1000):\n"
             "    if os.path.exists('go'): break\n"
             "    time.sleep(0.01)\n"
             "print('DONE')\n",
             &o);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_true(hv.seen);
  assert_has(&c->out, "DONE");
  assert_int_equal(hv.n, 1); /* exactly the interpreter runs as the run's uid */
  char v[256], v1[64], v2[64], v3[64];
  uid_t uid = script_uid(c);
  cleanup_free char *uids = xasprintf("%u\t%u\t%u\t%u", uid, uid, uid, uid);
  print_message("host view of pid %d: Uid %s, CapEff %s, NoNewPrivs %s, Seccomp %s\n",
                (int)hv.pi.pid, status_field(&hv.pi, "Uid", v, sizeof v),
                status_field(&hv.pi, "CapEff", v1, sizeof v1),
                status_field(&hv.pi, "NoNewPrivs", v2, sizeof v2),
                status_field(&hv.pi, "Seccomp", v3, sizeof v3));
  assert_string_equal(status_field(&hv.pi, "Uid", v, sizeof v), uids);
  assert_string_equal(status_field(&hv.pi, "Gid", v, sizeof v), uids);
  assert_string_equal(status_field(&hv.pi, "CapEff", v, sizeof v), "0000000000000000");
  assert_string_equal(status_field(&hv.pi, "CapPrm", v, sizeof v), "0000000000000000");
  assert_string_equal(status_field(&hv.pi, "CapBnd", v, sizeof v), "0000000000000000");
  assert_string_equal(status_field(&hv.pi, "NoNewPrivs", v, sizeof v), "1");
  assert_string_equal(status_field(&hv.pi, "Seccomp", v, sizeof v), "2");
  assert_int_equal(procs_left(uid), 0);
  capture_release(c);
}

/* ---------------------------------------------------------------- network */

static void test_network(void **state UNUSED) {
  int srv = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(srv >= 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(srv, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(srv, 8), 0);
  socklen_t len = sizeof addr;
  assert_int_equal(getsockname(srv, (struct sockaddr *)&addr, &len), 0);
  cleanup_free char *script = xasprintf(
      "import socket\n"
      "try:\n"
      "    socket.create_connection(('127.0.0.1', %d), timeout=3).close()\n"
      "    print('CONNECTED')\n"
      "except OSError as e:\n"
      "    print('NETFAIL', e.errno)\n"
      "print('IFACES=' + ','.join(n for _, n in socket.if_nameindex()))\n"
      "import os, ssl\n"
      "print('ETC=' + ','.join(sorted(os.listdir('/etc'))))\n"
      "print('CAS=%%d' %% ssl.create_default_context().cert_store_stats()['x509_ca'])\n",
      ntohs(addr.sin_port));

  run_capture_t cap = {0}, *c = &cap;
  run_script(c, script, NULL);
  assert_int_equal(c->result.exit_code, 0);
  assert_has(&c->out, "NETFAIL");
  assert_lacks(&c->out, "CONNECTED");
  assert_has(&c->out, "IFACES=lo\n");
  capture_release(c);

  /* With network on, the same server is reachable: the flag really does something. */
  run_opts_t o = {.network = true};
  run_capture_t cap2 = {0};
  c = &cap2;
  run_script(c, script, &o);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_has(&c->out, "CONNECTED");
  assert_has(&c->out, "resolv.conf");
  assert_lacks(&c->out, "CAS=0\n");
  capture_release(c);
  close(srv);
}

/* The supervisor as forwarder: connections to 127.0.0.1:PORT and [::1]:PORT inside the
 * sandbox arrive here as file descriptors over the socket pair; nothing else gets out. */
typedef struct egress_peer {
  int fd; /* our end */
  int received;
} egress_peer_t;

static egress_peer_t egress_peer;

static void on_egress(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  egress_peer_t *p = data;
  for (;;) {
    char byte;
    struct iovec iov = {&byte, 1};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n <= 0) return;
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    assert_non_null(h);
    assert_int_equal(h->cmsg_type, SCM_RIGHTS);
    int conn;
    memcpy(&conn, CMSG_DATA(h), sizeof conn);
    p->received++;
    /* A connected TCP socket of the sandbox's namespace: answer on it. */
    int type = 0;
    socklen_t tl = sizeof type;
    assert_int_equal(getsockopt(conn, SOL_SOCKET, SO_TYPE, &type, &tl), 0);
    assert_int_equal(type, SOCK_STREAM);
    assert_int_equal(write(conn, "pong\n", 5), 5);
    close(conn);
  }
}

/* The same for a forked child, where cmocka's assertions cannot be used. */
static void on_egress_plain(cm_loop_t *loop, int fd, uint32_t revents, void *data) {
  egress_peer_t *p = data;
  for (;;) {
    char byte;
    struct iovec iov = {&byte, 1};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    if (recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0) return;
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    if (!h || h->cmsg_type != SCM_RIGHTS) continue;
    int conn;
    memcpy(&conn, CMSG_DATA(h), sizeof conn);
    p->received++;
    if (write(conn, "pong\n", 5) != 5) p->received = -1000;
    close(conn);
  }
}

static const char egress_script[] =
    "import socket, sys\n"
    "for host in ('127.0.0.1', '::1'):\n"
    "    try:\n"
    "        s = socket.create_connection((host, 3128), timeout=5)\n"
    "        print(host, 'GOT', s.recv(16).decode().strip() or 'EOF')\n"
    "    except OSError as e:\n"
    "        print(host, 'NOPROXY', type(e).__name__)\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)\n"
    "    print('HOSTLOOPBACK')\n"
    "except OSError as e:\n"
    "    print('isolated', e.errno)\n";

static void close_egress_peer(void) {
  close(egress_peer.fd);
  egress_peer.fd = -1;
}

static void test_egress_forwarder(void **state UNUSED) {
  int srv = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(srv, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(srv, 8), 0);
  socklen_t len = sizeof addr;
  assert_int_equal(getsockname(srv, (struct sockaddr *)&addr, &len), 0);
  cleanup_free char *port = xasprintf("%d", ntohs(addr.sin_port));
  char *argv[] = {SYSTEM_PYTHON, "-I", "script.py", port, NULL};

  for (int held = 0; held < 2; held++) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    egress_peer = (egress_peer_t){.fd = sv[0]};
    cm_error_t err = CM_ERROR_INIT;
    cm_watch_t *w = cm_loop_watch(g.loop, sv[0], EPOLLIN, on_egress, &egress_peer, &err);
    assert_non_null(w);
    sbx_egress_t eg = {.fd = sv[1], .port = 3128};
    run_opts_t o = {.network = true, .egress = &eg, .argv = argv, .hold = held};
    run_capture_t cap = {0}, *c = &cap;
    run_script(c, egress_script, &o);
    close(sv[1]);
    if (c->result.exit_code != 0) dump(c);
    assert_int_equal(c->result.exit_code, 0);
    /* A prestarted (held) sandbox has its listener before the go. */
    assert_has(&c->out, "127.0.0.1 GOT pong");
    assert_has(&c->out, "isolated");
    assert_lacks(&c->out, "HOSTLOOPBACK");
    bool v6 = has(&c->out, "::1 GOT pong");
    assert_int_equal(egress_peer.received, v6 ? 2 : 1);
    capture_release(c);
    cm_watch_remove(w);
    close(sv[0]);
  }

  /* The server's end closed before the script runs: the forwarder stops listening. */
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
  egress_peer = (egress_peer_t){.fd = sv[0]};
  sbx_egress_t eg = {.fd = sv[1], .port = 3128};
  run_opts_t o = {.network = true, .egress = &eg, .argv = argv, .hold = true};
  run_capture_t cap = {0}, *c = &cap;
  c->user = (void *)close_egress_peer;
  run_script(c, egress_script, &o);
  close(sv[1]);
  assert_int_equal(c->result.exit_code, 0);
  assert_has(&c->out, "127.0.0.1 NOPROXY");
  assert_lacks(&c->out, "GOT pong");
  capture_release(c);
  close(srv);
}

/* ---------------------------------------------------------------- resource abuse */

static void test_fork_bomb(void **state UNUSED) {
  sbx_limits_t l = default_limits;
  l.max_processes = 32;
  l.timeout_ms = 4000; /* (the script's start, on a loaded machine, comes well before) */
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.limits = &l};
  run_script(c,
             "import os, time\n"
             "print('UID=%d' % os.getuid(), flush=True)\n"
             "n = fails = 0\n"
             "while n + fails < 5000:\n"
             "    try:\n"
             "        if os.fork() == 0:\n"
             "            n = fails = 0\n"
             "            continue\n"
             "        n += 1\n"
             "    except OSError:\n"
             "        fails += 1\n"
             "        time.sleep(0.001)\n"
             "time.sleep(60)\n",
             &o);
  uid_t uid = script_uid(c);
  print_message("fork bomb: exit %d, timed_out %d, %llu ms\n", c->result.exit_code,
                c->result.timed_out, (unsigned long long)c->result.duration_ms);
  assert_true(c->result.timed_out);
  assert_true(c->result.duration_ms < l.timeout_ms + l.grace_ms + 2000);
  assert_int_equal(procs_left(uid), 0);
  capture_release(c);

  /* The host still forks, and so does the next sandbox. */
  run_capture_t cap2 = {0};
  c = &cap2;
  run_script(c, "import os\nprint('ALIVE', os.getpid())\n", NULL);
  assert_has(&c->out, "ALIVE 2\n");
  capture_release(c);
}

static void test_process_limit_counts_this_run(void **state UNUSED) {
  sbx_limits_t l = default_limits;
  l.max_processes = 16;
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.limits = &l};
  run_script(c,
             "import os, time\n"
             "kids = []\n"
             "try:\n"
             "    for i in range(100):\n"
             "        pid = os.fork()\n"
             "        if pid == 0:\n"
             "            time.sleep(30)\n"
             "            os._exit(0)\n"
             "        kids.append(pid)\n"
             "except OSError as e:\n"
             "    print('LIMIT', len(kids), e.errno)\n",
             &o);
  if (c->result.exit_code != 0) dump(c);
  /* A fresh uid per run: the limit is reached by this run's own processes only (it and
   * its 15 children), whatever else runs on the host. */
  assert_has(&c->out, "LIMIT 15 11\n");
  capture_release(c);
}

static void test_memory_bomb(void **state UNUSED) {
  sbx_limits_t l = default_limits;
  l.memory_bytes = 256ULL << 20;
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.limits = &l};
  run_script(c,
             "try:\n"
             "    x = bytearray(1 << 30)\n"
             "    print('ALLOCATED 1G')\n"
             "except MemoryError:\n"
             "    print('MEMERR big')\n"
             "chunks = []\n"
             "try:\n"
             "    while True: chunks.append(bytearray(16 << 20))\n"
             "except MemoryError:\n"
             "    n = len(chunks)\n"
             "    chunks = None\n"
             "    print('MEMERR after', n * 16, 'MiB')\n",
             &o);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_has(&c->out, "MEMERR big");
  assert_has(&c->out, "MEMERR after");
  assert_lacks(&c->out, "ALLOCATED");
  capture_release(c);
}

static void test_tmp_is_capped(void **state UNUSED) {
  sbx_limits_t l = default_limits;
  l.tmp_bytes = 8ULL << 20;
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.limits = &l};
  run_script(c,
             "import os\n"
             "for d in ['/tmp', '/dev/shm']:\n"
             "    total = 0\n"
             "    try:\n"
             "        with open(os.path.join(d, 'fill'), 'wb') as f:\n"
             "            while total < (64 << 20):\n"
             "                f.write(b'x' * (1 << 20)); f.flush(); total += 1 << 20\n"
             "        print('NOLIMIT', d)\n"
             "    except OSError as e:\n"
             "        print('FULL', d, e.errno, total >> 20)\n",
             &o);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_lacks(&c->out, "NOLIMIT");
  assert_has(&c->out, "FULL /tmp 28 ");
  assert_has(&c->out, "FULL /dev/shm 28 ");
  const char *p = strstr(c->out.data, "FULL /tmp 28 ");
  assert_true(atoi(p + 13) <= 8);
  capture_release(c);
}

static void test_daemon_does_not_outlive_run(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  run_script(c,
             "import os, signal, time, sys\n"
             "print('UID=%d' % os.getuid(), flush=True)\n"
             "if os.fork() == 0:\n"
             "    os.setsid()\n"
             "    if os.fork() == 0:\n"
             "        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT): signal.signal(s, "
             "signal.SIG_IGN)\n"
             "        while not os.path.exists('/work/go'): time.sleep(0.05)\n"
             "        open('/work/marker', 'w').write('I survived')\n"
             "        time.sleep(60)\n"
             "    os._exit(0)\n"
             "os.wait()\n"
             "print('PARENT EXITS')\n",
             NULL);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_has(&c->out, "PARENT EXITS");
  uid_t uid = script_uid(c);
  /* The run did not wait for the daemon (it sleeps a minute once told to go) ... */
  assert_true(c->result.duration_ms < 30000);
  assert_int_equal(procs_left(uid), 0);
  /* ... and the daemon is gone: told to go now, it writes nothing. */
  write_file(c->workdir, "go", "", 0644);
  usleep(500 * 1000);
  cleanup_free char *marker = xasprintf("%s/marker", c->workdir);
  assert_int_equal(access(marker, F_OK), -1);
  assert_int_equal(count_procs(uid, uid + 1, NULL), 0);
  capture_release(c);
}

static void test_sigterm_ignored_killed_at_timeout(void **state UNUSED) {
  sbx_limits_t l = default_limits;
  l.timeout_ms = 4000; /* (the script's start, on a loaded machine, comes well before) */
  l.grace_ms = 500;
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.limits = &l};
  run_script(c,
             "import os, signal, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "print('UID=%d' % os.getuid(), flush=True)\n"
             "if os.fork() == 0:\n"
             "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "    time.sleep(60)\n"
             "while True: time.sleep(1)\n",
             &o);
  uid_t uid = script_uid(c);
  print_message("SIGTERM-ignoring script: ended after %llu ms (timeout 4000, grace 500)\n",
                (unsigned long long)c->result.duration_ms);
  assert_true(c->result.timed_out);
  assert_true(c->result.duration_ms >= 4000 + 500);
  assert_true(c->result.duration_ms < 4000 + 500 + 1000);
  /* The sandbox went down with SIGKILL before the supervisor could report. */
  assert_int_equal(c->result.term_signal, SIGKILL);
  assert_int_equal(c->result.exit_code, -SIGKILL);
  assert_true(c->result.status_unknown);
  assert_int_equal(procs_left(uid), 0);
  capture_release(c);
}

/* ---------------------------------------------------------------- what the result says */

static void test_exit_status_is_the_scripts(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  run_script(c, "import sys\nprint('bye')\nsys.exit(3)\n", NULL);
  if (c->result.exit_code != 3) dump(c);
  assert_int_equal(c->result.exit_code, 3);
  assert_int_equal(c->result.term_signal, 0);
  assert_false(c->result.status_unknown);
  assert_false(c->result.timed_out);
  capture_release(c);

  /* bwrap alone would say "exit 137". */
  run_capture_t cap2 = {0};
  c = &cap2;
  run_script(c, "import os\nos.kill(os.getpid(), 9)\n", NULL);
  if (c->result.term_signal != 9) dump(c);
  assert_int_equal(c->result.term_signal, 9);
  assert_int_equal(c->result.exit_code, -9);
  assert_false(c->result.status_unknown);
  assert_false(c->result.cpu_limit);
  capture_release(c);

  run_capture_t cap3 = {0};
  c = &cap3;
  run_script(c, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", NULL);
  assert_int_equal(c->result.term_signal, SIGSEGV);
  assert_int_equal(c->result.exit_code, -SIGSEGV);
  capture_release(c);
}

/* A held run sets the sandbox up but starts nothing until it is released; its clock starts
 * then; a held run that is freed instead leaves nothing behind. */
static void test_hold_and_release(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  cm_buf_init(&c->out, 1 << 20);
  cm_buf_init(&c->err, 1 << 20);
  c->workdir = new_workdir();
  char *argv[] = {SYSTEM_PYTHON, "-I", "script.py", NULL};
  char *envp[] = {"PATH=/usr/bin:/bin", NULL};
  sbx_limits_t limits = default_limits;
  limits.timeout_ms = 0;
  sbx_spec_t spec = {
      .argv = argv, .envp = envp, .workdir = c->workdir, .hold = true, .limits = limits};
  sbx_run_callbacks_t held_cbs = {.on_exit = on_exit_cb};
  sbx_run_t *run = NULL;
  cm_error_t err = CM_ERROR_INIT;
  assert_true(sbx_backend_can_hold(g.backend));
  if (sbx_run_start(g.loop, g.backend, &spec, &held_cbs, c, &run, &err) < 0)
    fail_msg("%s", err.msg);
  /* Held: the script does not exist yet, and nothing runs for a while. */
  uint64_t until = cm_now_ms() + 400;
  while (cm_now_ms() < until) assert_int_equal(cm_loop_run_once(g.loop, 50, &err), 0);
  assert_false(c->done);
  write_file(c->workdir, "script.py", "import time\ntime.sleep(0.2)\nprint('released')\n", 0644);
  sbx_run_callbacks_t cbs = {.on_output = on_output, .on_exit = on_exit_cb};
  if (sbx_run_release(run, &cbs, c, 100, &err) < 0) fail_msg("%s", err.msg);
  /* Released twice: refused. */
  cm_error_t err2 = CM_ERROR_INIT;
  assert_int_equal(sbx_run_release(run, &cbs, c, 100, &err2), -1);
  cm_error_release(&err2);
  while (!c->done) assert_int_equal(cm_loop_run_once(g.loop, 1000, &err), 0);
  /* The 100 ms timeout counted from the release: the 200 ms sleep hit it. */
  assert_true(c->result.timed_out);
  assert_true(c->result.duration_ms < 400 + 2000);
  sbx_run_free(run);
  assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0);
  capture_release(c);

  /* Released in time: runs and reports normally. */
  run_capture_t cap2 = {0};
  c = &cap2;
  cm_buf_init(&c->out, 1 << 20);
  cm_buf_init(&c->err, 1 << 20);
  c->workdir = new_workdir();
  spec.workdir = c->workdir;
  if (sbx_run_start(g.loop, g.backend, &spec, &held_cbs, c, &run, &err) < 0)
    fail_msg("%s", err.msg);
  write_file(c->workdir, "script.py", "print('released')\n", 0644);
  if (sbx_run_release(run, &cbs, c, 10000, &err) < 0) fail_msg("%s", err.msg);
  while (!c->done) assert_int_equal(cm_loop_run_once(g.loop, 1000, &err), 0);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_has(&c->out, "released");
  assert_false(c->result.status_unknown);
  sbx_run_free(run);
  assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0);
  capture_release(c);

  /* Freed while held: killed, no process of the sandbox's uid is left. */
  run_capture_t cap3 = {0};
  c = &cap3;
  c->workdir = new_workdir();
  spec.workdir = c->workdir;
  if (sbx_run_start(g.loop, g.backend, &spec, &held_cbs, c, &run, &err) < 0)
    fail_msg("%s", err.msg);
  until = cm_now_ms() + 200;
  while (cm_now_ms() < until) assert_int_equal(cm_loop_run_once(g.loop, 50, &err), 0);
  struct stat st;
  assert_int_equal(stat(c->workdir, &st), 0); /* handed to the run's uid */
  sbx_run_free(run);
  assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0);
  assert_false(c->done);
  if (geteuid() == 0) assert_int_equal(procs_left(st.st_uid), 0);
  free(c->workdir);
}

/* spec.hold_in_command (a prestarted interpreter): the command runs at once, but until the
 * release its output goes nowhere and no deadline runs; the release sends nothing (the
 * command is not waiting for the supervisor) and starts the timeout. */
static void test_hold_in_command(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  cm_buf_init(&c->out, 1 << 20);
  cm_buf_init(&c->err, 1 << 20);
  c->workdir = new_workdir();
  /* It says where it is (a file in its work directory) and waits for the test's go (another
   * file, written after the release): no sleep of its own stands in for either. */
  char *argv[] = {SYSTEM_PYTHON, "-I", "-c",
                  "import os, time\nprint('while held', flush=True)\n"
                  "open('/work/started', 'w').close()\n"
                  "while not os.path.exists('/work/go'): time.sleep(0.02)\n"
                  "print('after the release', flush=True)\ntime.sleep(30)\n",
                  NULL};
  char *envp[] = {"PATH=/usr/bin:/bin", NULL};
  sbx_limits_t limits = default_limits;
  limits.timeout_ms = 0;
  sbx_spec_t spec = {.argv = argv,
                     .envp = envp,
                     .workdir = c->workdir,
                     .hold = true,
                     .hold_in_command = true,
                     .limits = limits};
  sbx_run_callbacks_t held_cbs = {.on_exit = on_exit_cb};
  sbx_run_t *run = NULL;
  cm_error_t err = CM_ERROR_INIT;
  if (sbx_run_start(g.loop, g.backend, &spec, &held_cbs, c, &run, &err) < 0)
    fail_msg("%s", err.msg);
  cleanup_free char *started = xasprintf("%s/started", c->workdir);
  uint64_t until = cm_now_ms() + 60000;
  while (access(started, F_OK) < 0 && cm_now_ms() < until)
    assert_int_equal(cm_loop_run_once(g.loop, 20, &err), 0);
  assert_int_equal(access(started, F_OK), 0);
  assert_false(c->done);
  sbx_run_callbacks_t cbs = {.on_output = on_output, .on_exit = on_exit_cb};
  if (sbx_run_release(run, &cbs, c, 1500, &err) < 0) fail_msg("%s", err.msg);
  write_file(c->workdir, "go", "", 0644);
  while (!c->done) assert_int_equal(cm_loop_run_once(g.loop, 1000, &err), 0);
  /* Killed by the timeout given at the release, with only what it printed after it. */
  assert_true(c->result.timed_out);
  assert_has(&c->out, "after the release");
  assert_null(memmem(c->out.data, c->out.len, "while held", 10));
  assert_true(c->result.duration_ms >= 1500);
  sbx_run_free(run);
  assert_int_equal(cm_loop_run_once(g.loop, 0, &err), 0);
  capture_release(c);
}

static void test_usage_is_the_scripts(void **state UNUSED) {
  /* ~0.3 s of CPU and ~100 MB resident in the interpreter itself. */
  run_capture_t cap = {0}, *c = &cap;
  run_script(c,
             "import time\n"
             "x = b'x' * (100 << 20)\n"
             "t = time.process_time()\n"
             "while time.process_time() - t < 0.3: pass\n"
             "print('DONE', len(x))\n",
             NULL);
  print_message("usage: user %llu ms, system %llu ms, max rss %llu KiB\n",
                (unsigned long long)c->result.cpu_user_ms,
                (unsigned long long)c->result.cpu_system_ms,
                (unsigned long long)c->result.max_rss_kib);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_false(c->result.status_unknown);
  assert_true(c->result.cpu_user_ms + c->result.cpu_system_ms >= 200);
  assert_true(c->result.max_rss_kib >= 80 * 1024);
  capture_release(c);

  /* The same in a grandchild that outlives its parent (an orphan the supervisor reaps as
   * subreaper), while the script waits for it to finish through a file. */
  run_capture_t cap2 = {0};
  c = &cap2;
  run_script(c,
             "import os, time\n"
             "if os.fork() == 0:\n"
             "    if os.fork() == 0:\n"
             "        x = b'x' * (100 << 20)\n"
             "        t = time.process_time()\n"
             "        while time.process_time() - t < 0.3: pass\n"
             "        open('/work/burnt', 'w').close()\n"
             "        os._exit(0)\n"
             "    os._exit(0)\n"
             "os.wait()\n"
             "while not os.path.exists('/work/burnt'): time.sleep(0.01)\n"
             "time.sleep(0.1)\n"
             "print('DONE')\n",
             NULL);
  print_message("orphan usage: user %llu ms, system %llu ms, max rss %llu KiB\n",
                (unsigned long long)c->result.cpu_user_ms,
                (unsigned long long)c->result.cpu_system_ms,
                (unsigned long long)c->result.max_rss_kib);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_true(c->result.cpu_user_ms + c->result.cpu_system_ms >= 200);
  assert_true(c->result.max_rss_kib >= 80 * 1024);
  capture_release(c);
}

static void test_cpu_limit_is_reported(void **state UNUSED) {
  sbx_limits_t l = default_limits;
  l.cpu_seconds = 1;
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.limits = &l};
  run_script(c, "print('SPIN', flush=True)\nwhile True: pass\n", &o);
  print_message("busy loop under a 1 s CPU limit: signal %d, %llu ms CPU, %llu ms wall\n",
                c->result.term_signal,
                (unsigned long long)(c->result.cpu_user_ms + c->result.cpu_system_ms),
                (unsigned long long)c->result.duration_ms);
  if (!c->result.cpu_limit) dump(c);
  assert_true(c->result.cpu_limit);
  assert_false(c->result.timed_out);
  assert_false(c->result.status_unknown);
  assert_true(c->result.term_signal == SIGXCPU || c->result.term_signal == SIGKILL);
  assert_true(c->result.cpu_user_ms + c->result.cpu_system_ms >= 500);
  capture_release(c);
}

/* A script that handles SIGTERM: at the timeout it (and every process of it) gets SIGTERM,
 * and the grace period to act on it. */
static void check_graceful_timeout(sbx_backend_t *backend) {
  sbx_limits_t l = default_limits;
  l.timeout_ms = 4000; /* (the script's start, on a loaded machine, comes well before) */
  l.grace_ms = 3000;
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.limits = &l, .backend = backend};
  run_script(c,
             "import os, signal, sys, time\n"
             "def child_term(*a):\n"
             "    open('child-term', 'w').close()\n"
             "    os._exit(0)\n"
             "if os.fork() == 0:\n"
             "    signal.signal(signal.SIGTERM, child_term)\n"
             "    while True: time.sleep(1)\n"
             "def term(*a):\n"
             "    time.sleep(0.2)\n"
             "    print('got TERM', flush=True)\n"
             "    sys.exit(0)\n"
             "signal.signal(signal.SIGTERM, term)\n"
             "print('READY', flush=True)\n"
             "while True: time.sleep(1)\n",
             &o);
  print_message("%s: SIGTERM-handling script ended after %llu ms (timeout 4000, grace 3000)\n",
                sbx_backend_name(backend), (unsigned long long)c->result.duration_ms);
  if (c->result.exit_code != 0 || !has(&c->out, "got TERM")) dump(c);
  assert_true(c->result.timed_out);
  assert_has(&c->out, "READY");
  assert_has(&c->out, "got TERM");
  assert_int_equal(c->result.exit_code, 0);
  assert_int_equal(c->result.term_signal, 0);
  assert_false(c->result.status_unknown);
  assert_true(c->result.duration_ms >= 4000);
  assert_true(c->result.duration_ms < 4000 + 3000);
  cleanup_free char *marker = xasprintf("%s/child-term", c->workdir);
  assert_int_equal(access(marker, F_OK), 0);
  capture_release(c);
}

static void test_grace_on_timeout(void **state UNUSED) {
  check_graceful_timeout(g.backend);
  check_graceful_timeout(g.none);
}

/* The supervisor (pid 1) stays out of the script's reach: it cannot be signalled, traced
 * or have its fds read, so its report cannot be faked or suppressed. */
static void test_supervisor_out_of_reach(void **state UNUSED) {
  run_capture_t cap = {0}, *c = &cap;
  run_script(c,
             "import errno, os, signal, sys\n"
             "print('PPID', os.getppid())\n"
             "for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, 0):\n"
             "    try:\n"
             "        os.kill(1, sig); print('SIGNALLED', sig)\n"
             "    except OSError as e:\n"
             "        print('kill', int(sig), errno.errorcode[e.errno])\n"
             "for p in ['/proc/1/fd', '/proc/1/mem', '/proc/1/environ', '/proc/1/fd/3']:\n"
             "    try:\n"
             "        (os.listdir if p.endswith('fd') else lambda p: open(p, 'rb').read(1))(p)\n"
             "        print('READ', p)\n"
             "    except OSError as e:\n"
             "        print('denied', p, errno.errorcode[e.errno])\n"
             "st = open('/proc/1/status').read()\n"
             "for k in ['Uid', 'CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs']:\n"
             "    print('SUP', [l for l in st.splitlines() if l.startswith(k + ':')][0]"
             ".replace('\\t', ' '))\n"
             "sys.exit(5)\n",
             NULL);
  if (c->result.exit_code != 5) dump(c);
  assert_int_equal(c->result.exit_code, 5);
  assert_false(c->result.status_unknown);
  assert_has(&c->out, "PPID 1\n");
  assert_lacks(&c->out, "SIGNALLED");
  assert_has(&c->out, "kill 9 EPERM\n");
  assert_has(&c->out, "kill 15 EPERM\n");
  assert_lacks(&c->out, "READ");
  assert_has(&c->out, "SUP Uid: 0 0 0 0\n");
  assert_has(&c->out, "SUP CapEff: 0000000000000020\n"); /* CAP_KILL alone */
  assert_has(&c->out, "SUP CapPrm: 0000000000000020\n");
  assert_has(&c->out, "SUP CapBnd: 0000000000000000\n");
  assert_has(&c->out, "SUP NoNewPrivs: 1\n");
  capture_release(c);
}

/* ---------------------------------------------------------------- mounts and identities */

static void test_mounts(void **state UNUSED) {
  cleanup_free char *ro = xasprintf("%s/mount-ro", g.root);
  cleanup_free char *rw = xasprintf("%s/mount-rw", g.root);
  assert_int_equal(mkdir(ro, 0755), 0);
  assert_int_equal(mkdir(rw, 0755), 0);
  write_file(ro, "marker", "read-only content\n", 0644);
  /* World-writable on the host, so that only the mount can refuse the write. */
  cleanup_free char *marker = xasprintf("%s/marker", ro);
  assert_int_equal(chmod(marker, 0666), 0);
  sbx_mount_t mounts[] = {
      {.host = ro, .target = "/env", .writable = false},
      {.host = rw, .target = "/data/out", .writable = true},
  };
  cleanup_free char *script = xasprintf(
      "import errno, os\n"
      "print('UID=%%d' %% os.getuid())\n"
      "print('MARKER', open('/env/marker').read().strip())\n"
      "for p in ['/env/new', '/env/marker', '/data/new']:\n"
      "    try:\n"
      "        open(p, 'a').write('x'); print('WROTE', p)\n"
      "    except OSError as e:\n"
      "        print('refused', p, errno.errorcode[e.errno])\n"
      "open('/data/out/result', 'w').write('written')\n"
      "print('RW ok')\n"
      "print('HOSTPATH', os.path.exists('%s'), os.path.exists('%s'))\n",
      ro, rw);
  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.mounts = mounts, .n_mounts = CM_ARRAY_SIZE(mounts)};
  run_script(c, script, &o);
  if (c->result.exit_code != 0) dump(c);
  assert_int_equal(c->result.exit_code, 0);
  assert_has(&c->out, "MARKER read-only content\n");
  assert_has(&c->out, "refused /env/new EROFS\n");
  assert_has(&c->out, "refused /env/marker EROFS\n");
  assert_has(&c->out, "refused /data/new EROFS\n");
  assert_lacks(&c->out, "WROTE");
  assert_has(&c->out, "RW ok\n");
  assert_has(&c->out, "HOSTPATH False False\n");
  cleanup_free char *result = xasprintf("%s/result", rw);
  struct stat st;
  assert_int_equal(stat(result, &st), 0);
  assert_int_equal(st.st_uid, script_uid(c));
  capture_release(c);
}

/* The steps of one build: one identity for all of them (each step finds what the one
 * before wrote as its own), another for another build, and neither is a run's.  A mount
 * at /tmp replaces the sandbox's tmpfs, so /tmp is on the build's own space. */
static void test_identity_kept_across_runs(void **state UNUSED) {
  if (geteuid() != 0) skip();
  sbx_identity_t *one = sbx_identity_new(g.backend), *other = sbx_identity_new(g.backend);
  assert_true(one->has_uid && other->has_uid);
  assert_int_not_equal(one->uid, other->uid);
  cleanup_free char *cache = xasprintf("%s/identity-cache", g.root);
  cleanup_free char *tmp = xasprintf("%s/identity-tmp", g.root);
  assert_int_equal(mkdir(cache, 0700), 0);
  assert_int_equal(mkdir(tmp, 0700), 0);
  cleanup_free char *cache2 = xasprintf("%s/identity-cache2", g.root);
  cleanup_free char *tmp2 = xasprintf("%s/identity-tmp2", g.root);
  assert_int_equal(mkdir(cache2, 0700), 0);
  assert_int_equal(mkdir(tmp2, 0700), 0);
  sbx_mount_t mounts[] = {{.host = cache, .target = "/cache", .writable = true},
                          {.host = tmp, .target = "/tmp", .writable = true}};
  sbx_mount_t mounts2[] = {{.host = cache2, .target = "/cache", .writable = true},
                           {.host = tmp2, .target = "/tmp", .writable = true}};
  uid_t seen[3];
  for (int i = 0; i < 3; i++) {
    run_opts_t o = {
        .identity = i < 2 ? one : other, .mounts = i < 2 ? mounts : mounts2, .n_mounts = 2};
    run_capture_t cap = {0}, *c = &cap;
    cleanup_free char *script = xasprintf(
        "import os\n"
        "print('UID=%%d' %% os.getuid(), 'GID=%%d' %% os.getgid(), os.getgroups())\n"
        "for d in ['/cache', '/tmp']:\n"
        "    try:\n"
        "        open(d + '/step-%d', 'w').write('x')\n"
        "    except OSError as e:\n"
        "        print('refused', d, e.errno)\n"
        "print('CACHE', sorted(os.listdir('/cache')), 'TMP', sorted(os.listdir('/tmp')))\n",
        i);
    run_script(c, script, &o);
    if (c->result.exit_code != 0) dump(c);
    assert_int_equal(c->result.exit_code, 0);
    seen[i] = script_uid(c);
    assert_true(seen[i] >= OUR_UID_FIRST && seen[i] < OUR_UID_FIRST + 4096);
    if (i == 0) assert_has(&c->out, "CACHE ['step-0'] TMP ['step-0']\n");
    /* The second step of the same build writes where the first one did. */
    if (i == 1) assert_has(&c->out, "CACHE ['step-0', 'step-1'] TMP ['step-0', 'step-1']\n");
    /* Another build: its own uid and its own space, where the first one's are not. */
    if (i == 2) assert_has(&c->out, "CACHE ['step-2'] TMP ['step-2']\n");
    capture_release(c);
  }
  assert_int_equal(seen[0], one->uid);
  assert_int_equal(seen[1], one->uid);
  assert_int_equal(seen[2], other->uid);
  /* What the first build wrote stays its own: the second one's uid cannot reach it. */
  struct stat st;
  assert_int_equal(stat(cache, &st), 0);
  assert_int_equal(st.st_uid, one->uid);
  assert_int_equal(st.st_mode & 077, 0);
  /* A run without an identity gets a uid of its own. */
  run_capture_t cap = {0}, *c = &cap;
  run_script(c, "import os\nprint('UID=%d' % os.getuid())\n", NULL);
  assert_int_not_equal(script_uid(c), one->uid);
  assert_int_not_equal(script_uid(c), other->uid);
  capture_release(c);
  assert_int_equal(procs_left(one->uid), 0);
  assert_int_equal(procs_left(other->uid), 0);
  sbx_identity_free(one);
  sbx_identity_free(other);
}

/* ---------------------------------------------------------------- functions in a child */

typedef struct call_result {
  bool done;
  int rc;
  char *text;
} call_result_t;

static void on_call_done(void *data, int rc, const char *text) {
  call_result_t *r = data;
  r->done = true;
  r->rc = rc;
  r->text = xstrdup(text);
}

static int call_report(void *arg, cm_buf_t *out, cm_error_t *err) {
  const int *fds = arg;
  cm_buf_printf(out, "pid %d kept %d other %d stdout %s", (int)getpid(),
                fcntl(fds[0], F_GETFD) >= 0, fcntl(fds[1], F_GETFD) >= 0,
                isatty(1) ? "tty" : "not a tty");
  return 0;
}
static int call_fail(void *arg, cm_buf_t *out, cm_error_t *err) {
  return cm_error_set(err, ENOSPC, CM_ERR_IO, "copying");
}
static int call_hang(void *arg, cm_buf_t *out, cm_error_t *err) {
  for (;;) pause();
  return 0;
}
static int call_die(void *arg, cm_buf_t *out, cm_error_t *err) {
  kill(getpid(), SIGKILL);
  return 0;
}

static void run_call(sbx_call_fn fn, void *arg, const int *keep, size_t n_keep, uint64_t timeout_ms,
                     call_result_t *r) {
  cm_error_t err = CM_ERROR_INIT;
  sbx_call_t *c = NULL;
  memset(r, 0, sizeof *r);
  if (sbx_call_start(g.loop, fn, arg, keep, n_keep, timeout_ms, on_call_done, r, &c, &err) < 0)
    fail_msg("sbx_call_start: %s", err.msg);
  while (!r->done) assert_int_equal(cm_loop_run_once(g.loop, 1000, &err), 0);
}

/* The helper for work that must not block the loop: the function's text or error comes
 * back, the child keeps only the fds it was given, a crash or a timeout is an error, and a
 * call freed early is killed without a callback. */
static void test_function_in_a_child(void **state UNUSED) {
  int fds[2];
  assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
  call_result_t r;
  run_call(call_report, fds, &fds[0], 1, 0, &r);
  assert_int_equal(r.rc, 0);
  int pid = 0, kept = -1, other = -1;
  assert_int_equal(sscanf(r.text, "pid %d kept %d other %d", &pid, &kept, &other), 3);
  assert_true(pid > 0 && pid != getpid());
  assert_int_equal(kept, 1);
  assert_int_equal(other, 0);
  assert_non_null(strstr(r.text, "stdout not a tty"));
  free(r.text);
  close(fds[0]);
  close(fds[1]);

  run_call(call_fail, NULL, NULL, 0, 0, &r);
  assert_int_equal(r.rc, -1);
  assert_string_equal(r.text, "copying: No space left on device");
  free(r.text);
  run_call(call_hang, NULL, NULL, 0, 200, &r);
  assert_int_equal(r.rc, -1);
  assert_non_null(strstr(r.text, "took too long"));
  free(r.text);
  run_call(call_die, NULL, NULL, 0, 0, &r);
  assert_int_equal(r.rc, -1);
  assert_non_null(strstr(r.text, "killed by signal 9"));
  free(r.text);

  cm_error_t err = CM_ERROR_INIT;
  sbx_call_t *c = NULL;
  memset(&r, 0, sizeof r);
  assert_int_equal(sbx_call_start(g.loop, call_hang, NULL, NULL, 0, 0, on_call_done, &r, &c, &err),
                   0);
  sbx_call_free(c);
  for (int i = 0; i < 5; i++) assert_int_equal(cm_loop_run_once(g.loop, 20, &err), 0);
  assert_false(r.done);
  assert_int_equal(waitpid(-1, NULL, WNOHANG), -1); /* reaped: no child of ours is left */
  assert_int_equal(errno, ECHILD);
}

/* ---------------------------------------------------------------- a server that is not root */

/* In a child that dropped to uid 65534: probe and run a script the way an unprivileged
 * server would (bwrap makes a user namespace; the script keeps the server's uid).  Exit 0 =
 * fine, 77 = unprivileged user namespaces are off here, else a failure (said on stderr). */
static int unprivileged_child(void) {
  if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
      setresuid(65534, 65534, 65534) < 0)
    return 2;
  cm_error_t err = CM_ERROR_INIT;
  cm_loop_t *loop = cm_loop_new(&err);
  sbx_backend_t *b = sbx_backend_new("bwrap", &err);
  sbx_bwrap_set_paths(b, NULL, MPS_SANDBOX_DROP_PATH);
  sbx_backend_probe(b);
  if (!b->available) {
    fprintf(stderr, "unprivileged probe: %s\n", b->unavailable);
    return 77;
  }
  char wd[] = "/tmp/mps-test-bwrap-user-XXXXXX";
  if (!mkdtemp(wd)) return 3;
  const char *script =
      "import os\n"
      "s = open('/proc/self/status').read()\n"
      "f = {l.split(':')[0]: l.split(':')[1].split() for l in s.splitlines() if ':' in l}\n"
      "print('UID', f['Uid'][0], 'CAPEFF', f['CapEff'][0], 'NNP', f['NoNewPrivs'][0],\n"
      "      'SECCOMP', f['Seccomp'][0])\n"
      "for d in ['/', '/etc', '/usr']:\n"
      "    try:\n"
      "        open(d + '/x', 'w'); print('WROTE', d)\n"
      "    except OSError: pass\n"
      "import resource\n"
      "print('NPROC', resource.getrlimit(resource.RLIMIT_NPROC)[0])\n";
  cleanup_free char *path = xasprintf("%s/script.py", wd);
  if (cm_write_file(path, script, strlen(script), 0600, &err) < 0) return 4;
  run_capture_t c = {0};
  cm_buf_init(&c.out, 1 << 16);
  cm_buf_init(&c.err, 1 << 16);
  char *argv[] = {SYSTEM_PYTHON, "-I", "script.py", NULL};
  char *envp[] = {"PATH=/usr/bin:/bin", NULL};
  sbx_limits_t l = default_limits;
  l.max_processes = 32;
  sbx_spec_t spec = {.argv = argv, .envp = envp, .workdir = wd, .limits = l};
  sbx_run_callbacks_t cbs = {.on_output = on_output, .on_exit = on_exit_cb};
  sbx_run_t *run = NULL;
  if (sbx_run_start(loop, b, &spec, &cbs, &c, &run, &err) < 0) {
    fprintf(stderr, "unprivileged run: %s\n", err.msg);
    return 5;
  }
  while (!c.done) cm_loop_run_once(loop, 1000, &err);
  sbx_run_free(run);
  cm_loop_run_once(loop, 0, &err);
  int rc = 0;
  if (!has(&c.out, "UID 65534 CAPEFF 0000000000000000 NNP 1 SECCOMP 2\n") || has(&c.out, "WROTE") ||
      !has(&c.out, "NPROC 32\n") || c.result.exit_code != 0 || c.result.status_unknown)
    rc = 6;
  if (rc) fprintf(stderr, "unprivileged run output:\n%s\n%s\n", c.out.data, c.err.data);
  cm_buf_release(&c.out);
  cm_buf_release(&c.err);

  /* The forwarder works in a user namespace too (the port needs no capability there). */
  if (rc == 0) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0) return 8;
    egress_peer = (egress_peer_t){.fd = sv[0]};
    cm_watch_t *w = cm_loop_watch(loop, sv[0], EPOLLIN, on_egress_plain, &egress_peer, &err);
    if (!w || cm_write_file(path, egress_script, strlen(egress_script), 0600, &err) < 0) return 8;
    sbx_egress_t eg = {.fd = sv[1], .port = 3128};
    char *eargv[] = {SYSTEM_PYTHON, "-I", "script.py", "9", NULL};
    sbx_spec_t es = spec;
    es.argv = eargv;
    es.network = true;
    es.egress = &eg;
    run_capture_t e = {0};
    cm_buf_init(&e.out, 1 << 16);
    cm_buf_init(&e.err, 1 << 16);
    if (sbx_run_start(loop, b, &es, &cbs, &e, &run, &err) < 0) {
      fprintf(stderr, "unprivileged egress run: %s\n", err.msg);
      return 5;
    }
    while (!e.done) cm_loop_run_once(loop, 1000, &err);
    sbx_run_free(run);
    cm_loop_run_once(loop, 0, &err);
    if (!has(&e.out, "127.0.0.1 GOT pong") || !has(&e.out, "isolated") ||
        egress_peer.received < 1) {
      fprintf(stderr, "unprivileged egress run output:\n%s\n%s\n", e.out.data, e.err.data);
      rc = 9;
    }
    cm_watch_remove(w);
    close(sv[0]);
    close(sv[1]);
    cm_buf_release(&e.out);
    cm_buf_release(&e.err);
  }

  /* Here the script shares the supervisor's uid, but the supervisor is pid 1 of the run's
   * pid namespace: signals from inside it that it has no handler for, SIGKILL and SIGSTOP
   * included, never reach it, so the report still comes (and is the supervisor's). */
  const char *killer =
      "import os, signal, sys, time\n"
      "print('PPID', os.getppid(), flush=True)\n"
      "for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n"
      "    os.kill(os.getppid(), sig)\n"
      "time.sleep(0.3)\n"
      "sys.exit(7)\n";
  if (rc == 0 && cm_write_file(path, killer, strlen(killer), 0600, &err) < 0) return 4;
  run_capture_t k = {0};
  cm_buf_init(&k.out, 1 << 16);
  cm_buf_init(&k.err, 1 << 16);
  if (rc == 0 && sbx_run_start(loop, b, &spec, &cbs, &k, &run, &err) < 0) {
    fprintf(stderr, "unprivileged run: %s\n", err.msg);
    return 5;
  }
  while (rc == 0 && !k.done) cm_loop_run_once(loop, 1000, &err);
  if (rc == 0) {
    sbx_run_free(run);
    cm_loop_run_once(loop, 0, &err);
    if (!has(&k.out, "PPID 1\n") || k.result.status_unknown || k.result.exit_code != 7) {
      fprintf(stderr, "signalled supervisor: exit %d, status_unknown %d, %llu ms:\n%s\n%s\n",
              k.result.exit_code, k.result.status_unknown, (unsigned long long)k.result.duration_ms,
              k.out.data, k.err.data);
      rc = 7;
    }
  }
  cm_buf_release(&k.out);
  cm_buf_release(&k.err);
  cm_rm_rf(wd, &err);
  sbx_run_reap_detached();
  sbx_backend_free(b);
  cm_loop_free(loop);
  return rc;
}

static void test_unprivileged_server(void **state UNUSED) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(unprivileged_child());
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    print_message("unprivileged user namespaces are not available here; skipped\n");
    skip();
  }
  assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---------------------------------------------------------------- failures */

static void test_setup_failure_is_reported(void **state UNUSED) {
  /* A drop helper that disappears after the probe (a package upgrade in between): bwrap
   * fails to set up the sandbox, and says why on the run's stderr. */
  cleanup_free char *dir = xasprintf("%s/helper", g.root);
  cleanup_free char *helper = xasprintf("%s/mps-sandbox-drop", dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  cleanup_free char *cmd = xasprintf("cp '%s' '%s'", MPS_SANDBOX_DROP_PATH, helper);
  assert_int_equal(system(cmd), 0);
  cm_error_t err = CM_ERROR_INIT;
  sbx_backend_t *b = sbx_backend_new("bwrap", &err);
  sbx_bwrap_set_paths(b, NULL, helper);
  sbx_backend_probe(b);
  assert_true(b->available);
  assert_int_equal(unlink(helper), 0);

  run_capture_t cap = {0}, *c = &cap;
  run_opts_t o = {.backend = b};
  run_script(c, "print('RAN')\n", &o);
  print_message("setup failure: exit %d, stderr: %s", c->result.exit_code, c->err.data);
  assert_int_not_equal(c->result.exit_code, 0);
  assert_true(c->result.status_unknown);
  assert_lacks(&c->out, "RAN");
  assert_has(&c->err, "bwrap");
  assert_has(&c->err, "mps-sandbox-drop");
  capture_release(c);

  /* A command that does not exist inside the sandbox: the helper says so. */
  char *argv[] = {"/opt/nowhere/python3", "-c", "pass", NULL};
  run_opts_t o2 = {.argv = argv};
  run_capture_t cap2 = {0};
  c = &cap2;
  run_script(c, NULL, &o2);
  assert_int_equal(c->result.exit_code, 127);
  assert_false(c->result.status_unknown); /* the supervisor saw its child exit 127 */
  assert_has(&c->err, "cannot execute /opt/nowhere/python3");
  capture_release(c);
  sbx_run_reap_detached();
  sbx_backend_free(b);
}

static void test_spec_validation(void **state UNUSED) {
  cm_error_t err = CM_ERROR_INIT;
  cleanup_free char *wd = new_workdir();
  char *argv[] = {SYSTEM_PYTHON, "-c", "pass", NULL};
  char *envp[] = {NULL};
  char *bad[] = {"/",    "/etc",  "/proc/1",         "relative/path", "/usr/../root",
                 "/tmp", "/work", "/nonexistent-dir"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++) {
    char *binds[] = {bad[i], NULL};
    sbx_spec_t spec = {
        .argv = argv, .envp = envp, .workdir = wd, .ro_binds = binds, .limits = default_limits};
    sbx_launch_t l = SBX_LAUNCH_INIT;
    assert_int_equal(g.backend->ops->build(g.backend, &spec, &l, &err), -1);
    sbx_launch_close_channel(&l);
    sbx_launch_release(&l);
    cm_error_release(&err);
  }
  char *rel[] = {"python3", NULL};
  sbx_spec_t spec = {.argv = rel, .envp = envp, .workdir = wd, .limits = default_limits};
  sbx_launch_t l = SBX_LAUNCH_INIT;
  assert_int_equal(g.backend->ops->build(g.backend, &spec, &l, &err), -1);
  assert_int_equal(err.kind, CM_ERR_INVALID);
  cm_error_release(&err);
  sbx_launch_close_channel(&l);
  sbx_launch_release(&l);
}

/* ---------------------------------------------------------------- cost */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void test_measure_cost(void **state UNUSED) {
  enum { N = 21 };
  uint64_t t_backend[N], t_bwrap[N], t_bare[N];
  char *bare_argv[] = {SYSTEM_PYTHON, "-I", "-c", "pass", NULL};
  cleanup_free char *bwrap_path = cm_find_executable("bwrap");
  assert_non_null(bwrap_path);
  char *bwrap_argv[] = {
      bwrap_path,      "--ro-bind",         "/",           "/",  "--dev", "/dev", "--proc", "/proc",
      "--unshare-all", "--die-with-parent", SYSTEM_PYTHON, "-I", "-c",    "pass", NULL};
  cleanup_free char *wd = new_workdir();
  for (int i = 0; i < N; i++) {
    run_capture_t a = {0}, b = {0}, d = {0};
    a.workdir = xstrdup(wd);
    b.workdir = xstrdup(wd);
    d.workdir = xstrdup(wd);
    run_opts_t oa = {.argv = bare_argv};
    run_opts_t ob = {.argv = bwrap_argv, .backend = g.none};
    run_opts_t od = {.argv = bare_argv, .backend = g.none};
    uint64_t t0 = cm_now_us();
    run_script(&a, NULL, &oa);
    uint64_t t1 = cm_now_us();
    run_script(&b, NULL, &ob);
    uint64_t t2 = cm_now_us();
    run_script(&d, NULL, &od);
    uint64_t t3 = cm_now_us();
    if (a.result.exit_code || b.result.exit_code || d.result.exit_code)
      fail_msg("exit codes %d %d %d; stderr: %s | %s | %s", a.result.exit_code, b.result.exit_code,
               d.result.exit_code, a.err.data, b.err.data, d.err.data);
    t_backend[i] = t1 - t0;
    t_bwrap[i] = t2 - t1;
    t_bare[i] = t3 - t2;
    capture_release(&a);
    capture_release(&b);
    capture_release(&d);
  }
  qsort(t_backend, N, sizeof t_backend[0], cmp_u64);
  qsort(t_bwrap, N, sizeof t_bwrap[0], cmp_u64);
  qsort(t_bare, N, sizeof t_bare[0], cmp_u64);

  /* Pieces of a build(). */
  uint64_t t0 = cm_now_us();
  void *bpf = NULL;
  size_t len = 0;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(sbx_seccomp_build(&bpf, &len, &err), 0);
  uint64_t t_seccomp_build = cm_now_us() - t0;
  free(bpf);
  t0 = cm_now_us();
  for (int i = 0; i < 100; i++) close(sbx_seccomp_fd(&err));
  uint64_t t_seccomp_fd = (cm_now_us() - t0) / 100;
  char *argv[] = {SYSTEM_PYTHON, "-c", "pass", NULL};
  char *envp[] = {NULL};
  sbx_spec_t spec = {.argv = argv, .envp = envp, .workdir = wd, .limits = default_limits};
  t0 = cm_now_us();
  for (int i = 0; i < 100; i++) {
    sbx_launch_t l = SBX_LAUNCH_INIT;
    assert_int_equal(g.backend->ops->build(g.backend, &spec, &l, &err), 0);
    sbx_launch_close_channel(&l);
    sbx_launch_release(&l);
  }
  uint64_t t_build = (cm_now_us() - t0) / 100;

  print_message(
      "cost of `python3 -I -c pass` (median of %d, wall clock, start to on_exit):\n"
      "  bwrap backend            %6.1f ms\n"
      "  bare bwrap (ro / , unshare-all) %6.1f ms\n"
      "  bare python              %6.1f ms\n"
      "  seccomp program build %llu us (%zu instructions), per-run memfd %llu us, "
      "whole build() %llu us\n",
      N, t_backend[N / 2] / 1000.0, t_bwrap[N / 2] / 1000.0, t_bare[N / 2] / 1000.0,
      (unsigned long long)t_seccomp_build, len / 8, (unsigned long long)t_seccomp_fd,
      (unsigned long long)t_build);
}

/* ---------------------------------------------------------------- the end */

static void test_nothing_left_behind(void **state UNUSED) {
  proc_info_t pi;
  int n = 0;
  for (int i = 0; i < 100; i++) {
    n = count_procs(OUR_UID_FIRST, OUR_UID_END, &pi);
    if (n == 0) break;
    usleep(20000);
  }
  if (n) print_message("left behind: pid %d uid %u\n", (int)pi.pid, (unsigned)pi.uid);
  assert_int_equal(n, 0);
  /* No child of ours other than zombies in flight. */
  DIR *d = opendir("/proc");
  struct dirent *e;
  int children = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0) continue;
    buf[r] = '\0';
    const char *rp = strrchr(buf, ')');
    char st = 0;
    int ppid = 0;
    if (rp && sscanf(rp + 1, " %c %d", &st, &ppid) == 2 && ppid == getpid() && st != 'Z')
      children++;
  }
  closedir(d);
  assert_int_equal(children, 0);
}

static int group_setup(void **state UNUSED) {
  cm_error_t err = CM_ERROR_INIT;
  g.loop = cm_loop_new(&err);
  g.none = sbx_backend_new("none", &err);
  sbx_backend_probe(g.none);
  g.root = xstrdup("/tmp/mps-test-bwrap-XXXXXX");
  if (!mkdtemp(g.root)) return -1;
  g.state = xasprintf("%s/state", g.root);
  cleanup_free char *runs = xasprintf("%s/runs", g.root);
  if (mkdir(g.state, 0700) < 0 || mkdir(runs, 0755) < 0) return -1;
  write_file(g.state, "secret.txt", "server secret\n", 0644);
  static const char *const versions[] = {"3.13.0",  "3.12.1", "3.11.7",
                                         "3.10.13", "3.9.18", "3.8.18"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(versions) && !g.pyenv_python; i++) {
    char *prefix = xasprintf("/root/.pyenv/versions/%s", versions[i]);
    char *python = xasprintf("%s/bin/python3", prefix);
    if (access(python, X_OK) == 0) {
      g.pyenv_prefix = prefix;
      g.pyenv_python = python;
    } else {
      free(prefix);
      free(python);
    }
  }
  return 0;
}

static int group_teardown(void **state UNUSED) {
  cm_error_t err = CM_ERROR_INIT;
  int rc = cm_rm_rf(g.root, &err);
  cm_error_release(&err);
  struct stat st;
  if (rc < 0 || lstat(g.root, &st) == 0) {
    fprintf(stderr, "temporary directory %s left behind\n", g.root);
    rc = -1;
  }
  free(g.root);
  free(g.state);
  free(g.pyenv_prefix);
  free(g.pyenv_python);
  sbx_run_reap_detached();
  sbx_backend_free(g.backend);
  sbx_backend_free(g.none);
  cm_loop_free(g.loop);
  return rc;
}

int main(void) {
  /* A secret in the server's environment that no sandbox may see. */
  setenv("MPS_TEST_SECRET", SECRET_ENV_VALUE, 1);
  cm_error_t err = CM_ERROR_INIT;
  g.backend = sbx_backend_new("bwrap", &err);
  if (!g.backend) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  sbx_bwrap_set_paths(g.backend, NULL, MPS_SANDBOX_DROP_PATH);
  sbx_backend_probe(g.backend);
  if (!g.backend->available) {
    /* Skip only if bubblewrap itself cannot make a sandbox here; a probe failure when
     * plain bwrap works is a bug. */
    int rc = system(
        "bwrap --ro-bind / / --dev /dev --unshare-pid --unshare-net /bin/true "
        ">/dev/null 2>&1");
    if (rc != 0) {
      printf("skipped: bubblewrap cannot create a sandbox here: %s\n", g.backend->unavailable);
      sbx_backend_free(g.backend);
      return 77;
    }
    fprintf(stderr, "the bwrap probe failed although bwrap works: %s\n", g.backend->unavailable);
    sbx_backend_free(g.backend);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_probe_succeeds),
      cmocka_unit_test(test_runs_python),
      cmocka_unit_test(test_hold_and_release),
      cmocka_unit_test(test_hold_in_command),
      cmocka_unit_test(test_runs_pyenv_python),
      cmocka_unit_test(test_host_files_hidden),
      cmocka_unit_test(test_writes_confined),
      cmocka_unit_test(test_symlink_escape),
      cmocka_unit_test(test_environment_is_clean),
      cmocka_unit_test(test_seccomp_and_privileges),
      cmocka_unit_test(test_host_view_of_script),
      cmocka_unit_test(test_network),
      cmocka_unit_test(test_egress_forwarder),
      cmocka_unit_test(test_fork_bomb),
      cmocka_unit_test(test_process_limit_counts_this_run),
      cmocka_unit_test(test_memory_bomb),
      cmocka_unit_test(test_tmp_is_capped),
      cmocka_unit_test(test_daemon_does_not_outlive_run),
      cmocka_unit_test(test_sigterm_ignored_killed_at_timeout),
      cmocka_unit_test(test_exit_status_is_the_scripts),
      cmocka_unit_test(test_usage_is_the_scripts),
      cmocka_unit_test(test_cpu_limit_is_reported),
      cmocka_unit_test(test_grace_on_timeout),
      cmocka_unit_test(test_supervisor_out_of_reach),
      cmocka_unit_test(test_mounts),
      cmocka_unit_test(test_identity_kept_across_runs),
      cmocka_unit_test(test_function_in_a_child),
      cmocka_unit_test(test_unprivileged_server),
      cmocka_unit_test(test_setup_failure_is_reported),
      cmocka_unit_test(test_spec_validation),
      cmocka_unit_test(test_probe_bogus_bwrap),
      cmocka_unit_test(test_probe_is_asynchronous),
      cmocka_unit_test(test_probe_failure_is_deferred),
      cmocka_unit_test(test_measure_cost),
      cmocka_unit_test(test_nothing_left_behind),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
