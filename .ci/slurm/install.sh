#!/usr/bin/env bash
# Install the Debian packages of a real Slurm with accounting (slurmctld, slurmd, munge,
# slurmdbd, MariaDB), only when they are missing. Needs root and apt (CI: a fresh Debian
# machine). Recipe: shared/reference/slurm-ray.md §1.1.
set -euo pipefail
need=()
for cmd in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge \
           slurmdbd:slurmdbd mysqld_safe:mariadb-server; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${cmd%%:*}" ] || need+=("${cmd#*:}")
done
if [ ${#need[@]} -eq 0 ]; then
  echo "slurm: packages already installed"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "slurm: missing ${need[*]} and cannot install them (needs root and apt-get)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "slurm: installing ${need[*]}"
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
