#!/usr/bin/env bash
# What the tests need from the machine: system packages, and PostgreSQL and Redis running.
set -euo pipefail

need=()
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v chromium >/dev/null || need+=(chromium)
command -v bwrap >/dev/null || need+=(bubblewrap)        # the sandbox of jobs on this machine
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi

for _ in $(seq 1 60); do
    pg_isready -q -h 127.0.0.1 -p 5432 && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && exit 0
    sleep 0.5
done
echo "PostgreSQL or Redis did not come up" >&2
exit 1
