/* Open MPI's non-blocking reductions against an all-to-all and an all-gather of the same volume (docs/communication.md,
 * "Reductions are built from an all-to-all"): 16 MiB of fp32, 1 warm-up + 3 timed calls each, polled with MPI_Test.
 * Built and run over the shaped veth link by run.sh. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static double run(int which, int n, float* s, float* r) {
  MPI_Request q; double t = MPI_Wtime(); int np; MPI_Comm_size(MPI_COMM_WORLD,&np);
  if (which == 0) MPI_Ireduce_scatter_block(s, r, n / np, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
  else if (which == 1) MPI_Ialltoall(s, n / np, MPI_FLOAT, r, n / np, MPI_FLOAT, MPI_COMM_WORLD, &q);
  else if (which == 2) MPI_Iallgather(s, n / np, MPI_FLOAT, r, n / np, MPI_FLOAT, MPI_COMM_WORLD, &q);
  else MPI_Iallreduce(s, r, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
  int done = 0; while (!done) MPI_Test(&q, &done, MPI_STATUS_IGNORE);
  MPI_Barrier(MPI_COMM_WORLD);
  return MPI_Wtime() - t;
}
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv); int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int n = 4 << 20;  /* 16 MiB of floats */
  float* s = calloc(n, 4); float* r = calloc(n, 4);
  const char* nm[4] = {"Ireduce_scatter_block 16MiB in", "Ialltoall 16MiB (8 MiB each way)", "Iallgather 8MiB each -> 16MiB", "Iallreduce 16MiB"};
  for (int w = 0; w < 4; ++w) { run(w, n, s, r); double t = 0; for (int i = 0; i < 3; ++i) t += run(w, n, s, r);
    if (rank == 0) printf("%-36s %8.1f ms\n", nm[w], t / 3 * 1e3); }
  MPI_Finalize(); return 0;
}
