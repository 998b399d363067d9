/* The syscall policy's two renderings agree (sandbox/seccomp.c): the BPF program bubblewrap
 * loads and the OCI profile docker and podman load.
 *
 * Two checks.  By structure: every rule of the table appears in the profile with the same
 * action, errno and argument comparison, and the profile has nothing else.  By behaviour: the
 * profile is turned into a filter the way an OCI runtime does it (runc and crun: each entry's
 * names resolved by libseccomp, its action, its argument comparisons ANDed), and that program
 * and the native one are run by a small classic-BPF interpreter over the same system calls:
 * every syscall number with zero arguments, and every syscall that has an argument rule in
 * either with each argument set in turn to the values around every rule's mask and datum.
 * They must answer alike every time.  Then the answers themselves are checked for the calls
 * the policy exists to refuse (namespaces, io_uring, keyrings, file watches). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <errno.h>
#include <jansson.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "sandbox/sandbox-internal.h"

/* ---------------------------------------------------------------- a classic BPF interpreter */

typedef struct program {
  struct sock_filter *insns;
  size_t n;
} program_t;

/* What the kernel would do with d: the filter's return value (SECCOMP_RET_*). */
static uint32_t bpf_run(const program_t *p, const struct seccomp_data *d) {
  uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = {0};
  for (size_t pc = 0; pc < p->n; pc++) {
    const struct sock_filter *f = &p->insns[pc];
    switch (f->code) {
      case BPF_LD | BPF_W | BPF_ABS:
        if (f->k % 4 != 0 || f->k + 4 > sizeof *d) fail_msg("load at offset %u", f->k);
        memcpy(&a, (const char *)d + f->k, 4);
        break;
      case BPF_LD | BPF_IMM:
        a = f->k;
        break;
      case BPF_LDX | BPF_IMM:
        x = f->k;
        break;
      case BPF_LD | BPF_MEM:
      case BPF_LDX | BPF_MEM:
      case BPF_ST:
      case BPF_STX:
        if (f->k >= BPF_MEMWORDS) fail_msg("scratch word %u", f->k);
        if (f->code == (BPF_LD | BPF_MEM)) a = mem[f->k];
        if (f->code == (BPF_LDX | BPF_MEM)) x = mem[f->k];
        if (f->code == BPF_ST) mem[f->k] = a;
        if (f->code == BPF_STX) mem[f->k] = x;
        break;
      case BPF_ALU | BPF_AND | BPF_K:
        a &= f->k;
        break;
      case BPF_ALU | BPF_OR | BPF_K:
        a |= f->k;
        break;
      case BPF_ALU | BPF_ADD | BPF_K:
        a += f->k;
        break;
      case BPF_ALU | BPF_SUB | BPF_K:
        a -= f->k;
        break;
      case BPF_ALU | BPF_RSH | BPF_K:
        a >>= f->k;
        break;
      case BPF_ALU | BPF_LSH | BPF_K:
        a <<= f->k;
        break;
      case BPF_ALU | BPF_AND | BPF_X:
        a &= x;
        break;
      case BPF_ALU | BPF_OR | BPF_X:
        a |= x;
        break;
      case BPF_ALU | BPF_NEG:
        a = -a;
        break;
      case BPF_MISC | BPF_TAX:
        x = a;
        break;
      case BPF_MISC | BPF_TXA:
        a = x;
        break;
      case BPF_JMP | BPF_JA:
        pc += f->k;
        break;
      case BPF_JMP | BPF_JEQ | BPF_K:
        pc += a == f->k ? f->jt : f->jf;
        break;
      case BPF_JMP | BPF_JGT | BPF_K:
        pc += a > f->k ? f->jt : f->jf;
        break;
      case BPF_JMP | BPF_JGE | BPF_K:
        pc += a >= f->k ? f->jt : f->jf;
        break;
      case BPF_JMP | BPF_JSET | BPF_K:
        pc += (a & f->k) ? f->jt : f->jf;
        break;
      case BPF_JMP | BPF_JEQ | BPF_X:
        pc += a == x ? f->jt : f->jf;
        break;
      case BPF_JMP | BPF_JGT | BPF_X:
        pc += a > x ? f->jt : f->jf;
        break;
      case BPF_JMP | BPF_JGE | BPF_X:
        pc += a >= x ? f->jt : f->jf;
        break;
      case BPF_JMP | BPF_JSET | BPF_X:
        pc += (a & x) ? f->jt : f->jf;
        break;
      case BPF_RET | BPF_K:
        return f->k;
      case BPF_RET | BPF_A:
        return a;
      default:
        fail_msg("BPF instruction %#x at %zu is not interpreted here", f->code, pc);
    }
  }
  fail_msg("the program ran past its end");
  return 0;
}

