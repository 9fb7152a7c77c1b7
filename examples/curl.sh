#!/usr/bin/env bash
# Take a lock with curl, use its fencing token on a write, release it.
#   PODLOCK_ADDR  the sidecar (default http://127.0.0.1:4040)
#   STORE_URL     a fenced resource, e.g. examples/fenced_store.py (default http://127.0.0.1:8000)
set -euo pipefail
addr=${PODLOCK_ADDR:-http://127.0.0.1:4040}
store=${STORE_URL:-http://127.0.0.1:8000}

# The injector sets PODLOCK_CONTAINER to this container's name: passed along, the hold ends when
# this container restarts, and not when another container of the pod does.
container=${PODLOCK_CONTAINER:+", \"container\": \"$PODLOCK_CONTAINER\""}
# Wait up to 30 s in the FIFO queue; -f makes curl fail on 409 lock_held and friends.
grant=$(curl -sf -XPOST "$addr/v1/locks/report/acquire" -d "{\"waitSeconds\": 30, \"holderId\": \"curl-example\"$container}")
token=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["fencingToken"])' <<<"$grant")
echo "acquired report with fencing token $token"

# Every write carries the token; the resource refuses tokens older than the newest it has seen.
curl -sf -XPOST "$store/increment?token=$token&writer=curl-example" >/dev/null
echo "wrote with token $token"

curl -sf -XPOST "$addr/v1/locks/report/release" -d '{"holderId": "curl-example"}' >/dev/null
echo "released"
