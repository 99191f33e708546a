"""A kernel that Triton's interpreter runs and its compiler rejects, for ``test_hopper_build``: ``c`` is a
constexpr loop variable of the first loop and a tensor assigned in the second (the bug that once reached
the quantiser)."""

import triton
import triton.language as tl


@triton.jit
def faulty_kernel(x_ptr, N: tl.constexpr):
    total = tl.zeros((16,), dtype=tl.float32)
    for c in tl.static_range(N):
        total += tl.load(x_ptr + c * 16 + tl.arange(0, 16))
    for i in tl.range(0, N):
        c = i * 2
        tl.store(x_ptr + c * 16 + tl.arange(0, 16), total)
