"""SGLang interoperability: the engine that drives an SGLang server, and the endpoint that serves a Nibble
sampler under SGLang's ``/generate``."""

from nibble.sampler.sglang.endpoint import GenerateEndpoint
from nibble.sampler.sglang.engine import (
    SGLangEngine,
    SGLangError,
    SGLangTimeout,
    SGLangUnavailable,
    VersionMismatch,
)

__all__ = [
    "GenerateEndpoint",
    "SGLangEngine",
    "SGLangError",
    "SGLangTimeout",
    "SGLangUnavailable",
    "VersionMismatch",
]