static program_t program_from(void *bpf, size_t len) {
  assert_int_equal(len % sizeof(struct sock_filter), 0);
  return (program_t){bpf, len / sizeof(struct sock_filter)};
}

static program_t export_program(scmp_filter_ctx ctx) {
  int fd = memfd_create("test-seccomp", MFD_CLOEXEC);
  assert_true(fd >= 0);
  assert_int_equal(seccomp_export_bpf(ctx, fd), 0);
  off_t size = lseek(fd, 0, SEEK_END);
  assert_true(size > 0);
  void *buf = xmalloc((size_t)size);
  assert_int_equal(pread(fd, buf, (size_t)size, 0), size);
  close(fd);
  return program_from(buf, (size_t)size);
}

/* ---------------------------------------------------------------- the profile, as a runtime reads
 * it */

static json_t *profile(void) {
  cm_error_t err = CM_ERROR_INIT;
  cleanup_free char *text = sbx_seccomp_oci_json(&err);
  if (!text) fail_msg("%s", cm_error_message(&err));
  json_error_t jerr;
  json_t *p = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
  if (!p) fail_msg("the profile is not JSON: %s (line %d)", jerr.text, jerr.line);
  return p;
}

static uint32_t action_of(json_t *entry) {
  const char *action = json_string_value(json_object_get(entry, "action"));
  assert_non_null(action);
  if (strcmp(action, "SCMP_ACT_ALLOW") == 0) return SCMP_ACT_ALLOW;
  if (strcmp(action, "SCMP_ACT_KILL_PROCESS") == 0) return SCMP_ACT_KILL_PROCESS;
  if (strcmp(action, "SCMP_ACT_ERRNO") == 0) {
    json_t *ret = json_object_get(entry, "errnoRet");
    return SCMP_ACT_ERRNO(ret ? (uint32_t)json_integer_value(ret) : EPERM);
  }
  fail_msg("action %s is not expected in our profile", action);
  return 0;
}

static enum scmp_compare op_of(const char *op) {
  static const struct {
    const char *name;
    enum scmp_compare op;
  } ops[] = {{"SCMP_CMP_NE", SCMP_CMP_NE},
             {"SCMP_CMP_LT", SCMP_CMP_LT},
             {"SCMP_CMP_LE", SCMP_CMP_LE},
             {"SCMP_CMP_EQ", SCMP_CMP_EQ},
             {"SCMP_CMP_GE", SCMP_CMP_GE},
             {"SCMP_CMP_GT", SCMP_CMP_GT},
             {"SCMP_CMP_MASKED_EQ", SCMP_CMP_MASKED_EQ}};
  for (size_t i = 0; op && i < CM_ARRAY_SIZE(ops); i++)
    if (strcmp(ops[i].name, op) == 0) return ops[i].op;
  fail_msg("comparison %s", op ? op : "(none)");
  return SCMP_CMP_EQ;
}

/* The filter an OCI runtime builds from the profile. */
static program_t runtime_program(json_t *p) {
  const char *dflt = json_string_value(json_object_get(p, "defaultAction"));
  assert_non_null(dflt);
  assert_string_equal(dflt, "SCMP_ACT_ALLOW");
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  assert_non_null(ctx);
  size_t i, j;
  json_t *entry, *name;
  json_array_foreach(json_object_get(p, "syscalls"), i, entry) {
    uint32_t action = action_of(entry);
    struct scmp_arg_cmp cmp[6];
    size_t n_cmp = 0;
    json_t *arg;
    json_array_foreach(json_object_get(entry, "args"), j, arg) {
      assert_true(n_cmp < CM_ARRAY_SIZE(cmp));
      cmp[n_cmp++] = (struct scmp_arg_cmp){
          .arg = (unsigned)json_integer_value(json_object_get(arg, "index")),
          .op = op_of(json_string_value(json_object_get(arg, "op"))),
          .datum_a = (uint64_t)json_integer_value(json_object_get(arg, "value")),
          .datum_b = (uint64_t)json_integer_value(json_object_get(arg, "valueTwo")),
      };
    }
    json_array_foreach(json_object_get(entry, "names"), j, name) {
      int nr = seccomp_syscall_resolve_name(json_string_value(name));
      if (nr < 0) continue; /* what runc does with a name it does not know */
      assert_int_equal(seccomp_rule_add_array(ctx, action, nr, (unsigned)n_cmp, cmp), 0);
    }
  }
  program_t prog = export_program(ctx);
  seccomp_release(ctx);
  return prog;
}

