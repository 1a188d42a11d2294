#!/usr/bin/env bash
# Stop what up.sh started, by PID file only (never by process name), then wait until it is gone.
set -uo pipefail
stop() {  # stop PIDFILE...: SIGTERM, wait up to 15 s, then SIGKILL
  local pids=() f
  for f in "$@"; do
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && pids+=("$(cat "$f")")
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  kill "${pids[@]}" 2>/dev/null
  for _ in $(seq 30); do
    kill -0 "${pids[@]}" 2>/dev/null || return 0
    sleep 0.5
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}
stop /run/slurmd-n*.pid /run/slurmctld.pid
stop /run/slurmdbd.pid
if [ -f /run/mysqld/mysqld.pid ]; then
  mysqladmin shutdown 2>/dev/null || stop /run/mysqld/mysqld.pid
  for _ in $(seq 30); do [ -f /run/mysqld/mysqld.pid ] || break; sleep 0.5; done
fi
stop /run/munge/munged.pid
exit 0
