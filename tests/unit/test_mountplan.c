/* sandbox/mountplan.c: one typed mount plan per run, rendered as bubblewrap's arguments and
 * as docker's and podman's flags.  For each spec of a table, both renderings are read back
 * into the same normalised entries ("file /etc/hosts", "tmpfs /tmp 8388608",
 * "ro /opt/data -> /opt/data", "cwd /work", ...) and must agree: a backend cannot drift from
 * another on a mount.  The one documented difference: docker leaves out a read-only bind
 * holding the host's interpreter (the image's replaces it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "sandbox/sandbox-internal.h"

#define MAX_ENTRIES 64

typedef struct entries {
  char *v[MAX_ENTRIES];
  size_t n;
} entries_t;

static void add(entries_t *e, char *s) {
  assert_true(e->n < MAX_ENTRIES);
  e->v[e->n++] = s;
}

static int cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void entries_free(entries_t *e) {
  for (size_t i = 0; i < e->n; i++) free(e->v[i]);
  e->n = 0;
}

/* The files a container gets, as written by the docker backend. */
static const char *const FILE_PATHS[] = {"/state/sandbox/passwd-1", "/state/sandbox/group-1",
                                         "/state/sandbox/hosts-1", "/state/sandbox/resolv.conf-1"};

static bool is_file_path(const char *p) {
  for (size_t i = 0; i < CM_ARRAY_SIZE(FILE_PATHS); i++)
    if (strcmp(p, FILE_PATHS[i]) == 0) return true;
  return false;
}

/* bwrap's arguments, read back.  Each --file's fd must hold what the plan says. */
static void read_bwrap(char **a, const sbx_mount_plan_t *plan, entries_t *e) {
  for (size_t i = 0; a[i]; i++) {
    if (strcmp(a[i], "--perms") == 0 && strcmp(a[i + 2], "--dir") == 0) {
      assert_string_equal(a[i + 1], "0755");
      i += 3;
    } else if (strcmp(a[i], "--perms") == 0 && strcmp(a[i + 2], "--file") == 0) {
      const char *target = a[i + 4];
      int fd = atoi(a[i + 3]);
      char buf[4096];
      ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
      assert_true(n >= 0);
      buf[n] = '\0';
      bool found = false;
      for (size_t k = 0; k < plan->n; k++)
        if (plan->ops[k].kind == SBX_MOUNT_FILE && strcmp(plan->ops[k].target, target) == 0) {
          assert_string_equal(plan->ops[k].data, buf);
          found = true;
        }
      assert_true(found);
      assert_string_equal(a[i + 1], "0644");
      add(e, xasprintf("file %s", target));
      i += 4;
    } else if (strcmp(a[i], "--size") == 0 && strcmp(a[i + 2], "--perms") == 0 &&
               strcmp(a[i + 4], "--tmpfs") == 0) {
      assert_string_equal(a[i + 3], "1777");
      add(e, xasprintf("tmpfs %s %s", a[i + 5], a[i + 1]));
      i += 5;
    } else if (strcmp(a[i], "--ro-bind") == 0 || strcmp(a[i], "--bind") == 0) {
      add(e, xasprintf("%s %s -> %s", a[i][2] == 'r' ? "ro" : "rw", a[i + 1], a[i + 2]));
      i += 2;
    } else if (strcmp(a[i], "--chdir") == 0) {
      add(e, xasprintf("cwd %s", a[++i]));
    } else {
      fail_msg("unexpected bwrap argument %s", a[i]);
    }
  }
}

