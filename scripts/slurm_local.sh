#!/usr/bin/env bash
# A single-node SLURM on this machine, from Debian's packages, to try the cluster path (docs/cluster.md) and to
# test it (tests/slurm/). As root:
#   bash scripts/slurm_local.sh up                   # munge, MariaDB, slurmdbd (accounting), slurmctld, slurmd
#   bash scripts/slurm_local.sh up --no-accounting   # munge, slurmctld, slurmd: sacct answers "disabled"
#   bash scripts/slurm_local.sh down                 # stops every daemon it started; nothing is left running
#   bash scripts/slurm_local.sh install              # only the packages (up installs any that is missing)
# The node is this machine: its CPUs, 2 GPUs declared as gres (fake device files: GPU-shaped jobs schedule, and
# a CPU build of torch trains them on the CPU) and two partitions on it, gpu (the default) and cpu. Every daemon
# runs in the foreground of a background process whose id is kept in $NLQ_SLURM_DIR/pids/; `down` stops each by
# that id (a munged that was running already is used, and left running). `up` again is a no-op in the same
# mode, and restarts in the other. The daemons' logs are in $NLQ_SLURM_DIR (default /tmp/nlq-slurm); the
# configuration is written to /etc/slurm/ (where sbatch, squeue and sacct read it), never over a slurm.conf
# this script did not write.
set -euo pipefail
state=${NLQ_SLURM_DIR:-/tmp/nlq-slurm}
mode=${2:-}
node=$(hostname -s)
marker="# written by nlq's scripts/slurm_local.sh"
packages="munge slurmctld slurmd slurmdbd slurm-client mariadb-server"

die() { echo "slurm_local.sh: $*" >&2; exit 1; }

alive() {  # alive NAME: the daemon NAME started by this script still runs (its id, and still that program)
    [[ -f $state/pids/$1 ]] && grep -qa "$1" "/proc/$(cat "$state/pids/$1")/cmdline" 2>/dev/null
}

start() {  # start NAME COMMAND...: run COMMAND (a daemon in the foreground) in the background, keep its id
    setsid "${@:2}" >>"$state/$1.log" 2>&1 < /dev/null &
    echo $! > "$state/pids/$1"
    for _ in $(seq 50); do alive "$1" && break; sleep 0.1; done  # (the fork has not run COMMAND yet)
}

wait_for() {  # wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds, or fail naming WHAT and its log
    local what=$1 deadline=$((SECONDS + $2))
    until "${@:3}" >/dev/null 2>&1; do
        alive "$what" || die "$what exited as it started; see $state/$what.log"
        ((SECONDS < deadline)) || die "$what did not come up in $2 s; see $state/$what.log"
        sleep 0.5
    done
}

stop() {  # stop NAME: SIGTERM to the daemon's process id, SIGKILL after 30 s
    if alive "$1"; then
        local pid
        pid=$(cat "$state/pids/$1")
        kill -TERM "$pid"
        for _ in $(seq 60); do alive "$1" || break; sleep 0.5; done
        if alive "$1"; then kill -KILL "$pid"; fi
        while alive "$1"; do sleep 0.2; done
    fi
    rm -f "$state/pids/$1"
}

down() {
    # jobs first (else slurmd's steps would outlive it), then the daemons in the reverse order of up
    if alive slurmctld && alive slurmd; then
        scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 30); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 1; done
    fi
    for name in slurmd slurmctld slurmdbd mariadb munged; do stop "$name"; done
    rm -f "$state/mode"
}

write_config() {  # write_config ACCOUNTING(yes|no)
    local cpus mem acct_lines=""
    if [[ -f /etc/slurm/slurm.conf ]] && ! grep -qF "$marker" /etc/slurm/slurm.conf; then
        die "/etc/slurm/slurm.conf exists and was not written by this script: this machine has its own SLURM"
    fi
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
    if [[ $1 == yes ]]; then
        acct_lines="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu"
        cat > /etc/slurm/slurmdbd.conf <<EOF
$marker
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$state/slurmdbd.pid
LogFile=$state/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=nlq
StorageLoc=slurm_acct_db
EOF
        chmod 600 /etc/slurm/slurmdbd.conf
    else
        acct_lines="AccountingStorageType=accounting_storage/none"
    fi
    cat > /etc/slurm/slurm.conf <<EOF
$marker
ClusterName=nlq
SlurmctldHost=$node
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/slurmd
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=none
ReturnToService=2
KillWait=5
AuthInfo=cred_expire=10
SchedulerParameters=sched_interval=5,bf_interval=5
$acct_lines
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=gpu Nodes=$node Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes=$node MaxTime=INFINITE State=UP
EOF
    cat > /etc/slurm/gres.conf <<EOF
$marker
AutoDetect=off
NodeName=$node Name=gpu File=$state/dev/nvidia[0-1]
EOF
}

