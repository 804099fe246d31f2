#!/bin/sh
# Make sure the multi-host tests (tests/multihost) have what they use: `ip` (iproute2)
# for the namespaces and links, and iptables for the NFQUEUE fallback of loss and delay
# where the kernel has no sch_netem (as on this project's build machine). A no-op when
# they are there; otherwise installs Debian's packages with apt-get (needs root, as in
# CI). Where that cannot be done the tests that need them skip, saying why.
set -eu
have_iptables() {
    command -v iptables-legacy >/dev/null 2>&1 || command -v iptables >/dev/null 2>&1
}
if command -v ip >/dev/null 2>&1 && have_iptables; then
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-netns-tools: iproute2 or iptables missing and cannot apt-get install" \
         "them; the multi-host tests that need them will skip" >&2
    exit 0
fi
echo "ensure-netns-tools: installing iproute2 and iptables (Debian packages) for" \
     "the multi-host tests" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends iproute2 iptables >/dev/null
