#!/bin/bash
# vast-agent-onstart: keeps the agent running on vast.ai's ssh/jupyter run types.
#
# Those run types replace the image ENTRYPOINT with vast.ai's own init (sshd,
# jupyter) and run the template's onstart script, kept as /root/onstart.sh, at
# every container start. That script calls this one (installed in the image
# as /usr/local/bin/vast-agent-onstart), which starts a supervisor in the
# background and returns, so vast.ai's boot goes on.
#
#   vast-agent-onstart [start]  start the supervisor unless one already runs
#   vast-agent-onstart stop     stop the supervisor and its agent (SIGTERM)
#   vast-agent-onstart status   exit 0 when running, 3 when not
#
# The supervisor runs the image entrypoint (which checks the environment and
# execs `vast-agent run`) and restarts it when it exits, with a capped backoff.
# It stops for good when the agent exits with a status in VM_RESTART_FINAL_CODES
# (default "0 3": terminated on the coordinator's directive, or the orphan
# rule destroyed the instance; restarting either would rent nothing back).
# A SIGTERM to the supervisor (container stop, `stop`) is passed to the agent,
# and nothing restarts.
#
# Environment (all optional; VM_* values the agent needs come from vast.ai):
#   VM_ROOT                    prefix for every path below (tests use a temporary root)
#   VM_AGENT_LOG               the agent's log (default $VM_ROOT/var/log/vast-agent.log)
#   VM_AGENT_LOG_MAX_BYTES     rotate the log to <log>.1 past this size (default 20 MiB)
#   VM_RESTART_BACKOFF_MIN     first delay before a restart, seconds (default 5)
#   VM_RESTART_BACKOFF_MAX     cap of the doubling delay, seconds (default 120)
#   VM_RESTART_RESET_AFTER     a run this long (seconds) resets the delay (default 600)
#   VM_RESTART_FINAL_CODES     exit statuses that end the loop (default "0 3")
#   VM_STOP_TIMEOUT            seconds `stop` waits before SIGKILL (default 60)
#   VM_ENTRYPOINT              the entrypoint to run (default: next to this script,
#                              else /usr/local/bin/vast-agent-entrypoint)
#   VM_AGENT_BIN, VM_AGENT_USER  passed on to the entrypoint
set -eu
umask 022

prog=vast-agent-onstart
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
here=$(dirname "$self")

root=${VM_ROOT:-}
run_dir=$root/run/vast-agent
lock=$run_dir/supervisor.lock
supervisor_pidfile=$run_dir/supervisor.pid
agent_pidfile=$run_dir/agent.pid
env_file=$root/etc/vast-agent/env

die() {
    local code=$1
    shift
    printf '%s: %s\n' "$prog" "$*" >&2
    exit "$code"
}

# vast.ai shows the instance env to onstart only: an operator who later runs
# this from an ssh session has none of it. The first start saves what the
# agent needs (root-only, it holds the agent key) and such a run reloads it.
# The file is only trusted when we own it.
if [ -z "${VM_COORDINATOR_URL:-}" ] && [ -f "$env_file" ] && [ -O "$env_file" ]; then
    # shellcheck source=/dev/null
    . "$env_file"
fi

log=${VM_AGENT_LOG:-$root/var/log/vast-agent.log}
log_max=${VM_AGENT_LOG_MAX_BYTES:-20971520}
backoff_min=${VM_RESTART_BACKOFF_MIN:-5}
backoff_max=${VM_RESTART_BACKOFF_MAX:-120}
reset_after=${VM_RESTART_RESET_AFTER:-600}
final_codes=${VM_RESTART_FINAL_CODES:-0 3}
stop_timeout=${VM_STOP_TIMEOUT:-60}

for setting in VM_AGENT_LOG_MAX_BYTES=$log_max VM_RESTART_BACKOFF_MIN=$backoff_min \
    VM_RESTART_BACKOFF_MAX=$backoff_max VM_RESTART_RESET_AFTER=$reset_after \
    VM_STOP_TIMEOUT=$stop_timeout; do
    case ${setting#*=} in
        '' | *[!0-9]*) die 2 "${setting%%=*} must be a whole number of seconds or bytes, not '${setting#*=}'" ;;
    esac
