// Packed NVFP4 x NVFP4 products on weights in the fragment layout of nibble/kernels/fragments.py. Compiled
// at run time with NVRTC (no CUDA toolkit needed beyond what a CUDA build of PyTorch ships);
// fragment_gemm.py defines the macros and launches them.
//
// Arithmetic (docs/design.md §2.6, "block-ordered accumulation"): for output row r and column n, each
// 16-element block b gives t_b = sum_i x[r, 16b + i] * w[n, 16b + i] over operands decoded without their
// global scales. Every such t_b is exact in float32 (E2M1 x E4M3 products are exact and a block's sum
// spans at most 20 bits), so one mma.m16n8k16 per block with a zero accumulator computes it exactly
// whatever the tensor core's internal order. Blocks are then added in float32, one IEEE add each, in
// block order within chunks of 32 blocks; chunk sums are added in chunk order; the result is multiplied by
// the activation's and the weight's global scales. That order depends on K alone, so a row gets the same
// bits from either kernel here, from the Triton kernel and from the CPU reference, whatever the row count.
//
// gemm multiplies the weight's codes by their block scale s_b before the mma: each operand, code x 2^-14 x s_b,
// is an exact float16 (the smallest, 0.5 x 2^-14 x 2^-9, is float16's least subnormal 2^-24), so t_b comes out
// exact. gemv leaves the scale out: its mma sums the unscaled operands (code x 2^-14; code 0.5 is the float16
// subnormal 2^-15, which mma.sync takes exactly, as the bit-for-bit GPU tests confirm) into u_b, exact for the
// same reason, with t_b = s_b x u_b; one fma.rn(u_b, s_b, acc) then adds the block, and since an fma rounds
// only its result, that is the add's rounding of acc + t_b: the same bits. acc starts at +0, so signed zeros
// and zero scales (padding) agree too. Fewer instructions where a decode feeds few tiles: 3.7-4.2% faster for
// dense gemv at 1 and 8 rows, but 3.4% slower for grouped gemv at 16 rows per expert
// (benchmarks/results/h200_fragment_ab.json), and 1-4% slower in gemm, whose decode feeds eight tiles
// (benchmarks/results/h200_gemv_variants_rejected.log, part 0), which therefore keeps the scaled form.
//
// Weights are the mma's A operand (16 weight rows of one column group), activations the B operand (8 rows
// per n8 tile). Two kernels:
// - nvfp4_fragment_gemv (few rows, decode): one CTA per (NT x 8 activation rows, COLUMN_WARPS x GROUPS column
//   groups) for all of K; the CTA's warps form COLUMN_WARPS columns of warps side by side along N, each owning
//   GROUPS column groups, and within a column warp w sums chunks w, w + warps, ... and leaves each chunk's
//   sum in shared memory, which the CTA adds in chunk order. Activations are read straight from global memory,
//   once per CTA from L2: a warp applies each activation load to its GROUPS column groups, and the column warps
//   that read the same chunk find it in L1, which is what bounds the L2 traffic when every column group would
//   otherwise read all the rows' activations again. With STAGE, each lane instead streams its operands
//   (weight words, block scales, activations) through a ring of PREFETCH shared-memory slots with cp.async,
//   PREFETCH - 1 quads ahead of the quad being summed: more loads in flight for no registers, which pays
//   where a product is too small to keep DRAM busy (fragment_gemm.py says where it is used).
// - nvfp4_fragment_gemm (many rows): one CTA per (64 activation rows, WARPS x GEMM_GROUPS column groups); each
//   warp holds its column groups' running chunk and total sums for the 64 rows. K goes in steps of 128 elements
//   through a ring of GEMM_STAGES shared-memory stages filled with cp.async GEMM_STAGES - 1 steps ahead: the
//   64 rows' activations, where every warp reads its B operands, and each warp's own weight words and scales.
// Macros: NT, PREFETCH (quads whose weight loads a warp issues together, or with STAGE the ring's slots),
// GROUPS (gemv's column groups per warp), COLUMN_WARPS (gemv's warps side by side along N), STAGE, WARPS,
// TILE_ROWS (gemm's activation rows per CTA), CHUNK_QUADS (the chunk of docs/design.md §2.6 in quads),
// GEMM_GROUPS and GEMM_STAGES (gemm's column groups per warp and ring stages),
// GROUPED (rows sorted by expert, tiles from device-side metadata), GATHER (activation row per output row),
// OUT_BF16 (bf16 output, else float32), MAX_THREADS (the CTA size gemv's registers are planned for: its
// tile's warps x column warps, at least gemm's; gemm plans for its own WARPS warps, so a gemv tile never
// changes gemm's code).

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

struct __align__(16) Words { u32 w[4]; };
struct __align__(8) Pair { u32 lo, hi; };

__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ u32 prmt(u32 a, u32 selector) {
    u32 d;
    asm("prmt.b32 %0, %1, %1, %2;" : "=r"(d) : "r"(a), "r"(selector));
    return d;
}

// Two E4M3 bytes (the low 16 bits of v) to a float16 pair: low byte to the low half. Exact.
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 v) {
    u32 d;
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(d) : "r"(v));
    return d;
}

