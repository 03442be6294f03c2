#!/usr/bin/env bash
# Opt-in end-to-end check of the compose deployment on a Docker host without registry access (`make compose-e2e`,
# not in CI). Needs a running Docker daemon (DOCKER_HOST is honoured), docker compose (v2 plugin, or v1
# docker-compose), debootstrap and a Debian mirror, Debian's prometheus binary, and a package index for the image's
# pip installs (PyPI, or PIP_INDEX_URL). torch comes from the local wheel E2E_TORCH_WHEEL through a throw-away
# index on the Docker bridge (deploy.torch_index_url).
#
#   1. base image from debootstrap (bookworm: Python 3.11, with libpython3.11: the Python-backend stub links it),
#      imported with `docker import`: no registry;
#      a Prometheus image from the host's /usr/bin/prometheus on it (Grafana has no offline image: not started)
#   2. `trtllm-pipeline deploy` of the tiny cpu config with deploy.image = that base, deploy.torch_index_url = the index
#   3. compose up of triton, openai and prometheus (an override file points prometheus at the local image)
#   4. answers: `trtllm-pipeline infer` over HTTP and gRPC, the OpenAI service (whole and streamed); hardening read
#      from inside the container (uid, no capabilities, read-only root); Prometheus scraped Triton and the OpenAI
#      front end, loaded the 14 rules (all healthy) and recorded TTFT / ITL from the front end's histograms
#   5. unless E2E_COMPARE=0: the same gRPC load (`bench load --url`) against the container and against
#      `trtllm-pipeline serve` on the host (same artifacts), interleaved A B A B; then a clean stop
# Prints build time, image size, time from `up` to healthy and the latency figures (record one run in BENCHMARKS.md).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLI="${CLI:-$ROOT/.venv/bin/trtllm-pipeline}"
WORK="${E2E_WORK:-$(mktemp -d /tmp/compose-e2e.XXXXXX)}"
mkdir -p "$WORK"
BASE_IMAGE="trtllm-pipeline-e2e/python-base:bookworm"
# libpython3.11: Debian's python3 is linked statically, the stub needs the shared library (pipeline/deploy/image_setup.py)
BASE_PACKAGES="python3,python3-venv,python-is-python3,libpython3.11,ca-certificates,wget"
ROOTFS_IMAGE="$BASE_IMAGE-rootfs-$(printf %s "$BASE_PACKAGES" | sha256sum | cut -c1-8)"
PROMETHEUS_IMAGE="trtllm-pipeline-e2e/prometheus:local"
TORCH_WHEEL="${E2E_TORCH_WHEEL:-$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -1)}"
INDEX_PORT="${E2E_INDEX_PORT:-18765}"
COMPARE="${E2E_COMPARE:-1}"
HOST_PORTS=(--set deploy.http_port=28000 --set deploy.grpc_port=28001 --set deploy.metrics_port=28002)
if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose); else COMPOSE=(docker-compose); fi
log() { printf '[compose-e2e] %s\n' "$*"; }
now() { date +%s; }

