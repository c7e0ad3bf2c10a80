#!/usr/bin/env bash
# A real single-node Apache Kafka 4.x broker (KRaft mode, loopback only) for rankwatch
# development and integration tests. The jars come from Maven Central through Maven
# (kafka/pom.xml pins the version) into .cache/kafka/<version>/libs; nothing is committed.
#
#   scripts/kafka.sh fetch                      copy the broker's jars into the cache (quick when there)
#   scripts/kafka.sh start [--port N] [--dir D] [--watch-pid P]
#                                               start in the background; prints host:port
#   scripts/kafka.sh stop   [--dir D]           stop it (data and logs stay in D)
#   scripts/kafka.sh status [--dir D]           "running ..." (exit 0) or "not running" (exit 3)
#   scripts/kafka.sh logs   [--dir D] [-f]      the broker's server.log (tail, or follow)
#   scripts/kafka.sh tool CLASS [ARGS...]       run one of the distribution's own tools, e.g.
#                                               org.apache.kafka.tools.ConsoleProducer
#                                               (what bin/kafka-console-producer.sh runs)
#
# D defaults to var/kafka. Storage is formatted (random cluster id) on the first start in
# a directory; later starts reuse it and its last ports when they are free. --watch-pid
# stops the broker when process P exits, so a killed test run leaves no broker behind.
#
# Environment: KAFKA_VERSION (override the pinned version, for trying others),
# KAFKA_HEAP_OPTS, KAFKA_JVM_OPTS, KAFKA_START_TIMEOUT (seconds, default 90),
# KAFKA_CDS=0 (do not use or write the class-data-sharing archive, see cds_opts),
# RANKWATCH_CACHE (default <repo>/.cache).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POM=$ROOT/kafka/pom.xml
LOG4J_CONFIG=$ROOT/kafka/log4j2.properties
TEMPLATE=$ROOT/kafka/server.properties.template
PINNED=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")
VERSION=${KAFKA_VERSION:-$PINNED}
CACHE=${RANKWATCH_CACHE:-$ROOT/.cache}
KAFKA_HOME=$CACHE/kafka/$VERSION
LIBS=$KAFKA_HOME/libs
STAMP=$KAFKA_HOME/fetched.sha256
CDS_ARCHIVE=$KAFKA_HOME/classes.jsa

# Small heap; serial GC and the C1 compiler only: a test broker on a 2-core machine
# starts faster and competes less with the tests than with G1 and C2.
HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms64m -Xmx512m}
JVM_OPTS=${KAFKA_JVM_OPTS:--XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true}

# Class-data sharing: the JVM maps the classes a broker loaded last time from an archive
# instead of parsing ~3,000 classes from jars, which halves start time here (about 3 s to
# 1.5 s, and 40% less CPU). The first broker of a cache runs without it and writes the
# archive when it exits (stop takes ~3 s longer once); the archive is moved into place
# only when complete. A JVM that cannot use it (another Java build) silently ignores it.
cds_opts() {
    local dir=$1
    [[ ${KAFKA_CDS:-1} == 1 ]] || return 0
    if [[ -f $CDS_ARCHIVE ]]; then
        echo "-XX:SharedArchiveFile=$CDS_ARCHIVE"
    else
        echo "-XX:ArchiveClassesAtExit=$dir/classes.jsa.partial"
    fi
}

# After the broker of $1 exited: publish the archive it wrote, if any.
publish_cds_archive() {
    local partial=$1/classes.jsa.partial
    [[ -f $partial ]] || return 0
    if [[ -f $CDS_ARCHIVE ]]; then rm -f "$partial"; else mv -f "$partial" "$CDS_ARCHIVE"; fi
}

say() { echo "kafka.sh: $*" >&2; }
die() {
    say "$*"
    exit 1
}

# The fingerprint of what fetch produced: the pom and the version it resolved.
fetch_fingerprint() { { cat "$POM"; echo "$VERSION"; } | sha256sum | cut -d' ' -f1; }

fetched() { [[ -f $STAMP && $(cat "$STAMP") == "$(fetch_fingerprint)" ]]; }