__device__ __forceinline__ void mma_zero(float d[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

__device__ __forceinline__ float add_rn(float a, float b) {
    float d;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

__device__ __forceinline__ float mul_rn(float a, float b) {
    float d;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

__device__ __forceinline__ float fma_rn(float a, float b, float c) {
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
}

// One block's word as the mma's four operand registers: float16 pairs e2m1_value * 2^-14
// (fragments.py REGISTER_BITS; e2m1 0.5 is the float16 subnormal 2^-15). Exact.
__device__ __forceinline__ void decode(u32 w, u32 a[4]) {
    const u32 keep = 0x8E008E00u;
    a[0] = w & keep;
    a[1] = (w << 3) & keep;
    a[2] = ((w & 0x20072007u) * 516u) & keep;
    a[3] = ((w & 0x40384038u) * 66u) & keep;
}

// The E4M3 block scales of block j of a quad for the lane's two weight rows (grp, grp + 8), as float32. Exact.
__device__ __forceinline__ void block_scales(const Pair& scales, int j, float& row_low, float& row_high) {
    const u32 both = j < 2 ? scales.lo : scales.hi;
    const u32 s = e4m3x2_to_f16x2((j & 1) ? both >> 16 : both);
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.f32.f16 %0, lo;\n cvt.f32.f16 %1, hi;\n}"
        : "=f"(row_low), "=f"(row_high)
        : "r"(s));
}

// The operand registers times the block scales of their weight rows (gemm's form: its eight n8 tiles share
// one decode, so the scales go into the operands once rather than into every tile's sums). Exact.
__device__ __forceinline__ void scale_operands(u32 a[4], const Pair& scales, int j) {
    const u32 both = j < 2 ? scales.lo : scales.hi;
    const u32 s = e4m3x2_to_f16x2((j & 1) ? both >> 16 : both);
    const u32 s_low = prmt(s, 0x1010u), s_high = prmt(s, 0x3232u);
    a[0] = hmul2(a[0], s_low);
    a[1] = hmul2(a[1], s_high);
    a[2] = hmul2(a[2], s_low);
    a[3] = hmul2(a[3], s_high);
}

// acc += the block: the mma's D fragment (weight rows grp, grp + 8; two activation rows) times the rows' scales.
__device__ __forceinline__ void add_block(float acc[4], const float d[4], float row_low, float row_high) {
    acc[0] = fma_rn(d[0], row_low, acc[0]);
    acc[1] = fma_rn(d[1], row_low, acc[1]);
    acc[2] = fma_rn(d[2], row_high, acc[2]);
    acc[3] = fma_rn(d[3], row_high, acc[3]);
}

#if OUT_BF16
typedef u16 out_t;
__device__ __forceinline__ out_t to_out(float v) {
    u16 d;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d) : "f"(v));
    return d;
}
#else
typedef float out_t;
__device__ __forceinline__ out_t to_out(float v) { return v; }
#endif

// The CTA's activation rows [row_start, row_end) and expert.
__device__ __forceinline__ void tile_rows(int rows, int rows_total, const int* tile_expert, const int* tile_start,
                                          const int* tile_end, const int* num_tiles, int& expert, int& row_start,
                                          int& row_end, bool& live) {
#if GROUPED
    live = (int)blockIdx.x < num_tiles[0];
    expert = live ? tile_expert[blockIdx.x] : 0;
    row_start = live ? tile_start[blockIdx.x] : 0;
    row_end = live ? tile_end[blockIdx.x] : 0;
#else
    live = true;
    expert = 0;
    row_start = blockIdx.x * rows;
    row_end = rows_total;
#endif
    if (row_end > row_start + rows) row_end = row_start + rows;
}

__device__ __forceinline__ i64 source_row(const i64* x_rows, int r) {
#if GATHER
    return x_rows[r];
#else
    return r;
#endif
}

#define ROWS (NT * 8)
#define COLS (COLUMN_WARPS * GROUPS * 16)  // the CTA's output columns

// cp.async of 16 or 8 bytes from global to shared memory; `ok` false reads nothing and zero-fills the
// destination (source size 0), so quads past K and rows past the tile read as zeros there too. The destination
// is a shared-window address (u32; a base plus constants folds into the instruction) or a generic pointer.
__device__ __forceinline__ void copy_async16(u32 dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}

__device__ __forceinline__ void copy_async8(u32 dst, const void* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(ok ? 8 : 0) : "memory");
}

__device__ __forceinline__ void copy_async16(void* dst, const void* src, bool ok) {
    copy_async16((u32)__cvta_generic_to_shared(dst), src, ok);
}

__device__ __forceinline__ void copy_async8(void* dst, const void* src, bool ok) {
    copy_async8((u32)__cvta_generic_to_shared(dst), src, ok);
}

__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int PENDING>
__device__ __forceinline__ void copy_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}

__device__ __forceinline__ void zero_sums(float acc[GROUPS][NT][4]) {
#pragma unroll
    for (int h = 0; h < GROUPS; ++h)
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[h][t][i] = 0.0f;
}

