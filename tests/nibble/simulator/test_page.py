"""The interactive page (nibble.simulator.page) in headless Chromium: self-contained, sliders live, and its
JavaScript model gives the same numbers as Python."""

import html
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from nibble.simulator import SimConfig, load, published, simulate
from nibble.simulator.calibrate import Calibration
from nibble.simulator.page import model_js, render, write_html
from tests.helpers import NO_RECIPE, chromium_dom

AGREEMENT_CONFIGS = [
    SimConfig(steps=60),
    SimConfig(precision="bf16", max_staleness=0, steps=60),
    SimConfig(precision="nvfp4", **NO_RECIPE, max_staleness=8, horizon="long", seed=3, steps=60),
    SimConfig(precision="mxfp8", inflight_updates=True, max_staleness=4, horizon="long", num_samplers=13, seed=77),
    SimConfig(weight_sync=False, inflight_updates=True, batch=4, horizon="short", num_samplers=3, seed=2**32 - 1),
    SimConfig(batch=16, num_samplers=24, max_staleness=2, steps=120, seed=12345),
]
# Anything that would make the page reach out: a scheme, a protocol-relative host, an attribute or call that loads.
EXTERNAL = re.compile(
    r"https?:|ftp:|wss?:|//[\w.-]+\.[a-z]{2,}|\bsrc\s*=|\bhref\s*=|url\(|@import|fetch\(|XMLHttpRequest|WebSocket"
)


# A calibration source that, embedded raw, would end the data's <script> early or swallow the page.
HOSTILE = "<!--<script></script><b>&amp; /*MODEL*/ {{DATA}} /*PAGE*/"


def calibrated() -> Calibration:
    cal = published()
    floors = dict(cal.floors, nvfp4_4o6=0.0281)
    # a pause per format, as a stability grid gives them: the page must swap each plan for its own
    sync = {"bf16": 0.5, "mxfp8": 1.5, "nvfp4": 3.5, "nvfp4_4o6": 4.5}
    return Calibration(floors, cal.rollout_seconds, cal.train_seconds, sync, cal.sources)


def loaded(tmp_path: Path, floors: dict, source: str = "test") -> Calibration:
    path = tmp_path / f"calibration-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps({"source": source, "floors": floors, "step_seconds": {"weight_sync": 2.5}}))
    return load([path])


def python_record(config: SimConfig, calibration: Calibration) -> dict:
    result = simulate(config, calibration)
    dyn = result.run.dynamics
    return {
        "summary": result.summary(),
        "drift": dyn.drift,
        "mismatch": dyn.mismatch,
        "reward": dyn.reward,
        "ghosts": {p: {"verdict": g.dynamics.verdict, "reward": g.dynamics.reward} for p, g in result.ghosts.items()},
    }


def dom_json(dom: str, element: str) -> object:
    match = re.search(rf'<pre id="{element}">(.*?)</pre>', dom, re.S)
    assert match, dom[-2000:]
    return json.loads(html.unescape(match.group(1)))


def test_the_page_references_no_url_and_loads_nothing():
    page = render(SimConfig(), published())
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    assert "<script src" not in page and "<link" not in page and "<iframe" not in page


def test_the_javascript_model_agrees_with_python(tmp_path):
    runs = [(c, published()) for c in AGREEMENT_CONFIGS] + [(SimConfig(max_staleness=3), calibrated())]
    # every format on its own pause (the ghosts too), swapping between rollouts and in flight
    per_format = [SimConfig(precision="nvfp4", **NO_RECIPE, max_staleness=2, steps=60),
                  SimConfig(precision="mxfp8", inflight_updates=True, max_staleness=4, steps=60, seed=9),
                  SimConfig(precision="bf16", max_staleness=1, num_samplers=5, steps=60)]  # fmt: skip
    runs += [(c, calibrated()) for c in per_format]
    # A measured BF16 floor of 0: synchronous BF16 has m = m_eff = 0, and NVFP4 + 4/6 with the
    # high-precision backward too, with spikes (the drift map's linear case).
    zero = loaded(tmp_path, {"bf16": 0.0, "nvfp4_4o6": 0.0, "mxfp8": 0.01})
    runs += [(SimConfig(precision="bf16", max_staleness=0, steps=60), zero)]
    runs += [(SimConfig(max_staleness=0, dequantized_backward=False, steps=60, seed=5), zero)]
    harness = tmp_path / "harness.html"
    script = f"""{model_js()}
const runs = {json.dumps([[c.as_dict(), cal.as_dict()] for c, cal in runs])};
document.getElementById("out").textContent = JSON.stringify(runs.map(([c, cal]) => {{
  const r = NibbleModel.simulate(c, cal, true), dyn = r.run.dynamics;
  return {{ summary: NibbleModel.summary(r), drift: dyn.drift, mismatch: dyn.mismatch, reward: dyn.reward,
           ghosts: Object.fromEntries(Object.entries(r.ghosts).map(([p, g]) => [p, {{
             verdict: g.dynamics.verdict, reward: g.dynamics.reward }}])) }};
}}));"""
    harness.write_text(f'<!DOCTYPE html><html><body><pre id="out"></pre><script>{script}</script></body></html>')
    from_js = dom_json(chromium_dom(harness), "out")
    for (config, cal), js in zip(runs, from_js, strict=True):
        # Same IEEE operations in the same order: equal to the last bit, discrete outcomes included.
        assert js == python_record(config, cal), config


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    return write_html(SimConfig(), published(), tmp_path_factory.mktemp("page") / "simulation.html")


