# Network namespaces as "hosts" for the scale-out benchmark (the tests make theirs in
# tests/src/netns.rs). Source it, then `ferry_netns_up N`: a bridge with the address
# $FERRY_NET_GW in $FERRY_NET_SUBNET (198.18.0.0/15 is set aside for benchmarks), and N
# namespaces named in $FERRY_NET_HOSTS, each on the bridge through its own veth link. Servers
# of the root namespace that listen on $FERRY_NET_GW are reachable from every host.
# `ferry_netns_down` removes them all. Needs root and iproute2.

ferry_netns_up() {
  local n=$1 k
  command -v ip >/dev/null || ferry_apt ip iproute2
  FERRY_NET_TAG=$(( $$ % 100000 ))
  local net=$(( $$ % 250 + 1 ))
  FERRY_NET_GW=198.18.$net.1
  FERRY_NET_SUBNET=198.18.$net.0/24
  FERRY_NET_HOSTS=""
  ip link add name "fbr$FERRY_NET_TAG" type bridge
  ip addr add "$FERRY_NET_GW/24" dev "fbr$FERRY_NET_TAG"
  ip link set "fbr$FERRY_NET_TAG" up
  for k in $(seq 0 $((n - 1))); do
    local host=ferry${FERRY_NET_TAG}h$k
    # Listed first, so that ferry_netns_down removes what a failure half-way leaves.
    FERRY_NET_HOSTS="$FERRY_NET_HOSTS $host"
    ip netns add "$host"
    ip link add "fv${FERRY_NET_TAG}h$k" type veth peer name "fv${FERRY_NET_TAG}n$k"
    ip link set "fv${FERRY_NET_TAG}n$k" netns "$host"
    ip link set "fv${FERRY_NET_TAG}h$k" master "fbr$FERRY_NET_TAG"
    ip link set "fv${FERRY_NET_TAG}h$k" up
    ip -n "$host" addr add "198.18.$net.$((10 + k))/24" dev "fv${FERRY_NET_TAG}n$k"
    ip -n "$host" link set "fv${FERRY_NET_TAG}n$k" up
    ip -n "$host" link set lo up
  done
  export FERRY_NET_TAG FERRY_NET_GW FERRY_NET_SUBNET FERRY_NET_HOSTS
}

ferry_netns_down() {
  [ -n "${FERRY_NET_TAG:-}" ] || return 0
  local host k=0
  for host in $FERRY_NET_HOSTS; do
    ip link del "fv${FERRY_NET_TAG}h$k" 2>/dev/null || true
    ip netns del "$host" 2>/dev/null || true
    k=$((k + 1))
  done
  ip link del "fbr$FERRY_NET_TAG" 2>/dev/null || true
}
