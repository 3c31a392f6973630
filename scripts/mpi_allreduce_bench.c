/* MPI reference for `scripts/bench-vs-mpi.sh`: float sum all-reduce (out of place), broadcast
 * from rank 0, or barrier, sizes from MIN to MAX bytes doubling. Prints one line per size:
 * bytes, time (us, max over ranks of the mean per call), algbw and busbw (GB/s, nccl-tests'
 * definitions) and how many elements were wrong.
 *
 * Usage: mpi_allreduce_bench [MIN MAX [allreduce|bcast|barrier]]
 * Builds against any MPI (Open MPI, MPICH). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int rank, n;
    size_t min_bytes = 8, max_bytes = (size_t)64 << 20;
    const char *mode = "allreduce";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc > 2) { min_bytes = strtoull(argv[1], 0, 10); max_bytes = strtoull(argv[2], 0, 10); }
    if (argc > 3) mode = argv[3];
    int bcast = !strcmp(mode, "bcast"), barrier = !strcmp(mode, "barrier");
    if (!bcast && !barrier && strcmp(mode, "allreduce")) {
        if (rank == 0) fprintf(stderr, "unknown mode %s: allreduce, bcast or barrier\n", mode);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float *send = malloc(max_bytes), *recv = malloc(max_bytes);
    if (!send || !recv) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
    if (rank == 0) printf("# %s: bytes time_us algbw busbw wrong\n", mode);
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
        size_t count = bytes / sizeof(float);
        int iters = bytes <= (1 << 16) ? 5000 : bytes <= (1 << 22) ? 100 : 20;
        for (size_t i = 0; i < count; i++) send[i] = (float)((rank * 7 + i * 3) % 11);
        for (int w = 0; w < (bytes <= (1 << 16) ? 2000 : 5); w++) {
            if (barrier) MPI_Barrier(MPI_COMM_WORLD);
            else if (bcast) MPI_Bcast(rank == 0 ? send : recv, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
            else MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < iters; it++) {
            if (barrier) MPI_Barrier(MPI_COMM_WORLD);
            else if (bcast) MPI_Bcast(rank == 0 ? send : recv, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
            else MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        double mine = (MPI_Wtime() - t0) / iters, worst;
        MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        long wrong = 0;
        for (size_t i = 0; i < count && !barrier; i++) {
            float want = 0;
            if (bcast) want = rank == 0 ? recv[i] : (float)((i * 3) % 11);
            else for (int r = 0; r < n; r++) want += (float)((r * 7 + i * 3) % 11);
            if (recv[i] != want) wrong++;
        }
        if (rank == 0) {
            double algbw = bytes / worst / 1e9;
            double factor = bcast || barrier ? 1.0 : 2.0 * (n - 1) / n;
            printf("%zu %.3f %.3f %.3f %ld\n", bytes, worst * 1e6, algbw, algbw * factor, wrong);
            fflush(stdout);
        }
        if (barrier) break;
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
