# The bubblewrap backend (sandbox/bwrap.c) and its drop helper.  Its seccomp filter
# (sandbox/seccomp.c) is built with every backend: the container backends render it too.
#
# The top CMakeLists.txt includes this file, adds ${MPS_BWRAP_SOURCES} to mps_sandbox and
# defines MPS_HAVE_BWRAP (PUBLIC) there.  The helper is its own tiny executable: bwrap runs
# it inside the sandbox as the last step before the interpreter, so it links nothing but
# libc, and that statically (-static-pie, where the toolchain has a static libc, as
# Debian's libc6-dev does): it runs for every call, twice (it joins the cgroup before
# bubblewrap, and drops the uid inside), and a static binary skips the dynamic loader's
# work (mapping libc, relocations, and glibc's cache-size probing, a CPUID trap on VMs).
# Not with the sanitizers, whose runtimes are shared libraries.  It lands next to the
# server binary, where the backend looks for it at run time (or at $MPS_SANDBOX_DROP;
# installed: <prefix>/libexec/mcp-python-exec-sandbox/).
set(MPS_BWRAP_SOURCES ${CMAKE_CURRENT_LIST_DIR}/bwrap.c)

add_executable(mps-sandbox-drop ${CMAKE_CURRENT_LIST_DIR}/drop.c)
set_target_properties(mps-sandbox-drop PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

if(NOT MPS_SANITIZE AND NOT MPS_FUZZ)
  include(CheckCSourceCompiles)
  set(CMAKE_REQUIRED_LINK_OPTIONS -static-pie)
  set(CMAKE_REQUIRED_FLAGS -fPIE)
  check_c_source_compiles("int main(void) { return 0; }" MPS_HAVE_STATIC_PIE)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  unset(CMAKE_REQUIRED_FLAGS)
  if(MPS_HAVE_STATIC_PIE)
    target_compile_options(mps-sandbox-drop PRIVATE -fPIE)
    target_link_options(mps-sandbox-drop PRIVATE -static-pie)
  endif()
endif()
