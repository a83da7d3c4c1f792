# Which Python runs ashd, and the virtualenvs made with it. Sourced by scripts/_env.sh and
# scripts/test_installed; functions only.
#
# ashd_choose_python: PYTHON=<command or path> if set (refused, never replaced, if it cannot work);
#   otherwise the first of python3, python3.13, python3.12, python3.11, /usr/bin/python3 that can.
#   Sets ASHD_PY (real executable) and ASHD_PY_VERSION, and says on stderr which one and why.
# ashd_venv DIR: a virtualenv at DIR made by ASHD_PY; one made by another interpreter is replaced.
# ashd_pythons: every usable interpreter found here, "<version> <path>" per line (CI picks from it).

_ASHD_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

_ashd_check() {  # _ashd_check CMD: prints "<version> <real path>" or why not; status 0 if usable
  local path out
  path="$(command -v "$1" 2>/dev/null)" || { echo "not found"; return 1; }
  out="$("$path" "$_ASHD_SCRIPTS/check_python.py" 2>&1)" || { echo "${out%%$'\n'*}"; return 1; }
  echo "$out"
}

_ashd_is_debian_python() {
  case "$1" in /usr/bin/python3*) command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ] ;; *) false ;; esac
}

ashd_choose_python() {
  local candidates why="" c out reason
  if [ -n "${PYTHON:-}" ]; then
    candidates=("$PYTHON"); reason="set by PYTHON"
  else
    candidates=(python3 python3.13 python3.12 python3.11 /usr/bin/python3); reason="first usable of python3, python3.1x, /usr/bin/python3 on PATH"
  fi
  for c in "${candidates[@]}"; do
    if ! out="$(_ashd_check "$c")" && [[ "$out" == *"python3-venv"* ]] && _ashd_is_debian_python "$(command -v "$c")"; then
      echo "ashd: installing python3-venv for $c" >&2
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      out="$(_ashd_check "$c")" || true
    fi
    if out="$(_ashd_check "$c")"; then
      ASHD_PY_VERSION="${out%% *}"
      ASHD_PY="${out#* }"
      echo "ashd: using Python $ASHD_PY_VERSION ($ASHD_PY), $reason" >&2
      return 0
    fi
    why+="  $c: $out"$'\n'
  done
  local spec
  spec="$(sed -n 's/^requires-python *= *"\(.*\)"/\1/p' "$_ASHD_SCRIPTS/../pyproject.toml")"
  if [ -n "${PYTHON:-}" ]; then
    why="${why%$'\n'}"
    echo "ashd: refusing PYTHON=$PYTHON: ${why#*: }" >&2
  else
    echo "ashd: no Python that can run ashd was found:" >&2
    printf '%s' "$why" >&2
  fi
  echo "ashd: ashd needs CPython $spec with the venv module; name one with PYTHON=/path/to/python3" >&2
  return 1
}

ashd_venv() {  # ashd_venv DIR
  local dir="$1" made_version made_exe
  if [ -f "$dir/pyvenv.cfg" ]; then
    made_version="$(sed -n 's/^version *= *//p' "$dir/pyvenv.cfg")"
    made_exe="$(sed -n 's/^executable *= *//p' "$dir/pyvenv.cfg")"
    if [ -x "$dir/bin/python" ] && [ "$made_version" = "$ASHD_PY_VERSION" ] \
        && [ "$(realpath -q "$made_exe" || true)" = "$ASHD_PY" ]; then
      return 0
    fi
    echo "ashd: $dir was made by Python $made_version ($made_exe); recreating it with $ASHD_PY_VERSION ($ASHD_PY)" >&2
    rm -rf "$dir"
  fi
  "$ASHD_PY" -m venv "$dir"
}

ashd_pythons() {
  local c out seen=" "
  local candidates=(/usr/bin/python3 python3 python3.11 python3.12 python3.13)
  if command -v pyenv >/dev/null 2>&1; then
    for c in "$(pyenv root)"/versions/*/bin/python3; do candidates+=("$c"); done
  fi
  for c in "${candidates[@]}"; do
    out="$(_ashd_check "$c")" || continue
    case "$seen" in *" ${out#* } "*) continue ;; esac
    seen+="${out#* } "
    echo "$out"
  done
}
