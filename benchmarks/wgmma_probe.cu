// benchmarks/wgmma_probe_gpu.py's kernel: one Hopper wgmma.m64nNk16 (f16 operands, f32 result, a zero
// accumulator: scale-d false) with A from registers and B from shared memory without swizzle, so that a run on
// the GPU says which operand layouts a block-ordered wgmma gemm can rely on (docs/gpu-kernels.md, the wgmma note).
// Compiled for sm_90a (wgmma needs the architecture-specific target). Macro: N, the wgmma's N (8..256, a multiple
// of 8; the asm below is written for 16).
//
// B is staged K-major as two K halves of N rows each: half h, row n holds elements 8h..8h+7 of row n (16 bytes),
// so core matrices (8 rows x 16 bytes) are 128 bytes apart along N and N * 16 bytes apart along K. The descriptor
// takes those two distances as its leading and stride byte offsets in the order leading_is_k says.

typedef unsigned int u32;
typedef unsigned long long u64;

// A shared-memory matrix descriptor without swizzle: address, leading and stride byte offsets, each >> 4.
__device__ __forceinline__ u64 descriptor(const void* smem, u32 leading_bytes, u32 stride_bytes) {
    const u32 address = (u32)__cvta_generic_to_shared(smem);
    return (u64)((address >> 4) & 0x3FFF) | ((u64)((leading_bytes >> 4) & 0x3FFF) << 16) |
           ((u64)((stride_bytes >> 4) & 0x3FFF) << 32);
}

extern "C" __global__ void __launch_bounds__(128) wgmma_probe(const u32* __restrict__ a_regs,
    const unsigned short* __restrict__ b, float* __restrict__ d_out, int leading_is_k) {
    static_assert(N == 16, "the wgmma below names 8 result registers: N = 16");
    __shared__ __align__(128) unsigned short tile[2 * N * 8];
    const int t = threadIdx.x;
    for (int i = t; i < 2 * N * 8; i += 128) {
        const int half = i / (N * 8), n = (i / 8) % N;
        tile[i] = b[n * 16 + half * 8 + i % 8];
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the generic stores, seen by the async proxy
    __syncthreads();
    const u32 a0 = a_regs[t * 4 + 0], a1 = a_regs[t * 4 + 1], a2 = a_regs[t * 4 + 2], a3 = a_regs[t * 4 + 3];
    const u64 desc = leading_is_k ? descriptor(tile, N * 16, 128) : descriptor(tile, 128, N * 16);
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[i] = -1.0f;  // scale-d false must ignore these
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d_out[t * (N / 2) + i] = d[i];
}
