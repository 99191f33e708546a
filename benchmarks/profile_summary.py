"""Where one trainer step's time goes, from a ``torch.profiler`` recording, by category.

Every profiled op that ran work itself (kernels it launched on CUDA, its own CPU time on the CPU) is put
in the first category that its name or an enclosing range's name matches, innermost first:

- ``fsdp_all_gather`` / ``fsdp_reduce_scatter``: FSDP2's collectives and their copy-in/out kernels
  (names holding ``all_gather``/``allgather`` or ``reduce_scatter``/``reducescatter``);
- ``other_collectives``: any other c10d/NCCL/gloo op: the loss and gradient-norm all-reduces, broadcasts;
- ``backward``: the autograd engine's ops (``autograd::engine::...``) and the ``trainer.backward`` range;
- ``optimizer``: ``Optimizer.step`` and the ``trainer.optimizer`` range (gradient clipping included);
- ``forward``: π_θ's forward and loss (``trainer.forward``); ``old_policy``: π_old's scoring;
- ``other``: the rest (moving the batch, advantages).

On CUDA the collectives run on their own streams beside the compute, so category times may add up to
more than the step; ``gpu_busy`` is the union of all kernel intervals and ``host_gaps`` the step's wall
time when no kernel ran (the GPU waiting on Python, launches or host synchronisations).
"""

from __future__ import annotations

from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

CATEGORIES = (
    "forward",
    "old_policy",
    "backward",
    "optimizer",
    "fsdp_all_gather",
    "fsdp_reduce_scatter",
    "other_collectives",
    "other",
)
_RULES = (
    (("all_gather", "allgather"), "fsdp_all_gather"),
    (("reduce_scatter", "reducescatter"), "fsdp_reduce_scatter"),
    (("all_reduce", "allreduce", "c10d::", "nccl:", "gloo:"), "other_collectives"),
    (("autograd::engine", "trainer.backward"), "backward"),
    (("optimizer.step", "trainer.optimizer"), "optimizer"),
    (("trainer.forward",), "forward"),
    (("trainer.old_policy",), "old_policy"),
)


def category(event: FunctionEvent) -> str:
    """The category of ``event``: the first rule matched by its name, then by each enclosing range's."""
    node = event
    while node is not None:
        name = node.name.lower()
        for needles, label in _RULES:
            if any(needle in name for needle in needles):
                return label
        node = node.cpu_parent
    return "other"


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summarize(events: list[FunctionEvent], wall_seconds: float, cuda: bool) -> dict[str, float]:
    """Seconds per category for one profiled step (``events``: ``profiler.events()``).

    Args:
        events: the recording's events, CPU ops with their device time, and on CUDA the kernels.
        wall_seconds: the step's wall time (synchronised before and after).
        cuda: whether to count kernel time (CUDA) or CPU self time (a CPU run).
    Returns:
        ``{category: seconds}`` for :data:`CATEGORIES`, plus ``wall``, and on CUDA ``gpu_busy`` and
        ``host_gaps`` (NaN when the recording holds no kernel intervals).
    """
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    kernels = []
    for event in events:
        if event.device_type == DeviceType.CPU:
            spent = event.self_device_time_total if cuda else event.self_cpu_time_total
            seconds[category(event)] += spent / 1e6
        else:
            kernels.append((event.time_range.start, event.time_range.end))
    seconds["wall"] = wall_seconds
    if cuda:
        busy = _union_us(kernels) / 1e6 if kernels else float("nan")
        seconds["gpu_busy"] = busy
        seconds["host_gaps"] = max(wall_seconds - busy, 0.0) if kernels else float("nan")
    return seconds


def table(seconds: dict[str, float]) -> str:
    """The summary as text lines: seconds and share of the step's wall time per category."""
    wall = seconds["wall"]
    lines = [f"{'category':22s} {'seconds':>9s} {'of step':>8s}"]
    for name, value in seconds.items():
        lines.append(f"{name:22s} {value:9.4f} {value / wall:8.1%}")
    return "\n".join(lines)
