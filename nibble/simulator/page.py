"""The self-contained interactive page: ``web/template.html`` with ``web/model.js`` (the model, ported)
and ``web/page.js`` (sliders, charts) inlined, and the run's knobs and calibration embedded as JSON.

No server, no network: the page references no URL and loads nothing.
"""

from __future__ import annotations

import json
import re
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


def script_json(value: object) -> str:
    """``value`` as JSON safe to embed in a ``<script>`` element.

    Inside ``<script>`` the HTML parser ends the element at ``</script`` and, after ``<!--``, treats a
    ``<script`` as nesting, so a string holding them (a calibration's ``source``) could end the element
    early or swallow the rest of the page. Every ``<``, ``>`` and ``&`` is written as its JSON escape
    (``\\u003c``…), which means the same to ``JSON.parse`` and leaves no markup in the element.
    """
    data = json.dumps(value)
    return data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# The template's placeholders, replaced in one pass so that no inserted text is scanned again.
_PLACEHOLDERS = re.compile(r"\{\{DATA\}\}|/\*MODEL\*/|/\*PAGE\*/")


def render(config: SimConfig, calibration: Calibration) -> str:
    """The page's HTML, starting at ``config``."""
    parts = {
        "{{DATA}}": script_json({"config": config.as_dict(), "calibration": calibration.as_dict()}),
        "/*MODEL*/": model_js(),
        "/*PAGE*/": asset("page.js"),
    }
    return _PLACEHOLDERS.sub(lambda match: parts[match.group(0)], asset("template.html"))


def write_html(config: SimConfig, calibration: Calibration, path: Path) -> Path:
    Path(path).write_text(render(config, calibration), encoding="utf-8")
    return Path(path)