/* docker's and podman's flags, read back. */
static void read_docker(char **a, entries_t *e) {
  for (size_t i = 0; a[i]; i++) {
    if (strcmp(a[i], "-v") == 0) {
      cleanup_free char *v = xstrdup(a[++i]);
      char *c1 = strchr(v, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
      assert_non_null(c2);
      *c1 = *c2 = '\0';
      if (is_file_path(v)) {
        assert_string_equal(c2 + 1, "ro");
        add(e, xasprintf("file %s", c1 + 1));
      } else {
        add(e, xasprintf("%s %s -> %s", c2 + 1, v, c1 + 1));
      }
    } else if (strcmp(a[i], "--tmpfs") == 0) {
      cleanup_free char *v = xstrdup(a[++i]);
      char *colon = strchr(v, ':');
      assert_non_null(colon);
      *colon = '\0';
      const char *size = strstr(colon + 1, "size=");
      assert_non_null(size);
      assert_non_null(strstr(colon + 1, "nosuid,nodev"));
      add(e, xasprintf("tmpfs %s %.*s", v, (int)strcspn(size + 5, ","), size + 5));
    } else if (strcmp(a[i], "--shm-size") == 0) {
      add(e, xasprintf("tmpfs /dev/shm %s", a[++i]));
    } else if (strcmp(a[i], "-w") == 0) {
      add(e, xasprintf("cwd %s", a[++i]));
    } else {
      fail_msg("unexpected docker flag %s", a[i]);
    }
  }
}

typedef struct plan_case {
  const char *name;
  bool network, egress;
  uint64_t tmp_bytes;
  const char *ro_binds[4];
  sbx_mount_t mounts[3];
  size_t n_mounts;
  /* Entries the bwrap rendering must have, and those only bwrap has (docker leaves them out
   * by design), each NULL-terminated. */
  const char *must[8];
  const char *bwrap_only[2];
  const char *must_not[4];
} plan_case_t;

static const plan_case_t CASES[] = {
    {.name = "no network, defaults",
     .must = {"file /etc/passwd", "file /etc/hosts", "file /etc/resolv.conf",
              "tmpfs /tmp 104857600", "tmpfs /dev/shm 67108864", "rw /runs/run-1 -> /work",
              "cwd /work"}},
    {.name = "network through the proxy, binds and mounts",
     .network = true,
     .egress = true,
     .tmp_bytes = 8 << 20,
     .ro_binds = {"/usr/lib/python3", "/opt/data"},
     .mounts = {{"/envs/abc", "/env", false}, {"/cache/pip", "/cache", true}},
     .n_mounts = 2,
     .must = {"file /etc/hosts", "file /etc/resolv.conf", "tmpfs /tmp 8388608",
              "tmpfs /dev/shm 8388608", "ro /opt/data -> /opt/data", "ro /envs/abc -> /env",
              "rw /cache/pip -> /cache"},
     .must_not = {"ro /usr/lib/python3 -> /usr/lib/python3"}},
    {.name = "the host's network: the backend's own resolver files",
     .network = true,
     .must = {"file /etc/passwd", "file /etc/group", "cwd /work"},
     .must_not = {"file /etc/hosts", "file /etc/resolv.conf"}},
    {.name = "a build: its own /tmp, the host interpreter's prefix",
     .tmp_bytes = 1ull << 30,
     .ro_binds = {"/opt/python3.12"},
     .mounts = {{"/builds/b1/tmp", "/tmp", true}, {"/builds/b1/out", "/out", true}},
     .n_mounts = 2,
     .must = {"rw /builds/b1/tmp -> /tmp", "rw /builds/b1/out -> /out", "tmpfs /dev/shm 67108864"},
     .bwrap_only = {"ro /opt/python3.12 -> /opt/python3.12"},
     .must_not = {"tmpfs /tmp 1073741824"}},
};

static bool has(const entries_t *e, const char *s) {
  for (size_t i = 0; i < e->n; i++)
    if (strcmp(e->v[i], s) == 0) return true;
  return false;
}

static void test_renderings_agree(void **state) {
  (void)state;
  for (size_t c = 0; c < CM_ARRAY_SIZE(CASES); c++) {
    const plan_case_t *pc = &CASES[c];
    char *argv[] = {"/opt/python3.12/bin/python3", "-c", "pass", NULL};
    sbx_egress_t egress = {.fd = 3, .port = 3128};
    char *ro_binds[5] = {0};
    for (size_t i = 0; i < 4 && pc->ro_binds[i]; i++) ro_binds[i] = xstrdup(pc->ro_binds[i]);
    sbx_spec_t spec = {.argv = argv,
                       .workdir = "/runs/run-1",
                       .ro_binds = ro_binds,
                       .mounts = pc->mounts,
                       .n_mounts = pc->n_mounts,
                       .network = pc->network,
                       .egress = pc->egress ? &egress : NULL};
    spec.limits.tmp_bytes = pc->tmp_bytes;
    sbx_mount_plan_in_t common = {
        .workdir_target = "/work", .default_tmp_bytes = 100 << 20, .max_shm_bytes = 64 << 20};
    sbx_mount_plan_in_t in_bwrap = common, in_docker = common;
    in_bwrap.passwd.data = "root:x:0:0:root:/root:/usr/sbin/nologin\n";
    in_bwrap.group.data = "root:x:0:\n";
    in_bwrap.hosts.data = SBX_HOSTS_TEXT;
    in_bwrap.resolv.data = SBX_RESOLV_CONF_TEXT;
    in_docker.passwd.path = FILE_PATHS[0];
    in_docker.group.path = FILE_PATHS[1];
    in_docker.hosts.path = FILE_PATHS[2];
    in_docker.resolv.path = FILE_PATHS[3];

    sbx_mount_plan_t pb, pd;
    sbx_mount_plan_build(&spec, &in_bwrap, &pb);
    sbx_mount_plan_build(&spec, &in_docker, &pd);
    assert_int_equal(pb.n, pd.n); /* the same plan but for where the files come from */

    cm_error_t err = CM_ERROR_INIT;
    cm_strv_builder_t bw = {0}, dk = {0};
    int fds[8];
    size_t n_fds = 0;
    assert_int_equal(sbx_bwrap_render_mounts(&pb, &bw, fds, &n_fds, 8, &err), 0);
    assert_int_equal(sbx_docker_render_mounts(&pd, argv[0], &dk, &err), 0);
    char **a = cm_strv_steal(&bw), **d = cm_strv_steal(&dk);
    entries_t eb = {0}, ed = {0};
    read_bwrap(a, &pb, &eb);
    read_docker(d, &ed);
    for (size_t i = 0; i < n_fds; i++) close(fds[i]);

    for (size_t i = 0; pc->must[i]; i++) {
      if (!has(&eb, pc->must[i])) fail_msg("%s: bwrap lacks %s", pc->name, pc->must[i]);
      if (!has(&ed, pc->must[i])) fail_msg("%s: docker lacks %s", pc->name, pc->must[i]);
    }
    for (size_t i = 0; pc->must_not[i]; i++)
      if (has(&eb, pc->must_not[i]) || has(&ed, pc->must_not[i]))
        fail_msg("%s: has %s", pc->name, pc->must_not[i]);
    /* Everything else agrees, entry for entry. */
    for (size_t i = 0; pc->bwrap_only[i]; i++) {
      if (!has(&eb, pc->bwrap_only[i])) fail_msg("%s: bwrap lacks %s", pc->name, pc->bwrap_only[i]);
      if (has(&ed, pc->bwrap_only[i])) fail_msg("%s: docker has %s", pc->name, pc->bwrap_only[i]);
      add(&ed, xstrdup(pc->bwrap_only[i]));
    }
    qsort(eb.v, eb.n, sizeof *eb.v, cmp);
    qsort(ed.v, ed.n, sizeof *ed.v, cmp);
    assert_int_equal(eb.n, ed.n);
    for (size_t i = 0; i < eb.n; i++) assert_string_equal(eb.v[i], ed.v[i]);
    /* The work directory is the last mount (the command's cwd once everything is there). */
    assert_true(pb.ops[pb.n - 1].workdir);

    entries_free(&eb);
    entries_free(&ed);
    cm_strv_free(a);
    cm_strv_free(d);
    sbx_mount_plan_free(&pb);
    sbx_mount_plan_free(&pd);
    for (size_t i = 0; ro_binds[i]; i++) free(ro_binds[i]);
  }
}

/* A container's file must come from a host file: a plan with data only is refused. */
static void test_docker_refuses_a_file_without_a_path(void **state) {
  (void)state;
  char *argv[] = {"/usr/bin/python3", NULL};
  sbx_spec_t spec = {.argv = argv, .workdir = "/runs/run-1"};
  sbx_mount_plan_in_t in = {.workdir_target = "/work",
                            .default_tmp_bytes = 1 << 20,
                            .max_shm_bytes = 1 << 20,
                            .passwd = {.data = "root:x:0:0::/:/bin/false\n"}};
  sbx_mount_plan_t plan;
  sbx_mount_plan_build(&spec, &in, &plan);
  cm_strv_builder_t out = {0};
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(sbx_docker_render_mounts(&plan, argv[0], &out, &err), -1);
  cm_error_release(&err);
  cm_strv_free(cm_strv_steal(&out));
  sbx_mount_plan_free(&plan);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_renderings_agree),
      cmocka_unit_test(test_docker_refuses_a_file_without_a_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
