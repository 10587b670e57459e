#!/usr/bin/env bash
# Install the real third-party servers the tests talk to, from Debian's packages,
# when they are missing. Never fatal: tests that need a missing server fail in CI
# (CI=true) and skip elsewhere, with the reason.
set -uo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; }
have mosquitto || need+=(mosquitto)
have mosquitto_pub || need+=(mosquitto-clients)
have influxd || need+=(influxdb)
have victoria-metrics || need+=(victoria-metrics)
have prometheus || need+=(prometheus)
have prometheus-node-exporter || need+=(prometheus-node-exporter)
have prometheus-alertmanager || need+=(prometheus-alertmanager)  # alert rules (issue 15)
have vmalert || need+=(victoria-metrics)  # vmalert against /prometheus, bench_promql's peer
have collectd || need+=(collectd-core)  # bench_pusher: the peer a site would run instead
have snmpd || need+=(snmpd)
have snmpget || need+=(snmp)
have ipmitool || need+=(ipmitool)
have chromium || need+=(chromium)
have kubectl || need+=(kubernetes-client)
have clickhouse-server || need+=(clickhouse-server)
have clickhouse-client || need+=(clickhouse-client)
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
# A real Slurm for the slurm bridge's tests (never slurm-wlm-emulator: it replaces these binaries)
have slurmctld || need+=(slurmctld)
have slurmd || need+=(slurmd)
have sbatch || need+=(slurm-client)
have slurmrestd || need+=(slurmrestd)
have munged || need+=(munge)
[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so ] || [ -e /usr/lib/aarch64-linux-gnu/slurm-wlm/auth_jwt.so ] \
  || need+=(slurm-wlm-jwt-plugin)
# Kelvin's compiled core (services/common/csrc; scripts/bootstrap.sh builds it once these are here)
have cc || need+=(gcc libc6-dev)
py=python3; [ -x "$(dirname "$0")/../.venv/bin/python" ] && py="$(dirname "$0")/../.venv/bin/python"
"$py" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null \
  || need+=(python3-dev)
# `scripts/install-peers.sh image` (make image-test): what builds and runs the image.
if [ "${1:-}" = image ]; then
  have podman || need+=(podman)
  have runc || need+=(runc)
  have debootstrap || need+=(debootstrap)
fi
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "install-peers: not root and no sudo; missing: ${need[*]}" >&2; exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-peers: no apt-get; install these yourself: ${need[*]}" >&2; exit 0
fi
echo "install-peers: installing ${need[*]}" >&2
$sudo apt-get update -qq >/dev/null 2>&1 || true
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
  || echo "install-peers: apt-get failed for: ${need[*]}" >&2
# Debian starts some of these as system services where an init system runs; the
# tests start their own on free ports, so the system copies are not needed.
exit 0