// acc += one quad's products for the warp's column groups: the quad's weight words and block scales per
// group, and the activations of its four blocks per n8 tile.
__device__ __forceinline__ void quad_products(float acc[GROUPS][NT][4], const Words wq[GROUPS], const Pair sq[GROUPS],
                                              const Pair xq[NT][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < GROUPS; ++h) {
            u32 a[4];
            float row_low, row_high;
            decode(wq[h].w[j], a);
            block_scales(sq[h], j, row_low, row_high);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                float d[4];
                mma_zero(d, a, xq[t][j].lo, xq[t][j].hi);
                add_block(acc[h][t], d, row_low, row_high);
            }
        }
}

// One ring slot: a quad's weight words (16 bytes a lane) and block scales (8) per column group, then its
// activations (8 bytes a lane) per n8 tile and block, for the warp's 32 lanes; fragment_gemm.py sizes it too.
#define SLOT_BYTES (GROUPS * 768 + NT * 4 * 256)
#if STAGE && PREFETCH < 2
#error "a staged gemv needs a ring of at least two slots (PREFETCH >= 2)"
#endif

extern "C" __global__ void __launch_bounds__(MAX_THREADS) nvfp4_fragment_gemv(
    const Words* __restrict__ w_words,  // [E, G, Q, 32]
    const Pair* __restrict__ w_scales,  // [E, G, Q, 8]
    const float* __restrict__ w_g,      // [E]
    const u16* __restrict__ x,          // [T, K] float16 bits, block scale applied, global scale not
    const float* __restrict__ x_g,      // [T]
    const i64* __restrict__ x_rows,     // [R] when GATHER
    out_t* __restrict__ out,            // [R, N]
    const int* __restrict__ tile_expert, const int* __restrict__ tile_start, const int* __restrict__ tile_end,
    const int* __restrict__ num_tiles, int rows_total, int n, int k, int groups, int quads) {
    extern __shared__ __align__(16) float partial[];  // [chunks][ROWS][COLS], then with STAGE each warp's ring
    const int lane = threadIdx.x & 31, grp = lane >> 2, c = lane & 3;
    // warp: the warp's place among those that split K; column: its column of warps along N
    const int column = (threadIdx.x >> 5) % COLUMN_WARPS, warp = (threadIdx.x >> 5) / COLUMN_WARPS;
    const int warps = (blockDim.x >> 5) / COLUMN_WARPS;
    int expert, row_start, row_end;
    bool live;
    tile_rows(ROWS, rows_total, tile_expert, tile_start, tile_end, num_tiles, expert, row_start, row_end, live);
    if (!live) return;
    const int cta_g0 = blockIdx.y * (COLS / 16), g0 = cta_g0 + column * GROUPS;
    const int blocks = k / 16;
    const int chunks = (quads + CHUNK_QUADS - 1) / CHUNK_QUADS;

    const u16* xrow[NT];
    bool xok[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const int r = row_start + t * 8 + grp;
        xok[t] = r < row_end;
        xrow[t] = x + (xok[t] ? source_row(x_rows, r) : 0) * k + 4 * c;
    }
    // groups past the weight's last (only where a CTA has several) read nothing: their sums stay 0 and are
    // never written out
    const Words* wbase[GROUPS];
    const Pair* sbase[GROUPS];
    bool gok[GROUPS];
#pragma unroll
    for (int h = 0; h < GROUPS; ++h) {
        gok[h] = COLS == 16 || g0 + h < groups;
        const i64 gi = ((i64)expert * groups + (gok[h] ? g0 + h : 0)) * quads;
        wbase[h] = w_words + gi * 32 + lane;
        sbase[h] = w_scales + gi * 8 + grp;
    }

#if STAGE
    // The warp's quads in order (chunks warp, warp + warps, ...) through the lane's ring: quad i + PREFETCH - 1's
    // operands are in flight while quad i is summed. A lane reads back only what it copied itself, so its own
    // wait_group orders the two: no barrier.
    char* ring = (char*)(partial + (i64)chunks * ROWS * COLS) + (i64)(threadIdx.x >> 5) * PREFETCH * SLOT_BYTES;
    const int owned = (chunks - warp + warps - 1) / warps;  // chunks of this warp
    const int sequence = owned * CHUNK_QUADS;
    auto issue = [&](int i) {
        if (i < sequence) {
            const int q = (warp + (i / CHUNK_QUADS) * warps) * CHUNK_QUADS + i % CHUNK_QUADS;
            char* slot = ring + (i % PREFETCH) * SLOT_BYTES;
#pragma unroll
            for (int h = 0; h < GROUPS; ++h) {
                const bool ok = gok[h] && q < quads;
                copy_async16((Words*)slot + h * 32 + lane, wbase[h] + (ok ? (i64)q * 32 : 0), ok);
                copy_async8((Pair*)(slot + GROUPS * 512) + h * 32 + lane, sbase[h] + (ok ? (i64)q * 8 : 0), ok);
            }
#pragma unroll
            for (int t = 0; t < NT; ++t)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int b = 4 * q + j;
                    const bool ok = xok[t] && b < blocks;
                    copy_async8((Pair*)(slot + GROUPS * 768) + (t * 4 + j) * 32 + lane, xrow[t] + (ok ? (i64)b * 16 : 0), ok);
                }
        }
        copy_commit();  // an empty group past the end keeps the count wait_group relies on
    };