done
if [ "$backoff_min" -lt 1 ]; then
    # A zero delay would never double: a crashing agent would spin.
    die 2 "VM_RESTART_BACKOFF_MIN must be at least 1"
fi

entrypoint=${VM_ENTRYPOINT:-}
if [ -z "$entrypoint" ]; then
    for candidate in "$here/vast-agent-entrypoint" "$here/entrypoint.sh" \
        /usr/local/bin/vast-agent-entrypoint; do
        if [ -x "$candidate" ]; then
            entrypoint=$candidate
            break
        fi
    done
fi
if [ -z "$entrypoint" ] || [ ! -x "$entrypoint" ]; then
    die 2 "no executable entrypoint (set VM_ENTRYPOINT; looked next to $self and in /usr/local/bin)"
fi

# A supervisor holds an flock on $lock for its whole life, and so does its agent
# (the descriptor is inherited on purpose): a lock dies with its holders, so a
# PID left from an earlier container start can never be mistaken for a live one,
# and while any agent from an earlier supervisor lives no second agent starts
# (two agents with one key would fight over the instance's phase).
running() {
    ! flock -n "$lock" true
}

note() {
    printf '%s %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$prog" "$*"
}

save_env() {
    local name tmp
    mkdir -p "$(dirname "$env_file")"
    tmp=$env_file.tmp.$$
    (
        umask 077
        : >"$tmp"
        while IFS= read -r name; do
            case $name in
                VM_* | CONTAINER_* | VAST_* | FIL_PROOFS_* | IPFS_GATEWAY | RUST_LOG | PUBLIC_IPADDR | GPU_COUNT)
                    printf 'export %s=%q\n' "$name" "${!name}" >>"$tmp"
                    ;;
            esac
        done < <(compgen -e)
    )
    mv -f "$tmp" "$env_file"
}

start() {
    mkdir -p "$run_dir" "$(dirname "$log")"
    if running; then
        echo "$prog: already running (supervisor pid $(cat "$supervisor_pidfile" 2>/dev/null || echo '?')); nothing to do"
        return 0
    fi
    # Fail here, where vast.ai's onstart log shows it, rather than in a loop
    # that restarts a misconfigured agent every two minutes.
    local rc=0
    "$entrypoint" --check-env || rc=$?
    if [ "$rc" -ne 0 ]; then
        note "not starting: the environment check failed (status $rc)" >>"$log"
        return "$rc"
    fi
    save_env
    # setsid: a session of its own, so neither vast.ai's onstart runner nor an
    # ssh logout (SIGHUP) takes the supervisor down with the caller.
    # Through bash: a pasted copy kept as /root/onstart.sh need not be executable.
    setsid bash "$self" __supervise </dev/null >>"$log" 2>&1 &
    echo "$prog: supervisor started; log: $log"
}

stop() {
    local pid deadline agent
    if ! running; then
        echo "$prog: not running"
        return 0
    fi
    pid=$(cat "$supervisor_pidfile" 2>/dev/null || true)
    agent=$(cat "$agent_pidfile" 2>/dev/null || true)
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null || true
    elif [ -n "$agent" ]; then
        # The supervisor died (e.g. SIGKILL) and left its agent: stop that one.
        kill -TERM "$agent" 2>/dev/null || true
    fi
    deadline=$((SECONDS + stop_timeout))
    while running; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "$prog: still running after ${stop_timeout}s; sending SIGKILL" >&2
            for p in $agent $pid; do kill -KILL "$p" 2>/dev/null || true; done
            break
        fi
        sleep 0.2
    done
    echo "$prog: stopped"
}

status() {
    if running; then
        echo "$prog: running (supervisor pid $(cat "$supervisor_pidfile" 2>/dev/null || echo '?')," \
            "agent pid $(cat "$agent_pidfile" 2>/dev/null || echo '?'))"
        return 0
    fi
    echo "$prog: not running"
    return 3
}

