"""Weight transport's interface (docs/design.md §5): how the trainer publishes a policy version and a sampler
learns of and fetches one, whatever carries them. :mod:`nibble.transport.weights.publisher` and
:mod:`nibble.transport.weights.subscriber` implement it over gRPC, through the weight-sync service.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from nibble.wire import pb

if TYPE_CHECKING:
    import torch

    from nibble.recipe.plan import PrecisionPlan


class VersionUnavailable(LookupError):
    """The version asked for is not held (rotated out of the store, or never complete): a newer one will be
    announced, so the sampler skips it."""


class FetchFailed(RuntimeError):
    """A fetch that transport cut short once its own retries were spent (the source unreachable, refused,
    or stalled): nothing was applied, and the same version may be fetched again later."""


class WeightPublisher(Protocol):
    """The trainer's side: publishes each policy version."""

    def latest_version(self) -> int:
        """The newest version held downstream (0 when none), so a resumed trainer continues above it."""
        ...

    def publish(self, version: int, state: dict[str, torch.Tensor], plan: PrecisionPlan) -> pb.PublishReply:
        """Send ``state`` (bf16 tensors by name) as ``version`` and wait until it is verified and stored."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


class WeightSubscriber(Protocol):
    """A sampler's side: learns of new policy versions and fetches them, verified."""

    def latest_version(self) -> int:
        """The newest version held (0 when none)."""
        ...

    def watch(self, after_version: int = 0) -> Iterator[pb.VersionAnnouncement]:
        """Announcements of complete versions above ``after_version``, each once and in increasing order,
        until :meth:`close`."""
        ...

    def fetch(self, version: int) -> tuple[pb.WeightManifest, dict[str, torch.Tensor]]:
        """The verified manifest and (quantised) tensors of ``version``.

        Raises:
            WeightRejected: the version failed verification; nothing of it may be applied.
            VersionUnavailable: the version is not held (skip it; a newer one comes).
            FetchFailed: transport failed after its retries (try again later).
        """
        ...

    def close(self) -> None:
        """Release the connection; a running :meth:`watch` returns."""
        ...