cmd_fetch() {
    fetched && return 0
    command -v mvn >/dev/null || die "mvn not found (Maven 3.8+ is needed to fetch Kafka)"
    mkdir -p "$KAFKA_HOME"
    # Two test runs may fetch at once: one fetches, the other waits and finds it done.
    exec 9>"$KAFKA_HOME/fetch.lock"
    flock 9
    if fetched; then
        exec 9>&-
        return 0
    fi
    local tmp=$KAFKA_HOME/libs.partial
    rm -rf "$tmp"
    mkdir -p "$tmp"
    say "fetching Apache Kafka $VERSION from Maven Central into $LIBS"
    # Maven's output goes to a file and is shown only when it fails.
    if ! mvn -q -B -Dstyle.color=never -f "$POM" -Dmaven.repo.local="$CACHE/m2" \
        -Dkafka.version="$VERSION" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$tmp" >"$KAFKA_HOME/fetch.log" 2>&1; then
        rm -rf "$tmp"
        sed -e 's/\x1b\[[0-9;]*m//g' "$KAFKA_HOME/fetch.log" | grep -v '^$' >&2 || true
        die "mvn could not fetch Kafka $VERSION (the log is in $KAFKA_HOME/fetch.log)"
    fi
    rm -rf "$LIBS" "$CDS_ARCHIVE"
    mv "$tmp" "$LIBS"
    fetch_fingerprint >"$STAMP"
    exec 9>&-
}

# A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it).
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_is_free() {
    python3 -c 'import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))' \
        "$1" 2>/dev/null
}

