/* The PEP 508 marker environment of an interpreter (what validate_script evaluates
 * requirement markers against). */
#include <stdio.h>
#include <sys/utsname.h>

#include "interp/interp.h"

void py_marker_env(const py_interp_t *py, py_marker_env_t *out) {
  memset(out, 0, sizeof *out);
  struct utsname u;
  if (uname(&u) == 0) {
    snprintf(out->machine, sizeof out->machine, "%s", u.machine);
    snprintf(out->release, sizeof out->release, "%s", u.release);
    snprintf(out->version, sizeof out->version, "%s", u.version);
  }
  const char *v = py->version;
  const char *dot = strchr(v, '.');
  const char *dot2 = dot ? strchr(dot + 1, '.') : NULL;
  size_t mm = CM_MIN(dot2 ? (size_t)(dot2 - v) : strlen(v), (size_t)60);
  snprintf(out->python_version, sizeof out->python_version, "%.*s", (int)mm, v);
  bool pypy = strcmp(py->implementation, "pypy") == 0;
  out->env.implementation_name = py->implementation;
  out->env.implementation_version = py->version;
  out->env.os_name = "posix";
  out->env.platform_machine = out->machine;
  out->env.platform_python_implementation = pypy ? "PyPy" : "CPython";
  out->env.platform_release = out->release;
  out->env.platform_system = "Linux";
  out->env.platform_version = out->version;
  out->env.python_full_version = py->version;
  out->env.python_version = out->python_version;
  out->env.sys_platform = "linux";
  out->env.extra = "";
}
