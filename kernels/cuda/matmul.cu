// c[m x n] = a[m x k] . b[k x n], row-major f32, in 16 x 16 tiles: the consumer of the
// pipelined all-gather + matmul (ferrocx_kernels::matmul).
extern "C" __global__ void fx_matmul_f32(const float* __restrict__ a,
                                         const float* __restrict__ b,
                                         float* __restrict__ c,
                                         unsigned m, unsigned n, unsigned k) {
    __shared__ float ta[16][17];
    __shared__ float tb[16][17];
    unsigned row = blockIdx.y * 16 + threadIdx.y;
    unsigned col = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.f;
    for (unsigned t = 0; t < k; t += 16) {
        ta[threadIdx.y][threadIdx.x] =
            (row < m && t + threadIdx.x < k) ? a[(unsigned long long)row * k + t + threadIdx.x] : 0.f;
        tb[threadIdx.y][threadIdx.x] =
            (t + threadIdx.y < k && col < n) ? b[(unsigned long long)(t + threadIdx.y) * n + col] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int i = 0; i < 16; ++i) acc += ta[threadIdx.y][i] * tb[i][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) c[(unsigned long long)row * n + col] = acc;
}
