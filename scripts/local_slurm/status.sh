#!/usr/bin/env bash
# Report the local SLURM cluster's daemons (by pid file) and node state. Exit 0 only when every daemon of
# up.sh runs and the node accepts jobs, so scripts can use it as a cheap "is the cluster up" check.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

all_up=0
for name in "${DAEMONS[@]}"; do
    pid=$(daemon_pid "$name")
    if [ -n "$pid" ]; then
        printf '%-10s running (pid %s)\n' "$name" "$pid"
    else
        printf '%-10s NOT running (log: %s)\n' "$name" "${LOG_FILE[$name]}"
        all_up=1
    fi
done
node_state=$(timeout 15 sinfo -h -N -o '%N %T %c' 2>&1) || all_up=1
printf 'node       %s\n' "${node_state:-unknown}"
echo "$node_state" | grep -Eq ' (idle|mixed|allocated|completing) ' || all_up=1
echo "state dir  $SLURM_DIR"
exit $all_up
