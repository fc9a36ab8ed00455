#!/usr/bin/env bash
# Installs mimalloc (Debian's libmimalloc2.0), the allocator `zephon serve --allocator auto`
# preloads: tokenizing takes about a quarter less CPU on it (docs/operations.md).
#
#   tools/install-mimalloc.sh                 fails when it cannot install (CI, the tests)
#   tools/install-mimalloc.sh --best-effort   says why and exits 0 (make run: the server then
#                                             runs on glibc malloc and logs the hint)
# Quiet when it is installed already.
set -euo pipefail
best_effort=""
[ "${1:-}" = "--best-effort" ] && best_effort=1
# Reads ldconfig's whole output first: with pipefail, `ldconfig -p | grep -q` fails whenever grep
# exits at its match while ldconfig still writes (SIGPIPE), and mimalloc then looked missing.
have() { grep -q 'libmimalloc\.so\.2 ' <<<"$(ldconfig -p 2>/dev/null)"; }
fail() {
  if [ -n "$best_effort" ]; then
    echo "install-mimalloc: $* (the server runs on glibc malloc)" >&2
    exit 0
  fi
  echo "install-mimalloc: $*" >&2
  exit 1
}
have && exit 0
[ "$(id -u)" -eq 0 ] || fail "not root: install it with 'sudo apt-get install libmimalloc2.0'"
command -v apt-get >/dev/null || fail "no apt-get: install mimalloc by hand (libmimalloc.so.2)"
apt_log=$(mktemp /tmp/install-mimalloc.XXXXXX)
if ! { apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libmimalloc2.0; } >"$apt_log" 2>&1; then
  cat "$apt_log" >&2
  rm -f "$apt_log"
  fail "could not install Debian's libmimalloc2.0 package (apt output above)"
fi
rm -f "$apt_log"
have || fail "libmimalloc2.0 installed no libmimalloc.so.2"