cleanup() {
  if [ -n "${DEPLOY:-}" ] && [ -f "$DEPLOY/docker-compose.yml" ]; then
    (cd "$DEPLOY" && "${COMPOSE[@]}" -f docker-compose.yml -f "$WORK/override.yml" --profile cpu down -v --timeout 100 >/dev/null 2>&1) || true
  fi
  if [ -n "${INDEX_PID:-}" ]; then kill "$INDEX_PID" 2>/dev/null || true; fi
  if [ -n "${HOST_SERVE:-}" ]; then "$CLI" --artifacts "$WORK/artifacts" stop "$ROOT/build_configs/tiny-cpu.yaml" "${HOST_PORTS[@]}" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

# 1. images without a registry
BRIDGE="$(docker network inspect bridge --format '{{(index .IPAM.Config 0).Gateway}}')"
if ! docker image inspect "$ROOTFS_IMAGE" >/dev/null 2>&1; then  # cached across runs (keyed by the package list)
  log "debootstrap bookworm into $WORK/rootfs"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" \
    bookworm "$WORK/rootfs" "${E2E_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$WORK/debootstrap.log"
  tar -C "$WORK/rootfs" -c . | docker import --change 'CMD ["/bin/bash"]' - "$ROOTFS_IMAGE" >/dev/null
fi
{
  # the host's trust store, for pip behind a TLS-intercepting proxy (pip reads PIP_CERT, not the system store)
  mkdir -p "$WORK/base-image"
  cp "${E2E_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" "$WORK/base-image/ca-certificates.crt"
  # the plain-HTTP torch index below (on the bridge address) and PyPI (or E2E_PIP_INDEX) for torch's dependencies
  printf 'FROM %s\nCOPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\nENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_TRUSTED_HOST=%s PIP_EXTRA_INDEX_URL=%s\n' \
    "$ROOTFS_IMAGE" "$BRIDGE" "${E2E_PIP_INDEX:-https://pypi.org/simple}" >"$WORK/base-image/Dockerfile"
  docker build -q -t "$BASE_IMAGE" "$WORK/base-image" >/dev/null
}
mkdir -p "$WORK/prometheus-image"
cp /usr/bin/prometheus "$WORK/prometheus-image/prometheus"
cat >"$WORK/prometheus-image/Dockerfile" <<EOF
FROM $BASE_IMAGE
COPY prometheus /bin/prometheus
RUN mkdir -p /prometheus /etc/prometheus && chown 65534:65534 /prometheus
USER 65534:65534
ENTRYPOINT ["/bin/prometheus"]
EOF
docker build -q -t "$PROMETHEUS_IMAGE" "$WORK/prometheus-image" >/dev/null

# a PEP 503 index holding the local torch wheel, on the bridge address the image build reaches
mkdir -p "$WORK/index/torch"
ln -sf "$TORCH_WHEEL" "$WORK/index/torch/$(basename "$TORCH_WHEEL")"
printf '<a href="%s">%s</a>\n' "$(basename "$TORCH_WHEEL" | sed 's/+/%2B/')" "$(basename "$TORCH_WHEEL")" >"$WORK/index/torch/index.html"
python3 -m http.server "$INDEX_PORT" --bind "$BRIDGE" --directory "$WORK/index" >"$WORK/index.log" 2>&1 &
INDEX_PID=$!

# 2. the deployment
DEPLOY="$WORK/deploy"
"$CLI" --artifacts "$WORK/artifacts" deploy "$ROOT/build_configs/tiny-cpu.yaml" --out "$DEPLOY" \
  --set "deploy.image=$BASE_IMAGE" --set "deploy.torch_index_url=http://$BRIDGE:$INDEX_PORT/" \
  --set deploy.http_port=18000 --set deploy.grpc_port=18001 --set deploy.metrics_port=18002 \
  --set deploy.openai_port=19000 --set deploy.prometheus_port=19090 --set deploy.grafana_port=13000
cat >"$WORK/override.yml" <<EOF
services:
  prometheus:
    image: $PROMETHEUS_IMAGE
    pull_policy: never
EOF

# 3. build and start
cd "$DEPLOY"
started=$(now)
"${COMPOSE[@]}" -f docker-compose.yml -f "$WORK/override.yml" --profile cpu build triton >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
built=$(now)
"${COMPOSE[@]}" -f docker-compose.yml -f "$WORK/override.yml" --profile cpu up -d triton openai prometheus
container() { "${COMPOSE[@]}" -f docker-compose.yml -f "$WORK/override.yml" --profile cpu ps -q "$1"; }
for _ in $(seq 1 120); do
  [ "$(docker inspect --format '{{.State.Health.Status}}' "$(container openai)")" = healthy ] && break
  sleep 5
done
healthy=$(now)
[ "$(docker inspect --format '{{.State.Health.Status}}' "$(container openai)")" = healthy ] || { docker logs "$(container triton)" | tail -30; exit 1; }

# 4. answers, hardening, metrics
# the front end's key: the first of TRTLLM_PIPELINE_API_KEYS in .env (NAME:KEY, comma-separated)
API_KEY=$(sed -n 's/^TRTLLM_PIPELINE_API_KEYS=//p' .env | cut -d, -f1 | sed 's/^[^:]*://')
[ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:19000/v1/models)" = 401 ] || { log "the OpenAI front end answered without a key"; exit 1; }
"$CLI" infer --protocol http --url 127.0.0.1:18000 --max-tokens 16 'def __init__(self'
"$CLI" infer --protocol grpc --url 127.0.0.1:18001 --max-tokens 16 'import'
curl -fsS http://127.0.0.1:19000/v1/completions -H 'content-type: application/json' -H "Authorization: Bearer $API_KEY" \
  -d '{"model": "tiny-cpu", "prompt": "class Parser", "max_tokens": 16}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
triton=$(container triton)
[ "$(docker exec "$triton" id -u)" = 1000 ] || { log "triton runs as uid $(docker exec "$triton" id -u)"; exit 1; }
# the server's own process tree (PID 1 is compose's init): uid 1000, no effective capabilities
docker exec "$triton" grep -q '^Uid:[[:space:]]*1000[[:space:]]' /proc/1/status || { log "triton's PID 1 is not uid 1000"; exit 1; }
for status in /proc/self/status /proc/1/status; do
  docker exec "$triton" grep -q '^CapEff:[[:space:]]*0000000000000000$' "$status" || { log "triton has capabilities ($status)"; exit 1; }
done
if docker exec "$triton" touch /opt/probe 2>/dev/null; then log "triton's root file system is writable"; exit 1; fi
if docker logs "$triton" 2>&1 | grep -q 'Failed to give execute permission'; then log "Triton tried to chmod its stub"; exit 1; fi
query() { curl -fsS "http://127.0.0.1:19090/api/v1/query" --data-urlencode "query=$1"; }
wait_for() {  # a PromQL query until its answer matches a pattern (rules evaluate every 15 s, over 5m rates of 5 s scrapes)
  for _ in $(seq 1 45); do grep -q "$2" <<<"$(query "$1")" && return 0; sleep 2; done
  log "Prometheus: no '$2' in the answer to $1: $(query "$1")"; exit 1
}
wait_for 'nv_inference_request_success' '"model":"ensemble"'
# streamed requests once Prometheus scrapes the front end: a rate needs the counts to rise between two of its scrapes
wait_for 'up{job="openai"}' '"value":\[[0-9.]*,"1"\]'
sleep 6
for prompt in 'def main(' 'import os' 'class Config'; do
  curl -fsSN http://127.0.0.1:19000/v1/completions -H 'content-type: application/json' -H "Authorization: Bearer $API_KEY" \
    -d "{\"model\": \"tiny-cpu\", \"prompt\": \"$prompt\", \"max_tokens\": 16, \"stream\": true}" | grep -c '^data: ' | sed 's/^/streamed events: /'
done
curl -fsS http://127.0.0.1:19000/metrics | grep -E '^trtllm_pipeline_openai_(time_to_first_token_seconds|inter_token_latency_seconds)_count' \
  | tee "$WORK/front-end-metrics.txt"
grep -q '^trtllm_pipeline_openai_time_to_first_token_seconds_count [1-9]' "$WORK/front-end-metrics.txt" || { log "the OpenAI front end counted no first token"; exit 1; }
number='"build":"tiny-cpu"},"value":\[[0-9.]*,"[0-9]'  # a value, not NaN (no rise in the window)
wait_for 'trtllm_pipeline:time_to_first_token_ms:p50_rate5m' "$number"
wait_for 'trtllm_pipeline:inter_token_latency_ms:p50_rate5m' "$number"
recorded() { query "$1" | python3 -c 'import json,sys; print(round(float(json.load(sys.stdin)["data"]["result"][0]["value"][1]), 2))'; }
log "recorded by Prometheus' rules: TTFT p50 $(recorded 'trtllm_pipeline:time_to_first_token_ms:p50_rate5m') ms, ITL p50 $(recorded 'trtllm_pipeline:inter_token_latency_ms:p50_rate5m') ms"
curl -fsS http://127.0.0.1:19090/api/v1/rules | python3 -c '
import json, sys
rules = [rule for group in json.load(sys.stdin)["data"]["groups"] for rule in group["rules"]]
bad = [rule["name"] for rule in rules if rule["health"] != "ok"]
print(f"Prometheus loaded {len(rules)} rules; unhealthy: {bad or None}")
sys.exit(1 if bad or len(rules) != 14 else 0)'

# 5. latency: the same load against the container and against `serve` on the host, interleaved
if [ "$COMPARE" = 1 ]; then
  HOST_SERVE=1
  "$CLI" --artifacts "$WORK/artifacts" serve "$ROOT/build_configs/tiny-cpu.yaml" "${HOST_PORTS[@]}" --detach >"$WORK/host-serve.log" 2>&1 \
    || { tail -20 "$WORK/host-serve.log"; exit 1; }
  bench() {  # $1: label, $2: Triton gRPC host:port
    "$CLI" --artifacts "$WORK/artifacts" bench load "$ROOT/build_configs/tiny-cpu.yaml" --url "$2" --endpoint grpc \
      --concurrency 1 --requests 24 --warmup 4 --input-tokens 32 --output-tokens 16 --out "$WORK/bench-$1" >"$WORK/bench-$1.log" 2>&1 || { tail -20 "$WORK/bench-$1.log"; exit 1; }
  }
  for round in 1 2; do bench "container-$round" 127.0.0.1:18001; bench "host-$round" 127.0.0.1:28001; done
  "$CLI" --artifacts "$WORK/artifacts" stop "$ROOT/build_configs/tiny-cpu.yaml" "${HOST_PORTS[@]}" >/dev/null
  HOST_SERVE=""
  python3 "$ROOT/scripts/compose_e2e_latency.py" "$WORK"/bench-container-*/bench-serve-load.json -- "$WORK"/bench-host-*/bench-serve-load.json | tee "$WORK/latency.md"
fi

image_bytes=$(docker image inspect "$(docker inspect --format '{{.Image}}' "$triton")" --format '{{.Size}}')
stop_started=$(now)
"${COMPOSE[@]}" -f docker-compose.yml -f "$WORK/override.yml" --profile cpu down -v --timeout 100
stopped=$(now)
DEPLOY=""
log "image build $((built - started)) s; image size $((image_bytes / 1000000)) MB; up to healthy (triton and openai) $((healthy - built)) s; stop $((stopped - stop_started)) s"
log "passed: HTTP, gRPC and OpenAI answered; uid 1000, no capabilities, read-only root; Prometheus scraped Triton and the OpenAI front end and recorded TTFT / ITL"