install() {  # Debian's packages, if any is missing
    local missing=0
    for command in munged slurmctld slurmd slurmdbd sbatch mariadbd; do
        command -v $command >/dev/null || missing=1
    done
    if ((missing)); then
        [[ $(id -u) == 0 ]] || die "run it as root (it installs $packages with apt-get)"
        echo "slurm_local.sh: installing $packages"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null
    fi
}

up() {
    local accounting=yes
    [[ $mode == --no-accounting ]] && accounting=no
    [[ -z $mode || $mode == --no-accounting ]] || die "unknown option $mode: up [--no-accounting]"
    [[ $(id -u) == 0 ]] || die "run it as root (it starts munge and slurmd)"
    if [[ -f $state/mode && $(cat "$state/mode") == "$accounting" ]] && alive slurmctld && alive slurmd; then
        echo "slurm_local.sh: SLURM is up already (accounting: $accounting)"
        return
    fi
    down
    install
    mkdir -p "$state"/{pids,ctld,slurmd,dev,munge}
    touch "$state"/dev/nvidia0 "$state"/dev/nvidia1
    [[ -f /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
    mkdir -p /run/munge
    chown munge:munge "$state/munge" /run/munge /etc/munge/munge.key
    write_config "$accounting"
    if ! munge -n >/dev/null 2>&1; then  # (else a munged runs already: used, and left running)
        start munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground \
            --socket=/run/munge/munge.socket.2 --pid-file="$state/munge/munged.pid" \
            --log-file="$state/munge/munged.log" --seed-file="$state/munge/munged.seed"
        wait_for munged 30 munge -n
    fi
    if [[ $accounting == yes ]]; then
        if [[ ! -d $state/mysql/mysql ]]; then
            mkdir -p "$state/mysql" && chown mysql:mysql "$state/mysql"
            mariadb-install-db --user=mysql --datadir="$state/mysql" --auth-root-authentication-method=socket \
                --skip-test-db > "$state/mariadb-install.log" 2>&1
        fi
        start mariadb mariadbd --user=mysql --datadir="$state/mysql" --socket="$state/mysql/mysqld.sock" \
            --pid-file="$state/mysql/mysqld.pid" --bind-address=127.0.0.1 --port=3306 \
            --innodb-buffer-pool-size=64M --innodb-log-file-size=16M
        wait_for mariadb 60 mariadb --socket="$state/mysql/mysqld.sock" -e "select 1"
        for host in localhost 127.0.0.1; do  # slurmdbd's database user (it connects over TCP)
            mariadb --socket="$state/mysql/mysqld.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'$host'
                IDENTIFIED BY 'nlq'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'$host';"
        done
        start slurmdbd slurmdbd -D
        wait_for slurmdbd 60 sacctmgr -i show cluster
        sacctmgr -i show cluster -n format=cluster | grep -qw nlq || sacctmgr -i add cluster nlq >/dev/null
    fi
    start slurmctld slurmctld -D -i
    wait_for slurmctld 60 scontrol ping
    start slurmd slurmd -D
    wait_for slurmd 60 bash -c "sinfo -h -n $node -o %t | grep -qE '^(idle|mix|alloc)'"
    echo "$accounting" > "$state/mode"
    echo "slurm_local.sh: SLURM is up on $node (accounting: $accounting; partitions gpu and cpu; logs in $state)"
}

case ${1:-} in
    install) install ;;
    up) up ;;
    down) down; echo "slurm_local.sh: SLURM is down" ;;
    *) die "usage: bash scripts/slurm_local.sh up [--no-accounting] | down | install" ;;
esac
