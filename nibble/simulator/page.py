"""The self-contained interactive page: ``web/template.html`` with ``web/model.js`` (the model, ported)
and ``web/page.js`` (sliders, charts) inlined, and the run's knobs and calibration embedded as JSON.

No server, no network: the page references no URL and loads nothing.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from nibble.simulator.calibrate import Calibration
from nibble.simulator.config import SimConfig


def asset(name: str) -> str:
    """Text of one file of ``web/`` (``model.js``, ``page.js``, ``template.html``)."""
    return resources.files("nibble.simulator").joinpath("web", name).read_text(encoding="utf-8")


def model_js() -> str:
    """The JavaScript port of the model; defines ``NibbleModel``."""
    return asset("model.js")


def render(config: SimConfig, calibration: Calibration) -> str:
    """The page's HTML, starting at ``config``."""
    data = json.dumps({"config": config.as_dict(), "calibration": calibration.as_dict()})
    # Inside <script>, "</" could end the element early; "<\/" means the same to JSON.
    data = data.replace("</", "<\\/")
    html = asset("template.html")
    return html.replace("{{DATA}}", data).replace("/*MODEL*/", model_js()).replace("/*PAGE*/", asset("page.js"))


def write_html(config: SimConfig, calibration: Calibration, path: Path) -> Path:
    Path(path).write_text(render(config, calibration), encoding="utf-8")
    return Path(path)
