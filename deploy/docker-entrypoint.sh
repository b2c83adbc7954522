#!/bin/sh
# Entrypoint of the portal image (deploy/Dockerfile). One image, one process per container:
#
#   web                  uvicorn, ASGI: Django views over HTTP and Channels websockets
#   worker               the Celery worker (thread pool for tasks; followed jobs in its follow hub)
#   beat                 Celery beat: reconcile every 15 s, instance health every minute
#   migrate              apply the database migrations, then exit
#   wait-for-migrations  wait until the database has every migration (init container of
#                        worker and beat, so they never run against a half-migrated schema)
#   manage ARGS...       python manage.py ARGS... (createsuperuser, add_cluster, ...)
#   anything else        run as given
#
# web, worker and beat start exactly what deploy/Procfile starts for `make run` (same programs,
# same flags); tests/test_deploy.py checks that they stay in step. Extra arguments are appended.
set -eu

command=${1:-web}
[ "$#" -gt 0 ] && shift

case "$command" in
    web)
        exec uvicorn portal.asgi:application --host "${RINGMASTER_HOST:-0.0.0.0}" --port "${RINGMASTER_PORT:-8000}" --ws portal.websocket:WebSocketProtocol --no-access-log --timeout-graceful-shutdown 10 "$@"
        ;;
    worker)
        exec celery -A portal worker --pool threads --concurrency "${RINGMASTER_WORKER_CONCURRENCY:-16}" --loglevel INFO -n "worker@%h" "$@"
        ;;
    beat)
        exec celery -A portal beat --loglevel INFO --schedule "${RINGMASTER_DATA_DIR:-var}/celerybeat-schedule" "$@"
        ;;
    migrate)
        exec python manage.py migrate --noinput "$@"
        ;;
    wait-for-migrations)
        until python manage.py migrate --check >/dev/null 2>&1; do
            echo "waiting for the database to be migrated (the web pod's migrate init container)"
            sleep 5
        done
        echo "database is migrated"
        ;;
    manage)
        exec python manage.py "$@"
        ;;
    *)
        exec "$command" "$@"
        ;;
esac