static program_t native_program(void) {
  void *bpf = NULL;
  size_t len = 0;
  cm_error_t err = CM_ERROR_INIT;
  if (sbx_seccomp_build(&bpf, &len, &err) < 0) fail_msg("%s", cm_error_message(&err));
  return program_from(bpf, len);
}

/* Our masks and data are 32-bit values: jansson's signed integers hold them. */
static uint64_t json_u64(json_t *v) {
  assert_true(json_is_integer(v));
  return (uint64_t)json_integer_value(v);
}

/* ---------------------------------------------------------------- by structure */

static bool entry_is_rule(json_t *entry, const sbx_seccomp_rule_t *r) {
  json_t *names = json_object_get(entry, "names");
  if (json_array_size(names) != 1 ||
      strcmp(json_string_value(json_array_get(names, 0)) ?: "", r->syscall) != 0)
    return false;
  if (action_of(entry) != SCMP_ACT_ERRNO((uint32_t)r->errno_value)) return false;
  json_t *args = json_object_get(entry, "args");
  if (r->arg < 0) return json_array_size(args) == 0;
  if (json_array_size(args) != 1) return false;
  json_t *a = json_array_get(args, 0);
  return json_integer_value(json_object_get(a, "index")) == r->arg &&
         strcmp(json_string_value(json_object_get(a, "op")) ?: "", "SCMP_CMP_MASKED_EQ") == 0 &&
         json_u64(json_object_get(a, "value")) == r->mask &&
         json_u64(json_object_get(a, "valueTwo")) == r->value;
}

static void test_profile_lists_the_table(void **state) {
  json_t *p = profile();
  /* The native architecture alone, as the native filter (a foreign ABI is killed). */
  json_t *arches = json_object_get(p, "architectures");
  assert_int_equal(json_array_size(arches), 1);
  assert_string_equal(json_string_value(json_array_get(arches, 0)), sbx_seccomp_oci_arch());
  json_t *entries = json_object_get(p, "syscalls");
  size_t n_entries = json_array_size(entries);
  bool *matched = xcalloc(n_entries ? n_entries : 1, sizeof *matched);
  size_t n_rules = 0, n_known = 0;
  const sbx_seccomp_rule_t *rules = sbx_seccomp_rules(&n_rules);
  assert_true(n_rules > 50);
  for (size_t i = 0; i < n_rules; i++) {
    if (sbx_seccomp_resolve(rules[i].syscall) < 0) continue; /* the native filter skips it too */
    n_known++;
    bool found = false;
    for (size_t j = 0; j < n_entries && !found; j++)
      if (!matched[j] && entry_is_rule(json_array_get(entries, j), &rules[i]))
        found = matched[j] = true;
    if (!found)
      fail_msg("rule %zu (%s, errno %d, arg %d mask %#llx value %#llx) is not in the profile", i,
               rules[i].syscall, rules[i].errno_value, rules[i].arg,
               (unsigned long long)rules[i].mask, (unsigned long long)rules[i].value);
  }
  for (size_t j = 0; j < n_entries; j++)
    if (!matched[j]) {
      cleanup_free char *dump = json_dumps(json_array_get(entries, j), JSON_COMPACT);
      fail_msg("the profile has an entry the table does not: %s", dump);
    }
  assert_int_equal(n_entries, n_known);
  free(matched);
  json_decref(p);
}

/* ---------------------------------------------------------------- by behaviour */

static uint32_t native_arch(void) {
  return seccomp_arch_native(); /* libseccomp's tokens are the AUDIT_ARCH_* values */
}

static struct seccomp_data call(int nr, int arg, uint64_t value) {
  struct seccomp_data d = {.nr = nr, .arch = native_arch()};
  if (arg >= 0) d.args[arg] = value;
  return d;
}

static void add_value(uint64_t **v, size_t *n, size_t *cap, uint64_t x) {
  for (size_t i = 0; i < *n; i++)
    if ((*v)[i] == x) return;
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 64;
    *v = xrealloc(*v, *cap * sizeof **v);
  }
  (*v)[(*n)++] = x;
}

