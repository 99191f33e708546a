"""KL estimators.

Source: J. Schulman, *Approximating KL Divergence* (2020, joschu.net/blog/kl-approx.html). With samples
``x ~ q`` and ``d = log p(x) − log q(x)``, ``k3 = exp(d) − d − 1`` is an unbiased, always non-negative
estimate of ``KL(q ‖ p)``. The RL loss penalises ``KL(π_θ ‖ π_ref)`` with ``d = π_ref − π_θ``; the
mismatch metric estimates ``KL(μ ‖ π_old)`` with ``d = π_old − μ``.
"""

from __future__ import annotations

import torch

# |d| beyond this is clamped before exp (float64): e^80 ≈ 5.5e34, finite in float32 with room to spare.
# Only a log-ratio over 80 nats is affected, where the estimate is meaningless anyway; the clamp keeps the
# value finite and passes no gradient there.
K3_LOG_RATIO_LIMIT = 80.0


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp(d) − d − 1`` elementwise for ``d = log p − log q`` (any shape, any floating dtype).

    ``d`` is clamped to ``[−80, 80]`` first, so ``±inf`` gives a finite value and no gradient; NaN stays NaN.
    """
    d = log_ratio.clamp(-K3_LOG_RATIO_LIMIT, K3_LOG_RATIO_LIMIT)
    return d.exp() - d - 1.0
