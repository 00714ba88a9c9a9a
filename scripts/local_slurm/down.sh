#!/usr/bin/env bash
# Stop the one-node SLURM cluster started by up.sh: cancel its jobs, then stop slurmd -> slurmctld ->
# slurmdbd -> MariaDB -> munged, each by the pid in its own pid file (never by process name, so no other
# slurm or database on the machine is touched). Idempotent: a daemon that is not running is skipped.
# State and logs stay in MIRROR_ES_SLURM_DIR; delete that directory for a fresh cluster (job ids restart at 1).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"
STOP_TIMEOUT=${MIRROR_ES_SLURM_STOP_TIMEOUT:-30}

# Cancel every job of this cluster so no slurmstepd/job processes outlive the daemons.
cancel_jobs() {
    [ -n "$(daemon_pid slurmctld)" ] || return 0
    local jobs
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ') || return 0
    [ -n "${jobs// /}" ] || return 0
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null || true
    for _ in $(seq 1 50); do
        [ -z "$(timeout 10 squeue -h -o %A 2>/dev/null)" ] && return 0
        sleep 0.2
    done
    log "some jobs were still ending when slurmd was stopped"
}

stop_daemon() {
    local name=$1 pid
    pid=$(daemon_pid "$name")
    if [ -z "$pid" ]; then
        rm -f "${PID_FILE[$name]}"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while [ -d "/proc/$pid" ] && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if [ -d "/proc/$pid" ]; then
        log "$name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "${PID_FILE[$name]}"
}

cancel_jobs
for name in slurmd slurmctld slurmdbd mariadbd munged; do stop_daemon "$name"; done
log "cluster stopped"
