// The simulator's model in JavaScript, for the interactive page: a line-for-line port of
// nibble/simulator/drift_model.py, nibble/simulator/rng.py, timeline.py, dynamics.py and simulate.py.
// Same operations in the same order on IEEE doubles, so a config and a seed give the same numbers as
// Python (tests/nibble/simulator/test_page.py checks it in headless Chromium). Keep them in step.
"use strict";

const NibbleModel = (() => {
  // ---- nibble/simulator/drift_model.py -------------------------------------------------------
  const PRECISIONS = ["bf16", "mxfp8", "nvfp4"];
  const FLOOR_SCALE = 1.6, FLOOR_LAST_15_FACTOR = 0.625, FLOOR_SHARED_EXPERTS_FACTOR = 0.8;
  const FLOOR_NO_FOUR_OVER_SIX_PENALTY = 0.008;
  const STALENESS_COEFFICIENT = 0.011, FLOOR_WEIGHT = 0.5, EFFECTIVE_SOFTNESS = 0.02;
  const DRIFT_GAIN = 6.0, DRIFT_FEEDBACK = 0.65, DRIFT_DECAY = 0.12, COLLAPSE_DRIFT = 2.2;
  const REWARD_START = 0.45, REWARD_RATE = 0.06, REWARD_CEILING = 0.88, REWARD_MISMATCH_SCALE = 0.22;
  const REWARD_MIN_LEARNING = 0.15, REWARD_DRIFT_SLOWDOWN = 0.12, REWARD_MAX_SLOWDOWN = 0.5;
  const REWARD_COLLAPSED_FLOOR = 0.08, REWARD_COLLAPSED_DECAY = 0.8, REWARD_COLLAPSED_STEP = 0.01;

  function formatKey(precision, fourOverSix) {
    return precision === "nvfp4" && fourOverSix ? "nvfp4_4o6" : precision;
  }
  function trainKey(precision, dequantized) {
    if (precision === "bf16") return "bf16";
    return precision + "_" + (dequantized ? "dequantized" : "high_precision");
  }
  function planFloorFactor(last15, shared) {
    let factor = FLOOR_SCALE;
    if (last15) factor = factor * FLOOR_LAST_15_FACTOR;
    if (shared) factor = factor * FLOOR_SHARED_EXPERTS_FACTOR;
    return factor;
  }
  function precisionFloor(c, floors) {
    const base = floors.bf16;
    if (c.precision === "bf16") return base;
    const key = formatKey(c.precision, c.four_over_six);
    let floor = base + (floors[key] - base) * planFloorFactor(c.bf16_last_15, c.bf16_shared_experts);
    if (c.precision === "nvfp4" && !c.four_over_six) floor = floor + FLOOR_NO_FOUR_OVER_SIX_PENALTY;
    return floor;
  }
  function stalenessCost(gap) { return STALENESS_COEFFICIENT * (gap * Math.sqrt(gap)); }
  function batchMismatch(cost, floor) { return cost + FLOOR_WEIGHT * floor; }
  function effectiveMismatch(m) { return (m * m) / (m + EFFECTIVE_SOFTNESS); }
  function driftStep(drift, mEff, spike) {
    const moved = drift + DRIFT_GAIN * mEff + DRIFT_FEEDBACK * mEff * (drift * drift) - DRIFT_DECAY * drift;
    return Math.max(0.0, moved) + spike;
  }
  function criticalEffectiveMismatch() { return DRIFT_DECAY / (2.0 * Math.sqrt(DRIFT_FEEDBACK * DRIFT_GAIN)); }
  function criticalMismatch() {
    const mc = criticalEffectiveMismatch();
    return (mc + Math.sqrt(mc * mc + 4.0 * EFFECTIVE_SOFTNESS * mc)) / 2.0;
  }
  function spikeLaw(c) {
    if (c.precision !== "nvfp4") return { probability: 0.0, kick: 0.0 };
    if (!c.dequantized_backward) return { probability: 0.08, kick: 0.4 };
    if (!c.four_over_six) return { probability: 0.05, kick: 0.3 };
    return { probability: 0.0, kick: 0.0 };
  }
  function rewardStep(reward, m, drift, collapsed) {
    if (collapsed) return Math.max(REWARD_COLLAPSED_FLOOR, REWARD_COLLAPSED_DECAY * reward - REWARD_COLLAPSED_STEP);
    const ratio = m / REWARD_MISMATCH_SCALE;
    const learning = Math.max(REWARD_MIN_LEARNING, 1.0 - ratio * ratio);
    const slowdown = 1.0 - Math.min(REWARD_MAX_SLOWDOWN, REWARD_DRIFT_SLOWDOWN * drift);
    return reward + REWARD_RATE * (REWARD_CEILING - reward) * learning * slowdown;
  }
  function willDiverge(drift, m, meanSpike) {
    const mEff = effectiveMismatch(m);
    const c = DRIFT_GAIN * mEff + meanSpike;
    if (mEff === 0) return c / DRIFT_DECAY > COLLAPSE_DRIFT;  // linear map d ← 0.88·d + c: one, stable, fixed point
    const a = DRIFT_FEEDBACK * mEff;
    const disc = DRIFT_DECAY * DRIFT_DECAY - 4.0 * a * c;
    if (disc < 0) return true;
    const root = Math.sqrt(disc);
    const stable = (DRIFT_DECAY - root) / (2.0 * a), unstable = (DRIFT_DECAY + root) / (2.0 * a);
    return drift > unstable || stable > COLLAPSE_DRIFT;
  }

  // ---- nibble/simulator/rng.py ---------------------------------------------------------------
  const DYNAMICS_STREAM = 0x5bd1e995;
  function mulberry32(seed, stream) {
    let state = (seed ^ stream) >>> 0;
    const rng = {
      uniform() {
        state = (state + 0x6d2b79f5) >>> 0;
        let z = state;
        z = Math.imul(z ^ (z >>> 15), z | 1) >>> 0;
        z = (z ^ (z + Math.imul(z ^ (z >>> 7), z | 61))) >>> 0;
        return ((z ^ (z >>> 14)) >>> 0) / 4294967296.0;
      },
      pareto(tail) {
        const u = 1.0 - rng.uniform();
        if (tail === 1) return 1.0 / u;
        if (tail === 2) return 1.0 / Math.sqrt(u);
        return 1.0 / Math.sqrt(Math.sqrt(u));
      },
    };
    return rng;
  }

  // ---- nibble/simulator/config.py ------------------------------------------------------------
  const HORIZONS = {
    short: { length_scale: 0.25, min_fraction: 0.3, tail: 4 },
    medium: { length_scale: 1.0, min_fraction: 0.15, tail: 2 },
    long: { length_scale: 4.0, min_fraction: 0.03, tail: 1 },
  };

  // ---- nibble/simulator/timeline.py ----------------------------------------------------------
  const IDLE = 0, GENERATING = 1, SYNCING = 2, PAUSED = 3;

  function buildTimeline(c, rolloutSeconds, trainSeconds, syncSecondsIn) {
    const horizon = HORIZONS[c.horizon];
    const budget = rolloutSeconds * horizon.length_scale;
    const sync = c.weight_sync ? syncSecondsIn : 0.0;
    const rng = mulberry32(c.seed, 0);
    const samplers = [];
    for (let i = 0; i < c.num_samplers; i++) {
      samplers.push({ held: 0, state: IDLE, until: 0.0, target: 0, rollout: null, remaining: 0.0,
                      segmentStart: 0.0, pauseStart: 0.0 });
    }
    const rollouts = [], steps = [], pauses = [], queue = [];
    let qHead = 0, batch = [], admitted = 0, version = 0, trainingUntil = null, trainingStart = 0.0;
    let blocked = false;
    // A port of the one Python source of the admission rule, nibble.config.admission.allowed_groups
    // (which Timeline.full calls): keep the two in step.
    const full = () => admitted >= (version + c.max_staleness + 1) * c.batch;

    function completeEvents(t) {
      for (let i = 0; i < samplers.length; i++) {
        const s = samplers[i];
        if (s.state === IDLE || s.until !== t) continue;
        if (s.state === GENERATING) {
          s.rollout.end = t;
          queue.push(s.rollout);
          s.rollout = null;
          s.state = IDLE;
        } else if (s.state === SYNCING) {
          pauses.push({ sampler: i, start: s.pauseStart, end: t, version: s.target });
          s.held = s.target;
          s.state = IDLE;
        } else {
          pauses.push({ sampler: i, start: s.pauseStart, end: t, version: s.target });
          s.held = s.target;
          s.rollout.segments.push([s.target, s.remaining]);
          s.segmentStart = t;
          s.until = t + s.remaining;
          s.state = GENERATING;
        }
      }
    }
    function finishStep(t) {
      steps.push({ index: version, start: trainingStart, end: t, rollouts: batch.map((r) => r.id) });
      batch = [];
      trainingUntil = null;
      version = version + 1;
      if (c.inflight_updates) swapInFlight(t);
    }
    function swapInFlight(t) {
      for (const s of samplers) {
        if (s.state === GENERATING) {
          const done = t - s.segmentStart;
          s.rollout.segments[s.rollout.segments.length - 1][1] = done;
          s.remaining = s.remaining - done;
          if (sync > 0) {
            s.state = PAUSED; s.until = t + sync; s.target = version; s.pauseStart = t;
          } else {
            s.held = version;
            s.rollout.segments.push([version, s.remaining]);
            s.segmentStart = t;
          }
        } else if (s.state === PAUSED) {
          s.target = version; s.until = t + sync;
        }
      }
    }
    function assemble(t) {
      while (batch.length < c.batch && qHead < queue.length) {
        const r = queue[qHead++];
        r.staleness = version - r.version;
        r.step = version;
        if (r.staleness > c.max_staleness) {
          r.discarded = true;
          admitted = admitted - 1;
        } else {
          batch.push(r);
        }
      }
      if (batch.length === c.batch) {
        trainingStart = t;
        trainingUntil = t + trainSeconds;
      }
    }
    function act(i, t) {
      const s = samplers[i];
      if (s.held < version) {
        if (sync > 0) {
          s.state = SYNCING; s.until = t + sync; s.target = version; s.pauseStart = t;
          return;
        }
        s.held = version;
      }
      if (!full()) {
        admitted = admitted + 1;
        const seconds = budget * Math.min(1.0, horizon.min_fraction * rng.pareto(horizon.tail));
        const r = { id: rollouts.length, sampler: i, start: t, generation_seconds: seconds, version: s.held,
                    segments: [[s.held, seconds]], end: null, step: null, staleness: null, discarded: false };
        rollouts.push(r);
        s.rollout = r; s.remaining = seconds; s.segmentStart = t;
        s.state = GENERATING; s.until = t + seconds;
      } else {
        blocked = true;
      }
    }
    function nextTime() {
      let best = Infinity;
      for (const s of samplers) if (s.state !== IDLE && s.until < best) best = s.until;
      if (trainingUntil !== null && trainingUntil < best) best = trainingUntil;
      if (best === Infinity) throw new Error("timeline deadlock: no sampler busy and the trainer idle (a bug)");
      return best;
    }

    let t = 0.0;
    for (;;) {
      completeEvents(t);
      if (trainingUntil === t) {
        finishStep(t);
        if (steps.length === c.steps) break;
      }
      if (trainingUntil === null) assemble(t);
      for (let i = 0; i < samplers.length; i++) {
        const s = samplers[i];
        if (s.state === IDLE && (s.held < version || !full())) act(i, t);
        else if (s.state === IDLE) blocked = true;
      }
      t = nextTime();
    }
    const endTime = steps[steps.length - 1].end;
    let busy = 0.0, discards = 0;
    for (const st of steps) busy = busy + (st.end - st.start);
    for (const r of rollouts) if (r.discarded) discards++;
    return { rollouts, steps, pauses, trainSeconds, admissionBlocked: blocked, endTime, discards,
             utilisation: busy / endTime };
  }

  // ---- nibble/simulator/dynamics.py ----------------------------------------------------------
  const DRIFT_CEILING = 10.0, STEADY_WINDOW = 20;

  function rolloutCost(r, version) {
    let cost = 0.0;
    for (const [segVersion, seconds] of r.segments) {
      cost = cost + (seconds / r.generation_seconds) * stalenessCost(version - segVersion);
    }
    return cost;
  }
  function stepCosts(tl) {
    return tl.steps.map((st) => {
      let total = 0.0;
      for (const id of st.rollouts) total = total + rolloutCost(tl.rollouts[id], st.index);
      return total / st.rollouts.length;
    });
  }
  function mean(values) {
    let total = 0.0;
    for (const v of values) total = total + v;
    return total / values.length;
  }
  function runDynamics(costs, floor, spikes, seed) {
    const rng = mulberry32(seed, DYNAMICS_STREAM);
    let drift = 0.0, reward = REWARD_START, collapsedAt = null;
    const mismatch = [], drifts = [], rewards = [], spikeSteps = [];
    costs.forEach((cost, k) => {
      const m = batchMismatch(cost, floor);
      const draw = rng.uniform();
      const kick = draw < spikes.probability ? spikes.kick : 0.0;
      if (kick > 0) spikeSteps.push(k);
      drift = Math.min(DRIFT_CEILING, driftStep(drift, effectiveMismatch(m), kick));
      if (collapsedAt === null && drift > COLLAPSE_DRIFT) collapsedAt = k;
      reward = rewardStep(reward, m, drift, collapsedAt !== null);
      mismatch.push(m); drifts.push(drift); rewards.push(reward);
    });
    const steady = mean(mismatch.slice(-STEADY_WINDOW));
    let verdict = "stable";
    if (collapsedAt !== null) verdict = "diverged";
    else if (willDiverge(drift, steady, spikes.probability * spikes.kick)) verdict = "will_diverge";
    return { mismatch, drift: drifts, reward: rewards, spikes: spikeSteps, collapsedAt, steady, verdict };
  }

  // ---- nibble/simulator/simulate.py ----------------------------------------------------------
  function stepSeconds(c, cal) {
    const fmt = formatKey(c.precision, c.four_over_six);
    return [cal.rollout_seconds[fmt], cal.train_seconds[trainKey(c.precision, c.dequantized_backward)],
            cal.weight_sync_seconds[fmt]];
  }
  function runConfig(c, cal) {
    const tl = buildTimeline(c, ...stepSeconds(c, cal));
    const floor = precisionFloor(c, cal.floors);
    const dyn = runDynamics(stepCosts(tl), floor, spikeLaw(c), c.seed);
    let stale = 0, consumed = 0;
    for (const r of tl.rollouts) if (r.step !== null && !r.discarded) { stale += r.staleness; consumed++; }
    return { config: c, timeline: tl, dynamics: dyn, floor, meanStaleness: stale / consumed };
  }
  function simulate(c, cal, withGhosts) {
    const run = runConfig(c, cal);
    const base = Object.assign({}, c, { precision: "bf16", max_staleness: 0 });
    const baseline = buildTimeline(base, ...stepSeconds(base, cal));
    const ghosts = {};
    if (withGhosts) {
      for (const p of PRECISIONS) if (p !== c.precision) ghosts[p] = runConfig(Object.assign({}, c, { precision: p }), cal);
    }
    return { run, baselineSeconds: baseline.endTime, ghosts };
  }
  function summary(result) {
    const run = result.run, tl = run.timeline, dyn = run.dynamics, critical = criticalMismatch();
    return {
      steps: tl.steps.length,
      wall_clock_seconds: tl.endTime,
      sync_bf16_wall_clock_seconds: result.baselineSeconds,
      speed_vs_sync_bf16: result.baselineSeconds / tl.endTime,
      trainer_utilisation: tl.utilisation,
      discards: tl.discards,
      mean_staleness: run.meanStaleness,
      grad_spikes: dyn.spikes.length,
      final_drift: dyn.drift[dyn.drift.length - 1],
      final_reward: dyn.reward[dyn.reward.length - 1],
      verdict: dyn.verdict,
      collapsed_at_step: dyn.collapsedAt === null ? null : dyn.collapsedAt + 1,
      critical_mismatch: critical,
      precision_floor: run.floor,
      steady_mismatch: dyn.steady,
      drift_headroom: critical - dyn.steady,
    };
  }

  return { PRECISIONS, HORIZONS, COLLAPSE_DRIFT, criticalMismatch, precisionFloor, stalenessCost, simulate,
           summary, runConfig, rolloutCost };
})();
