#!/bin/bash
# Overlap benchmark across a real, rate-limited network stack (DESIGN.md section 6; machine-facts section 3):
# two network namespaces joined by a veth pair, tbf-shaped on both egresses, one MPI rank in each (OpenMPI TCP),
# running build-dir/bench/overlap_bench. Needs root (ip netns, tc). Torn down on exit by a trap.
#
#   bench/overlap/run_overlap.sh [BUILD_DIR] [RATE] -- [overlap_bench flags]
#   bench/overlap/run_overlap.sh build-comm 1gbit -- --mib 8 --iters 8 --trials 3
set -u
BUILD=${1:-build-comm}
RATE=${2:-1gbit}
shift $(( $# >= 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
BENCH=$(readlink -f "$BUILD/bench/overlap_bench" 2>/dev/null)
NS0=ampipe_ov0 NS1=ampipe_ov1 IP0=10.77.0.1 IP1=10.77.0.2

skip() { echo "run_overlap.sh: SKIPPED: $*" >&2; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root for ip netns / tc (run as root)"
command -v ip >/dev/null || skip "the 'ip' tool (iproute2) is missing"
command -v tc >/dev/null || skip "the 'tc' tool (iproute2) is missing"
[ -x "$BENCH" ] || skip "$BUILD/bench/overlap_bench not built (ninja -C $BUILD overlap_bench)"

WORK=$(mktemp -d)
cleanup() {
  ip netns del $NS0 2>/dev/null
  ip netns del $NS1 2>/dev/null   # deleting a namespace removes its end of the veth pair, and so the pair
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
ip netns del $NS0 2>/dev/null; ip netns del $NS1 2>/dev/null  # stale ones from a killed run

set -e
ip netns add $NS0 || skip "ip netns add failed (no CAP_SYS_ADMIN / network namespaces here?)"
ip netns add $NS1
ip link add ampipe_v0 type veth peer name ampipe_v1 || skip "cannot create a veth pair"
ip link set ampipe_v0 netns $NS0
ip link set ampipe_v1 netns $NS1
ip -n $NS0 addr add $IP0/24 dev ampipe_v0
ip -n $NS1 addr add $IP1/24 dev ampipe_v1
ip -n $NS0 link set ampipe_v0 up; ip -n $NS1 link set ampipe_v1 up
ip -n $NS0 link set lo up; ip -n $NS1 link set lo up
ip netns exec $NS0 tc qdisc add dev ampipe_v0 root tbf rate "$RATE" burst 256kb latency 50ms \
  || skip "tc tbf is not available in this kernel"
ip netns exec $NS1 tc qdisc add dev ampipe_v1 root tbf rate "$RATE" burst 256kb latency 50ms
set +e

# mpirun's rsh agent: "ssh" into the namespace that owns the address.
cat > "$WORK/nsagent.sh" <<AGENT
#!/bin/bash
host=\$1; shift
case "\$host" in $IP0) ns=$NS0 ;; $IP1) ns=$NS1 ;; *) ns=\$host ;; esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$WORK/nsagent.sh"

echo "run_overlap.sh: 2 ranks in namespaces $NS0/$NS1, veth shaped by tbf rate $RATE each way"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ip netns exec $NS0 \
  mpirun -np 2 --host $IP0,$IP1 --mca plm_rsh_agent "$WORK/nsagent.sh" \
  --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
  --mca btl_tcp_links 2 --bind-to none "$BENCH" "$@"
rc=$?
exit $rc
