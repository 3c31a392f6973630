/* MPI_Allreduce reference for `scripts/bench-vs-mpi.sh`: float sum, sizes from 8 B to 64 MiB
 * doubling, out of place. Prints one line per size: bytes, time (us, max over ranks), algbw and
 * busbw (GB/s, nccl-tests' definition), and whether the result was right. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int rank, n;
    size_t min_bytes = 8, max_bytes = (size_t)64 << 20;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc > 2) { min_bytes = strtoull(argv[1], 0, 10); max_bytes = strtoull(argv[2], 0, 10); }
    float *send = malloc(max_bytes), *recv = malloc(max_bytes);
    if (!send || !recv) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
    if (rank == 0) printf("# bytes time_us algbw busbw wrong\n");
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
        size_t count = bytes / sizeof(float);
        int iters = bytes <= (1 << 16) ? 1000 : bytes <= (1 << 22) ? 100 : 20;
        for (size_t i = 0; i < count; i++) send[i] = (float)((rank * 7 + i * 3) % 11);
        for (int w = 0; w < 5; w++) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < iters; it++) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mine = (MPI_Wtime() - t0) / iters, worst;
        MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        long wrong = 0;
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++) want += (float)((r * 7 + i * 3) % 11);
            if (recv[i] != want) wrong++;
        }
        if (rank == 0) {
            double algbw = bytes / worst / 1e9;
            printf("%zu %.3f %.3f %.3f %ld\n", bytes, worst * 1e6, algbw, algbw * 2.0 * (n - 1) / n, wrong);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
