#!/usr/bin/env bash
# Start (installing if needed) a one-node SLURM cluster with real accounting, for tests/slurm/ and
# bench/bench_slurm_scale.py. Idempotent: with everything running it checks and exits 0; a dead daemon is
# restarted. Order: munged -> MariaDB (socket only) -> slurmdbd -> slurmctld -> slurmd, each waited for.
# Needs root and apt on Debian/Ubuntu. Settings (env): MIRROR_ES_SLURM_DIR (state, logs; default
# /var/lib/mirror-es-slurm), MIRROR_ES_SLURM_CPUS (advertised CPUs, 16), MIRROR_ES_SLURM_MAX_ARRAY (50).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

PACKAGES=(munge mariadb-server slurmdbd slurmctld slurmd slurm-client)
HOST=$(hostname -s)

die() { log "ERROR: $*"; exit 1; }
exec 3>&2   # readiness checks run with stderr silenced; fd 3 still reaches the user

check_prerequisites() {
    [ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons); try: sudo $0"
    [[ "$SLURM_CPUS" =~ ^[1-9][0-9]*$ ]] || die "MIRROR_ES_SLURM_CPUS='$SLURM_CPUS' is not a positive integer"
    [[ "$SLURM_MAX_ARRAY" =~ ^[1-9][0-9]*$ ]] \
        || die "MIRROR_ES_SLURM_MAX_ARRAY='$SLURM_MAX_ARRAY' is not a positive integer"
    [[ "$SLURM_DIR" = /* ]] || die "MIRROR_ES_SLURM_DIR='$SLURM_DIR' must be an absolute path"
}

install_packages() {
    local missing=() pkg
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by hand"
    log "installing ${missing[*]} with apt-get"
    # Keep the packages' own init scripts from starting default-configured daemons: we run our own.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && made_policy=1
    fi
    local rc=0 apt_log="/tmp/mirror-es-slurm-apt.$$.log"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >"$apt_log" 2>&1 \
        || { apt-get update -q >>"$apt_log" 2>&1 \
             && apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$apt_log" 2>&1; } || rc=$?
    [ $made_policy = 1 ] && rm -f "$policy"
    if [ $rc != 0 ]; then
        tail -n 20 "$apt_log" >&2
        die "apt-get install ${missing[*]} failed (full log: $apt_log)"
    fi
    rm -f "$apt_log"
}

make_dirs() {
    mkdir -p "$SLURM_DIR" "$ETC_DIR" "$RUN_DIR" "$LOG_DIR" "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd" \
        "$MUNGE_DIR" "$MUNGE_RUN" "$MYSQL_DATA" "$MYSQL_RUN"
    # munged refuses keys and sockets in directories others can write; MariaDB runs as mysql.
    chmod 755 "$SLURM_DIR" "$RUN_DIR"
    chown munge:munge "$MUNGE_DIR" "$MUNGE_RUN" && chmod 700 "$MUNGE_DIR" && chmod 755 "$MUNGE_RUN"
    chown mysql:mysql "$MYSQL_DATA" "$MYSQL_RUN"
    touch "${LOG_FILE[munged]}" "${LOG_FILE[mariadbd]}"
    chown munge:munge "${LOG_FILE[munged]}"
    chown mysql:mysql "${LOG_FILE[mariadbd]}"
}

# Render a template into place; replace the file only when its content changes. Returns 0 if it changed.
render() {
    local template=$1 target=$2 mode=$3 real_mem mem_per_cpu tmp
    real_mem=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 ))
    # Leave the node's memory generous but bounded per CPU so many array tasks fit at once.
    mem_per_cpu=$(( real_mem / SLURM_CPUS ))
    [ $mem_per_cpu -gt 1024 ] && mem_per_cpu=1024
    tmp="$target.tmp.$$"
    sed -e "s|@CLUSTER@|$SLURM_CLUSTER|g" -e "s|@HOST@|$HOST|g" -e "s|@CPUS@|$SLURM_CPUS|g" \
        -e "s|@REAL_MEM@|$real_mem|g" -e "s|@MEM_PER_CPU@|$mem_per_cpu|g" \
        -e "s|@MAX_ARRAY@|$SLURM_MAX_ARRAY|g" -e "s|@CRED_EXPIRE@|$SLURM_CRED_EXPIRE|g" -e "s|@MUNGE_SOCKET@|$MUNGE_SOCKET|g" \
        -e "s|@RUN_DIR@|$RUN_DIR|g" -e "s|@LOG_DIR@|$LOG_DIR|g" -e "s|@STATE_DIR@|$STATE_DIR|g" \
        -e "s|@MYSQL_DATA@|$MYSQL_DATA|g" -e "s|@MYSQL_SOCKET@|$MYSQL_SOCKET|g" -e "s|@MYSQL_RUN@|$MYSQL_RUN|g" \
        "$template" > "$tmp"
    chmod "$mode" "$tmp"
    if [ -f "$target" ] && cmp -s "$tmp" "$target"; then rm -f "$tmp"; return 1; fi
    mv -f "$tmp" "$target"
    return 0
}

SLURM_CONF_CHANGED=0
write_configs() {
    render "$HERE/my.cnf.in" "$ETC_DIR/my.cnf" 644 || true
    render "$HERE/slurmdbd.conf.in" "$ETC_DIR/slurmdbd.conf" 600 || true   # slurmdbd demands 600
    if render "$HERE/slurm.conf.in" "$SLURM_CONF_FILE" 644; then SLURM_CONF_CHANGED=1; fi
    # Plain sbatch/sacct/submitit read /etc/slurm/slurm.conf; point it at ours, never over a foreign one.
    mkdir -p /etc/slurm
    if [ -L "$SYSTEM_SLURM_CONF" ] || [ ! -e "$SYSTEM_SLURM_CONF" ]; then
        ln -sfn "$SLURM_CONF_FILE" "$SYSTEM_SLURM_CONF"
    elif ! head -n 1 "$SYSTEM_SLURM_CONF" | grep -qF "$MARKER"; then
        die "$SYSTEM_SLURM_CONF exists and was not written by this script; move it away or export SLURM_CONF=$SLURM_CONF_FILE yourself"
    fi
    if [ ! -s "$MUNGE_DIR/munge.key" ]; then
        log "creating munge key"
        dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
    fi
    chown munge:munge "$MUNGE_DIR/munge.key" && chmod 400 "$MUNGE_DIR/munge.key"
}

# Poll CHECK (a shell function) until it succeeds, the daemon dies, or READY_TIMEOUT passes.
wait_ready() {
    local name=$1 check=$2 deadline=$((SECONDS + READY_TIMEOUT))
    while [ $SECONDS -lt $deadline ]; do
        if "$check" >/dev/null 2>&1; then return 0; fi
        if [ -z "$(daemon_pid "$name")" ] && [ $((SECONDS + READY_TIMEOUT - deadline)) -ge 3 ]; then
            log "ERROR: $name died while starting"
            log_tail "$name"; exit 1
        fi
        sleep 0.5
    done
    log "ERROR: $name did not become ready within ${READY_TIMEOUT}s (pid: $(daemon_pid "$name"))"
    log_tail "$name"; exit 1
}

munge_ok() { munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"; }
mariadb_ok() { mariadb-admin --defaults-file="$ETC_DIR/my.cnf" ping; }
slurmdbd_ok() { timeout 10 sacctmgr -n -P show cluster format=cluster; }
slurmctld_ok() { timeout 10 scontrol ping | grep -q "is UP"; }
# A node left drained or down by an earlier test (slurmd itself answering) is resumed: the cluster is ours.
slurmd_ok() {
    local state
    state=$(timeout 10 sinfo -h -n "$HOST" -o %T) || return 1
    case "$state" in
        idle|mixed|allocated|completing) return 0 ;;
        drain|drained|draining|down)
            log "node $HOST is $state; resuming it" 2>&3
            timeout 10 scontrol update nodename="$HOST" state=resume reason="mirror-es up.sh" >&2 || true
            return 1 ;;
        *) return 1 ;;
    esac
}

start_munged() {
    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="${PID_FILE[munged]}" --log-file="${LOG_FILE[munged]}" \
        --seed-file="$MUNGE_DIR/munged.seed" --num-threads=10 \
        || { log "ERROR: munged failed to start"; log_tail munged; exit 1; }
}

start_mariadbd() {
    if [ ! -d "$MYSQL_DATA/mysql" ]; then
        log "initialising MariaDB data directory $MYSQL_DATA"
        mariadb-install-db --defaults-file="$ETC_DIR/my.cnf" --user=mysql --datadir="$MYSQL_DATA" \
            --auth-root-authentication-method=socket --skip-test-db >>"${LOG_FILE[mariadbd]}" 2>&1 \
            || { log "ERROR: mariadb-install-db failed"; log_tail mariadbd; exit 1; }
    fi
    setsid /usr/sbin/mariadbd --defaults-file="$ETC_DIR/my.cnf" --user=mysql \
        </dev/null >>"${LOG_FILE[mariadbd]}" 2>&1 &
    # mariadbd writes its pid file only after start-up; wait for it so daemon_pid sees the process.
    local deadline=$((SECONDS + READY_TIMEOUT))
    while [ -z "$(daemon_pid mariadbd)" ] && [ $SECONDS -lt $deadline ]; do
        kill -0 $! 2>/dev/null || { log "ERROR: mariadbd exited while starting"; log_tail mariadbd; exit 1; }
        sleep 0.3
    done
}

start_slurmdbd() { /usr/sbin/slurmdbd || { log "ERROR: slurmdbd failed to start"; log_tail slurmdbd; exit 1; }; }
start_slurmctld() { /usr/sbin/slurmctld || { log "ERROR: slurmctld failed to start"; log_tail slurmctld; exit 1; }; }
start_slurmd() { /usr/sbin/slurmd || { log "ERROR: slurmd failed to start"; log_tail slurmd; exit 1; }; }

ensure() {
    local name=$1 check=$2
    if [ -n "$(daemon_pid "$name")" ]; then
        wait_ready "$name" "$check"
        return 0
    fi
    log "starting $name"
    "start_$name"
    wait_ready "$name" "$check"
}

stop_daemon() {
    local name=$1 pid
    pid=$(daemon_pid "$name")
    [ -n "$pid" ] || return 0
    log "stopping $name (pid $pid) to apply the new configuration"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do [ -d "/proc/$pid" ] || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}

register_accounting() {
    if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$SLURM_CLUSTER"; then
        log "registering cluster $SLURM_CLUSTER in slurmdbd"
        sacctmgr -i add cluster "$SLURM_CLUSTER" >/dev/null
    fi
    if ! sacctmgr -n -P show account format=account | grep -qx "$SLURM_ACCOUNT"; then
        sacctmgr -i add account "$SLURM_ACCOUNT" cluster="$SLURM_CLUSTER" \
            description="mirror-es test jobs" organization=mirror-es >/dev/null
    fi
    if ! sacctmgr -n -P show assoc where user=root account="$SLURM_ACCOUNT" format=user | grep -qx root; then
        sacctmgr -i add user root account="$SLURM_ACCOUNT" cluster="$SLURM_CLUSTER" >/dev/null
    fi
}

main() {
    local t0=$SECONDS
    check_prerequisites
    install_packages
    make_dirs
    write_configs
    if [ $SLURM_CONF_CHANGED = 1 ]; then
        stop_daemon slurmd
        stop_daemon slurmctld
    fi
    ensure munged munge_ok
    ensure mariadbd mariadb_ok
    ensure slurmdbd slurmdbd_ok
    # The cluster must exist in the database before slurmctld registers with it.
    register_accounting
    ensure slurmctld slurmctld_ok
    ensure slurmd slurmd_ok
    log "cluster '$SLURM_CLUSTER' up on $HOST with $SLURM_CPUS CPUs, MaxArraySize=$SLURM_MAX_ARRAY ($((SECONDS - t0)) s); state in $SLURM_DIR"
}

main "$@"
