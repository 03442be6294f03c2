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
#   4. answers: `trtllm-pipeline infer` over HTTP and gRPC, the OpenAI service; hardening read from inside the
#      container (uid, no capabilities, read-only root); Prometheus scraped Triton; then a clean stop
# Prints build time and time to healthy (record one run in BENCHMARKS.md).
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
if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose); else COMPOSE=(docker-compose); fi
log() { printf '[compose-e2e] %s\n' "$*"; }
now() { date +%s; }

cleanup() {
  if [ -n "${DEPLOY:-}" ] && [ -f "$DEPLOY/docker-compose.yml" ]; then
    (cd "$DEPLOY" && "${COMPOSE[@]}" -f docker-compose.yml -f "$WORK/override.yml" --profile cpu down -v --timeout 100 >/dev/null 2>&1) || true
  fi
  if [ -n "${INDEX_PID:-}" ]; then kill "$INDEX_PID" 2>/dev/null || true; fi
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
"$CLI" infer --protocol http --url 127.0.0.1:18000 --max-tokens 16 'def __init__(self'
"$CLI" infer --protocol grpc --url 127.0.0.1:18001 --max-tokens 16 'import'
curl -fsS http://127.0.0.1:19000/v1/completions -H 'content-type: application/json' \
  -d '{"model": "tiny-cpu", "prompt": "class Parser", "max_tokens": 16}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
triton=$(container triton)
[ "$(docker exec "$triton" id -u)" = 1000 ] || { log "triton runs as uid $(docker exec "$triton" id -u)"; exit 1; }
docker exec "$triton" grep -q '^CapEff:[[:space:]]*0000000000000000$' /proc/self/status || { log "triton has capabilities"; exit 1; }
if docker exec "$triton" touch /opt/probe 2>/dev/null; then log "triton's root file system is writable"; exit 1; fi
for _ in $(seq 1 30); do
  curl -fsS 'http://127.0.0.1:19090/api/v1/query?query=nv_inference_request_success' | grep -q '"model":"ensemble"' && break
  sleep 2
done
curl -fsS 'http://127.0.0.1:19090/api/v1/query?query=nv_inference_request_success' | grep -q '"model":"ensemble"' || { log "Prometheus has no Triton series"; exit 1; }
stop_started=$(now)
"${COMPOSE[@]}" -f docker-compose.yml -f "$WORK/override.yml" --profile cpu down -v --timeout 100
stopped=$(now)
DEPLOY=""
log "image build $((built - started)) s; start to healthy (triton and openai) $((healthy - built)) s; stop $((stopped - stop_started)) s"
log "passed: HTTP, gRPC and OpenAI answered; uid 1000, no capabilities, read-only root; Prometheus scraped Triton"
