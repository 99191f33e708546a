"""Run configuration: one pydantic model per service plus the run's composite, from YAML + environment.

Every model forbids unknown keys, so a misspelt or renamed key fails loudly, naming it. Environment
variables override YAML values: ``NIBBLE_TRAINER__LEARNING_RATE=1e-4`` sets ``trainer.learning_rate``
(``nibble.config.env``: every ``NIBBLE_*`` variable applies or fails, naming itself). Secrets (tokens, passwords) are
never values here, only the files or environment variables they are read from.

Modules: one per section (``model``, ``task``, ``stream``, ``weightsync``, ``sampler``, ``trainer``), ``run``
composing them into :class:`RunConfig`, ``loading`` (YAML + environment), ``env`` (the ``NIBBLE_*``
overrides), ``devices`` (the ``device`` setting) and ``base`` (what every section shares).
"""

from nibble.config.base import Device, MemoryFraction, Section
from nibble.config.loading import load, load_with_overrides
from nibble.config.model import ModelSection, PlanConfig
from nibble.config.run import RunConfig
from nibble.config.sampler import SamplerConfig
from nibble.config.stream import RedisConfig
from nibble.config.task import TaskConfig
from nibble.config.trainer import TrainerConfig
from nibble.config.weightsync import WeightSyncConfig

__all__ = [
    "Device",
    "MemoryFraction",
    "ModelSection",
    "PlanConfig",
    "RedisConfig",
    "RunConfig",
    "SamplerConfig",
    "Section",
    "TaskConfig",
    "TrainerConfig",
    "WeightSyncConfig",
    "load",
    "load_with_overrides",
]
