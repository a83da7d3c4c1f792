#!/usr/bin/env bash
# The two-host layout of docs/deployment.md on one machine: nginx on :4100 in front of two
# coordinators (:4101, :4102), two runners (:4201, :4202), PostgreSQL and S3 from common.env.
#
#   cd configs/cluster && ./run.sh          # edit common.env and the *.env files first
#
# Each process reads common.env, then its own env file; logs go to ./data/<name>.log. Ctrl-C (or
# SIGTERM) stops the runners first (they drain their turns and deregister, which pauses their
# sessions), then the coordinators and nginx. ASHD_BIN (default: `ashd` on PATH) and NGINX_BIN (default:
# `nginx`) name the programs.
set -euo pipefail
cd "$(dirname "$0")"
ASHD_BIN=${ASHD_BIN:-ashd}
NGINX_BIN=${NGINX_BIN:-nginx}
mkdir -p data/nginx
pids=()

start() {  # start NAME COMMAND...: in the background, with common.env and NAME.env
    local name=$1; shift
    ( set -a; . ./common.env; . "./$name.env"; set +a; exec "$@" ) >>"data/$name.log" 2>&1 &
    pids+=("$name:$!")
    echo "started $name (pid $!), log data/$name.log"
}

wait_http() {  # wait_http URL: until it answers (60 s)
    for _ in $(seq 600); do
        curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "no answer from $1; see data/*.log" >&2
    return 1
}

stop_all() {
    trap - INT TERM EXIT
    local entry i
    for (( i=${#pids[@]}-1; i>=0; i-- )); do   # started last, stopped first: runners, then the rest
        entry=${pids[$i]}
        kill -TERM "${entry#*:}" 2>/dev/null || true
        wait "${entry#*:}" 2>/dev/null || true
        echo "stopped ${entry%%:*}"
    done
}
trap stop_all INT TERM EXIT

cat > data/nginx/nginx.conf <<CONF
daemon off;
worker_processes 1;
pid $PWD/data/nginx/nginx.pid;
error_log $PWD/data/nginx/error.log;
events { worker_connections 1024; }
http {
    access_log $PWD/data/nginx/access.log;
    client_body_temp_path $PWD/data/nginx/body;
    proxy_temp_path $PWD/data/nginx/proxy;
    fastcgi_temp_path $PWD/data/nginx/fastcgi;
    uwsgi_temp_path $PWD/data/nginx/uwsgi;
    scgi_temp_path $PWD/data/nginx/scgi;
    include $PWD/nginx.conf;
}
CONF
"$NGINX_BIN" -t -p "$PWD/data/nginx" -e "$PWD/data/nginx/error.log" -c "$PWD/data/nginx/nginx.conf"
"$NGINX_BIN" -p "$PWD/data/nginx" -e "$PWD/data/nginx/error.log" -c "$PWD/data/nginx/nginx.conf" &
pids+=("nginx:$!")

# The first coordinator applies the database migrations; the second starts once it answers.
start coordinator-1 "$ASHD_BIN" serve
wait_http http://127.0.0.1:4101/health
start coordinator-2 "$ASHD_BIN" serve
wait_http http://127.0.0.1:4102/health
start runner-1 "$ASHD_BIN" runner
start runner-2 "$ASHD_BIN" runner
wait_http http://127.0.0.1:4100/health
echo "cluster up: http://127.0.0.1:4100 (Ctrl-C stops it)"
wait
