"""What every config section shares: unknown keys refused, values frozen, and the device types."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from nibble.config import devices

Device = Annotated[str, AfterValidator(lambda v: devices.check("device", v))]
"""``cpu``, ``cuda`` or ``cuda:N`` (physical GPU N; see :mod:`nibble.config.devices`)."""
MemoryFraction = Annotated[float | None, Field(None, gt=0, le=1)]


class Section(BaseModel):
    """A config section: an unknown or misspelt key fails naming it, and values never change after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)
