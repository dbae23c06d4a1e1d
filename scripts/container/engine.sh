#!/usr/bin/env bash
# A Docker engine for the container test (make test-container).
#
#   engine.sh start   prints DOCKER_HOST=... for an engine that answers: the one DOCKER_HOST (or the
#                     default socket) already names, or else one started here (Debian's docker.io,
#                     installed with apt-get when missing; root needed), with its own data root,
#                     socket and state, on the overlay2 storage driver (vfs where overlays cannot be
#                     mounted), without iptables or a bridge (containers use --network host).
#   engine.sh stop    stops the engine that `start` started (none other).
#
# The engine's data root lives in the container cache ($S3BATCH_CONTAINER_CACHE, default
# ~/.cache/s3batch-container), so the base image it holds survives between runs.
# Exit status 3 from `start`: no engine can be had here (not root, or no apt-get); the reason is on stderr.
set -euo pipefail

# shellcheck source=scripts/container/lib.sh
. "$(dirname "$0")/lib.sh"
RUN_DIR=${S3BATCH_CONTAINER_RUN:-/run/s3batch-container}
SOCK=$RUN_DIR/docker.sock
PIDFILE=$RUN_DIR/dockerd.pid
LOG=$CACHE/dockerd.log

answers() {  # answers HOST: the engine at HOST replies to `docker version`
    DOCKER_HOST=$1 timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

storage_driver() {  # overlay2 where this kernel mounts an overlay on the cache's file system, else vfs
    # vfs copies an image's whole file system for every layer and every container (the engine then
    # spends most of the container test's CPU copying); overlay2 copies nothing.
    local dir ok=vfs
    dir=$(mktemp -d "$CACHE/overlay-probe.XXXXXX")
    mkdir -p "$dir/lower" "$dir/upper" "$dir/work" "$dir/merged"
    if mount -t overlay overlay -o "lowerdir=$dir/lower,upperdir=$dir/upper,workdir=$dir/work" "$dir/merged" 2>/dev/null; then
        umount "$dir/merged" && ok=overlay2
    fi
    rm -rf "$dir"
    echo "$ok"
}

install_engine() {
    command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1 && return 0
    apt_install docker.io
}

start() {
    if [ -n "${DOCKER_HOST:-}" ] && answers "$DOCKER_HOST"; then echo "DOCKER_HOST=$DOCKER_HOST"; return; fi
    if answers unix:///var/run/docker.sock; then echo "DOCKER_HOST=unix:///var/run/docker.sock"; return; fi
    if answers "unix://$SOCK"; then echo "DOCKER_HOST=unix://$SOCK"; return; fi
    install_engine || return $?
    if [ "$(id -u)" != 0 ]; then echo "dockerd needs root to start" >&2; return 3; fi
    mkdir -p "$CACHE/engine" "$RUN_DIR"
    local driver
    driver=$(storage_driver)
    echo "starting dockerd ($driver, no iptables, no bridge; log: $LOG)" >&2
    # setsid: the engine outlives this script; `engine.sh stop` ends it through its pid file.
    setsid dockerd --iptables=false --ip-masq=false --bridge=none --storage-driver="$driver" \
        --data-root "$CACHE/engine" --exec-root "$RUN_DIR/exec" --pidfile "$PIDFILE" \
        --host "unix://$SOCK" >"$LOG" 2>&1 </dev/null &
    for _ in $(seq 1 120); do
        if answers "unix://$SOCK"; then
            touch "$RUN_DIR/started-here"
            echo "DOCKER_HOST=unix://$SOCK"
            return
        fi
        sleep 0.5
    done
    echo "dockerd did not answer within 60 s; its log ($LOG) ends with:" >&2
    tail -n 20 "$LOG" >&2
    return 1
}

stop() {
    [ -f "$RUN_DIR/started-here" ] || { echo "no engine started by engine.sh: nothing to stop" >&2; return 0; }
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "dockerd $pid still running 30 s after SIGTERM: killing it" >&2
            kill -KILL "$pid"
        fi
    fi
    # dockerd leaves its network namespace mounted under the exec root.
    for mnt in "$RUN_DIR"/exec/netns/*; do
        if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" || true; fi
    done
    rm -f "$RUN_DIR/started-here"
    echo "engine stopped" >&2
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
