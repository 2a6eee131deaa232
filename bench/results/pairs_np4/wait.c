// How the wait of a small MPI collective fares on more ranks than cores: 1 KiB all_gather on
// the whole world and on pairs (world ranks {0,1} and {2,3}), MPI's blocking call against its
// persistent request waited for by MPI_Wait, by MPI_Test and a yield at every poll, and by
// MPI_Test spinning 16 or 128 polls before it yields. Each iteration is timed on every rank;
// the figure is the mean over iterations of the per-iteration maximum over all ranks (the
// bench's default timing), three repetitions of 2000 iterations each.
//   mpicc -O2 -o wait wait.c && mpiexec -n 4 ./wait 1024 && mpiexec -n 4 ./wait 1024 pair
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Completes a started request: MPI_Wait (spin < 0), or MPI_Test with `spin` polls before each
// sched_yield.
static void complete(MPI_Request* r, int spin) {
  if (spin < 0) {
    MPI_Wait(r, MPI_STATUS_IGNORE);
    return;
  }
  int done = 0, polls = 0;
  for (;;) {
    MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (++polls > spin) sched_yield();
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int wr, wp;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &wp);
  const int n = (argc > 1 ? atoi(argv[1]) : 1024) / 4;
  const int pairs = argc > 2 && strcmp(argv[2], "pair") == 0;
  MPI_Comm c = MPI_COMM_WORLD;
  if (pairs) MPI_Comm_split(MPI_COMM_WORLD, wr / 2, wr, &c);
  int p;
  MPI_Comm_size(c, &p);
  float* s = calloc(n, sizeof(float));
  float* o = calloc((size_t)n * p, sizeof(float));
  MPI_Request pr;
  MPI_Allgather_init(s, n, MPI_FLOAT, o, n, MPI_FLOAT, c, MPI_INFO_NULL, &pr);
  const char* names[] = {"blocking", "persistent+MPI_Wait", "persistent+yield",
                         "persistent+spin16", "persistent+spin128"};
  const int spins[] = {0, -1, 0, 16, 128};
  enum { kModes = 5, kIters = 2000, kReps = 3 };
  double* ts = malloc(sizeof(double) * kIters);
  double* all = malloc(sizeof(double) * kIters * wp);
  double fig[kModes][kReps];
  for (int rep = 0; rep < kReps; rep++) {
    for (int m = 0; m < kModes; m++) {
      for (int it = -100; it < kIters; it++) {
        const double t0 = now();
        if (m == 0) {
          MPI_Allgather(s, n, MPI_FLOAT, o, n, MPI_FLOAT, c);
        } else {
          MPI_Start(&pr);
          complete(&pr, spins[m]);
        }
        if (it >= 0) ts[it] = now() - t0;
      }
      MPI_Gather(ts, kIters, MPI_DOUBLE, all, kIters, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      if (wr == 0) {
        double sum = 0;
        for (int i = 0; i < kIters; i++) {
          double mx = 0;
          for (int r = 0; r < wp; r++) mx = all[r * kIters + i] > mx ? all[r * kIters + i] : mx;
          sum += mx;
        }
        fig[m][rep] = sum / kIters * 1e6;
      }
    }
  }
  if (wr == 0) {
    for (int m = 0; m < kModes; m++) {
      printf("%d B %-5s %-20s", n * 4, pairs ? "pairs" : "world", names[m]);
      for (int rep = 0; rep < kReps; rep++) printf(" %6.1f", fig[m][rep]);
      printf("  us\n");
    }
  }
  MPI_Request_free(&pr);
  free(s), free(o), free(ts), free(all);
  MPI_Finalize();
  return 0;
}
