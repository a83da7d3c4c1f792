# Shared by scripts/serve and scripts/test: system packages, the interpreter and the virtualenv,
# idempotent. PYTHON=/path/to/python3 chooses the interpreter (see scripts/_python.sh); the
# virtualenv is .venv, or VENV=<dir>. Argument: the extras to install ("dev" for the tests).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)  # setpriv, nsenter
# The sandbox seccomp filters are compiled with libseccomp (through the pyseccomp binding).
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || need_apt+=(libseccomp2)
# mkfs.ext4 makes every sandbox's disk image (the disk quota), and full-disk tests mount a small
# ext4 image of their own; it lives in /sbin.
PATH="$PATH:/usr/sbin:/sbin" command -v mkfs.ext4 >/dev/null 2>&1 || need_apt+=(e2fsprogs)
command -v mount >/dev/null 2>&1 || need_apt+=(mount)
# Networked sandboxes: their egress firewall and NAT (the nft binary lives in /usr/sbin).
{ [ -x /usr/sbin/nft ] || command -v nft >/dev/null 2>&1; } || need_apt+=(nftables)
if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${need_apt[*]} (sandbox isolation and network)" >&2
    # Wait for another apt run (unattended upgrades, a second checkout) instead of failing on its lock.
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "warning: ${need_apt[*]} missing and cannot be installed here; sandboxes need them" >&2
  fi
fi

source "$ROOT/scripts/_python.sh"
ashd_choose_python
VENV="${VENV:-.venv}"
# One setup of the virtualenv at a time: the README's offline start runs scripts/fake_model and
# scripts/serve together, and on a fresh checkout both would make .venv at once (one of them then
# fails on the other's half-made files). Released before the program runs.
exec 9>"${VENV%/}.lock"
flock 9
ashd_venv "$VENV"
EXTRAS="${1:-}"
stamp="$VENV/.installed${EXTRAS:+-$EXTRAS}"
fresh() { [ -f "$1" ] && ! [ pyproject.toml -nt "$1" ]; }
# A dev install (scripts/test) has everything scripts/serve needs: no second install over it.
if ! fresh "$stamp" && ! { [ -z "$EXTRAS" ] && fresh "$VENV/.installed-dev"; }; then
  # A first start takes a while (pip resolves and downloads everything): say so instead of going quiet.
  echo "ashd: installing ashd${EXTRAS:+[$EXTRAS]} and its Python dependencies into $VENV (first start or pyproject.toml changed)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -U pip >/dev/null
  # swagger-ui-bundle (Swagger UI 4) was replaced by swagger-ui-bundle-v2, which ships the same module:
  # removing the old one first keeps it from deleting the new one's files on a later uninstall.
  if "$VENV/bin/python" -m pip show -q swagger-ui-bundle >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip uninstall -q -y swagger-ui-bundle >/dev/null
  fi
  # setuptools warns on every editable install that a folder named like the package could shadow
  # it (it is the package): a warning a first start should not greet people with.
  PYTHONWARNINGS="ignore::UserWarning" \
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".${EXTRAS:+[$EXTRAS]}"
  touch "$stamp"
fi
exec 9>&-
