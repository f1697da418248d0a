#!/usr/bin/env bash
# Install what the dtwork browser tests need, then run them (Galata / Playwright, headless Chromium).
#
#   bash extension/ui-tests/run.sh [playwright args...]
#
# Needs: Python with dtwork installed (pip install -e '.[test]'), Node.js >= 20 and jlpm
# (comes with jupyterlab). Installs Chromium from Debian when /usr/bin/chromium is missing
# (Playwright cannot download its own browser here), the extension's and ui-tests' node
# modules, rebuilds dtwork/labextension (DTWORK_SKIP_BUILD=1 tests the committed build as is),
# then runs the suite. Artifacts (screenshots, traces): extension/ui-tests/test-results/.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXT="$(dirname "$HERE")"
step() { echo "== dtwork ui-tests: $1 (${SECONDS}s)"; }

if [ ! -x /usr/bin/chromium ]; then
  step "installing chromium"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

if [ "${DTWORK_SKIP_BUILD:-0}" != 1 ]; then
  step "building the extension"
  # one install at a time in extension/: the tests' linters and vitest install there too (tests/node_modules.py)
  (cd "$EXT" && flock .jlpm.lock sh -c 'jlpm install && jlpm build')
fi

step "installing ui-tests node modules"
cd "$HERE"
jlpm install

# Galata's server listens on 8888; take another free port when that one is busy.
if [ -z "${DTWORK_UI_PORT:-}" ]; then
  DTWORK_UI_PORT="$(python - <<'PY'
import socket
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
if free(8888):
    print(8888)
else:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])
PY
)"
  export DTWORK_UI_PORT
fi

step "running playwright on port ${DTWORK_UI_PORT}"
jlpm playwright test "$@"
step "done"
