#!/bin/sh
# vast-agent-entrypoint: the instance image's ENTRYPOINT (behind tini as PID 1).
#
# vast.ai's `args` run type runs the image ENTRYPOINT, so this starts the
# agent directly; the ssh/jupyter run types replace the ENTRYPOINT and run
# /root/onstart.sh instead, whose supervisor (image/onstart.sh) starts the
# agent through this same script, so both boot paths check and default the
# environment in one place.
#
#   vast-agent-entrypoint [run]      check the environment, exec `vast-agent run`
#   vast-agent-entrypoint --check-env  check the environment only (exit 0 or 2)
#   vast-agent-entrypoint CMD ...    exec CMD (e.g. `docker run -it IMAGE bash`)
#
# Environment (besides the agent's own VM_* table in docs/architecture.md):
#   VM_AGENT_BIN   the agent executable (default: vast-agent on PATH)
#   VM_AGENT_USER  run the agent as this user when started as root (needs
#                  setpriv from util-linux); empty: keep the current user
#   VM_ROOT        prefix for the default folders (tests run in a temporary root)
#
# Exit status: the agent's own (this script execs it), 2 when a required
# variable is missing or VM_AGENT_USER is unknown.
set -eu

prog=vast-agent-entrypoint

die() {
    code=$1
    shift
    printf '%s: %s\n' "$prog" "$*" >&2
    exit "$code"
}

mode=run
if [ "$#" -gt 0 ]; then
    case $1 in
        run) mode=run ;;
        --check-env) mode=check ;;
        # Anything else is a command to run instead of the agent, so the image
        # stays usable for debugging without overriding the ENTRYPOINT.
        *) exec "$@" ;;
    esac
fi

# The coordinator injects these three per instance at deploy. Only names are
# printed: the key's value must never reach a log.
missing=
for name in VM_COORDINATOR_URL VM_AGENT_ID VM_AGENT_KEY; do
    eval "value=\${$name:-}"
    if [ -z "$value" ]; then
        missing="$missing $name"
    fi
done
value=
if [ -n "$missing" ]; then
    die 2 "required environment variable(s) not set:$missing" \
        "(the coordinator sets VM_COORDINATOR_URL, VM_AGENT_ID and VM_AGENT_KEY" \
        "per instance at deploy; see image/vast-template.md)"
fi

user=${VM_AGENT_USER:-}
if [ "$user" = root ] || [ "$(id -u)" -ne 0 ]; then
    # Not root: nothing to drop to; the agent runs as whoever started us.
    user=
fi
if [ -n "$user" ]; then
    id "$user" >/dev/null 2>&1 || die 2 "VM_AGENT_USER: no such user: $user"
    command -v setpriv >/dev/null 2>&1 ||
        die 2 "VM_AGENT_USER=$user needs setpriv (util-linux) to drop root"
fi

if [ "$mode" = check ]; then
    exit 0
fi

root=${VM_ROOT:-}
# VM_PARAMS_DIR wins; a bare FIL_PROOFS_PARAMETER_CACHE (the proofs stack's own
# name, which operators may already set) is taken as the parameter folder.
# Both end up equal so cuzk and the agent's fetcher use the same files.
: "${VM_STATE_DIR:=$root/var/lib/vast-agent}"
: "${VM_PARAMS_DIR:=${FIL_PROOFS_PARAMETER_CACHE:-$root/var/tmp/filecoin-proof-parameters}}"
FIL_PROOFS_PARAMETER_CACHE=$VM_PARAMS_DIR
export VM_STATE_DIR VM_PARAMS_DIR FIL_PROOFS_PARAMETER_CACHE

# Created here, while possibly still root, so a dropped user can own them.
mkdir -p "$VM_STATE_DIR" "$VM_PARAMS_DIR"
chmod 0700 "$VM_STATE_DIR"

agent_bin=${VM_AGENT_BIN:-vast-agent}

if [ -n "$user" ]; then
    # Earlier boots may have run as root (an operator clearing VM_AGENT_USER);
    # hand the agent's folders over so the spool and parameter cache stay usable.
    chown -R "$user:" "$VM_STATE_DIR" "$VM_PARAMS_DIR"
    gid=$(id -g "$user")
    HOME=$(getent passwd "$user" | cut -d: -f6)
    export HOME
    # setpriv execs in place: the agent keeps this PID, so tini's signals and
    # the supervisor's wait reach the agent itself.
    exec setpriv --reuid="$user" --regid="$gid" --init-groups -- "$agent_bin" run
fi
exec "$agent_bin" run
