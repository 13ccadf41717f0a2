# Shared network-namespace setup for the benchmarks that need a real, rate-limited network stack between two MPI
# ranks (docs/design.md, "How we measure" and "The machines"). Source it, do not run it:
#
#   NETNS_PREFIX=ampipe_ov NETNS_SUBNET=10.77.0 NETNS_WHO=run_overlap.sh . bench/netns/netns.sh
#   netns_require_root                 # skips (exit 0, one line saying why) when not root / no ip / no tc
#   netns_setup 1gbit                  # two namespaces + veth pair, tbf on both egresses ("none" = unshaped)
#   netns_set_rate 200mbit             # re-shape the live pair (tc qdisc replace; "none" removes the shaping)
#   netns_mpirun ./app args...         # OpenMPI, rank 0 in ${PREFIX}0, rank 1 in ${PREFIX}1, TCP over the veth
#   netns_mpirun_n N ./app args...     # 2N ranks: 0..N-1 in ${PREFIX}0, N..2N-1 in ${PREFIX}1; inside a namespace
#                                      # (a "node") unshaped TCP over loopback, between them TCP over the veth
#   (teardown is automatic: netns_setup installs an EXIT/INT/TERM trap that calls netns_teardown)
#
# Set NETNS_PREFIX to something of your own so that two benchmarks can run at once without touching each
# other's namespaces. NETNS_BURST / NETNS_LATENCY tune tbf (default 256kb / 50ms; 5ms / 64kb measured no different).
# NETNS_MPI_EXTRA: extra mpirun arguments (word-split).

NETNS_PREFIX=${NETNS_PREFIX:-ampipe_ns}
NETNS_SUBNET=${NETNS_SUBNET:-10.77.0}
NETNS_WHO=${NETNS_WHO:-netns.sh}
NETNS_BURST=${NETNS_BURST:-256kb}
NETNS_LATENCY=${NETNS_LATENCY:-50ms}
NS0=${NETNS_PREFIX}0 NS1=${NETNS_PREFIX}1
VETH0=${NETNS_PREFIX}_v0 VETH1=${NETNS_PREFIX}_v1
IP0=$NETNS_SUBNET.1 IP1=$NETNS_SUBNET.2
NETNS_WORK=""

netns_skip() { echo "$NETNS_WHO: SKIPPED: $*" >&2; exit 0; }

netns_require_root() {
  [ "$(id -u)" = 0 ] || netns_skip "needs root for ip netns / tc (run as root)"
  command -v ip >/dev/null || netns_skip "the 'ip' tool (iproute2) is missing"
  command -v tc >/dev/null || netns_skip "the 'tc' tool (iproute2) is missing"
  command -v mpirun >/dev/null || netns_skip "mpirun (OpenMPI) is missing"
}

netns_teardown() {
  ip netns del "$NS0" 2>/dev/null
  ip netns del "$NS1" 2>/dev/null   # deleting a namespace removes its end of the veth pair, and so the pair
  ip link del "$VETH0" 2>/dev/null  # a pair that never got moved into a namespace
  [ -n "$NETNS_WORK" ] && rm -rf "$NETNS_WORK"
  NETNS_WORK=""
  return 0
}

# tc on both egresses: "none"/"" = no qdisc (unshaped veth), else a tbf rate such as 200mbit.
netns_set_rate() {
  local rate=${1:-none} ns dev
  for pair in "$NS0:$VETH0" "$NS1:$VETH1"; do
    ns=${pair%%:*} dev=${pair#*:}
    if [ "$rate" = none ]; then
      ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null
    else
      ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$NETNS_BURST" \
        latency "$NETNS_LATENCY" || return 1
    fi
  done
  return 0
}

netns_setup() {
  local rate=${1:-none}
  trap netns_teardown EXIT
  trap 'netns_teardown; exit 130' INT
  trap 'netns_teardown; exit 143' TERM
  netns_teardown   # stale ones from a killed run
  NETNS_WORK=$(mktemp -d)
  ip netns add "$NS0" || netns_skip "ip netns add failed (no CAP_SYS_ADMIN / network namespaces here?)"
  ip netns add "$NS1" || netns_skip "ip netns add $NS1 failed"
  ip link add "$VETH0" type veth peer name "$VETH1" || netns_skip "cannot create a veth pair"
  ip link set "$VETH0" netns "$NS0" && ip link set "$VETH1" netns "$NS1" &&
    ip -n "$NS0" addr add "$IP0/24" dev "$VETH0" && ip -n "$NS1" addr add "$IP1/24" dev "$VETH1" &&
    ip -n "$NS0" link set "$VETH0" up && ip -n "$NS1" link set "$VETH1" up &&
    ip -n "$NS0" link set lo up && ip -n "$NS1" link set lo up || netns_skip "configuring the veth pair failed"
  netns_set_rate "$rate" || netns_skip "tc tbf is not available in this kernel"
  # mpirun's rsh agent: "ssh" into the namespace that owns the address.
  cat > "$NETNS_WORK/nsagent.sh" <<AGENT
#!/bin/bash
host=\$1; shift
case "\$host" in $IP0) ns=$NS0 ;; $IP1) ns=$NS1 ;; *) ns=\$host ;; esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
  chmod +x "$NETNS_WORK/nsagent.sh"
}

# Two ranks, one per namespace, OpenMPI TCP BTL over the veth. btl_tcp_links 2: bidirectional traffic on one TCP
# connection gets only half the link (docs/design.md, "The machines").
netns_mpirun() {
  # shellcheck disable=SC2086
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ip netns exec "$NS0" \
    mpirun -np 2 --host "$IP0,$IP1" --mca plm_rsh_agent "$NETNS_WORK/nsagent.sh" \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$NETNS_SUBNET.0/24" \
    --mca oob_tcp_if_include "$NETNS_SUBNET.0/24" --mca btl_tcp_links 2 --bind-to none ${NETNS_MPI_EXTRA:-} "$@"
}

# N ranks per namespace (2N in all), filled in rank order: ranks 0..N-1 in the first, N..2N-1 in the second, so
# with tp = N the tensor-parallel groups stay inside a namespace and everything else crosses the shaped veth, as tp
# inside a node and EP / DP across nodes on a cluster. Ranks of one namespace share its address, so their TCP
# traffic takes the loopback route, which tbf (on the veth) does not shape. (Not vader: both namespaces have the
# same host name, so OpenMPI would take all ranks for one node and move cross-namespace bytes through shared memory,
# and the two daemons' session directories collide; it crashed in mca_btl_vader_poll_handle_frag.)
netns_mpirun_n() {
  local n=$1
  shift
  # shellcheck disable=SC2086
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ip netns exec "$NS0" \
    mpirun -np $((2 * n)) --host "$IP0:$n,$IP1:$n" --map-by slot --mca plm_rsh_agent "$NETNS_WORK/nsagent.sh" \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$NETNS_SUBNET.0/24" \
    --mca oob_tcp_if_include "$NETNS_SUBNET.0/24" --mca btl_tcp_links 2 --bind-to none ${NETNS_MPI_EXTRA:-} "$@"
}
