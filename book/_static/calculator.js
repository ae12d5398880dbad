/* Train Faster: "will it fit, and how long will a step take?" calculator.
 *
 * Hand-written, no dependencies, no network: it fills every <div class="trainfast-calculator">
 * on the page. The formulas are trainfast.calculator.estimate's, line for line; the presets and
 * a grid of cases computed in Python come from calculator-data.js, which the build writes
 * (trainfast.calculator.write_script), and tests/test_calculator_widget.py checks in a browser
 * that this file gives the same numbers on every case.
 */
(function () {
  "use strict";

  // --- the model: trainfast.accounting and trainfast.calculator, in the same order ---------

  function parameterCount(s) {
    const h = s.d_model, f = s.d_ff;
    const attention = 4 * h * h + 4 * h;
    const mlp = 2 * h * f + f + h;
    const layerNorms = 2 * 2 * h;
    const embeddings = s.vocab_size * h + s.seq_len * h;
    return embeddings + s.n_layers * (attention + mlp + layerNorms) + 2 * h;
  }

  function linearTrainingFlops(tokens, inFeatures, outFeatures) {
    const forward = 2 * tokens * inFeatures * outFeatures;
    return forward + forward + forward;
  }

  function trainingFlops(s) {
    const tokens = s.seq_len * s.batch_size, h = s.d_model, f = s.d_ff;
    const headDim = Math.floor(h / s.n_heads);
    const attentionForward = s.batch_size * s.n_heads * 2 * (2 * s.seq_len * headDim * s.seq_len);
    const layer =
      linearTrainingFlops(tokens, h, 3 * h) +
      linearTrainingFlops(tokens, h, h) +
      linearTrainingFlops(tokens, h, f) +
      linearTrainingFlops(tokens, f, h) +
      3 * attentionForward;
    return s.n_layers * layer + linearTrainingFlops(tokens, h, s.vocab_size);
  }

  // activation_bytes with attention="sdpa" and no dropout
  function activationBytes(s, tensor, sequenceParallel, valueBytes) {
    const h = s.d_model, f = s.d_ff;
    const tokenWise = 4 * h * valueBytes;
    let split = (4 * h + 2 * f) * valueBytes;
    split += s.n_heads * 4;
    if (sequenceParallel) return (s.seq_len * s.batch_size * (tokenWise + split)) / tensor;
    return s.seq_len * s.batch_size * (tokenWise + split / tensor);
  }

  function checkpointedLayerBytes(s, tensor, sequenceParallel, valueBytes) {
    const kept = s.seq_len * s.batch_size * s.d_model * valueBytes;
    return sequenceParallel ? kept / tensor : kept;
  }

  function zeroMemory(n, worldSize, stage, paramBytes, gradBytes, optimizerBytes) {
    const shard = 1.0 / worldSize;
    return {
      parameters: n * paramBytes * (stage >= 3 ? shard : 1.0),
      gradients: n * gradBytes * (stage >= 2 ? shard : 1.0),
      optimizer_state: n * optimizerBytes * (stage >= 1 ? shard : 1.0),
    };
  }

  function allReduceRing(nBytes, worldSize, link) {
    if (worldSize === 1) return 0.0;
    const latencies = 2.0 * (worldSize - 1);
    const volume = (2.0 * (worldSize - 1) * nBytes) / worldSize;
    return latencies * link.alpha + volume * link.beta;
  }

  function link(group, members, nvlink, c) {
    const inside = group * members <= c.gpus_per_node;
    const bandwidth = inside ? nvlink / 2 : c.network_bytes_per_s;
    return { alpha: c.link_latency_s, beta: 1.0 / bandwidth };
  }

  /** Check a setup as TrainingSetup does; return an error message or null. */
  function problem(x, data) {
    for (const name of ["vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "seq_len", "batch_size"]) {
      if (!Number.isInteger(x.shape[name]) || x.shape[name] < 1) return `Invalid ${name}: ${x.shape[name]} (expected a positive integer)`;
    }
    for (const name of ["data", "tensor", "pipeline", "global_batch"]) {
      if (!Number.isInteger(x[name]) || x[name] < 1) return `Invalid ${name}: ${x[name]} (expected a positive integer)`;
    }
    if (x.shape.d_model % x.shape.n_heads) return `Invalid n_heads: ${x.shape.n_heads} (must divide d_model = ${x.shape.d_model})`;
    if (x.shape.n_heads % x.tensor) return `Invalid tensor: ${x.tensor} (must divide n_heads = ${x.shape.n_heads})`;
    if (x.shape.n_layers % x.pipeline) return `Invalid pipeline: ${x.pipeline} (must divide n_layers = ${x.shape.n_layers})`;
    if (x.global_batch % (x.shape.batch_size * x.data))
      return `Invalid global_batch: ${x.global_batch} (must be a multiple of micro-batch ${x.shape.batch_size} x data ${x.data})`;
    if (!(x.mfu > 0 && x.mfu <= 1)) return `Invalid mfu: ${x.mfu} (expected 0 < mfu <= 1)`;
    if (!(x.recipe in data.recipes) || !(x.optimizer in data.optimizer_moments) || !(x.gpu in data.gpus)) return "Unknown choice";
    return null;
  }

  /** trainfast.calculator.estimate: the same dictionary as _estimate_dict. */
  function estimate(x, data) {
    const s = x.shape, gpu = data.gpus[x.gpu], c = data.constants;
    const d = x.data, t = x.tensor, p = x.pipeline;
    const m = Math.floor(x.global_batch / (s.batch_size * d));
    const recipe = data.recipes[x.recipe];
    const valueBytes = recipe.activation_bytes_per_value;

    const per = {
      parameters: recipe.weight_bytes,
      gradients: recipe.gradient_bytes,
      master_weights: recipe.master_bytes,
      optimizer_state: data.optimizer_moments[x.optimizer] * recipe.state_bytes_per_moment,
    };
    const local = parameterCount(s) / (t * p);
    const state = zeroMemory(local, d, x.zero_stage, per.parameters, per.gradients, per.optimizer_state);
    const master = zeroMemory(local, d, x.zero_stage, 2, 2, per.master_weights);
    const sequenceParallel = t > 1;
    const layer = activationBytes(s, t, sequenceParallel, valueBytes);
    const layersAlive = Math.floor(s.n_layers / p) * Math.min(p, m);
    let layers;
    if (x.checkpointing) {
      layers = layersAlive * checkpointedLayerBytes(s, t, sequenceParallel, valueBytes) + layer;
    } else {
      layers = layersAlive * layer;
    }
    const tokens = s.seq_len * s.batch_size;
    const head = tokens * (2 * s.d_model + s.vocab_size / t) * valueBytes;
    const memory = {
      parameters: state.parameters,
      gradients: state.gradients,
      master_weights: master.optimizer_state,
      optimizer_state: state.optimizer_state,
      activations: layers + head,
    };
    memory.total = 0 + memory.parameters + memory.gradients + memory.master_weights + memory.optimizer_state + memory.activations;

    let flops = trainingFlops(Object.assign({}, s, { batch_size: x.global_batch }));
    if (x.checkpointing) flops *= 4 / 3;
    const peak = gpu.peak_flops[data.compute_format[x.recipe]];
    const compute = flops / (d * t * p * peak * x.mfu);
    const bubble = (compute * (p - 1)) / m;
    const gradBytes = local * per.gradients;
    let dataParallel = allReduceRing(gradBytes, d, link(d, t * p, gpu.nvlink_bytes_per_s, c));
    if (x.zero_stage === 3) dataParallel *= 1.5;
    const activation = tokens * s.d_model * valueBytes;
    const perLayer = 4 * allReduceRing(activation, t, link(t, 1, gpu.nvlink_bytes_per_s, c));
    const tensorParallel = perLayer * Math.floor(s.n_layers / p) * m;
    const stage = link(t * p, 1, gpu.nvlink_bytes_per_s, c);
    const pipeline = p > 1 ? 2 * m * (stage.alpha + (activation / t) * stage.beta) : 0.0;
    const time = { compute: compute, bubble: bubble, data_parallel: dataParallel, tensor_parallel: tensorParallel, pipeline: pipeline };
    time.step = compute + bubble + dataParallel + tensorParallel + pipeline;
    return { memory: memory, fits: memory.total <= gpu.memory_bytes * (1 - c.reserve), time: time };
  }

  // --- the widget -----------------------------------------------------------------------------

  const SHAPE_FIELDS = [
    ["vocab_size", "vocabulary"],
    ["d_model", "width d_model"],
    ["n_layers", "layers"],
    ["n_heads", "heads"],
    ["d_ff", "MLP width d_ff"],
    ["seq_len", "sequence length"],
  ];
  const MEMORY_PARTS = [
    ["parameters", "weights"],
    ["gradients", "gradients"],
    ["master_weights", "fp32 master weights"],
    ["optimizer_state", "optimizer state"],
    ["activations", "activations"],
  ];
  const TIME_PARTS = [
    ["compute", "compute (matmuls at the assumed MFU)"],
    ["bubble", "pipeline bubble"],
    ["data_parallel", "gradient all-reduce (data parallel)"],
    ["tensor_parallel", "activation all-reduces (tensor parallel)"],
    ["pipeline", "sends between stages (pipeline)"],
  ];

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    }
    for (const child of children || []) node.appendChild(child);
    return node;
  }

  function field(label, input) {
    return el("label", { class: "tfc-field" }, [el("span", { text: label }), input]);
  }

  function numberInput(name, value, step) {
    return el("input", { type: "number", name: name, value: String(value), min: step ? "0.01" : "1", step: step || "1" });
  }

  function select(name, options, value) {
    const node = el("select", { name: name });
    for (const option of options) {
      const o = el("option", { value: String(option), text: String(option) });
      if (String(option) === String(value)) o.selected = true;
      node.appendChild(o);
    }
    return node;
  }

  function gb(bytes) {
    return (bytes / 1e9).toFixed(2);
  }

  function seconds(s) {
    return s >= 1 ? s.toFixed(2) + " s" : (s * 1e3).toFixed(1) + " ms";
  }

  function build(root, data) {
    const preset = root.dataset.preset in data.shapes ? root.dataset.preset : Object.keys(data.shapes)[1];
    const shape = data.shapes[preset];
    const form = el("form", { class: "tfc-form" });
    const presetSelect = select("preset", Object.keys(data.shapes).concat(["custom"]), preset);
    form.appendChild(el("fieldset", {}, [el("legend", { text: "Model" }), field("preset", presetSelect)].concat(
      SHAPE_FIELDS.map(([name, label]) => field(label, numberInput(name, shape[name]))))));
    form.appendChild(el("fieldset", {}, [
      el("legend", { text: "Training" }),
      field("precision recipe", select("recipe", Object.keys(data.recipes), "bf16-mixed")),
      field("optimizer", select("optimizer", Object.keys(data.optimizer_moments), "adamw")),
      field("ZeRO stage", select("zero_stage", [0, 1, 2, 3], 1)),
      field("activation checkpointing", el("input", { type: "checkbox", name: "checkpointing" })),
      field("micro-batch (sequences)", numberInput("batch_size", 1)),
      field("global batch (sequences)", numberInput("global_batch", 256)),
    ]));
    form.appendChild(el("fieldset", {}, [
      el("legend", { text: "Hardware and layout" }),
      field("GPU", select("gpu", Object.keys(data.gpus), Object.keys(data.gpus)[0])),
      field("data parallel d", numberInput("data", 8)),
      field("tensor parallel t", numberInput("tensor", 1)),
      field("pipeline parallel p", numberInput("pipeline", 1)),
      field("assumed MFU", numberInput("mfu", 0.4, "0.01")),
    ]));
    const output = el("div", { class: "tfc-output", "aria-live": "polite" });
    root.replaceChildren(el("div", { class: "tfc" }, [form, output]));

    function read() {
      const value = (name) => form.elements[name].value;
      const int = (name) => Number(value(name));
      const s = {};
      for (const [name] of SHAPE_FIELDS) s[name] = int(name);
      s.batch_size = int("batch_size");
      return {
        shape: s, recipe: value("recipe"), optimizer: value("optimizer"), zero_stage: int("zero_stage"),
        data: int("data"), tensor: int("tensor"), pipeline: int("pipeline"), global_batch: int("global_batch"),
        gpu: value("gpu"), checkpointing: form.elements.checkpointing.checked, mfu: Number(value("mfu")),
      };
    }

    function row(label, key, raw, shown, extra) {
      return el("tr", {}, [el("th", { scope: "row", text: label }),
        el("td", { "data-out": key, "data-value": String(raw), text: shown }), extra || el("td")]);
    }

    function render() {
      const x = read();
      const error = problem(x, data);
      if (error) {
        output.replaceChildren(el("p", { class: "tfc-error", "data-out": "error", text: error }));
        return;
      }
      const r = estimate(x, data);
      const capacity = data.gpus[x.gpu].memory_bytes;
      const bar = el("div", { class: "tfc-bar", role: "img",
        "aria-label": `memory per GPU: ${gb(r.memory.total)} GB of ${gb(capacity)} GB` });
      const scale = Math.max(capacity, r.memory.total);
      MEMORY_PARTS.forEach(([key, label], i) => {
        bar.appendChild(el("span", { class: `tfc-part tfc-part-${i}`, title: `${label}: ${gb(r.memory[key])} GB`,
          style: `width: ${(100 * r.memory[key]) / scale}%` }));
      });
      bar.appendChild(el("span", { class: "tfc-capacity", style: `left: ${(100 * capacity * (1 - data.constants.reserve)) / scale}%` }));
      const memoryRows = MEMORY_PARTS.map(([key, label], i) =>
        row(label, "memory." + key, r.memory[key], gb(r.memory[key]) + " GB", el("td", {}, [el("span", { class: `tfc-swatch tfc-part-${i}` })])));
      memoryRows.push(row("total per GPU", "memory.total", r.memory.total, gb(r.memory.total) + " GB"));
      const timeRows = TIME_PARTS.map(([key, label]) => row(label, "time." + key, r.time[key], seconds(r.time[key])));
      timeRows.push(row("step", "time.step", r.time.step, seconds(r.time.step)));
      const tokensPerSecond = (x.global_batch * x.shape.seq_len) / r.time.step;
      const usable = gb(capacity * (1 - data.constants.reserve));
      const verdict = r.fits
        ? `Fits: ${gb(r.memory.total)} GB of the ${usable} GB usable on each ${x.gpu}.`
        : `Does not fit: ${gb(r.memory.total)} GB per GPU, more than the ${usable} GB usable on one ${x.gpu}.`;
      output.replaceChildren(
        el("p", { class: r.fits ? "tfc-verdict tfc-fits" : "tfc-verdict tfc-nofit", "data-out": "fits", "data-value": String(r.fits), text: verdict }),
        bar,
        el("table", { class: "tfc-table" }, [el("caption", { text: "Memory per GPU" }), el("tbody", {}, memoryRows)]),
        el("table", { class: "tfc-table" }, [el("caption", { text: "Time per step (no overlap of communication)" }), el("tbody", {}, timeRows)]),
        el("p", { class: "tfc-note", text:
          `${x.data * x.tensor * x.pipeline} GPUs, ${Math.floor(x.global_batch / (x.shape.batch_size * x.data))} micro-batches per step, ` +
          `about ${Math.round(tokensPerSecond).toLocaleString("en")} tokens/s. Formulas: trainfast.calculator.estimate.` }),
      );
    }

    presetSelect.addEventListener("change", () => {
      const chosen = data.shapes[presetSelect.value];
      if (chosen) for (const [name] of SHAPE_FIELDS) form.elements[name].value = chosen[name];
      render();
    });
    form.addEventListener("input", (event) => {
      if (SHAPE_FIELDS.some(([name]) => name === event.target.name)) presetSelect.value = "custom";
      if (event.target !== presetSelect) render();
    });
    form.addEventListener("submit", (event) => event.preventDefault());
    render();
  }

  function start() {
    const data = window.TRAINFAST_CALCULATOR;
    const roots = document.querySelectorAll(".trainfast-calculator");
    if (!data) {
      roots.forEach((root) => { root.textContent = "The calculator's data (calculator-data.js) did not load."; });
      return;
    }
    roots.forEach((root) => build(root, data));
  }

  window.trainfastCalculator = { estimate: estimate, problem: problem };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
