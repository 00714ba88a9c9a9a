# Shared by up.sh, down.sh and status.sh: where the one-node cluster keeps its files, and how a daemon is
# found by its pid file. Sourced, not executed.
# Everything (configs, databases, state, logs, sockets, pid files) lives under one directory so that a
# cluster can be wiped by deleting it, and nothing of the distro's default service layout is touched except
# the /etc/slurm/slurm.conf link that lets plain `sbatch`/`sacct` (and submitit) find this cluster.

SLURM_DIR=${MIRROR_ES_SLURM_DIR:-/var/lib/mirror-es-slurm}
SLURM_CPUS=${MIRROR_ES_SLURM_CPUS:-16}             # advertised, deliberately more than the machine has
SLURM_MAX_ARRAY=${MIRROR_ES_SLURM_MAX_ARRAY:-50}   # small, so tests can exercise array splitting
SLURM_CLUSTER=${MIRROR_ES_SLURM_CLUSTER:-mirror-es}
SLURM_ACCOUNT=${MIRROR_ES_SLURM_ACCOUNT:-mirror_es}
SLURM_CRED_EXPIRE=${MIRROR_ES_SLURM_CRED_EXPIRE:-20} # s; also how long a requeued job waits to restart
READY_TIMEOUT=${MIRROR_ES_SLURM_READY_TIMEOUT:-60} # seconds each daemon gets to become ready

ETC_DIR="$SLURM_DIR/etc"
RUN_DIR="$SLURM_DIR/run"
LOG_DIR="$SLURM_DIR/log"
STATE_DIR="$SLURM_DIR/state"
MUNGE_DIR="$SLURM_DIR/munge"
MUNGE_RUN="$RUN_DIR/munge"
MUNGE_SOCKET="$MUNGE_RUN/munge.socket.2"
MYSQL_DATA="$SLURM_DIR/mysql"
MYSQL_RUN="$RUN_DIR/mysqld"
MYSQL_SOCKET="$MYSQL_RUN/mysqld.sock"
SLURM_CONF_FILE="$ETC_DIR/slurm.conf"
SYSTEM_SLURM_CONF=/etc/slurm/slurm.conf
MARKER="# written by mirror-es scripts/local_slurm/up.sh"

# pid file and expected process name (/proc/PID/comm) of each daemon, in start order.
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)
declare -A PID_FILE=(
    [munged]="$MUNGE_RUN/munged.pid"
    [mariadbd]="$MYSQL_RUN/mariadbd.pid"
    [slurmdbd]="$RUN_DIR/slurmdbd.pid"
    [slurmctld]="$RUN_DIR/slurmctld.pid"
    [slurmd]="$RUN_DIR/slurmd.pid"
)
declare -A LOG_FILE=(
    [munged]="$LOG_DIR/munged.log"
    [mariadbd]="$LOG_DIR/mariadb.log"
    [slurmdbd]="$LOG_DIR/slurmdbd.log"
    [slurmctld]="$LOG_DIR/slurmctld.log"
    [slurmd]="$LOG_DIR/slurmd.log"
)

log() { echo "local_slurm: $*" >&2; }

# The pid of a daemon if its pid file names a live process with the expected name; empty otherwise.
# Checking the name guards against a stale pid file whose number was reused by an unrelated process.
daemon_pid() {
    local name=$1 file=${PID_FILE[$1]} pid comm
    [ -r "$file" ] || return 0
    pid=$(tr -dc '0-9' < "$file")
    [ -n "$pid" ] || return 0
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 0
    # mariadb may report itself as mysqld on some builds.
    case "$name:$comm" in
        "$name:$name"|mariadbd:mysqld) echo "$pid" ;;
    esac
}

log_tail() {
    local file=${LOG_FILE[$1]}
    echo "----- last 30 lines of $file -----" >&2
    tail -n 30 "$file" >&2 2>/dev/null || echo "(no log file)" >&2
    echo "-----" >&2
}

# Environment every slurm command of ours runs with: our config, and our MariaDB socket for slurmdbd.
export SLURM_CONF="$SLURM_CONF_FILE"
export MYSQL_UNIX_PORT="$MYSQL_SOCKET"
