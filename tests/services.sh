#!/usr/bin/env bash
# What the tests need from the machine: system packages, and PostgreSQL and Redis running.
set -euo pipefail

need=()
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v chromium >/dev/null || need+=(chromium)
command -v bwrap >/dev/null || need+=(bubblewrap)        # the sandbox of jobs on this machine
command -v pasta >/dev/null || need+=(passt)             # its way out (RINGMASTER_JOB_NETWORK=outbound)
command -v git >/dev/null || need+=(git)                  # projects from git: the portal's fetch, git daemon, http-backend
command -v sudo >/dev/null || need+=(sudo)                # an instance account that may `sudo -n` (tests/integration/test_instance_isolation.py)
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
# make test's parallel workers each run a portal of their own (web server, Celery worker and its
# followers) against this one server, and the race tests open fifty connections at once:
# PostgreSQL's default of 100 connections leaves too little room for them.
MIN_CONNECTIONS=300
for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -Atc 'SHOW max_connections')" -lt "$MIN_CONNECTIONS" ]; then
    echo "letting PostgreSQL take $MIN_CONNECTIONS connections (a restart)"
    psql -q -h 127.0.0.1 -U postgres -d postgres -c "ALTER SYSTEM SET max_connections = $MIN_CONNECTIONS"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main restart
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
