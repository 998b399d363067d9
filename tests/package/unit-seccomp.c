/* What the unit's seccomp settings do, for a process started outside systemd
 * (tests/package/unit-env.sh):
 *   unit-seccomp [--native] [--families AF_UNIX,AF_INET,...] -- COMMAND ARGS...
 * --native:   SystemCallArchitectures=native (only the native ABI's system calls; another
 *             ABI's kill the process, as systemd's filter does);
 * --families: RestrictAddressFamilies= (socket() of any other family fails with EAFNOSUPPORT).
 * The filter is installed with no_new_privs and passes to COMMAND and everything it starts. */
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define FAMILY_MAX 64

static int family_number(const char *name) {
  static const struct {
    const char *name;
    int value;
  } known[] = {{"AF_UNIX", AF_UNIX},       {"AF_INET", AF_INET},     {"AF_INET6", AF_INET6},
               {"AF_NETLINK", AF_NETLINK}, {"AF_PACKET", AF_PACKET}, {"AF_VSOCK", AF_VSOCK}};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strcmp(name, known[i].name) == 0) return known[i].value;
  return -1;
}

int main(int argc, char **argv) {
  int native = 0;
  char allowed[FAMILY_MAX] = {0};
  int restrict_families = 0;
  int i = 1;
  for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
    if (strcmp(argv[i], "--native") == 0) {
      native = 1;
    } else if (strcmp(argv[i], "--families") == 0 && i + 1 < argc) {
      restrict_families = 1;
      char *list = argv[++i], *save = NULL;
      for (char *f = strtok_r(list, ", ", &save); f; f = strtok_r(NULL, ", ", &save)) {
        int n = family_number(f);
        if (n < 0 || n >= FAMILY_MAX) {
          fprintf(stderr, "unit-seccomp: unknown family %s\n", f);
          return 2;
        }
        allowed[n] = 1;
      }
    } else {
      fprintf(stderr, "unit-seccomp: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (i + 1 >= argc) {
    fprintf(stderr, "usage: unit-seccomp [--native] [--families LIST] -- COMMAND...\n");
    return 2;
  }
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return 1;
  /* A context holds the native architecture only: another ABI's calls meet the bad-arch action. */
  if (native && seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) < 0) return 1;
  if (!native) {
    /* Without it, the host's other ABIs stay allowed (on x86-64: i386 and x32). */
    (void)seccomp_arch_add(ctx, SCMP_ARCH_X86);
    (void)seccomp_arch_add(ctx, SCMP_ARCH_X32);
  }
  if (restrict_families) {
    for (int f = 0; f < FAMILY_MAX; f++)
      if (!allowed[f] && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                                          SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)f)) < 0)
        return 1;
    if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                         SCMP_A0(SCMP_CMP_GE, (scmp_datum_t)FAMILY_MAX)) < 0)
      return 1;
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || seccomp_load(ctx) < 0) {
    perror("unit-seccomp: loading the filter");
    return 1;
  }
  seccomp_release(ctx);
  execvp(argv[i + 1], argv + i + 1);
  perror(argv[i + 1]);
  return 127;
}
