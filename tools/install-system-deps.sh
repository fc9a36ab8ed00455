#!/usr/bin/env bash
# Installs the system tools the tests need, from Debian's packages; idempotent, needs root.
#
#   * Prometheus (/usr/bin/prometheus), for tests that scrape the server with the real thing.
#     The package's own service is never left running: tests start their own instances.
#   * mimalloc (libmimalloc2.0), the allocator `zephon serve` preloads by default.
#   * Docker, through shared/tools/docker-env.sh when it exists (beside the repo, or
#     $ZEPHON_SHARED_DIR): installs docker.io, starts dockerd, builds a local base image. The
#     base image's name goes to .ci/base-image for `docker build --build-arg BASE_IMAGE=...`.
#     Set ZEPHON_NO_DOCKER=1 to skip this part (the Docker tests then skip).
#
# Quiet when everything is there (well under a second); fails with a clear message otherwise.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
base_file="$repo/.ci/base-image"
die() { echo "install-system-deps: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs Debian packages)"

# --- Prometheus ---------------------------------------------------------------------------
if ! [ -x /usr/bin/prometheus ]; then
  command -v apt-get >/dev/null || die "no apt-get: install Prometheus by hand (/usr/bin/prometheus)"
  # Keep the package's service from starting while it installs (no-op under a policy already).
  added_policy=""
  if ! [ -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    added_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt_log=$(mktemp /tmp/install-system-deps.XXXXXX)
  if ! { apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        prometheus; } >"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    die "could not install Debian's prometheus package (apt output above)"
  fi
  rm -f "$apt_log"
  if [ -n "$added_policy" ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
  [ -x /usr/bin/prometheus ] || die "the prometheus package installed no /usr/bin/prometheus"
fi
# Whatever the package (or an earlier install) started runs as the user `prometheus`; stop it
# and keep it from starting at boot, so only the tests' own instances ever run.
if pids=$(pgrep -u prometheus -x prometheus 2>/dev/null); then
  [ -x /etc/init.d/prometheus ] && /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  for pid in $pids; do kill "$pid" 2>/dev/null || true; done
fi
if command -v update-rc.d >/dev/null && [ -e /etc/init.d/prometheus ]; then
  update-rc.d prometheus disable >/dev/null 2>&1 || true
fi
/usr/bin/prometheus --version >/dev/null 2>&1 || die "/usr/bin/prometheus does not run"

# --- mimalloc -----------------------------------------------------------------------------
# `zephon serve --allocator auto` preloads it; the allocator tests check that servers and their
# workers run on it.
bash "$repo/tools/install-mimalloc.sh" || die "could not install mimalloc (see above)"

# --- Docker -------------------------------------------------------------------------------
[ "${ZEPHON_NO_DOCKER:-}" = 1 ] && exit 0
docker_env=""
for dir in "${ZEPHON_SHARED_DIR:-}" "$repo/../shared"; do
  if [ -n "$dir" ] && [ -f "$dir/tools/docker-env.sh" ]; then
    docker_env="$dir/tools/docker-env.sh"
    break
  fi
done
if [ -z "$docker_env" ]; then
  # Elsewhere Docker is the machine's own business; FROM python:3.11-slim is pulled as usual.
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    echo "python:3.11-slim" >"$base_file.tmp" && mv "$base_file.tmp" "$base_file"
  else
    rm -f "$base_file"
  fi
  exit 0
fi
env_log=$(mktemp /tmp/install-system-deps.XXXXXX)
if ! base=$(bash "$docker_env" 2>"$env_log") || [ -z "$base" ]; then
  cat "$env_log" >&2
  rm -f "$env_log" "$base_file"
  die "Docker setup failed ($docker_env; its output above)"
fi
rm -f "$env_log"
echo "$base" >"$base_file.tmp" && mv "$base_file.tmp" "$base_file"