static void test_renderings_answer_alike(void **state) {
  json_t *p = profile();
  program_t native = native_program(), runtime = runtime_program(p);

  /* Every syscall number, no arguments. */
  for (int nr = 0; nr < 1024; nr++) {
    struct seccomp_data d = call(nr, -1, 0);
    uint32_t a = bpf_run(&native, &d), b = bpf_run(&runtime, &d);
    if (a != b) {
      cleanup_free char *name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr);
      fail_msg("syscall %d (%s): native %#x, profile %#x", nr, name ? name : "?", a, b);
    }
  }

  /* The syscalls with argument rules, each argument over the values around every rule's. */
  size_t n_rules;
  const sbx_seccomp_rule_t *rules = sbx_seccomp_rules(&n_rules);
  uint64_t *values = NULL;
  size_t n_values = 0, cap = 0;
  static const uint64_t extra[] = {0,
                                   1,
                                   17 /* SIGCHLD, clone's exit signal */,
                                   0x7fffffff,
                                   0xffffffff,
                                   0x100000000ULL,
                                   0xffffffff00000000ULL,
                                   UINT64_MAX};
  for (size_t i = 0; i < CM_ARRAY_SIZE(extra); i++) add_value(&values, &n_values, &cap, extra[i]);
  int conditional[16];
  size_t n_conditional = 0;
  for (size_t i = 0; i < n_rules; i++) {
    const sbx_seccomp_rule_t *r = &rules[i];
    if (r->arg < 0) continue;
    uint64_t low = r->mask & -r->mask;
    uint64_t around[] = {
        r->value, r->value | ~r->mask, r->value ^ low, r->value - 1,   r->value + 1,
        r->mask,  ~r->value,           r->value | 17,  r->value << 32, r->value | (1ULL << 32)};
    for (size_t k = 0; k < CM_ARRAY_SIZE(around); k++)
      add_value(&values, &n_values, &cap, around[k]);
    int nr = sbx_seccomp_resolve(r->syscall);
    bool seen = nr < 0;
    for (size_t k = 0; k < n_conditional && !seen; k++) seen = conditional[k] == nr;
    if (!seen) {
      assert_true(n_conditional < CM_ARRAY_SIZE(conditional));
      conditional[n_conditional++] = nr;
    }
  }
  assert_true(n_conditional >= 3); /* clone, ioctl, personality */
  size_t compared = 0;
  for (size_t c = 0; c < n_conditional; c++)
    for (int arg = 0; arg < 6; arg++)
      for (size_t v = 0; v < n_values; v++) {
        struct seccomp_data d = call(conditional[c], arg, values[v]);
        uint32_t a = bpf_run(&native, &d), b = bpf_run(&runtime, &d);
        if (a != b)
          fail_msg("syscall %d, argument %d = %#llx: native %#x, profile %#x", conditional[c], arg,
                   (unsigned long long)values[v], a, b);
        compared++;
      }
  print_message("compared %zu calls with arguments over %zu values\n", compared, n_values);
  free(values);
  free(native.insns);
  free(runtime.insns);
  json_decref(p);
}

/* ---------------------------------------------------------------- what the policy refuses */

static uint32_t answer(const program_t *prog, const char *syscall, int arg, uint64_t value) {
  int nr = seccomp_syscall_resolve_name(syscall);
  if (nr < 0) fail_msg("%s is unknown to this libseccomp", syscall);
  struct seccomp_data d = call(nr, arg, value);
  return bpf_run(prog, &d);
}

