"""The part of SGLang's native HTTP API that Nibble speaks, as pydantic models.

Field names and shapes follow SGLang 0.5.23 (PyPI ``sglang``; read from its wheel, not imported):
``sglang/srt/managers/io_struct.py`` (``GenerateReqInput``, ``PauseGenerationReqInput``,
``ContinueGenerationReqInput``, ``UpdateWeightFromDiskReqInput``), ``sglang/srt/sampling/sampling_params.py``
(``SamplingParams``), ``sglang/srt/entrypoints/http_server.py`` (the routes: ``/generate``,
``/pause_generation``, ``/update_weights_from_disk``, ``/continue_generation``, ``/health_generate``,
``/model_info``, ``/server_info``; ``/get_model_info`` and ``/get_server_info`` are their deprecated names),
``sglang/srt/managers/tokenizer_manager.py`` (a response's ``meta_info``: ``finish_reason``,
``weight_version``, ``output_token_logprobs`` as ``[logprob, token_id, text]`` triples),
``sglang/srt/managers/schedule_batch.py`` (``FINISH_*.to_json``: ``{"type": "stop" | "length" | "abort", …}``)
and ``sglang/srt/utils/weight_versions.py`` (``weight_versions``: the spans of a response generated across a
weight update). Requests forbid unknown fields, so a request using more of SGLang than this subset is
refused naming the field instead of being half served; responses ignore the many fields Nibble does not
read.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SamplingParams(_Request):
    """``sampling_params`` of ``/generate`` (SGLang's defaults; Nibble always sends every field it uses)."""

    max_new_tokens: int = Field(128, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    stop_token_ids: list[int] | None = None
    n: int = Field(1, ge=1, description="samples per prompt; the outputs of one prompt are consecutive")
    sampling_seed: int | None = Field(None, description="seeds this request's sampling (reproducible batches)")


def _batch_or(single: str, batch: str = "batch"):
    """Which form a union field has, decided by its shape, so a bad value gets the errors of that form only
    (a plain union reports why it fits neither)."""

    def tag(value) -> str:
        is_list = isinstance(value, list)
        if single == "prompt":  # input_ids: a batch is a list of lists
            is_list = is_list and bool(value) and isinstance(value[0], list)
        return batch if is_list else single

    return tag


UNION_TAGS = frozenset({"prompt", "batch", "shared", "per_prompt"})
"""Discriminator tags pydantic puts in an error's location; :func:`field_path` leaves them out."""


def field_path(loc: tuple) -> str:
    """An error location as the request's own path (``sampling_params.1.top_k``)."""
    return ".".join(str(part) for part in loc if part not in UNION_TAGS) or "body"


class GenerateRequest(_Request):
    """``POST /generate`` with token ids: one prompt (``input_ids: [int]``) or a batch (``[[int]]``), with one
    ``sampling_params`` for all or one per prompt. Only non-streaming requests (``stream: false``)."""

    input_ids: Annotated[
        Annotated[list[int], Tag("prompt")] | Annotated[list[list[int]], Tag("batch")],
        Discriminator(_batch_or("prompt")),
    ]
    sampling_params: Annotated[
        Annotated[SamplingParams, Tag("shared")] | Annotated[list[SamplingParams], Tag("per_prompt")],
        Discriminator(_batch_or("shared", batch="per_prompt")),
    ] = SamplingParams()
    return_logprob: bool = False
    stream: Literal[False] = False
    rid: str | list[str] | None = None
    # sglang-router 0.3.2 re-serialises every request with these GenerateReqInput fields at SGLang's
    # defaults; they are accepted at those values only (a Nibble sampler computes none of what they ask for),
    # and the bookkeeping ones (model, log_metrics, no_logs) with any value
    model: str | None = None
    log_metrics: bool = True
    no_logs: bool = False
    return_text_in_logprobs: Literal[False] = False
    return_hidden_states: Literal[False] = False
    background: Literal[False] = False
    return_bytes: Literal[False] = False
    return_entropy: Literal[False] = False

    @property
    def is_batch(self) -> bool:
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    def prompts(self) -> list[list[int]]:
        return list(self.input_ids) if self.is_batch else [list(self.input_ids)]

    def params(self) -> list[SamplingParams]:
        """One :class:`SamplingParams` per prompt."""
        if isinstance(self.sampling_params, list):
            return list(self.sampling_params)
        return [self.sampling_params] * len(self.prompts())

    @model_validator(mode="after")
    def _one_params_per_prompt(self) -> GenerateRequest:
        if not self.input_ids:
            raise ValueError("input_ids: at least one token is needed")
        if self.is_batch and any(not p for p in self.input_ids):
            raise ValueError("input_ids: every prompt needs at least one token")
        if isinstance(self.sampling_params, list):
            if not self.is_batch:
                raise ValueError("sampling_params: a list needs a batch of input_ids ([[int]])")
            if len(self.sampling_params) != len(self.input_ids):
                raise ValueError(
                    f"sampling_params: {len(self.sampling_params)} entries for {len(self.input_ids)} prompts"
                )
        return self


class FinishReason(_Response):
    """Why a response ended: ``stop`` (``matched`` the stop token), ``length`` (``max_new_tokens``) or
    ``abort`` (``message``: the server dropped it, e.g. paused in ``abort`` mode)."""

    type: Literal["stop", "length", "abort"]
    matched: int | str | list[int] | None = None
    length: int | None = None
    message: str | None = None


class WeightVersionSpan(_Response):
    """Output tokens ``[start, end)`` generated under weights ``version``."""

    version: str
    start: int
    end: int


class MetaInfo(_Response):
    id: str | None = None
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    weight_version: str | None = Field(None, description="the server's weight version when the response ended")
    weight_versions: list[WeightVersionSpan] | None = Field(
        None, description="present when weights changed while the response was generated (one span per version)"
    )
    output_token_logprobs: list[tuple[float, int, str | None]] | None = Field(
        None, description="with return_logprob: [logprob, token_id, text or null] per output token"
    )


class GenerateOutput(_Response):
    """One response of ``/generate`` (a batch request returns a list of these, prompt by prompt, ``n`` each)."""

    text: str | None = None
    output_ids: list[int] = Field(default_factory=list)
    meta_info: MetaInfo


class PauseGenerationRequest(_Request):
    """``POST /pause_generation``. ``abort`` returns every request in flight as aborted; ``retract`` and
    ``in_place`` keep them and would finish them under the new weights."""

    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueGenerationRequest(_Request):
    """``POST /continue_generation`` (an empty body: SGLang's defaults)."""


class UpdateWeightsFromDiskRequest(_Request):
    """``POST /update_weights_from_disk``: load ``model_path`` (a checkpoint directory the server can read)
    in place and report ``weight_version`` from then on."""

    model_path: str
    weight_version: str | None = None
    load_format: str | None = None
    abort_all_requests: bool = False


class UpdateWeightsFromDiskResponse(_Response):
    success: bool
    message: str = ""
    num_paused_requests: int | None = 0


class ModelInfo(_Response):
    """``GET /model_info``."""

    model_path: str | None = None
    is_generation: bool = True
    weight_version: str | None = None


class ServerInfo(_Response):
    """``GET /server_info``: the server's resolved launch arguments; Nibble reads ``quantization``."""

    quantization: str | None = None
    version: str | None = None
