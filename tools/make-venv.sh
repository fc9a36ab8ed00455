#!/usr/bin/env bash
# Creates a virtual environment for the Makefile.
#
#   tools/make-venv.sh PYTHON DIR          DIR from PYTHON (3.11 or newer), pip upgraded
#   tools/make-venv.sh PYTHON DIR --over   DIR sees PYTHON's installed packages behind its own
#                                          (the numpy 1.x environment shadows numpy and pyarrow
#                                          and takes everything else from the project's .venv)
#
# A stock Debian/Ubuntu Python ships without `ensurepip`; as root the script installs Debian's
# python3-venv and tries again, otherwise it says which package to install.
set -euo pipefail
python=$1
dir=$2
over=${3:-}
die() { echo "make-venv: $*" >&2; exit 1; }

command -v "$python" >/dev/null || die "no '$python' on PATH: install Python 3.11+ or pass BASE_PYTHON=/path/to/python3.11"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$python is Python $("$python" -c 'import platform; print(platform.python_version())'); Zephon needs 3.11 or newer (BASE_PYTHON=...)"

if ! "$python" -m venv "$dir" >/dev/null 2>&1; then
  rm -rf "$dir"
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "make-venv: $python cannot create environments; installing Debian's python3-venv" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends python3-venv; } >/dev/null \
      || die "could not install python3-venv"
    "$python" -m venv "$dir" || die "$python -m venv $dir failed"
  else
    die "$python -m venv failed: install your distribution's venv package (Debian/Ubuntu: sudo apt-get install python3-venv)"
  fi
fi

if [ "$over" = "--over" ]; then
  # A .pth line starting with `import` runs at start-up: the other environment's site-packages
  # (and the .pth files in it, such as editable installs) come after this one's.
  site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  own=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$site')" >"$own/zz-over.pth"
fi
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
