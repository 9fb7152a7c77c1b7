#!/bin/sh
# Take a lock with curl, use its fencing token on a write, release it. Needs only curl, sed and a
# POSIX sh (no bash, no JSON tool).
#   PODLOCK_ADDR    the sidecar (default http://127.0.0.1:4040)
#   STORE_URL       a fenced resource, e.g. examples/fenced_store.py (default http://127.0.0.1:8000)
#   LOCK            the lock (default report)
#   PODLOCK_HOLDER  the holder id (default curl-HOST-PID: unique to this run, so that two runs
#                   never act as one holder)
#   WAIT_SECONDS    how long to wait in the FIFO queue (default 30)
# Exit status: 0 done and released, 1 not acquired (or another error), 75 the store refused the
# token (a newer holder wrote). The lock is released on every exit once asked for, also on
# INT and TERM.
set -eu
addr=${PODLOCK_ADDR:-http://127.0.0.1:4040}
store=${STORE_URL:-http://127.0.0.1:8000}
lock=${LOCK:-report}
holder=${PODLOCK_HOLDER:-curl-$(uname -n)-$$}
wait=${WAIT_SECONDS:-30}

# Field $2 of the flat JSON object $1: a string's text (up to an escaped quote) or a number.
field() {
  printf '%s\n' "$1" | sed -n -e "s/.*\"$2\": *\"\([^\"]*\)\".*/\1/p" -e t \
    -e "s/.*\"$2\": *\(-\{0,1\}[0-9][0-9]*\).*/\1/p"
}

# Releases the hold (if any: a release of nothing answers 409, ignored). Run on every exit.
asked=
release() {
  [ -n "$asked" ] || return 0
  asked=
  if curl -sf -m 5 -XPOST "$addr/v1/locks/$lock/release" -d "{\"holderId\": \"$holder\"}" >/dev/null
  then
    echo "released"
  fi
}
trap release EXIT
trap 'exit 130' INT # the EXIT trap then releases
trap 'exit 143' TERM

# The injector sets PODLOCK_CONTAINER to this container's name: passed along, the hold ends when
# this container restarts, and not when another container of the pod does.
container=${PODLOCK_CONTAINER:+", \"container\": \"$PODLOCK_CONTAINER\""}
# The sidecar answers once the lock is granted: allow the whole wait, and 2 s more.
asked=1
answer=$(curl -s -m "$((wait + 2))" -w '\n%{http_code}' -XPOST "$addr/v1/locks/$lock/acquire" \
  -d "{\"waitSeconds\": $wait, \"holderId\": \"$holder\"$container}") || {
  echo "could not acquire $lock: no answer from the sidecar at $addr" >&2
  exit 1
}
status=$(printf '%s\n' "$answer" | sed -n '$p')
body=$(printf '%s\n' "$answer" | sed '$d')
if [ "$status" != 200 ]; then # 409 lock_held after the wait, 404 lock_not_found, ...
  echo "could not acquire $lock: $(field "$body" error): $(field "$body" message)" >&2
  exit 1
fi
token=$(field "$body" fencingToken)
echo "acquired $lock with fencing token $token as $holder"

# Every write carries the token; the resource refuses tokens older than the newest it has seen.
status=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -XPOST "$store/increment?token=$token&writer=curl-example") || true
case $status in
  2??) echo "wrote with token $token" ;;
  409) echo "lost $lock: the store refused token $token: a newer holder wrote" >&2; exit 75 ;;
  *) echo "the write failed (HTTP status ${status:-none})" >&2; exit 1 ;;
esac

release
