// The interactive page: one slider per knob, the model (model.js) recomputed on every change, four
// canvases drawn by hand (no library, no network). Initial knobs come from the embedded data and may be
// overridden from the URL hash, e.g. #precision=nvfp4&max_staleness=8 — applied through the same slider
// handler a user's drag goes through. The latest result is also written as JSON into the #result element,
// so a headless browser (--dump-dom) can read it.
"use strict";

(() => {
  const DATA = JSON.parse(document.getElementById("nibble-data").textContent);
  const CAL = DATA.calibration;
  const COLOURS = { bf16: "#1f77b4", mxfp8: "#2ca02c", nvfp4: "#d62728" };
  const ONOFF = [false, true];
  const SEED_MAX = 4294967295, SEED_WINDOW = 1000;
  const KNOBS = [
    ["precision", "precision", ["bf16", "mxfp8", "nvfp4"]],
    ["four_over_six", "four-over-six (NVFP4)", ONOFF],
    ["dequantized_backward", "dequantized backward", ONOFF],
    ["bf16_last_15", "last 15% layers BF16", ONOFF],
    ["bf16_shared_experts", "shared experts BF16", ONOFF],
    ["max_staleness", "max staleness", [0, 1, 2, 3, 4, 5, 6, 7, 8]],
    ["weight_sync", "weight-sync pauses", ONOFF],
    ["inflight_updates", "in-flight weight updates", ONOFF],
    ["batch", "batch (groups / step)", [4, 8, 16]],
    ["horizon", "horizon", ["short", "medium", "long"]],
    ["num_samplers", "samplers", range(1, Math.max(64, DATA.config.num_samplers) + 1)],
    ["steps", "train steps", range(1, Math.max(1000, DATA.config.steps) + 1)],
    ["seed", "seed", seedWindow(DATA.config.seed)],
  ];
  function range(lo, hi) { const out = []; for (let v = lo; v < hi; v++) out.push(v); return out; }
  // The seed slider spans SEED_WINDOW consecutive seeds around the current one, not all 2^32 of them (an
  // array of every seed up to a large one would never finish); a URL seed outside it moves the window.
  function seedWindow(seed) {
    const lo = Math.max(0, Math.min(seed - SEED_WINDOW / 2 + 1, SEED_MAX - SEED_WINDOW + 1));
    return range(lo, lo + SEED_WINDOW);
  }

  const config = Object.assign({}, DATA.config);
  const sliders = {};

  function show(value) { return value === true ? "on" : value === false ? "off" : String(value); }
  function parseValue(values, text) {
    // Hash values by name: words, numbers, or on/off/true/false/1/0 for switches.
    for (let i = 0; i < values.length; i++) {
      const v = values[i];
      if (String(v) === text || (typeof v === "boolean" && ((v && ["on", "1"].includes(text)) ||
                                                              (!v && ["off", "0"].includes(text))))) return i;
    }
    return -1;
  }

  function buildControls() {
    const box = document.getElementById("controls");
    for (const [name, label, values] of KNOBS) {
      const row = document.createElement("label");
      row.className = "knob";
      const text = document.createElement("span");
      const slider = document.createElement("input");
      slider.type = "range"; slider.min = 0; slider.max = values.length - 1; slider.step = 1;
      slider.id = "knob-" + name; slider.name = name;
      slider.value = Math.max(0, values.indexOf(config[name]));
      const knob = { slider, values };
      const out = document.createElement("output");
      const sync = () => { out.textContent = show(knob.values[Number(slider.value)]); };
      slider.addEventListener("input", () => {
        config[name] = knob.values[Number(slider.value)];
        sync();
        recompute();
        writeHash();
      });
      sync();
      text.textContent = label;
      row.append(text, slider, out);
      box.append(row);
      sliders[name] = knob;
    }
  }

  function applyHash() {
    const hash = decodeURIComponent(location.hash.replace(/^#/, ""));
    if (!hash) return;
    const errors = [];
    for (const part of hash.split("&")) {
      const [name, text] = part.split("=");
      const knob = sliders[name];
      let moved = false;
      if (name === "seed" && /^[0-9]+$/.test(text) && Number(text) <= SEED_MAX && parseValue(knob.values, text) < 0) {
        knob.values = seedWindow(Number(text));  // a seed outside the slider's window: move the window to it
        moved = true;
      }
      const index = knob ? parseValue(knob.values, text) : -1;
      if (index < 0) { errors.push(part); continue; }
      if (moved || Number(knob.slider.value) !== index) {
        knob.slider.value = index;
        knob.slider.dispatchEvent(new Event("input"));  // the path a user's drag takes
      }
    }
    document.getElementById("errors").textContent = errors.length ? "ignored in URL: " + errors.join(", ") : "";
  }
  function writeHash() {
    const parts = KNOBS.map(([name]) => name + "=" + show(config[name]).replace(/^on$/, "1").replace(/^off$/, "0"));
    history.replaceState(null, "", "#" + parts.join("&"));
  }

  // ---- drawing ------------------------------------------------------------------------------------
  function chart(id, opts) {
    const canvas = document.getElementById(id);
    const ctx = canvas.getContext("2d");
    const W = canvas.width, H = canvas.height, L = 52, R = 10, T = 24, B = 34;
    ctx.clearRect(0, 0, W, H);
    ctx.font = "12px sans-serif"; ctx.fillStyle = "#222";
    ctx.fillText(opts.title, L, 15);
    const X = (x) => L + ((x - opts.xmin) / (opts.xmax - opts.xmin || 1)) * (W - L - R);
    const Y = (y) => H - B - ((Math.min(y, opts.ymax) - opts.ymin) / (opts.ymax - opts.ymin)) * (H - T - B);
    ctx.strokeStyle = "#888"; ctx.lineWidth = 1;
    ctx.strokeRect(L, T, W - L - R, H - T - B);
    for (let i = 0; i <= 4; i++) {
      const y = opts.ymin + (i / 4) * (opts.ymax - opts.ymin), x = opts.xmin + (i / 4) * (opts.xmax - opts.xmin);
      ctx.fillText(y.toPrecision(2), 4, Y(y) + 4);
      ctx.fillText(opts.xmax - opts.xmin > 10 ? String(Math.round(x)) : x.toFixed(1), X(x) - 10, H - B + 14);
    }
    ctx.fillText(opts.xlabel, W / 2 - 20, H - 4);
    for (const h of opts.hlines || []) {
      ctx.setLineDash([5, 4]); ctx.strokeStyle = h.color; ctx.beginPath();
      ctx.moveTo(L, Y(h.y)); ctx.lineTo(W - R, Y(h.y)); ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = h.color; ctx.fillText(h.label, W - R - 110, Y(h.y) - 4); ctx.fillStyle = "#222";
    }
    let legend = T + 14;
    for (const s of opts.series) {
      ctx.globalAlpha = s.alpha || 1; ctx.strokeStyle = s.color; ctx.lineWidth = s.width || 1.5;
      ctx.beginPath();
      s.y.forEach((y, i) => (i ? ctx.lineTo(X(s.x[i]), Y(y)) : ctx.moveTo(X(s.x[i]), Y(y))));
      ctx.stroke();
      ctx.fillStyle = s.color; ctx.fillText(s.label, L + 8, legend); legend += 14;
      ctx.globalAlpha = 1; ctx.fillStyle = "#222";
    }
  }
  function steps(n) { const out = []; for (let i = 1; i <= n; i++) out.push(i); return out; }

  function viridis(t) {
    // A five-stop approximation of matplotlib's viridis (the PNG's colour map).
    const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    const x = Math.max(0, Math.min(1, t)) * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x));
    const f = x - i, a = stops[i], b = stops[i + 1];
    return "rgb(" + a.map((v, k) => Math.round(v + f * (b[k] - v))).join(",") + ")";
  }

  function drawTimeline(result) {
    const run = result.run, tl = run.timeline, n = run.config.num_samplers;
    const canvas = document.getElementById("timeline"), ctx = canvas.getContext("2d");
    const W = canvas.width, H = canvas.height, L = 70, R = 10, T = 24, B = 30;
    ctx.clearRect(0, 0, W, H);
    ctx.font = "12px sans-serif"; ctx.fillStyle = "#222";
    const shown = tl.steps.slice(0, 12), end = shown[shown.length - 1].end;
    ctx.fillText("timeline, first " + shown.length + " steps (grey: discarded, black: weight sync)", L, 15);
    const lanes = n + 1, laneH = (H - T - B) / lanes;
    const X = (t) => L + (Math.min(t, end) / end) * (W - L - R);
    const laneY = (i) => T + (lanes - 1 - i) * laneH;
    const scale = NibbleModel.criticalMismatch() * 1.5, floorPart = 0.5 * run.floor;
    for (const r of tl.rollouts) {
      if (r.start >= end) break;
      const stop = r.end === null ? end : r.end;
      const gap = r.step === null ? tl.steps.length : r.step;
      ctx.fillStyle = r.discarded ? "#ccc" : viridis((floorPart + NibbleModel.rolloutCost(r, gap)) / scale);
      ctx.fillRect(X(r.start), laneY(r.sampler) + 2, Math.max(1, X(stop) - X(r.start) - 1), laneH - 4);
    }
    ctx.fillStyle = "#000";
    for (const p of tl.pauses) {
      if (p.start < end) ctx.fillRect(X(p.start), laneY(p.sampler) + laneH / 3, Math.max(1, X(p.end) - X(p.start)), laneH / 3);
    }
    shown.forEach((st) => {
      ctx.fillStyle = viridis(run.dynamics.mismatch[st.index] / scale);
      ctx.fillRect(X(st.start), laneY(n) + 2, Math.max(1, X(st.end) - X(st.start) - 1), laneH - 4);
    });
    ctx.fillStyle = "#222";
    ctx.font = Math.min(12, laneH) + "px sans-serif";
    for (let i = 0; i < n; i++) ctx.fillText("sampler " + i, 2, laneY(i) + laneH / 2 + 4);
    ctx.fillText("trainer", 2, laneY(n) + laneH / 2 + 4);
    ctx.font = "12px sans-serif";
    ctx.fillText("0 s", L, H - B + 14); ctx.fillText(Math.round(end) + " s", W - R - 50, H - B + 14);
  }

  function draw(result) {
    const run = result.run, dyn = run.dynamics, p = run.config.precision, n = dyn.drift.length;
    const ghosts = Object.entries(result.ghosts);
    const ghostSeries = (key) => ghosts.map(([q, g]) => ({ x: steps(n), y: g.dynamics[key], color: COLOURS[q],
                                                          alpha: 0.3, width: 1, label: q + " (ghost)" }));
    chart("drift", { title: "policy drift", xlabel: "train step", xmin: 1, xmax: n, ymin: 0,
                     ymax: Math.max(3, Math.min(10.5, Math.max(...dyn.drift) * 1.05)),
                     series: [...ghostSeries("drift"), { x: steps(n), y: dyn.drift, color: COLOURS[p], width: 2, label: p }],
                     hlines: [{ y: NibbleModel.COLLAPSE_DRIFT, color: "#000", label: "collapse (2.2)" }] });
    const mc = NibbleModel.criticalMismatch();
    chart("mismatch", { title: "batch mismatch m (nats/token)", xlabel: "train step", xmin: 1, xmax: n, ymin: 0,
                        ymax: Math.max(mc * 1.6, Math.min(0.3, Math.max(...dyn.mismatch) * 1.05)),
                        series: [{ x: steps(n), y: dyn.mismatch, color: COLOURS[p], label: "batch mismatch" }],
                        hlines: [{ y: mc, color: "#000", label: "critical m_c" },
                                 { y: 0.5 * run.floor, color: "#888", label: "0.5 · floor" }] });
    const all = [...ghosts, [p, run]];
    const hours = (r) => r.timeline.steps.map((s) => s.end / 3600);
    chart("reward", { title: "reward vs wall-clock", xlabel: "hours", xmin: 0,
                      xmax: Math.max(...all.map(([, r]) => r.timeline.endTime / 3600)), ymin: 0, ymax: 1,
                      series: all.map(([q, r]) => ({ x: hours(r), y: r.dynamics.reward, color: COLOURS[q],
                                                     alpha: r === run ? 1 : 0.35, width: r === run ? 2 : 1,
                                                     label: q + (r === run ? "" : " (ghost)") })) });
    drawTimeline(result);
  }

  function showSummary(summary) {
    const rows = [
      ["verdict", summary.verdict],
      ["speed vs synchronous BF16", summary.speed_vs_sync_bf16.toFixed(2) + "×"],
      ["trainer utilisation", (100 * summary.trainer_utilisation).toFixed(1) + "%"],
      ["discarded trajectories", summary.discards],
      ["mean staleness", summary.mean_staleness.toFixed(2)],
      ["gradient spikes", summary.grad_spikes],
      ["final drift", summary.final_drift.toFixed(3)],
      ["precision floor", summary.precision_floor.toFixed(4)],
      ["steady mismatch", summary.steady_mismatch.toFixed(4)],
      ["critical mismatch", summary.critical_mismatch.toFixed(4)],
      ["drift headroom", summary.drift_headroom.toFixed(4)],
      ["wall-clock", (summary.wall_clock_seconds / 3600).toFixed(2) + " h"],
    ];
    const body = document.getElementById("summary");
    body.replaceChildren(...rows.map(([k, v]) => {
      const tr = document.createElement("tr");
      const a = document.createElement("td"), b = document.createElement("td");
      a.textContent = k; b.textContent = v; tr.append(a, b); return tr;
    }));
    document.getElementById("verdict").textContent = summary.verdict;
    document.getElementById("verdict").className = summary.verdict;
  }

  function showSources() {
    const body = document.getElementById("sources");
    const rows = Object.entries(CAL.sources).map(([name, source]) => {
      const [table, key] = name.split(".");
      const value = table === "floors" ? CAL.floors[key] : table === "rollout" ? CAL.rollout_seconds[key]
        : table === "train" ? CAL.train_seconds[key] : CAL.weight_sync_seconds[key];
      const tr = document.createElement("tr");
      for (const text of [name, Number(value.toPrecision(4)), source]) {
        const td = document.createElement("td"); td.textContent = text; tr.append(td);
      }
      return tr;
    });
    body.replaceChildren(...rows);
  }

  function recompute() {
    const result = NibbleModel.simulate(Object.assign({}, config), CAL, true);
    const summary = NibbleModel.summary(result);
    showSummary(summary);
    draw(result);
    const dyn = result.run.dynamics;
    document.getElementById("result").textContent = JSON.stringify({
      config, summary, drift: dyn.drift, mismatch: dyn.mismatch, reward: dyn.reward,
      ghosts: Object.fromEntries(Object.entries(result.ghosts).map(([q, g]) => [q, {
        verdict: g.dynamics.verdict, reward: g.dynamics.reward }])),
    });
  }

  buildControls();
  showSources();
  recompute();
  applyHash();
  window.addEventListener("hashchange", applyHash);
})();