# The pid in D/kafka.pid when that process is alive and is this directory's broker
# (a pid file left by a crash may name a recycled pid).
running_pid() {
    local dir=$1 pid
    [[ -f $dir/kafka.pid ]] || return 1
    pid=$(cat "$dir/kafka.pid")
    [[ -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir/server.properties" || return 1
    echo "$pid"
}

# Kafka's cluster ids are 16 random bytes in unpadded URL-safe base64 (22 characters).
# One in 64 starts with '-': pass it as --cluster-id=ID, never as a separate argument
# (the tool's parser then takes it for an option and the broker does not start).
random_cluster_id() { head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n'; }

write_config() {
    local dir=$1 port=$2 controller_port=$3
    sed -e "s|@PORT@|$port|g" -e "s|@CONTROLLER_PORT@|$controller_port|g" \
        -e "s|@DATA_DIR@|$dir/data|g" "$TEMPLATE" >"$dir/server.properties"
    echo "$port $controller_port" >"$dir/ports"
}

format_storage() {
    local dir=$1 cluster_id
    cluster_id=$(random_cluster_id)
    # shellcheck disable=SC2086
    local cds=""
    [[ ${KAFKA_CDS:-1} == 1 && -f $CDS_ARCHIVE ]] && cds=-XX:SharedArchiveFile=$CDS_ARCHIVE
    java $HEAP_OPTS $JVM_OPTS $cds -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
        -Dkafka.logs.dir="$dir/logs" -cp "$LIBS/*" kafka.tools.StorageTool \
        format --cluster-id="$cluster_id" -c "$dir/server.properties" >"$dir/logs/format.out" 2>&1 ||
        die "formatting storage failed: $(tail -n 20 "$dir/logs/format.out")"
}

# Stop process $2 (the broker) once process $1 has exited. Detached from the caller's
# stdout so `$(kafka.sh start)` returns at once.
start_watchdog() {
    local watched=$1 broker=$2 dir=$3
    (
        while kill -0 "$watched" 2>/dev/null && kill -0 "$broker" 2>/dev/null; do sleep 1; done
        if kill -0 "$broker" 2>/dev/null; then
            echo "watched pid $watched exited; stopping the broker" >>"$dir/logs/kafka.out"
            "$ROOT/scripts/kafka.sh" stop --dir "$dir" >/dev/null 2>&1 || true
        fi
    ) </dev/null >/dev/null 2>&1 &
    disown
}

wait_until_ready() {
    local dir=$1 port=$2 pid=$3 timeout=${KAFKA_START_TIMEOUT:-90}
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            say "the broker exited during start; last lines of $dir/logs:"
            tail -n 30 "$dir/logs/kafka.out" "$dir/logs/server.log" >&2 2>/dev/null || true
            return 1
        fi
        # The socket server opens its listeners only after the broker has caught up
        # with the metadata log; the log line says the startup sequence finished.
        if grep -q "Kafka Server started" "$dir/logs/server.log" 2>/dev/null &&
            (: </dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    say "the broker did not become ready within ${timeout}s; see $dir/logs/server.log"
    return 1
}

cmd_start() {
    local dir=$1 port=$2 watch_pid=$3 pid controller_port
    if pid=$(running_pid "$dir"); then
        say "already running (pid $pid)"
        echo "127.0.0.1:$(cut -d' ' -f1 "$dir/ports")"
        return 0
    fi
    cmd_fetch
    mkdir -p "$dir/logs"
    # Reuse the last ports of this directory when they are free, so a restarted
    # development broker keeps its address.
    local last_port="" last_controller=""
    [[ -f $dir/ports ]] && read -r last_port last_controller <"$dir/ports"
    if [[ -z $port ]]; then
        if [[ -n $last_port ]] && port_is_free "$last_port"; then port=$last_port; else port=$(free_port); fi
    fi
    if [[ -n $last_controller && $last_controller != "$port" ]] && port_is_free "$last_controller"; then
        controller_port=$last_controller
    else
        controller_port=$(free_port)
        while [[ $controller_port == "$port" ]]; do controller_port=$(free_port); done
    fi
    port_is_free "$port" || die "port $port on 127.0.0.1 is in use"
    write_config "$dir" "$port" "$controller_port"
    [[ -f $dir/data/meta.properties ]] || format_storage "$dir"

    # shellcheck disable=SC2086
    nohup java $HEAP_OPTS $JVM_OPTS $(cds_opts "$dir") -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
        -Dkafka.logs.dir="$dir/logs" -cp "$LIBS/*" kafka.Kafka "$dir/server.properties" \
        </dev/null >>"$dir/logs/kafka.out" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/kafka.pid"
    if ! wait_until_ready "$dir" "$port" "$pid"; then
        cmd_stop "$dir" >/dev/null 2>&1 || true
        exit 1
    fi
    [[ -n $watch_pid ]] && start_watchdog "$watch_pid" "$pid" "$dir"
    echo "127.0.0.1:$port" >"$dir/bootstrap"
    echo "127.0.0.1:$port"
}

cmd_stop() {
    local dir=$1 pid
    if ! pid=$(running_pid "$dir"); then
        rm -f "$dir/kafka.pid"
        say "not running"
        return 0
    fi
    kill -TERM "$pid"
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        say "pid $pid did not stop within 30s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/kafka.pid"
    publish_cds_archive "$dir"
    say "stopped (pid $pid)"
}

cmd_status() {
    local dir=$1 pid
    if pid=$(running_pid "$dir"); then
        echo "running: pid $pid, bootstrap 127.0.0.1:$(cut -d' ' -f1 "$dir/ports"), dir $dir"
        return 0
    fi
    echo "not running (dir $dir)"
    return 3
}

cmd_logs() {
    local dir=$1 follow=$2 log=$1/logs/server.log
    [[ -f $log ]] || die "no log at $log"
    if [[ -n $follow ]]; then tail -n 50 -F "$log"; else tail -n 200 "$log"; fi
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

cmd_tool() {
    fetched || cmd_fetch
    local class=$1
    shift
    exec java -Dlog4j2.configurationFile="$ROOT/kafka/tools-log4j2.properties" -cp "$LIBS/*" "$class" "$@"
}

main() {
    [[ $# -ge 1 ]] || usage
    local command=$1
    shift
    if [[ $command == tool ]]; then
        [[ $# -ge 1 ]] || usage
        cmd_tool "$@"
    fi
    local dir=$ROOT/var/kafka port="" watch_pid="" follow=""
    while [[ $# -gt 0 ]]; do
        case $1 in
        --dir) dir=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --watch-pid) watch_pid=$2; shift 2 ;;
        -f | --follow) follow=1; shift ;;
        *) usage ;;
        esac
    done
    dir=$(realpath -m "$dir")
    case $command in
    fetch) cmd_fetch ;;
    start) cmd_start "$dir" "$port" "$watch_pid" ;;
    stop) cmd_stop "$dir" ;;
    status) cmd_status "$dir" ;;
    logs) cmd_logs "$dir" "$follow" ;;
    *) usage ;;
    esac
}

main "$@"
