#!/usr/bin/env bash
# Installs, from Debian's packages, the programs the browser, terminal and reverse-proxy tests drive,
# when they are missing: `scripts/ensure_tools.sh chromium nginx tmux`. Idempotent; prints the path
# of each program, one a line. Root and apt-get are needed only when something is missing.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
declare -A package=([chromium]=chromium [nginx]=nginx [tmux]=tmux)
missing=()
for tool in "$@"; do
  [ -n "${package[$tool]:-}" ] || { echo "ensure_tools: unknown tool $tool" >&2; exit 2; }
  command -v "$tool" >/dev/null 2>&1 || missing+=("${package[$tool]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_tools: ${missing[*]} missing; install them with apt-get as root" >&2
    exit 1
  fi
  echo "ensure_tools: installing ${missing[*]} (Debian packages, for the browser/terminal/proxy tests)" >&2
  # Wait for another apt run (a second test run, unattended upgrades) instead of failing on its lock.
  apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
for tool in "$@"; do command -v "$tool"; done
