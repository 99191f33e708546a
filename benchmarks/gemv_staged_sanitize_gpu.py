"""One launch of each staged gemv tile (``fragment_gemm.STAGED_GEMV_TILES``) on small dense products, for
``compute-sanitizer``'s race and barrier checks: uneven chunk counts per warp (K = 1280, 704), rows past the
tile, one-row and multi-group CTAs. Each output is also compared with the gemm kernel's bits. Run on the GPU
machine, once per tool (racecheck, synccheck):

    compute-sanitizer --tool racecheck --kernel-name kns=nvfp4_fragment_gemv \
        python -m benchmarks.gemv_staged_sanitize_gpu
"""

from __future__ import annotations

import torch

from benchmarks.gemm_backends_gpu import packed_activations, packed_weights
from nibble.kernels.gpu import fragment_gemm
from nibble.kernels.gpu import gemm as gpu_gemm

CASES = ((512, 2048, 8), (1536, 1280, 3), (256, 704, 16), (4096, 2048, 1))  # (N, K, M)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gemv_staged_sanitize_gpu.py needs a CUDA GPU")
    torch.manual_seed(0)
    wrong = 0
    for n, k, m in CASES:
        (qw,) = packed_weights(n, k, copies=1)
        qx = packed_activations(m, k)
        expected = gpu_gemm.fragment_matmul(qx, qw, torch.bfloat16, gemv=False)
        for tile in fragment_gemm.STAGED_GEMV_TILES:
            if tile[0] < m or not fragment_gemm.tile_fits(tile, k, qw.codes.device):
                continue
            same = torch.equal(gpu_gemm.fragment_matmul(qx, qw, torch.bfloat16, gemv=True, tile=tile), expected)
            wrong += not same
            print(f"{n}x{k} M={m} tile {tile}: same bits {same}", flush=True)
    if wrong:
        raise SystemExit(f"{wrong} staged launches differ from the gemm kernel")


if __name__ == "__main__":
    main()
