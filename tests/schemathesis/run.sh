#!/usr/bin/env bash
# Schemathesis against /api/v1/schema/ on the live production-mode stack: daphne + a separate
# Celery worker, PostgreSQL + Redis, a seeded tenant and its API key. Fails on any finding:
# a 5xx, a response (errors included) that the OpenAPI schema does not describe, an undocumented
# status code or content type.
#
# Everything it writes is throwaway: a fresh database `xagent_fuzz_<pid>` on the PostgreSQL server
# of DATABASE_URL (default postgres://postgres@127.0.0.1:5432), Redis db FUZZ_REDIS_DB (default 12)
# on the server of REDIS_URL (default redis://127.0.0.1:6379), a temporary workspaces directory.
# Knobs: FUZZ_MAX_EXAMPLES (20), FUZZ_PHASES (examples,coverage,fuzzing), FUZZ_SEED, FUZZ_ARGS,
# FUZZ_REPORT_DIR (a JUnit report there).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
here=tests/schemathesis

log() { printf '\n== fuzz: %s\n' "$*"; }

urls="$(FUZZ_PID=$$ "$PY" - <<'PY'
import os
from urllib.parse import urlsplit, urlunsplit

db = urlsplit(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres")
if db.scheme not in ("postgres", "postgresql", "pgsql"):
    db = urlsplit("postgres://postgres@127.0.0.1:5432/postgres")
redis = urlsplit(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
name = f"xagent_fuzz_{os.environ['FUZZ_PID']}"
print(urlunsplit(db._replace(path="/postgres")))
print(urlunsplit(db._replace(path=f"/{name}")))
print(urlunsplit(redis._replace(path=f"/{os.environ.get('FUZZ_REDIS_DB', '12')}")))
print(name)
PY
)"
{ read -r admin_url; read -r db_url; read -r redis_url; read -r db_name; } <<<"$urls"

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  psql "$admin_url" -q -c "DROP DATABASE IF EXISTS ${db_name}" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

psql "$admin_url" -q -c "CREATE DATABASE ${db_name}"
redis-cli -u "$redis_url" flushdb >/dev/null

export DATABASE_URL="$db_url" REDIS_URL="$redis_url"
export SECRET_KEY="${SECRET_KEY:-fuzz-$(head -c 48 /dev/urandom | base64 | tr -d '/+=\n')}"
export XAGENT_SECRETS_KEY="${XAGENT_SECRETS_KEY:-$(head -c 32 /dev/urandom | base64 | tr '+/' '-_')}"
export ALLOWED_HOSTS="127.0.0.1,localhost" XAGENT_HTTPS=false DEBUG=false
export XAGENT_WORKSPACES_DIR="$work/workspaces"
export XAGENT_THROTTLE_RATE="100000/min" XAGENT_THROTTLE_USER_RATE="100000/min"  # the fuzzer is one key sending far more than a person would
export PYTHONUNBUFFERED=1
unset OPENAI_API_KEY OPENAI_BASE_URL XAGENT_MODEL  # the scripted demo model: no outside calls

log "database ${db_name}, redis ${redis_url}"
"$PY" manage.py migrate --noinput -v0
"$PY" manage.py seed_demo >"$work/seed.txt"
key="$("$PY" manage.py create_api_key --tenant demo --user demo --name fuzz)"

port="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
base="http://127.0.0.1:${port}"
.venv/bin/daphne -b 127.0.0.1 -p "$port" config.asgi:application >"$work/web.log" 2>&1 &
pids+=($!)
.venv/bin/celery -A config worker --pool threads --concurrency 4 --loglevel INFO \
  --hostname "fuzz-$$@%h" --without-mingle --without-gossip >"$work/worker.log" 2>&1 &
pids+=($!)
ok=""
for _ in $(seq 1 120); do
  if curl -fsS "${base}/healthz?worker=1" >/dev/null 2>&1; then ok=1; break; fi
  sleep 0.5
done
if [ -z "$ok" ]; then
  echo "the stack never became healthy" >&2
  tail -n 50 "$work/web.log" "$work/worker.log" >&2
  exit 1
fi

# Real ids for path parameters, so operations on a Session or an approval reach their handlers
# and not only the 404 path: the demo Session (its run parks on an approval) and a fresh one.
auth="Authorization: Bearer ${key}"
session_id="$(curl -fsS -H "$auth" -H 'Content-Type: application/json' -d '{"title": "fuzz"}' \
  "${base}/api/v1/sessions/" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["id"])')"
approval_id=0
for _ in $(seq 1 90); do
  approval_id="$(curl -fsS -H "$auth" "${base}/api/v1/approvals/?status=pending" |
    "$PY" -c 'import json,sys; r=json.load(sys.stdin)["results"]; print(r[0]["id"] if r else 0)')"
  [ "$approval_id" != 0 ] && break
  sleep 0.5
done
[ "$approval_id" != 0 ] || echo "note: the demo run parked no approval yet; approval ids stay random"
# A key of its own for the api-keys/{id} operations: DELETE with a random id could otherwise
# revoke the fuzzer's own key and leave the rest of the run with 401s.
spare_key_id="$(curl -fsS -H "$auth" -H 'Content-Type: application/json' -d '{"name": "fuzz-spare"}' \
  "${base}/api/v1/api-keys/" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["id"])')"
export FUZZ_SESSION_ID="$session_id" FUZZ_APPROVAL_ID="$approval_id" FUZZ_SPARE_KEY_ID="$spare_key_id"

log "schemathesis against ${base}/api/v1/schema/ (session ${session_id}, approval ${approval_id})"
started=$(date +%s)
set +e
# shellcheck disable=SC2086
.venv/bin/schemathesis --config-file "$here/schemathesis.toml" run "${base}/api/v1/schema/" \
  --url "$base" \
  -H "$auth" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --phases "${FUZZ_PHASES:-examples,coverage,fuzzing}" \
  --max-examples "${FUZZ_MAX_EXAMPLES:-20}" \
  ${FUZZ_SEED:+--seed "$FUZZ_SEED"} \
  --generation-database none \
  --request-timeout 40 \
  --workers 2 \
  --no-color \
  --continue-on-failure \
  ${FUZZ_REPORT_DIR:+--report junit --report-junit-path "$FUZZ_REPORT_DIR/schemathesis-junit.xml"} \
  ${FUZZ_ARGS:-}
status=$?
set -e
echo "schemathesis took $(($(date +%s) - started)) s, exit ${status}"
if grep -q "Traceback" "$work/web.log"; then
  echo "--- tracebacks in the web log:" >&2
  grep -B2 -A25 "Traceback" "$work/web.log" | tail -n 120 >&2
fi
exit "$status"
