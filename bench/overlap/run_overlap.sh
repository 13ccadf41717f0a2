#!/bin/bash
# Overlap benchmark across a real, rate-limited network stack (docs/design.md, "How we measure", "The machines"):
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
HERE=$(dirname "$(readlink -f "$0")")
NETNS_PREFIX=ampipe_ov NETNS_SUBNET=10.77.0 NETNS_WHO=run_overlap.sh
. "$HERE/../netns/netns.sh"

netns_require_root
[ -x "$BENCH" ] || netns_skip "$BUILD/bench/overlap_bench not built (ninja -C $BUILD overlap_bench)"
netns_setup "$RATE"   # installs the teardown trap

echo "run_overlap.sh: 2 ranks in namespaces $NS0/$NS1, veth shaped by tbf rate $RATE each way"
netns_mpirun "$BENCH" "$@"
rc=$?
exit $rc