static void test_refuses_what_it_must(void **state) {
  json_t *p = profile();
  program_t progs[2] = {native_program(), runtime_program(p)};
  const uint32_t eperm = SECCOMP_RET_ERRNO | EPERM, enosys = SECCOMP_RET_ERRNO | ENOSYS;
  for (size_t i = 0; i < 2; i++) {
    const program_t *prog = &progs[i];
    /* A user namespace, by either call, and every other namespace. */
    assert_int_equal(answer(prog, "unshare", 0, CLONE_NEWUSER), eperm);
    assert_int_equal(answer(prog, "unshare", 0, 0), eperm);
    assert_int_equal(answer(prog, "clone", 0, CLONE_NEWUSER | 17), eperm);
    assert_int_equal(answer(prog, "clone", 0, CLONE_NEWNET | CLONE_NEWNS), eperm);
    assert_int_equal(answer(prog, "clone3", -1, 0), enosys);
    assert_int_equal(answer(prog, "setns", -1, 0), eperm);
    /* io_uring. */
    assert_int_equal(answer(prog, "io_uring_setup", -1, 0), eperm);
    assert_int_equal(answer(prog, "io_uring_enter", -1, 0), eperm);
    assert_int_equal(answer(prog, "io_uring_register", -1, 0), eperm);
    /* Kernel keyrings. */
    assert_int_equal(answer(prog, "keyctl", -1, 0), eperm);
    assert_int_equal(answer(prog, "add_key", -1, 0), eperm);
    assert_int_equal(answer(prog, "request_key", -1, 0), eperm);
    /* File watches. */
    assert_int_equal(answer(prog, "inotify_init", -1, 0), eperm);
    assert_int_equal(answer(prog, "inotify_init1", -1, 0), eperm);
    assert_int_equal(answer(prog, "inotify_add_watch", -1, 0), eperm);
    assert_int_equal(answer(prog, "fanotify_init", -1, 0), eperm);
    assert_int_equal(answer(prog, "fanotify_mark", -1, 0), eperm);
    /* What a script needs stays. */
    assert_int_equal(answer(prog, "clone", 0, 0x01200011 /* fork()'s flags */), SECCOMP_RET_ALLOW);
    assert_int_equal(answer(prog, "personality", 0, 0xffffffff), SECCOMP_RET_ALLOW);
    assert_int_equal(answer(prog, "personality", 0, 0x40000), eperm);
    assert_int_equal(answer(prog, "ioctl", 1, 0x5412 /* TIOCSTI */), eperm);
    assert_int_equal(answer(prog, "ioctl", 1, 0x5401 /* TCGETS */), SECCOMP_RET_ALLOW);
    assert_int_equal(answer(prog, "openat", -1, 0), SECCOMP_RET_ALLOW);
    assert_int_equal(answer(prog, "setresuid", -1, 0), SECCOMP_RET_ALLOW);
    free(prog->insns);
  }
  json_decref(p);
}

/* docs/security.md's table of what the filter refuses (every backend's: both renderings come
 * from the one table) names exactly the table's unconditional EPERM rules: the doc cannot
 * drift from the source. */
static bool doc_row_is_conditional(const char *row) {
  return strstr(row, "| namespace clones |") || strstr(row, "| terminal injection |") ||
         strstr(row, "| personality |");
}

static void test_the_docs_table_is_the_table(void **state) {
  (void)state;
  FILE *f = fopen(MPS_SOURCE_DIR "/docs/security.md", "r");
  assert_non_null(f);
  char line[4096];
  bool in_table = false, seen_table = false;
  char *documented[256];
  size_t n_doc = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "| group | refused with `EPERM` |", 32) == 0) {
      in_table = seen_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line[0] != '|') break;
    if (strncmp(line, "| ---", 5) == 0 || doc_row_is_conditional(line)) continue;
    /* Only the second column's names (the first is the group). */
    char *cell = strchr(line + 1, '|');
    assert_non_null(cell);
    for (char *p = strchr(cell, '`'); p; p = strchr(p, '`')) {
      char *end = strchr(p + 1, '`');
      assert_non_null(end);
      assert_true(n_doc < CM_ARRAY_SIZE(documented));
      documented[n_doc++] = strndup(p + 1, (size_t)(end - p - 1));
      p = end + 1;
    }
  }
  fclose(f);
  assert_true(seen_table);
  size_t n;
  const sbx_seccomp_rule_t *rules = sbx_seccomp_rules(&n);
  size_t n_rules = 0;
  for (size_t i = 0; i < n; i++) {
    if (rules[i].arg >= 0 || rules[i].errno_value != EPERM) continue;
    n_rules++;
    bool found = false;
    for (size_t j = 0; j < n_doc && !found; j++)
      found = strcmp(documented[j], rules[i].syscall) == 0;
    if (!found) fail_msg("%s is refused but not in docs/security.md's table", rules[i].syscall);
  }
  for (size_t j = 0; j < n_doc; j++) {
    bool found = false;
    for (size_t i = 0; i < n && !found; i++)
      found = rules[i].arg < 0 && rules[i].errno_value == EPERM &&
              strcmp(documented[j], rules[i].syscall) == 0;
    if (!found)
      fail_msg("docs/security.md's table names %s, which the table does not refuse", documented[j]);
    free(documented[j]);
  }
  assert_int_equal(n_doc, n_rules);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_profile_lists_the_table),
      cmocka_unit_test(test_renderings_answer_alike),
      cmocka_unit_test(test_refuses_what_it_must),
      cmocka_unit_test(test_the_docs_table_is_the_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
