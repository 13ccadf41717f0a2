#!/bin/bash
# Times MPI_Ireduce_scatter_block, MPI_Ialltoall, MPI_Iallgather and MPI_Iallreduce (16 MiB of fp32) between two
# ranks in two network namespaces joined by a veth pair shaped with tbf (bench/netns/netns.sh).
#
#   bench/mpi_reductions/run.sh [RATE]     (root; default RATE 1514mbit)
set -u
HERE=$(dirname "$(readlink -f "$0")")
RATE=${1:-1514mbit}
NETNS_PREFIX=ampipe_red NETNS_SUBNET=10.85.0 NETNS_WHO=mpi_reductions
. "$HERE/../netns/netns.sh"
netns_require_root
BIN=$(mktemp -d)/mpi_reductions
mpicc -O2 -o "$BIN" "$HERE/mpi_reductions.c" || exit 1
netns_setup "$RATE"
echo "# $(lscpu | sed -n 's/^Model name: *//p'), link $RATE"
netns_mpirun "$BIN"
