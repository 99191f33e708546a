"""A stand-in SGLang server for the SGLang engine's tests: the documented subset of SGLang's native HTTP API
(``/generate`` with token ids and logprobs, ``/pause_generation``, ``/update_weights_from_disk``,
``/continue_generation``, ``/health_generate``, ``/model_info``, ``/server_info``), with knobs for the faults
the engine must survive or refuse. Written from SGLang 0.5.23's ``http_server.py`` and ``io_struct.py``
with plain dicts — deliberately not with Nibble's own protocol models, so a wrong model fails here.
"""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class FakeSGLang:
    """Serves on a free loopback port until :meth:`stop`; ``log`` holds ``(method, path, body)`` per request.

    Knobs (set any time): ``quantization``; ``weight_version``; ``unavailable`` (answer the next N requests
    503); ``starting`` (answer the next N health checks 503); ``generate_delay`` (seconds before /generate
    answers); ``report_version`` (a weight version /generate reports instead of the real one);
    ``split_versions`` (report two weight-version spans, as a response generated across an update);
    ``abort`` (finish every response as aborted); ``old_routes`` (only ``/get_model_info`` and
    ``/get_server_info``, as SGLang before their rename); ``update_seconds`` (an update takes this long, and
    /generate answers 503 meanwhile).
    """

    def __init__(self, *, quantization: str | None = "compressed-tensors", weight_version: str = "0"):
        self.quantization, self.weight_version = quantization, weight_version
        self.unavailable = self.starting = 0
        self.generate_delay = self.update_seconds = 0.0
        self.report_version: str | None = None
        self.split_versions = self.abort = self.old_routes = False
        self.paused = self.updating = False
        self.log: list[tuple[str, str, object]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def calls(self, path: str) -> list[object]:
        return [body for _, p, body in self.log if p == path]

    # -- routes: (status, payload) -------------------------------------------------------------------

    def route(self, method: str, path: str, body) -> tuple[int, object]:
        with self._lock:
            self.log.append((method, path, body))
            if self.unavailable:
                self.unavailable -= 1
                return 503, None
        if path in ("/health", "/health_generate"):
            if self.starting:
                self.starting -= 1
                return 503, None
            return 200, None
        handler = {
            ("GET", "/model_info"): self.model_info,
            ("GET", "/get_model_info"): self.model_info,
            ("GET", "/server_info"): self.server_info,
            ("GET", "/get_server_info"): self.server_info,
            ("POST", "/generate"): self.generate,
            ("POST", "/pause_generation"): self.pause,
            ("POST", "/continue_generation"): self.resume,
            ("POST", "/update_weights_from_disk"): self.update,
        }.get((method, path))
        if handler is None or (self.old_routes and path in ("/model_info", "/server_info")):
            return 404, {"detail": "Not Found"}
        return handler(body)

    def model_info(self, _):
        return 200, {"model_path": "/models/start", "is_generation": True, "weight_version": self.weight_version}

    def server_info(self, _):
        return 200, {"quantization": self.quantization, "version": "0.5.23", "tp_size": 1}

    def pause(self, body):
        self.paused = True
        return 200, {"message": "Generation paused successfully.", "status": "ok"}

    def resume(self, body):
        self.paused = False
        return 200, {"message": "Generation continued successfully.", "status": "ok"}

    def update(self, body):
        path = Path(body["model_path"])
        if not (path / "config.json").is_file():
            return 400, {"success": False, "message": f"no config.json in {path}", "num_paused_requests": 0}
        self.updating = True
        time.sleep(self.update_seconds)
        self.weight_version = body.get("weight_version") or self.weight_version
        self.updating = False
        return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    def generate(self, body):
        if self.updating:
            return 503, None
        time.sleep(self.generate_delay)
        batch = isinstance(body["input_ids"][0], list)
        prompts = body["input_ids"] if batch else [body["input_ids"]]
        params = body.get("sampling_params") or {}
        params = params if isinstance(params, list) else [params] * len(prompts)
        outputs = [
            self.output(prompt, p, body.get("return_logprob", False))
            for prompt, p in zip(prompts, params, strict=True)
            for _ in range(p.get("n", 1))
        ]
        return 200, (outputs if batch or len(outputs) > 1 else outputs[0])

    def output(self, prompt: list[int], params: dict, logprob: bool) -> dict:
        """A response drawn from ``(prompt, sampling_seed)``: tokens 3..31, ending at a stop token or the length."""
        rng = random.Random(hash((tuple(prompt), params.get("sampling_seed"))))
        stops, tokens = params.get("stop_token_ids") or [], []
        for _ in range(params.get("max_new_tokens", 128)):
            tokens.append(rng.choice(stops) if stops and rng.random() < 0.2 else rng.randrange(3, 32))
            if tokens[-1] in stops:
                break
        finished = {"type": "stop", "matched": tokens[-1]} if tokens and tokens[-1] in stops else None
        finished = finished or {"type": "length", "length": len(tokens)}
        if self.abort:
            finished = {"type": "abort", "message": "Abort before prefill", "status_code": None, "err_type": None}
        version = self.report_version or self.weight_version
        meta = {
            "id": f"r{rng.getrandbits(32):08x}",
            "finish_reason": finished,
            "prompt_tokens": len(prompt),
            "weight_version": version,
            "completion_tokens": len(tokens),
            "cached_tokens": 0,
        }
        if self.split_versions:
            half = len(tokens) // 2
            meta["weight_versions"] = [
                {"version": str(int(version) - 1), "start": 0, "end": half},
                {"version": version, "start": half, "end": len(tokens)},
            ]
        if logprob:
            meta["output_token_logprobs"] = [[-0.01 * (i + 1), t, None] for i, t in enumerate(tokens)]
        return {"text": "".join(chr(96 + t % 26) for t in tokens), "output_ids": tokens, "meta_info": meta}


def _handler(fake: FakeSGLang) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self._answer("GET", None)

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer("POST", json.loads(raw) if raw else {})

        def _answer(self, method, body):
            status, payload = fake.route(method, self.path, body)
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler
