#!/usr/bin/env bash
# Install what the network-namespace test hosts (infra/testhosts.py) need:
#   - iproute2        -> `ip netns`, bridges, veths
#   - openssh-server  -> /usr/sbin/sshd, one instance per namespace
#   - openssh-client  -> ssh / ssh-keygen (pulled in by openssh-server, checked anyway)
# and what the Slurm tests (infra/slurm, tests/slurm) need:
#   - slurm-wlm       -> slurmctld, slurmd and the client commands (srun, scontrol, ...)
#   - munge           -> munged, Slurm's authentication daemon
# and what the Web UI browser test (tests/e2e/test_web_ui.py) needs:
#   - chromium        -> /usr/bin/chromium, driven by Playwright (which never downloads one)
# and what the metrics tests (tests/unit/test_grafana_dashboard.py, tests/e2e/test_metrics_e2e.py) need:
#   - prometheus      -> promtool, which checks the dashboard's PromQL and the exposition
#
# Idempotent: installs only what is missing and runs `apt-get update` only when it
# has to install something, so it is cheap to call from CI on every run.
#
# We deliberately do NOT want the distribution's system sshd running: the tests
# start their own sshd inside each namespace, bound to the namespace address only.
# Debian's postinst enables and starts ssh.service (or, without systemd, the
# sysvinit script) — we prevent that with a temporary policy-rc.d and stop/disable
# anything that slipped through. The same goes for the distribution's munge, slurmctld
# and slurmd services: the Slurm tests start their own, with a per-run configuration.
set -euo pipefail

if [[ ${EUID} -ne 0 ]]; then
    echo "install-test-prereqs.sh: must run as root (uses apt-get)" >&2
    exit 1
fi

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
{ command -v sshd >/dev/null 2>&1 || test -x /usr/sbin/sshd; } || missing+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
{ command -v slurmctld >/dev/null 2>&1 || test -x /usr/sbin/slurmctld; } || missing+=(slurm-wlm)
{ command -v munged >/dev/null 2>&1 || test -x /usr/sbin/munged; } || missing+=(munge)
# infra/ validation (tests/integration/test_deploy_files.py, test_temporal_tls.py):
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
test -x /usr/bin/chromium || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install-test-prereqs.sh: iproute2, openssh-server, slurm-wlm, munge and chromium already present"
    exit 0
fi

echo "install-test-prereqs.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive

# policy-rc.d exit code 101 = "action forbidden": invoke-rc.d then refuses to start
# services during package configuration. Only install ours if none exists, and
# always remove it again afterwards.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e ${policy} ]]; then
    printf '#!/bin/sh\nexit 101\n' >"${policy}"
    chmod 0755 "${policy}"
    created_policy=1
fi
cleanup() {
    if [[ ${created_policy} -eq 1 ]]; then
        rm -f "${policy}"
    fi
}
trap cleanup EXIT

apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"

# Belt and braces: if the package managed to start or enable a system sshd anyway,
# stop and disable it. (Ours only listen on namespace addresses, so a system sshd
# on 0.0.0.0:22 of the root namespace would not clash — but it is an unwanted
# extra attack surface on a CI machine.)
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
elif [[ -x /etc/init.d/ssh ]]; then
    /etc/init.d/ssh stop >/dev/null 2>&1 || true
    update-rc.d ssh disable >/dev/null 2>&1 || true
fi

# The same for Slurm and munge: a system slurmd or slurmctld would hold the ports and
# state the tests' own daemons use; the tests start munged themselves.
for service in slurmctld slurmd munge prometheus; do
    if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
        systemctl disable --now "${service}.service" >/dev/null 2>&1 || true
    elif [[ -x /etc/init.d/${service} ]]; then
        /etc/init.d/"${service}" stop >/dev/null 2>&1 || true
        update-rc.d "${service}" disable >/dev/null 2>&1 || true
    fi
done

# sshd refuses to start without its privilege-separation directory.
mkdir -p /run/sshd
chmod 0755 /run/sshd

echo "install-test-prereqs.sh: done"