#pragma unroll
    for (int i = 0; i < PREFETCH - 1; ++i) issue(i);
    for (int ci = 0; ci < owned; ++ci) {
        const int chunk = warp + ci * warps;
        float acc[GROUPS][NT][4];
        zero_sums(acc);
        for (int qi = 0; qi < CHUNK_QUADS; ++qi) {
            const int i = ci * CHUNK_QUADS + qi;
            copy_wait<PREFETCH - 2>();  // quad i has landed
            issue(i + PREFETCH - 1);    // into the slot quad i - 1 left
            const char* slot = ring + (i % PREFETCH) * SLOT_BYTES;
            Words wq[GROUPS];
            Pair sq[GROUPS], xq[NT][4];
#pragma unroll
            for (int h = 0; h < GROUPS; ++h) {
                wq[h] = ((const Words*)slot)[h * 32 + lane];
                sq[h] = ((const Pair*)(slot + GROUPS * 512))[h * 32 + lane];
            }
#pragma unroll
            for (int t = 0; t < NT; ++t)
#pragma unroll
                for (int j = 0; j < 4; ++j) xq[t][j] = ((const Pair*)(slot + GROUPS * 768))[(t * 4 + j) * 32 + lane];
            quad_products(acc, wq, sq, xq);
        }
#else
    for (int chunk = warp; chunk < chunks; chunk += warps) {
        float acc[GROUPS][NT][4];
        zero_sums(acc);
        // Weight loads for PREFETCH quads go out together, predicated rather than branched around; quads
        // past K read as zeros, whose products add +0 to a sum that is never -0.
        for (int qb = chunk * CHUNK_QUADS; qb < (chunk + 1) * CHUNK_QUADS; qb += PREFETCH) {
            Words wq[PREFETCH][GROUPS];
            Pair sq[PREFETCH][GROUPS];
#pragma unroll
            for (int qi = 0; qi < PREFETCH; ++qi)
#pragma unroll
                for (int h = 0; h < GROUPS; ++h) {
                    wq[qi][h] = Words{{0u, 0u, 0u, 0u}};
                    sq[qi][h] = Pair{0u, 0u};
                    if (gok[h] && qb + qi < quads) {
                        wq[qi][h] = wbase[h][(i64)(qb + qi) * 32];
                        sq[qi][h] = sbase[h][(i64)(qb + qi) * 8];
                    }
                }
#pragma unroll
            for (int qi = 0; qi < PREFETCH; ++qi) {
                // activations are small and cached: read them per quad, not prefetched with the weights
                Pair xq[NT][4];
#pragma unroll
                for (int t = 0; t < NT; ++t)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int b = 4 * (qb + qi) + j;
                        xq[t][j] = Pair{0u, 0u};
                        if (xok[t] && b < blocks) xq[t][j] = *(const Pair*)(xrow[t] + (i64)b * 16);
                    }
                quad_products(acc, wq[qi], sq[qi], xq);
            }
        }
#endif
        // D fragment: (weight row grp or grp + 8 of group h, activation rows 2c, 2c + 1)
        float* mine = partial + (i64)chunk * ROWS * COLS;
#pragma unroll
        for (int h = 0; h < GROUPS; ++h)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const int r0 = t * 8 + 2 * c, col = (column * GROUPS + h) * 16 + grp;
                mine[r0 * COLS + col] = acc[h][t][0];
                mine[(r0 + 1) * COLS + col] = acc[h][t][1];
                mine[r0 * COLS + col + 8] = acc[h][t][2];
                mine[(r0 + 1) * COLS + col + 8] = acc[h][t][3];
            }
    }
    __syncthreads();

    const float gw = w_g[expert];
    for (int idx = threadIdx.x; idx < COLS * ROWS; idx += blockDim.x) {
        const int row = idx / COLS, col = idx % COLS;
        const int nn = cta_g0 * 16 + col, r = row_start + row;
        if (nn >= n || r >= row_end) continue;
        float total = 0.0f;
        for (int ch = 0; ch < chunks; ++ch) total = add_rn(total, partial[((i64)ch * ROWS + row) * COLS + col]);
        const float gx = x_g[source_row(x_rows, r)];
        out[(i64)r * n + nn] = to_out(mul_rn(mul_rn(mul_rn(total, 16384.0f), gx), gw));
    }
}

#define STEP 128                  // elements of K staged per step: two quads
// Bytes per staged activation row: 8 banks of pad put the four rows a half-warp's B operand loads read
// (8 bytes a lane, two banks) on banks 0-7, 8-15, 16-23 and 24-31, so that they do not conflict.
#define X_STRIDE (STEP * 2 + 32)
#define W_BYTES (GEMM_GROUPS * 2 * 576)  // a warp's weight words (512 bytes a quad) and scales (64) per step
// One stage of gemm's ring: the step's activations for the CTA's rows, then each warp's weight words and scales.
#define STAGE_BYTES (TILE_ROWS * X_STRIDE + WARPS * W_BYTES)

