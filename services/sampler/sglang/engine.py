"""``sampler.engine: sglang``: Nibble's :class:`~nibble.sampler.engine.Engine` driven against an SGLang server
over its native HTTP API (:mod:`nibble.sampler.sglang.protocol`).

Weights: SGLang loads each version from disk (``/update_weights_from_disk``), from the directory weight-sync
exports for it (``weightsync.export_format``: ``<export_dir>/v<version, 20 digits>/``), which must be
readable at the same path by the server. The version Nibble stamps on a group is the one the server
reports in every response's ``meta_info.weight_version``; a batch in which any response reports another
version, or was generated across a weight update (``weight_versions`` with more than one span), is refused
whole (docs/design.md §5: a batch's tokens all come from one ``policy_version``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import requests
from pydantic import ValidationError

from nibble.interop import version_dir
from nibble.sampler.engine import Engine, EngineUnavailable, Sample
from nibble.sampler.sglang import protocol as api

log = logging.getLogger(__name__)

QUANTIZATION_FOR_EXPORT = {
    "compressed-tensors": ("compressed-tensors",),
    "modelopt": ("modelopt_fp4", "modelopt"),
}
"""SGLang ``--quantization`` values that load each ``weightsync.export_format`` as NVFP4 (SGLang's
``QUANTIZATION_CHOICES``, ``sglang/srt/arg_groups/choices.py``)."""

RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS = 0.1, 5.0
"""A 503 or a refused connection is retried after 0.1 s, doubling to at most 5 s between tries."""


class SGLangError(RuntimeError):
    """The server answered something Nibble cannot use (an HTTP error, an aborted or malformed response)."""


class SGLangUnavailable(SGLangError, EngineUnavailable):
    """The server kept answering 503 or refusing connections for ``sampler.sglang_retry_seconds``."""


class SGLangTimeout(SGLangError, EngineUnavailable):
    """The server accepted a request but did not answer within ``sampler.sglang_timeout_seconds``."""


class VersionMismatch(SGLangError):
    """A response reports weights other than the engine's ``policy_version``: the batch is refused."""


