#!/usr/bin/env bash
# Debian's Chromium for the browser tests (tests/integration/sdk/test_browser.py): installed from the
# distribution's package registry when missing. Fails (never skips) when it cannot be installed, so a run
# without a browser is not reported green.
set -euo pipefail
CHROMIUM=/usr/bin/chromium
if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "no $CHROMIUM and no apt-get: install Chromium so that $CHROMIUM exists" >&2; exit 1
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  SUDO=(sudo -n)
fi
export DEBIAN_FRONTEND=noninteractive
# The package lists may be stale or absent on a fresh machine: refresh once if the first attempt fails.
if ! "${SUDO[@]}" apt-get install -y -q chromium >/dev/null; then
  "${SUDO[@]}" apt-get update -q >/dev/null
  "${SUDO[@]}" apt-get install -y -q chromium >/dev/null
fi
test -x "$CHROMIUM" || { echo "apt-get installed chromium but $CHROMIUM is missing" >&2; exit 1; }