// gemm: GEMM_STAGES steps of K in flight per CTA. Every thread copies the same activation pieces (row,
// 16-byte part) each step and each warp its own column groups' weights, all with cp.async into the step's
// stage; one barrier per step both publishes a stage and frees the one read a step before, which the
// copies issued right after it refill. Operands past K, past the tile's rows or past the weight's groups
// are zero-filled: their products add +0 to sums that are never -0.
// One group a warp keeps a thread within 128 registers, so that 16 warps may share an SM (two CTAs of eight, four
// of four, where their rings fit); two groups hold twice the sums and take 8 warps an SM.
extern "C" __global__ void __launch_bounds__(32 * WARPS, (GEMM_GROUPS == 1 ? 16 : 8) / WARPS) nvfp4_fragment_gemm(
    const Words* __restrict__ w_words, const Pair* __restrict__ w_scales, const float* __restrict__ w_g,
    const u16* __restrict__ x, const float* __restrict__ x_g, const i64* __restrict__ x_rows,
    out_t* __restrict__ out, const int* __restrict__ tile_expert, const int* __restrict__ tile_start,
    const int* __restrict__ tile_end, const int* __restrict__ num_tiles, int rows_total, int n, int k, int groups,
    int quads) {
    extern __shared__ __align__(16) unsigned char ring[];  // [GEMM_STAGES][STAGE_BYTES]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = lane >> 2, c = lane & 3;
    int expert, row_start, row_end;
    bool live;
    tile_rows(TILE_ROWS, rows_total, tile_expert, tile_start, tile_end, num_tiles, expert, row_start, row_end, live);
    if (!live) return;  // the whole CTA: no barrier is left waiting
    const int g0 = (blockIdx.y * WARPS + warp) * GEMM_GROUPS;
    const Words* wbase[GEMM_GROUPS];
    const Pair* sbase[GEMM_GROUPS];
    bool gok[GEMM_GROUPS];
#pragma unroll
    for (int h = 0; h < GEMM_GROUPS; ++h) {
        gok[h] = g0 + h < groups;
        const i64 gi = ((i64)expert * groups + (gok[h] ? g0 + h : 0)) * quads;
        wbase[h] = w_words + gi * 32 + lane;
        sbase[h] = w_scales + gi * 8;
    }
    // This thread's activation pieces: 16 bytes (part) of each of PIECES rows of a step.
    constexpr int PARTS = STEP * 2 / 16, PIECES = TILE_ROWS * PARTS / (32 * WARPS), ROW_STEP = 32 * WARPS / PARTS;
    static_assert(TILE_ROWS * PARTS % (32 * WARPS) == 0, "a step's activation pieces split evenly over the CTA");
    const int part = threadIdx.x % PARTS, row0 = (int)threadIdx.x / PARTS;  // piece i: row row0 + i * ROW_STEP
    const u16* xsrc[PIECES];
    bool xok[PIECES];
#pragma unroll
    for (int i = 0; i < PIECES; ++i) {
        const int r = row_start + row0 + i * ROW_STEP;
        xok[i] = r < row_end;
        xsrc[i] = x + (xok[i] ? source_row(x_rows, r) : 0) * k;  // a row's start: valid even where nothing is read
    }
    // the lane's weight scales to copy: 8 per (group, quad), a lane each (group lane / 16, quad (lane / 8) % 2),
    // lanes past them copy none; selected, not indexed, so that the arrays stay in registers
    static_assert(GEMM_GROUPS <= 2, "a warp's 32 lanes copy the scales of at most two column groups");
    const bool scale_lane = lane < 16 * GEMM_GROUPS, second = lane >= 16;
    const Pair* const ssrc = (second ? sbase[GEMM_GROUPS - 1] : sbase[0]) + lane % 8;
    const bool sok = second ? gok[GEMM_GROUPS - 1] : gok[0];
    const int sq_i = (lane / 8) % 2;

    const int steps = (quads + 1) / 2;
    auto issue = [&](int step) {
        if (step < steps) {
            unsigned char* stage = ring + (step % GEMM_STAGES) * STAGE_BYTES;
#pragma unroll
            for (int i = 0; i < PIECES; ++i) {
                const int element = step * STEP + part * 8;
                const bool ok = xok[i] && element < k;
                copy_async16(stage + (row0 + i * ROW_STEP) * X_STRIDE + part * 16, xsrc[i] + (ok ? element : 0), ok);
            }
            unsigned char* wstage = stage + TILE_ROWS * X_STRIDE + warp * W_BYTES;
#pragma unroll
            for (int h = 0; h < GEMM_GROUPS; ++h)
#pragma unroll
                for (int qi = 0; qi < 2; ++qi) {
                    const int q = 2 * step + qi;
                    const bool ok = gok[h] && q < quads;
                    copy_async16((Words*)wstage + (h * 2 + qi) * 32 + lane, wbase[h] + (ok ? (i64)q * 32 : 0), ok);
                }
            if (scale_lane) {
                const int q = 2 * step + sq_i;
                const bool ok = sok && q < quads;
                copy_async8((Pair*)(wstage + GEMM_GROUPS * 1024) + lane, ssrc + (ok ? (i64)q * 8 : 0), ok);
            }
        }
        copy_commit();  // an empty group past the end keeps the count wait_group relies on
    };

    float acc[GEMM_GROUPS][8][4], total[GEMM_GROUPS][8][4];
#pragma unroll
    for (int h = 0; h < GEMM_GROUPS; ++h)
#pragma unroll
        for (int t = 0; t < 8; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[h][t][i] = total[h][t][i] = 0.0f;

#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) issue(s);
    for (int step = 0; step < steps; ++step) {
        copy_wait<GEMM_STAGES - 2>();  // this thread's copies of the step have landed
        __syncthreads();               // everyone's have, and everyone is done with the step before
        issue(step + GEMM_STAGES - 1);
        const unsigned char* stage = ring + (step % GEMM_STAGES) * STAGE_BYTES;
        const unsigned char* wstage = stage + TILE_ROWS * X_STRIDE + warp * W_BYTES;
#pragma unroll
        for (int qi = 0; qi < 2; ++qi) {
            Words wq[GEMM_GROUPS];
            Pair sq[GEMM_GROUPS];
#pragma unroll
            for (int h = 0; h < GEMM_GROUPS; ++h) {
                wq[h] = ((const Words*)wstage)[(h * 2 + qi) * 32 + lane];
                sq[h] = ((const Pair*)(wstage + GEMM_GROUPS * 1024))[(h * 2 + qi) * 8 + grp];
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                u32 a[GEMM_GROUPS][4];
#pragma unroll
                for (int h = 0; h < GEMM_GROUPS; ++h) {
                    decode(wq[h].w[j], a[h]);
                    scale_operands(a[h], sq[h], j);
                }
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    const Pair b = *(const Pair*)(stage + (t * 8 + grp) * X_STRIDE + (qi * 4 + j) * 32 + c * 8);
#pragma unroll
                    for (int h = 0; h < GEMM_GROUPS; ++h) {
                        float d[4];
                        mma_zero(d, a[h], b.lo, b.hi);
#pragma unroll
                        for (int i = 0; i < 4; ++i) acc[h][t][i] = add_rn(acc[h][t][i], d[i]);
                    }
                }
            }
        }
        const bool chunk_done = (2 * step + 2) % CHUNK_QUADS == 0 || step == steps - 1;
        if (chunk_done) {
#pragma unroll
            for (int h = 0; h < GEMM_GROUPS; ++h)
#pragma unroll
                for (int t = 0; t < 8; ++t)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        total[h][t][i] = add_rn(total[h][t][i], acc[h][t][i]);
                        acc[h][t][i] = 0.0f;
                    }
        }
    }
    const float gw = w_g[expert];