# Copies the agent's output into $log, moving it to $log.1 once it passes
# $log_max bytes: days of proving must not fill the disk the parameters need.
# It never gives up on an error (a vanished log folder, a full disk): if it
# died, the agent's next write would kill the agent with SIGPIPE. It ignores
# SIGTERM so it drains the agent's last lines during a shutdown; EOF ends it.
log_writer() {
    local LC_ALL=C line size
    set +e
    trap '' TERM INT HUP
    size=$(wc -c <"$log" 2>/dev/null || echo 0)
    exec 3>>"$log" || exec 3>/dev/null
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line" >&3
        size=$((size + ${#line} + 1))
        if [ "$size" -ge "$log_max" ]; then
            exec 3>&-
            mv -f "$log" "$log.1"
            exec 3>>"$log" || exec 3>/dev/null
            size=0
        fi
    done
    exec 3>&-
}

stopping=
agent_pid=
sleep_pid=

on_signal() {
    stopping=$1
    note "received SIG$1; stopping the agent"
    if [ -n "$agent_pid" ]; then
        kill -TERM "$agent_pid" 2>/dev/null || true
    fi
    if [ -n "$sleep_pid" ]; then
        kill -TERM "$sleep_pid" 2>/dev/null || true
    fi
}

# A trapped signal interrupts `wait` (status > 128) while the agent may still
# be shutting down; wait again until it is really gone and its own status is known.
wait_agent() {
    local rc
    while :; do
        rc=0
        wait "$agent_pid" || rc=$?
        if [ "$rc" -gt 128 ] && kill -0 "$agent_pid" 2>/dev/null; then
            continue
        fi
        return "$rc"
    done
}

is_final() {
    local code
    for code in $final_codes; do
        if [ "$1" = "$code" ]; then
            return 0
        fi
    done
    return 1
}

supervise() {
    local fifo writer_pid rc started ran delay starts=0
    mkdir -p "$run_dir" "$(dirname "$log")"
    exec 9>>"$lock"
    if ! flock -n 9; then
        # Lost a race with a concurrent start: that one runs, nothing to do.
        exit 0
    fi
    echo "$$" >"$supervisor_pidfile"

    fifo=$run_dir/log.fifo.$$
    rm -f "$fifo"
    mkfifo -m 600 "$fifo"
    log_writer <"$fifo" 9>&- &
    writer_pid=$!
    # Opening the write end waits for the writer's read end; both are open
    # after this line, so the name is no longer needed.
    exec 4>"$fifo"
    rm -f "$fifo"
    exec >&4 2>&4

    trap 'on_signal TERM' TERM
    trap 'on_signal INT' INT
    trap 'on_signal HUP' HUP

    delay=$backoff_min
    note "supervisor $$ started (entrypoint $entrypoint)"
    while :; do
        starts=$((starts + 1))
        started=$SECONDS
        note "starting the agent (start $starts)"
        "$entrypoint" run </dev/null >&4 2>&4 &
        agent_pid=$!
        echo "$agent_pid" >"$agent_pidfile"
        rc=0
        wait_agent || rc=$?
        agent_pid=
        ran=$((SECONDS - started))
        note "the agent exited with status $rc after ${ran}s"
        if [ -n "$stopping" ]; then
            break
        fi
        if is_final "$rc"; then
            note "status $rc means the agent ended on purpose; not restarting"
            break
        fi
        if [ "$ran" -ge "$reset_after" ]; then
            delay=$backoff_min
        fi
        note "restarting in ${delay}s"
        # Not holding the lock or the log: only the supervisor and agent may.
        sleep "$delay" 9>&- 4>&- &
        sleep_pid=$!
        wait "$sleep_pid" || true
        sleep_pid=
        if [ -n "$stopping" ]; then
            break
        fi
        delay=$((delay * 2))
        if [ "$delay" -gt "$backoff_max" ]; then
            delay=$backoff_max
        fi
    done
    note "supervisor $$ exiting"
    rm -f "$supervisor_pidfile" "$agent_pidfile"
    # Close our write end and let the writer drain, so the last lines land.
    exec 4>&- >/dev/null 2>&1
    wait "$writer_pid" || true
}

case ${1:-start} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    __supervise) supervise ;;
    *) die 2 "usage: $prog [start|stop|status]" ;;
esac
