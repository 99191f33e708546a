"""A Nibble sampler's engine behind SGLang's ``/generate`` (``sampler.http_port``), so SGLang's router — or
any client of SGLang's native API — can send it requests (:mod:`nibble.sampler.sglang.protocol`'s subset).

Routes: ``POST /generate`` (token ids in, tokens, logprobs, finish reason and ``weight_version`` out),
``GET /health`` and ``/health_generate``, ``GET /model_info`` and ``/server_info`` (with their older
``/get_*`` names). Every response of one request comes from one policy version, which it reports.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import ValidationError

from nibble.sampler.engine import Engine, Sample
from nibble.sampler.sglang import protocol as api

log = logging.getLogger(__name__)

VERSION_RETRIES = 3
"""A batch during which the engine swapped weights is generated again this many times before a 503."""


class GenerateEndpoint:
    """Serves ``engine`` on ``host:port`` (0: any free port) in a background thread.

    Args:
        engine: the sampler's engine (shared with its RL loop; the engine serialises the two).
        model_path: what ``/model_info`` reports as ``model_path`` (the checkpoint the sampler loaded).
        quantization: what ``/server_info`` reports (``None`` for Nibble's own NVFP4, which no SGLang
            ``--quantization`` names).
        decode: token ids → text for a response's ``text`` (``""`` without one).
    """

    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model_path: str = "",
        quantization: str | None = None,
        decode: Callable[[list[int]], str] | None = None,
    ):
        self.engine, self.model_path, self.quantization = engine, model_path, quantization
        self.decode = decode or (lambda tokens: "")
        self.requests_served = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="generate-api", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> GenerateEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- routes --------------------------------------------------------------------------------------

    def model_info(self) -> dict:
        return {"model_path": self.model_path, "is_generation": True, "weight_version": str(self.engine.policy_version)}

    def server_info(self) -> dict:
        return {"quantization": self.quantization, "version": "nibble"}

    def generate(self, request: api.GenerateRequest) -> dict | list[dict]:
        """The outputs of ``request`` (a dict for one prompt and one sample, else a list, prompt by prompt).

        Raises:
            RuntimeError: the engine is paused, or swapped weights during every try (answered with 503).
        """
        for _ in range(VERSION_RETRIES):
            version = self.engine.policy_version
            pairs = zip(request.prompts(), request.params(), strict=True)
            groups = [self._one_prompt(prompt, params) for prompt, params in pairs]
            if self.engine.policy_version == version:  # else some rows may be of the newer weights
                break
        else:
            raise RuntimeError("the sampler swapped weights during every try")
        outputs = [
            self._output(prompt, sample, version, request.return_logprob)
            for prompt, group in zip(request.prompts(), groups, strict=True)
            for sample in group
        ]
        with self._lock:
            self.requests_served += 1
        single = not request.is_batch and len(outputs) == 1
        return outputs[0] if single else outputs

    def _one_prompt(self, prompt: list[int], params: api.SamplingParams) -> list[Sample]:
        """``params.n`` samples of ``prompt`` alone, so they depend on its own seed only (as in SGLang), not on
        which other prompts share the request."""
        seed = params.sampling_seed if params.sampling_seed is not None else random.getrandbits(31)
        return self.engine.generate(
            [prompt],
            n=params.n,
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop_tokens=params.stop_token_ids or [],
            seed=seed,
        )[0]

    def _output(self, prompt: list[int], sample: Sample, version: int, logprobs: bool) -> dict:
        if sample.finish_reason == "stop":
            reason = {"type": "stop", "matched": sample.tokens[-1] if sample.tokens else None}
        else:
            reason = {"type": "length", "length": len(sample.tokens)}
        meta = {
            "finish_reason": reason,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(sample.tokens),
            "weight_version": str(version),
        }
        if logprobs:
            pairs = zip(sample.logprobs, sample.tokens, strict=True)
            meta["output_token_logprobs"] = [[logprob, token, None] for logprob, token in pairs]
        return {"text": self.decode(sample.tokens), "output_ids": list(sample.tokens), "meta_info": meta}


def _handler(endpoint: GenerateEndpoint) -> type[BaseHTTPRequestHandler]:
    gets = {
        "/health": lambda: None,
        "/health_generate": lambda: None,
        "/model_info": endpoint.model_info,
        "/get_model_info": endpoint.model_info,
        "/server_info": endpoint.server_info,
        "/get_server_info": endpoint.server_info,
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the router and Nibble's client reuse connections

        def do_GET(self):
            route = gets.get(self.path.split("?")[0])
            if route is None:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"{self.path}: not served by a Nibble sampler"})
                return
            self._send(HTTPStatus.OK, route())

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.split("?")[0] != "/generate":
                self._send(HTTPStatus.NOT_FOUND, {"error": f"{self.path}: a Nibble sampler serves only /generate"})
                return
            try:
                request = api.GenerateRequest.model_validate_json(body)
            except ValidationError as exc:
                self._send(HTTPStatus.BAD_REQUEST, {"error": _describe(exc)})
                return
            try:
                self._send(HTTPStatus.OK, endpoint.generate(request))
            except RuntimeError as exc:  # paused for a weight swap, or swapping: the client retries
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)})
            except Exception as exc:
                log.exception("/generate failed")
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})

        do_PUT = do_POST  # SGLang's /generate takes PUT too

        def _send(self, status: HTTPStatus, payload) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):  # requests are routine; errors are logged where they happen
            log.debug("%s " + format, self.client_address[0], *args)

    return Handler


def _describe(exc: ValidationError) -> str:
    """One line per problem, naming the field (``sampling_params.0.top_k: Extra inputs are not permitted``)."""
    return "; ".join(f"{api.field_path(e['loc'])}: {e['msg']}" for e in exc.errors())