#pragma unroll
    for (int h = 0; h < GEMM_GROUPS; ++h) {
        if (!gok[h]) continue;
#pragma unroll
        for (int t = 0; t < 8; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = row_start + t * 8 + 2 * c + (i & 1);
                const int nn = (g0 + h) * 16 + grp + 8 * (i >> 1);
                if (r < row_end && nn < n) {
                    const float gx = x_g[source_row(x_rows, r)];
                    out[(i64)r * n + nn] = to_out(mul_rn(mul_rn(mul_rn(total[h][t][i], 16384.0f), gx), gw));
                }
            }
    }
}

#if WGMMA
// nvfp4_fragment_wgmma: gemm's block-ordered sum with Hopper's warpgroup MMA (compiled for sm_90a only, with
// WGMMA defined; not dispatched: benchmarks/gemm_pipeline_gpu.py --wgmma and the GPU tests call it). A CTA of two
// warpgroups covers WG_TOKENS = 128 activation rows and 8 column groups (a group a warp); each warpgroup issues one
// wgmma.m64n128k16 per block, its A the four warps' decoded weights from registers (the fragment layout is
// mma.m16n8k16's A layout, which wgmma takes per warp), its B the block's activations in shared memory, with a zero
// accumulator (scale-d false), and adds the 64 x 128 block products to its running chunk sums in block order, as
// gemm does; the two warpgroups hide each other's waits. The activations must arrive with each block's elements
// in the fragment layout's K order (FRAGMENT_K_ORDER of fragment_gemm.py: 0, 1, 4, 5, ..., 2, 3, 6, 7, ...),
// so that the mma's logical positions pair the same elements of both operands. A stage: the step's 32 KB of
// activations, then each warp's weight words and scales as gemm stages them. Macros: WG_STAGES (the ring) and
// WG_SWIZZLE, how the activations lie: one of wgmma's K-major canonical layouts (PTX ISA, matrix descriptor;
// CUTLASS's make_gmma_desc), each meant to be read as the same matrix, so a speed choice only (0 has given gemm's
// bits on an H100; 32 and 128 are emulated on the CPU, tests/kernels/test_wgmma_emulation.py, not yet run):
//   0: no swizzle, [block (8)][half (2)][row (128)][16 bytes]: 8-row x 16-byte core matrices, the leading byte
//      offset stepping the halves (along K: benchmarks/wgmma_probe_gpu.py), the stride one the 8-row groups;
//   32: [block (8)][row (128)][32 bytes], the halves swapped in rows 4-7 of every 8 (address bit 4 ^= bit 7);
//   128: [block / 4 (2)][row (128)][128 bytes], 16-byte chunk c of a row at c ^ (row % 8) (bits 4-6 ^= bits
//      7-9), block b's 32 bytes at chunk 2 (b % 4): wgmma starts 32 (b % 4) bytes into the swizzled rows.
// A swizzle is of the shared address, so the ring must start on its 1024-byte period (the kernel traps if not).
#define WG_TOKENS 128
#define WG_WARPS 8
#define WG_X_BYTES (8 * 2 * WG_TOKENS * 16)  // a step's activations: 8 blocks x 2 halves x 128 rows x 16 bytes
#define WG_W_BYTES 1152                      // a warp's weight words (2 quads x 512) and scales (2 x 64) per step
#define WG_STAGE_BYTES (WG_X_BYTES + WG_WARPS * WG_W_BYTES)
static_assert(WG_STAGES * WG_STAGE_BYTES <= 232448 && WG_STAGE_BYTES % 1024 == 0,
              "the ring fits a CTA's shared memory, so every stage's address >> 4 fits the descriptor's 14 bits, and "
              "every stage starts on the swizzle's period");

