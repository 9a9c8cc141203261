#!/bin/sh
# One node of a Redis primary with replicas, watched by a Sentinel trio: `redis-ha.sh redis`
# starts a Redis server, `redis-ha.sh sentinel` a Sentinel. The Kubernetes overlay "sentinel"
# runs both in each pod of its StatefulSet; docker/compose.sentinel.yaml runs them as services.
#
# Whatever starts first asks the Sentinels where the primary is now, so a node that comes back
# after a failover rejoins as a replica of the promoted one (never as a second primary), and a
# Sentinel that comes back watches the primary the others watch. Only when no Sentinel answers
# (the group's very first start) is the first of HA_NODES the primary.
#
# Environment:
#   REDIS_PASSWORD    required: Redis's requirepass and masterauth, and the Sentinels' own
#   HA_NODES          the Redis nodes' host names, space-separated; the first is the first primary
#   HA_SENTINELS      the Sentinels' host names (default: HA_NODES, a Sentinel beside each node)
#   HA_SELF           this node's name, as the others reach it (default: hostname + HA_DOMAIN)
#   HA_MASTER_NAME    the name the Sentinels know the primary by (framefleet)
#   HA_QUORUM         Sentinels that must agree the primary is down (2)
#   HA_DOWN_AFTER_MS  silence before a Sentinel calls the primary down (5000)
#   HA_REDIS_PORT, HA_SENTINEL_PORT (6379, 26379); HA_BIND (unset: every interface)
#   HA_DATA           Redis's folder, append-only file included (/data)
#   HA_SENTINEL_DIR   a writable folder for the Sentinel's file, which it rewrites (/sentinel)
set -eu

: "${REDIS_PASSWORD:?REDIS_PASSWORD must be set}"
: "${HA_NODES:?HA_NODES must name the Redis nodes}"
name="${HA_MASTER_NAME:-framefleet}"
redis_port="${HA_REDIS_PORT:-6379}"
sentinel_port="${HA_SENTINEL_PORT:-26379}"
self="${HA_SELF:-$(hostname)${HA_DOMAIN:-}}"
# redis-cli reads the password from here (never on a command line).
export REDISCLI_AUTH="$REDIS_PASSWORD"

# The primary's name as the Sentinels give it, or the first node when none answers.
primary_now() {
  for sentinel in ${HA_SENTINELS:-$HA_NODES}; do
    found="$(timeout 3 redis-cli -h "$sentinel" -p "$sentinel_port" --raw \
      sentinel get-master-addr-by-name "$name" 2>/dev/null | head -n 1)" || found=""
    case "$found" in
      "" | *" "*) ;;  # no answer, or an error ("NOAUTH ...")
      *) echo "$found"; return ;;
    esac
  done
  # shellcheck disable=SC2086 # split on purpose: the first word is the first node
  set -- $HA_NODES
  echo "$1"
}

primary="$(primary_now)"
case "${1:-}" in
  redis)
    set -- redis-server --port "$redis_port" --dir "${HA_DATA:-/data}" --appendonly yes \
      --requirepass "$REDIS_PASSWORD" --masterauth "$REDIS_PASSWORD" \
      --replica-announce-ip "$self"
    if [ -n "${HA_BIND:-}" ]; then
      set -- "$@" --bind "$HA_BIND"
    fi
    if [ "$primary" != "$self" ]; then
      echo "redis-ha: $self starts as a replica of $primary"
      set -- "$@" --replicaof "$primary" "$redis_port"
    else
      echo "redis-ha: $self starts as the primary"
    fi
    exec "$@"
    ;;
  sentinel)
    dir="${HA_SENTINEL_DIR:-/sentinel}"
    {
      echo "port $sentinel_port"
      if [ -n "${HA_BIND:-}" ]; then echo "bind $HA_BIND"; fi
      echo "dir $dir"
      echo "sentinel resolve-hostnames yes"
      echo "sentinel announce-hostnames yes"
      echo "sentinel announce-ip $self"
      echo "requirepass $REDIS_PASSWORD"
      echo "sentinel sentinel-pass $REDIS_PASSWORD"
      echo "sentinel monitor $name $primary $redis_port ${HA_QUORUM:-2}"
      echo "sentinel auth-pass $name $REDIS_PASSWORD"
      echo "sentinel down-after-milliseconds $name ${HA_DOWN_AFTER_MS:-5000}"
      echo "sentinel failover-timeout $name 60000"
      echo "sentinel parallel-syncs $name 1"
    } > "$dir/sentinel.conf"
    echo "redis-ha: Sentinel $self watches $name at $primary"
    exec redis-server "$dir/sentinel.conf" --sentinel
    ;;
  *)
    echo "usage: redis-ha.sh redis|sentinel" >&2
    exit 2
    ;;
esac