def test_the_page_has_a_slider_for_every_knob_and_shows_python_s_numbers(page):
    dom = chromium_dom(page)
    for knob in fields(SimConfig):
        assert re.search(rf'<input type="range"[^>]*id="knob-{knob.name}"', dom), knob.name
    shown = dom_json(dom, "result")
    assert shown["config"] == SimConfig().as_dict()
    assert {k: shown[k] for k in ("summary", "drift", "mismatch", "reward", "ghosts")} == python_record(
        SimConfig(), published()
    )


def test_moving_sliders_changes_the_curves(page):
    before = dom_json(chromium_dom(page), "result")
    # The hash is applied by setting each slider and firing its input event, as a drag does.
    after = dom_json(chromium_dom(page, "max_staleness=8&horizon=long&four_over_six=off"), "result")
    changed = SimConfig(max_staleness=8, horizon="long", four_over_six=False)
    assert after["config"] == changed.as_dict()
    assert after["drift"] != before["drift"] and after["mismatch"] != before["mismatch"]
    assert after["summary"]["verdict"] == "diverged" != before["summary"]["verdict"]
    assert after["summary"] == python_record(changed, published())["summary"]


def test_the_committed_demo_page_is_current():
    committed = Path(__file__).resolve().parents[3] / "docs" / "simulator" / "simulation.html"
    assert committed.read_text() == render(SimConfig(), published()), "regenerate docs/simulator (README)"


def data_block(page: str) -> str:
    match = re.search(r'<script type="application/json" id="nibble-data">(.*?)</script>', page, re.S)
    assert match
    return match.group(1)


def test_embedded_json_holds_no_markup_and_placeholders_in_it_stay_data(tmp_path):
    cal = loaded(tmp_path, {"nvfp4_4o6": 0.03}, HOSTILE)
    page = render(SimConfig(), cal)
    block = data_block(page)
    assert "<" not in block and ">" not in block and "&" not in block
    assert json.loads(block) == {"config": SimConfig().as_dict(), "calibration": cal.as_dict()}
    assert page.count("</script>") == 3 and page.count(model_js()) == 1


@pytest.mark.parametrize(
    "config",
    [
        SimConfig(precision="mxfp8", max_staleness=2, steps=60, seed=2**32 - 1),  # the largest seed
        SimConfig(max_staleness=3, horizon="long", steps=80, seed=200_000_000),  # calibrated, hostile source
    ],
    ids=["largest-seed", "calibrated"],
)
def test_pages_of_other_configs_show_python_s_numbers(tmp_path, config):
    is_calibrated = config.seed != 2**32 - 1
    cal = loaded(tmp_path, {"bf16": 0.0, "nvfp4_4o6": 0.025}, HOSTILE) if is_calibrated else published()
    page = write_html(config, cal, tmp_path / "simulation.html")
    dom = chromium_dom(page)
    shown = dom_json(dom, "result")
    assert shown["config"] == config.as_dict()
    assert {k: shown[k] for k in ("summary", "drift", "mismatch", "reward", "ghosts")} == python_record(config, cal)
    # The seed slider spans 1000 seeds around the page's own, not every seed up to it.
    slider = re.search(r'<input type="range"[^>]*max="(\d+)"[^>]*id="knob-seed"', dom)
    assert slider and slider.group(1) == "999", slider
    if is_calibrated:
        assert f"[{HOSTILE}]: floors.nvfp4_4o6" in html.unescape(dom)  # shown as text in the sources table
    # A seed from the URL outside the slider's window moves the window to it.
    moved = dom_json(chromium_dom(page, "seed=7"), "result")
    assert moved["config"]["seed"] == 7
    assert moved["summary"] == python_record(config.with_(seed=7), cal)["summary"]