#if WG_SWIZZLE == 0
#define WG_LAYOUT 0ull                        // the descriptor's layout type
#define WG_LEADING ((8 * 2 * WG_TOKENS) >> 4)  // bytes >> 4: the two halves of a block
#define WG_STRIDE (128 >> 4)                  // the 8-row groups
#elif WG_SWIZZLE == 32
#define WG_LAYOUT 3ull
#define WG_LEADING 1  // unused by a swizzled K-major layout
#define WG_STRIDE (256 >> 4)
#elif WG_SWIZZLE == 128
#define WG_LAYOUT 1ull
#define WG_LEADING 1
#define WG_STRIDE (1024 >> 4)
#else
#error "WG_SWIZZLE is 0, 32 or 128"
#endif

__device__ __forceinline__ unsigned long long wg_descriptor(const void* smem) {
    const u32 address = (u32)__cvta_generic_to_shared(smem);
    return (unsigned long long)((address >> 4) & 0x3FFF) | ((unsigned long long)WG_LEADING << 16) |
           ((unsigned long long)WG_STRIDE << 32) | (WG_LAYOUT << 62);
}

// Where half `half` of block `block` of activation row `row` lies in a stage (bytes), and where block `block`
// starts for the descriptor (bytes >> 4).
__device__ __forceinline__ u32 wg_x_offset(int block, int row, int half) {
#if WG_SWIZZLE == 0
    return ((block * 2 + half) * WG_TOKENS + row) * 16;
#elif WG_SWIZZLE == 32
    return block * (2 * WG_TOKENS * 16) + row * 32 + ((half ^ ((row >> 2) & 1)) << 4);
#else
    return (block / 4) * (8 * WG_TOKENS * 16) + row * 128 + ((((block % 4) * 2 + half) ^ (row & 7)) << 4);
#endif
}
__device__ __forceinline__ constexpr unsigned long long wg_block_start(int block) {
    return WG_SWIZZLE == 128 ? (block / 4) * (8 * WG_TOKENS) + (block % 4) * 2 : block * ((2 * 16 * WG_TOKENS) >> 4);
}

// d = A x B for one block (scale-d false: d's earlier values are not read), issued and waited for; the fences keep
// the compiler from touching d or a before the wgmma has finished with them. (Decoding the next block's A
// between the issue and the wait buys nothing: ptxas gives both A operands the same registers and moves the
// wait up to before the decode.)
__device__ __forceinline__ void wgmma_block(float d[64], u32 a[4], unsigned long long desc) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

