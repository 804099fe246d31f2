#!/bin/sh
# Make sure a headless Chromium from the distribution's packages is installed: the
# dashboard's browser test (tests/e2e/test_dashboard.py) drives it. A no-op when one is
# there; otherwise installs Debian's `chromium` with apt-get (needs root, as in CI).
set -eu
for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: no chromium found and cannot apt-get install it;" \
         "install Chromium to run the dashboard browser test" >&2
    exit 1
fi
echo "ensure-chromium: installing chromium (Debian package) for the dashboard test" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