class SGLangEngine(Engine):
    """One SGLang server as a Nibble engine.

    Args:
        url: the server's base URL (``http://host:port``).
        export_dir: weight-sync's ``export_dir``, as the server sees it.
        export_format: weight-sync's ``export_format`` (decides which server quantisation is accepted).
        timeout_seconds: read timeout of every request (a whole batch's generation must fit in it).
        connect_timeout_seconds: TCP connect timeout.
        retry_seconds: how long 503s and refused connections are retried before giving up.
        session: the HTTP session (tests pass their own).
    """

    loads_from_disk = True

    def __init__(
        self,
        url: str,
        *,
        export_dir: Path,
        export_format: str,
        timeout_seconds: float = 600.0,
        connect_timeout_seconds: float = 5.0,
        retry_seconds: float = 60.0,
        session: requests.Session | None = None,
    ):
        if export_format not in QUANTIZATION_FOR_EXPORT:
            raise ValueError(
                f"weightsync.export_format={export_format!r}: sampler.engine=sglang loads every version from "
                f"weight-sync's export; use one of {sorted(QUANTIZATION_FOR_EXPORT)}"
            )
        self.url = url.rstrip("/")
        self.export_dir, self.export_format = Path(export_dir), export_format
        self.timeout = (connect_timeout_seconds, timeout_seconds)
        self.retry_seconds = retry_seconds
        self.session = session or requests.Session()
        self.policy_version = -1  # set by connect() from what the server reports
        self._paused = False

    # -- start-up ------------------------------------------------------------------------------------

    def connect(self, startup_seconds: float = 600.0) -> SGLangEngine:
        """Wait for the server to generate, then check it: its quantisation must load weight-sync's export
        format as NVFP4, and its ``weight_version`` must be a Nibble version (an integer ≥ 0).

        Raises:
            SGLangUnavailable: the server did not pass ``/health_generate`` within ``startup_seconds``.
            ValueError: the server's quantisation or weight version disagrees (the message says how to launch it).
        """
        self._call("GET", "/health_generate", None, retry_seconds=startup_seconds)  # 200 with an empty body
        self.check_quantization(self.server_info().quantization)
        self.policy_version = self._reported_version(self.model_info().weight_version)
        log.info("SGLang server %s: weight_version %d", self.url, self.policy_version)
        return self

    def check_quantization(self, quantization: str | None) -> None:
        """Raises ValueError unless ``quantization`` loads weight-sync's export as NVFP4."""
        accepted = QUANTIZATION_FOR_EXPORT[self.export_format]
        if quantization not in accepted:
            raise ValueError(
                f"sampler.engine=sglang: the SGLang server at {self.url} runs with quantization={quantization!r}, "
                f"but the precision plan samples in NVFP4 from weightsync.export_format={self.export_format!r}; "
                f"launch it with --quantization {accepted[0]}"
            )

    def _reported_version(self, reported: str | None) -> int:
        if reported is None or not reported.isdigit():
            raise ValueError(
                f"sampler.engine=sglang: the SGLang server at {self.url} reports weight_version={reported!r}, which "
                "is no Nibble policy version; launch it on the warm start with --weight-version 0 (or on an export "
                "v<N>/ with --weight-version N)"
            )
        return int(reported)

    def model_info(self) -> api.ModelInfo:
        """``GET /model_info`` (``/get_model_info`` on servers older than its rename)."""
        return api.ModelInfo.model_validate(self._get_either("/model_info", "/get_model_info"))

    def server_info(self) -> api.ServerInfo:
        """``GET /server_info`` (``/get_server_info`` on older servers)."""
        return api.ServerInfo.model_validate(self._get_either("/server_info", "/get_server_info"))

    # -- the Engine interface ------------------------------------------------------------------------

    def generate(self, prompts, *, n, max_new_tokens, temperature, top_p, stop_tokens, seed):
        """One ``/generate`` batch of ``len(prompts) × n`` rows, each with its own seed (SGLang's ``n`` would
        give every copy of a prompt the same seed, hence the same sample).

        Raises:
            RuntimeError: while paused. SGLangError (a RuntimeError): an HTTP error, an aborted or malformed
                response; VersionMismatch when any response reports weights other than ``policy_version``;
                SGLangTimeout, SGLangUnavailable.
        """
        if self._paused:
            raise RuntimeError("engine is paused (weights are being updated)")
        rows = [list(p) for p in prompts for _ in range(n)]
        params = [
            api.SamplingParams(
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                stop_token_ids=list(stop_tokens),
                sampling_seed=(seed * 1_000_003 + i) % 2**31,
            )
            for i in range(len(rows))
        ]
        request = api.GenerateRequest(input_ids=rows, sampling_params=params, return_logprob=True)
        body = self._post("/generate", request)
        if not isinstance(body, list) or len(body) != len(rows):
            raise SGLangError(f"/generate answered {type(body).__name__} for a batch of {len(rows)} rows")
        samples = [self._sample(self._output(item)) for item in body]
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def pause(self) -> None:
        """``/pause_generation`` in ``abort`` mode: nothing of this engine is in flight between batches, and a
        foreign request must not run on across the update (it would mix versions)."""
        self._post("/pause_generation", api.PauseGenerationRequest(mode="abort"))
        self._paused = True

    def update_weights(self, version: int, state=None) -> None:
        """Point the server at weight-sync's export of ``version`` (``state`` is not used: the server reads
        the directory) and adopt ``version`` once the server reports it.

        Raises:
            RuntimeError: when not paused. ValueError: the export is missing, the server refused to load it
                (it keeps its weights), or it reports another version afterwards. SGLangUnavailable,
                SGLangTimeout: the server is away (nothing known about its weights).
        """
        if not self._paused:
            raise RuntimeError("update_weights needs a paused engine")
        path = version_dir(self.export_dir, version)
        if not path.is_dir():
            raise ValueError(f"version {version}: no export at {path} (weightsync.export_dir)")
        request = api.UpdateWeightsFromDiskRequest(model_path=str(path), weight_version=str(version))
        reply = self._call("POST", "/update_weights_from_disk", request, accept=(200, 400))
        outcome = api.UpdateWeightsFromDiskResponse.model_validate(reply.json())
        if not outcome.success:
            raise ValueError(f"the SGLang server at {self.url} did not load {path}: {outcome.message}")
        reported = self.model_info().weight_version
        if reported != str(version):
            raise ValueError(f"the SGLang server at {self.url} loaded {path} but reports weight_version={reported!r}")
        self.policy_version = version

    def resume(self) -> None:
        self._post("/continue_generation", api.ContinueGenerationRequest())
        self._paused = False

    # -- responses -----------------------------------------------------------------------------------

    def _output(self, item) -> api.GenerateOutput:
        try:
            return api.GenerateOutput.model_validate(item)
        except ValidationError as exc:
            raise SGLangError(f"/generate answered a response Nibble cannot read: {exc}") from None

    def _sample(self, out: api.GenerateOutput) -> Sample:
        """The :class:`Sample` of one response, after checking its version, finish reason and logprobs."""
        meta = out.meta_info
        reported = [span.version for span in meta.weight_versions or []] or [meta.weight_version]
        if reported != [str(self.policy_version)]:
            raise VersionMismatch(
                f"response {meta.id} reports weight version(s) {reported}, the engine serves {self.policy_version}: "
                "the batch is refused (its tokens must all come from one policy version)"
            )
        reason = meta.finish_reason
        if reason is None or reason.type == "abort":
            raise SGLangError(f"response {meta.id} did not finish: {reason.message if reason else 'no finish_reason'}")
        if meta.output_token_logprobs is None:
            raise SGLangError(f"response {meta.id} has no output_token_logprobs (return_logprob was sent)")
        tokens = [token for _, token, _ in meta.output_token_logprobs]
        if out.output_ids not in (tokens, tokens[:-1]):  # some servers leave the matched stop token out
            raise SGLangError(f"response {meta.id}: output_ids disagree with the tokens of output_token_logprobs")
        return Sample(tokens, [logprob for logprob, _, _ in meta.output_token_logprobs], reason.type)

    # -- HTTP ----------------------------------------------------------------------------------------

    def _get_either(self, path: str, old_path: str):
        reply = self._call("GET", path, None, accept=(200, 404))
        if reply.status_code == 404:
            reply = self._call("GET", old_path, None)
        return reply.json()

    def _post(self, path: str, body):
        return self._call("POST", path, body).json()

    def _call(self, method, path, body, *, accept=(200,), retry_seconds=None) -> requests.Response:
        """Send one request, retrying 503s and refused connections with backoff for ``retry_seconds``
        (default ``self.retry_seconds``).

        Raises:
            SGLangUnavailable, SGLangTimeout; SGLangError for a status outside ``accept``.
        """
        url, payload = self.url + path, None if body is None else body.model_dump(exclude_none=True)
        started = time.monotonic()
        deadline = started + (self.retry_seconds if retry_seconds is None else retry_seconds)
        delay = RETRY_FIRST_SECONDS
        while True:
            try:
                reply = self.session.request(method, url, json=payload, timeout=self.timeout)
            except requests.ReadTimeout:
                raise SGLangTimeout(f"{method} {url}: no answer within {self.timeout[1]} s") from None
            except requests.ConnectionError as exc:  # refused or connect timeout: the server may be restarting
                why = f"cannot connect ({type(exc).__name__})"
            else:
                if reply.status_code != 503:
                    break
                why = "503 Service Unavailable"
            if time.monotonic() + delay > deadline:
                waited = time.monotonic() - started
                raise SGLangUnavailable(f"{method} {url}: {why}, still after retrying for {waited:.1f} s")
            log.debug("%s %s: %s; retrying in %.1f s", method, url, why, delay)
            time.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_SECONDS)
        if reply.status_code not in accept:
            raise SGLangError(f"{method} {url}: HTTP {reply.status_code}: {reply.text[:500]}")
        return reply