extern "C" __global__ void __launch_bounds__(32 * WG_WARPS, 1) nvfp4_fragment_wgmma(
    const Words* __restrict__ w_words, const Pair* __restrict__ w_scales, const float* __restrict__ w_g,
    const u16* __restrict__ x, const float* __restrict__ x_g, out_t* __restrict__ out, int rows_total, int n, int k,
    int groups, int quads) {
    extern __shared__ __align__(1024) unsigned char ring[];  // [WG_STAGES][WG_STAGE_BYTES]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = lane >> 2, c = lane & 3;
    const int row_start = blockIdx.x * WG_TOKENS;
    const int g = blockIdx.y * WG_WARPS + warp;  // this warp's column group
    const bool gok = g < groups;
    const Words* wbase = w_words + (i64)(gok ? g : 0) * quads * 32 + lane;
    const Pair* sbase = w_scales + (i64)(gok ? g : 0) * quads * 8;
    // This thread's activations: one half (16 bytes) of every block of row xrow; a warp's copy covers 16 rows'
    // whole 32-byte sectors. Without a swizzle lanes l and l + 8 take a row's two halves, so that a quarter-warp
    // writes 8 rows' 128 contiguous bytes of a half; with one, lanes 2i and 2i + 1 do, so that a quarter-warp
    // reads whole sectors (4 rows), on rows whose swizzled chunks fall on 8 different 16-byte bank groups.
    static_assert(WG_TOKENS == 16 * WG_WARPS, "each warp stages 16 rows");
#if WG_SWIZZLE == 0
    const int xrow = 16 * warp + (lane & 7) + 8 * (lane >> 4), xhalf = (lane >> 3) & 1;
#elif WG_SWIZZLE == 32
    const int xrow = 16 * warp + 4 * (lane >> 3) + ((lane >> 1) & 3), xhalf = lane & 1;
#else
    const int xrow = 16 * warp + 8 * (lane >> 4) + 2 * ((lane >> 1) & 3) + ((lane >> 3) & 1), xhalf = lane & 1;
#endif
    const bool xok = row_start + xrow < rows_total;
    const u16* xsrc = x + (i64)(xok ? row_start + xrow : 0) * k;
    const bool scale_lane = lane < 16;
    const int sq_i = (lane / 8) % 2;

    const int steps = (quads + 1) / 2;
    // A step's copies; `whole`: the step lies inside K, so only rows past M (and column groups past N) are out of
    // bounds and every source address is a base plus a constant (a last step that ends past K takes the general
    // path).
    auto copies = [&](int step, u32 stage, bool whole) {
        const u16* xstep = xsrc + (i64)step * STEP + xhalf * 8;
#pragma unroll
        for (int block = 0; block < 8; ++block) {
            const bool ok = xok && (whole || step * STEP + block * 16 + xhalf * 8 < k);
            const u32 dst = stage + wg_x_offset(block, xrow, xhalf);
            copy_async16(dst, whole || ok ? xstep + block * 16 : xsrc, ok);
        }
        const u32 wstage = stage + WG_X_BYTES + warp * WG_W_BYTES;
        const Words* wstep = wbase + (i64)step * 64;
#pragma unroll
        for (int qi = 0; qi < 2; ++qi) {
            const bool ok = gok && (whole || 2 * step + qi < quads);
            copy_async16(wstage + (qi * 32 + lane) * 16, whole || ok ? wstep + qi * 32 : wbase, ok);
        }
        if (scale_lane) {
            const bool ok = gok && (whole || 2 * step + sq_i < quads);
            const Pair* src = sbase + lane % 8 + (i64)(2 * step + sq_i) * 8;
            copy_async8(wstage + 1024 + lane * 8, whole || ok ? src : sbase, ok);
        }
    };
    const u32 ring_shared = (u32)__cvta_generic_to_shared(ring);
    if (WG_SWIZZLE && (ring_shared & 1023)) __trap();  // the swizzle's period; stages are whole periods
    auto issue = [&](int step) {
        const u32 stage = ring_shared + (step % WG_STAGES) * WG_STAGE_BYTES;
        if ((step + 1) * STEP <= k)
            copies(step, stage, true);
        else if (step < steps)
            copies(step, stage, false);
        copy_commit();
    };

    float d[64], acc[64], total[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = acc[i] = total[i] = 0.0f;
    const unsigned long long ring_descriptor = wg_descriptor(ring);
    constexpr unsigned long long stage_step = WG_STAGE_BYTES >> 4;

#pragma unroll
    for (int s = 0; s < WG_STAGES - 1; ++s) issue(s);
    for (int step = 0; step < steps; ++step) {
        copy_wait<WG_STAGES - 2>();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async's writes, seen by wgmma
        __syncthreads();
        issue(step + WG_STAGES - 1);
        const int slot = step % WG_STAGES;
        const unsigned char* wstage = ring + slot * WG_STAGE_BYTES + WG_X_BYTES + warp * WG_W_BYTES;
        // The descriptor's address field is the shared address >> 4, so stepping it is adding offsets >> 4 (no
        // carry leaves the 14-bit field: the ring ends below 256 KB, the static_assert above).
        const unsigned long long descriptor = ring_descriptor + slot * stage_step;
#pragma unroll
        for (int qi = 0; qi < 2; ++qi) {
            const Words wq = ((const Words*)wstage)[qi * 32 + lane];
            const Pair sq = ((const Pair*)(wstage + 1024))[qi * 8 + grp];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                u32 a[4];
                decode(wq.w[j], a);
                scale_operands(a, sq, j);
                wgmma_block(d, a, descriptor + wg_block_start(qi * 4 + j));
#pragma unroll
                for (int i = 0; i < 64; ++i) acc[i] = add_rn(acc[i], d[i]);
            }
        }
        if ((2 * step + 2) % CHUNK_QUADS == 0 || step == steps - 1) {
#pragma unroll
            for (int i = 0; i < 64; ++i) {
                total[i] = add_rn(total[i], acc[i]);
                acc[i] = 0.0f;
            }
        }
    }
    if (!gok) return;
    const float gw = w_g[0];
#pragma unroll
    for (int i = 0; i < 64; ++i) {  // register 4t + 2h + e: weight row grp + 8h, activation row 8t + 2c + e
        const int r = row_start + 8 * (i / 4) + 2 * c + (i & 1);
        const int nn = g * 16 + grp + 8 * ((i >> 1) & 1);
        if (r < rows_total && nn < n)
            out[(i64)r * n + nn] = to_out(mul_rn(mul_rn(mul_rn(total[i], 16384.0f), x_g[r]), gw));
    }
}
#endif
