/* Train Faster: "will it fit, and how long will a step take?" calculator.
 *
 * Hand-written, no dependencies, no network: it fills every <div class="trainfast-calculator">
 * on the page. The formulas are trainfast.distributed.step_time.estimate's, line for line; the
 * presets, default assumptions and a grid of cases computed in Python come from calculator-data.js,
 * which the build writes (trainfast.calculator.write_script), and tests/test_calculator_widget.py checks in a browser
 * that this file gives the same numbers on every case.
 */
(function () {
  "use strict";

  // --- the model: trainfast.accounting and trainfast.distributed.step_time, in the same order ---

  // keys' (and values') width: the key/value heads times the head dimension
  function kvDim(s) {
    const kvHeads = s.n_kv_heads == null ? s.n_heads : s.n_kv_heads;
    return kvHeads * Math.floor(s.d_model / s.n_heads);
  }

  function parameterCount(s) {
    const h = s.d_model, f = s.d_ff, k = kvDim(s);
    const attention = h * (h + 2 * k) + h * h + (h + 2 * k) + h;
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
      linearTrainingFlops(tokens, h, h + 2 * kvDim(s)) +
      linearTrainingFlops(tokens, h, h) +
      linearTrainingFlops(tokens, h, f) +
      linearTrainingFlops(tokens, f, h) +
      3 * attentionForward;
    return s.n_layers * layer + linearTrainingFlops(tokens, h, s.vocab_size);
  }

  // accounting.activation_bytes
  function activationBytes(s, tensor, sequenceParallel, valueBytes, dropout, attention) {
    const h = s.d_model, f = s.d_ff, a = s.n_heads, k = kvDim(s), grouped = k !== h;
    const tokenWise = 4 * h * valueBytes + (dropout ? 2 * h : 0);
    // accounting._attention_keeps: matmul keeps copies of Q, K, V; SDPA keeps the projection,
    // and K and V repeated to every query head when grouped
    const keeps = attention === "manual" ? h + 2 * (grouped ? h : k) + h : h + 2 * k + (grouped ? 2 * h : 0) + h;
    let split = (keeps + 2 * f) * valueBytes;
    if (attention === "manual") split += a * s.seq_len * (valueBytes + (dropout ? 1 + valueBytes : 0));
    else split += a * 4;
    if (sequenceParallel) return (s.seq_len * s.batch_size * (tokenWise + split)) / tensor;
    return s.seq_len * s.batch_size * (tokenWise + split / tensor);
  }

  function checkpointedLayerBytes(s, tensor, sequenceParallel, valueBytes) {
    const kept = s.seq_len * s.batch_size * s.d_model * valueBytes;
    return sequenceParallel ? kept / tensor : kept;
  }

  // step_time.layer_activation_bytes
  function layerActivationBytes(s, tensor, sequenceParallel, recompute, valueBytes, dropout) {
    if (recompute === "full") return checkpointedLayerBytes(s, tensor, sequenceParallel, valueBytes);
    const attention = recompute === "none" ? "manual" : "sdpa";
    return activationBytes(s, tensor, sequenceParallel, valueBytes, dropout, attention);
  }

  // step_time.layers_in_flight: [first stage, last stage]
  function layersInFlight(L, p, m, v) {
    if (v === 1) {
      const stage = Math.ceil(L / p);
      return [stage * Math.min(p, m), stage * Math.min(1, m)];
    }
    const chunk = Math.ceil(L / (p * v));
    return [chunk * Math.min(v * p + p - 1, m * v), chunk * Math.min((v - 1) * p + 1, m * v)];
  }

  // step_time.context_block_scores
  function contextBlockScores(seqLen, context) {
    return (seqLen / context) ** 2 / 2;
  }

  function zeroMemory(n, worldSize, stage, paramBytes, gradBytes, optimizerBytes) {
    const shard = 1.0 / worldSize;
    return {
      parameters: n * paramBytes * (stage >= 3 ? shard : 1.0),
      gradients: n * gradBytes * (stage >= 2 ? shard : 1.0),
      optimizer_state: n * optimizerBytes * (stage >= 1 ? shard : 1.0),
    };
  }

  // cost_model: ring all-reduce, reduce-scatter, all-gather; step_time.all_to_all_time
  function allReduceRing(nBytes, worldSize, link) {
    if (worldSize === 1) return 0.0;
    const latencies = 2.0 * (worldSize - 1);
    const volume = (2.0 * (worldSize - 1) * nBytes) / worldSize;
    return latencies * link.alpha + volume * link.beta + ((worldSize - 1) * nBytes / worldSize) * 0.0;
  }

  function reduceScatter(nBytes, n, link) {
    return (n - 1) * link.alpha + ((n - 1) / n) * nBytes * (link.beta + 0.0);
  }

  function allGather(nBytes, n, link) {
    return (n - 1) * link.alpha + ((n - 1) / n) * nBytes * link.beta;
  }

  function allToAll(nBytes, n, link) {
    return (n - 1) * link.alpha + ((n - 1) / n) * nBytes * link.beta;
  }

  function link(span, nvlink, a) {
    if (span <= a.gpus_per_node) return { alpha: a.nvlink_latency_s, beta: 2.0 / nvlink };
    return { alpha: a.network_latency_s, beta: 1.0 / a.network_bytes_per_s };
  }

  function isPositiveInteger(value) {
    return Number.isInteger(value) && value >= 1;
  }

  /**
   * Check a setup as TrainingSetup and StepAssumptions do. Returns null, or the field at fault
   * and why: {name, why}. The widget shows the field by its label on screen (see LABELS).
   */
  function problem(x, data) {
    const positive = "must be a whole number of at least 1";
    for (const name of ["vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "seq_len", "batch_size"]) {
      if (!isPositiveInteger(x.shape[name])) return { name: name, value: x.shape[name], why: positive };
    }
    if (x.shape.d_model % x.shape.n_heads)
      return { name: "n_heads", value: x.shape.n_heads, why: `must divide the width d_model (${x.shape.d_model})` };
    const kvHeads = x.shape.n_kv_heads == null ? x.shape.n_heads : x.shape.n_kv_heads;
    if (!isPositiveInteger(kvHeads)) return { name: "n_kv_heads", value: kvHeads, why: positive };
    if (x.shape.n_heads % kvHeads)
      return { name: "n_kv_heads", value: kvHeads, why: `must divide the heads (${x.shape.n_heads})` };
    const a = x.assumptions;
    const bad = (name, why) => ({ name: name, value: a[name], why: why });
    if (!(a.matmul_efficiency > 0 && a.matmul_efficiency <= 1)) return bad("matmul_efficiency", "must be above 0 and at most 1");
    if (!(a.overlap >= 0 && a.overlap <= 1)) return bad("overlap", "must be between 0 and 1");
    if (!(a.reserve >= 0 && a.reserve < 1)) return bad("reserve", "must be at least 0 and below 1");
    if (!isPositiveInteger(a.gpus_per_node)) return bad("gpus_per_node", positive);
    for (const name of ["nvlink_latency_s", "network_latency_s"]) {
      if (!(a[name] >= 0)) return bad(name, "must not be negative");
    }
    if (!(a.network_bytes_per_s > 0)) return bad("network_bytes_per_s", "must be above 0");
    for (const name of ["data", "tensor", "pipeline", "context", "virtual_stages", "experts", "top_k", "expert_parallel", "global_batch"]) {
      if (!isPositiveInteger(x[name])) return { name: name, value: x[name], why: positive };
    }
    if (!(x.recipe in data.recipes)) return { name: "recipe", value: x.recipe, why: "is not a known recipe" };
    if (!(x.optimizer in data.optimizer_moments)) return { name: "optimizer", value: x.optimizer, why: "is not a known optimizer" };
    const s = x.shape, m = x.global_batch / (s.batch_size * x.data);
    const checks = [
      [![0, 1, 2, 3].includes(x.zero_stage), "zero_stage", "must be 0, 1, 2 or 3"],
      [!(x.gpu in data.gpus), "gpu", "must be one of the listed NVLink GPUs"],
      [!data.recompute.includes(x.recompute), "recompute", "must be none, selective or full"],
      [s.n_heads % x.tensor, "tensor", `must divide the heads (${s.n_heads})`],
      [s.seq_len % (2 * x.context), "context", `2 × it must divide the sequence length (${s.seq_len})`],
      [x.pipeline * x.virtual_stages > s.n_layers, "virtual_stages", `× pipeline parallel p must not exceed the layers (${s.n_layers})`],
      [x.top_k > x.experts, "top_k", `must not exceed the experts per MLP (${x.experts})`],
      [x.experts % x.expert_parallel, "expert_parallel", `must divide the experts per MLP (${x.experts})`],
      [(x.data * x.context) % x.expert_parallel, "expert_parallel", `must divide data × context parallel (${x.data * x.context})`],
      [x.global_batch % (s.batch_size * x.data), "global_batch", `must be a multiple of micro-batch × data parallel (${s.batch_size} × ${x.data})`],
    ];
    for (const [isBad, name, why] of checks) if (isBad) return { name: name, value: x[name], why: why };
    if (x.virtual_stages > 1 && m % x.pipeline)
      return { name: "global_batch", value: x.global_batch,
        why: `with interleaving, its ${m} micro-batches must be a multiple of pipeline parallel p (${x.pipeline})` };
    return null;
  }

  /** trainfast.distributed.step_time.estimate: the same dictionary as calculator.estimate_dict. */
  function estimate(x, data) {
    const a = x.assumptions, shape = x.shape, gpu = data.gpus[x.gpu];
    const d = x.data, t = x.tensor, p = x.pipeline, c = x.context;
    const v = x.virtual_stages, m = Math.floor(x.global_batch / (shape.batch_size * d));
    const k = x.top_k, e = x.expert_parallel;
    const h = shape.d_model, f = shape.d_ff, L = shape.n_layers;
    const recipe = data.recipes[x.recipe];
    const valueBytes = recipe.activation_bytes_per_value;
    const routed = Object.assign({}, shape, { d_ff: f * k });
    const local = Object.assign({}, routed, { seq_len: Math.floor(shape.seq_len / c) });
    const stageLayers = Math.ceil(L / p);
    const nvlink = gpu.nvlink_bytes_per_s;

    const per = {
      parameters: recipe.weight_bytes,
      gradients: recipe.gradient_bytes,
      master_weights: recipe.master_bytes,
      optimizer_state: data.optimizer_moments[x.optimizer] * recipe.state_bytes_per_moment,
    };
    const mlp = 2 * h * f + f + h;
    const expertParams = x.experts > 1 ? L * x.experts * mlp : 0;
    let denseParams = parameterCount(shape) - (x.experts > 1 ? L * mlp : 0);
    denseParams += x.experts > 1 ? L * h * x.experts : 0;
    const parts = [[denseParams / (t * p), d * c], [expertParams / (t * p * e), Math.floor((d * c) / e)]];
    const state = [0.0, 0.0, 0.0, 0.0];
    for (const [n, replicas] of parts) {
      const shard = zeroMemory(n, replicas, x.zero_stage, per.parameters, per.gradients, per.optimizer_state);
      const master = zeroMemory(n, replicas, x.zero_stage, 2, 2, per.master_weights);
      state[0] += shard.parameters;
      state[1] += shard.gradients;
      state[2] += master.optimizer_state;
      state[3] += shard.optimizer_state;
    }
    const sp = x.sequence_parallel && t > 1;
    const one = layerActivationBytes(local, t, sp, x.recompute, valueBytes, x.dropout);
    const [first, last] = layersInFlight(L, p, m, v);
    const working = x.recompute === "full" ? layerActivationBytes(local, t, sp, "selective", valueBytes, x.dropout) : 0.0;
    const localTokens = local.seq_len * local.batch_size;
    const head = localTokens * (2 * h + shape.vocab_size / t) * valueBytes;
    const memory = {
      parameters: state[0],
      gradients: state[1],
      master_weights: state[2],
      optimizer_state: state[3],
      activations: Math.max(first * one, last * one + head) + working,
    };
    memory.total = 0 + memory.parameters + memory.gradients + memory.master_weights + memory.optimizer_state + memory.activations;

    const step = Object.assign({}, routed, { batch_size: x.global_batch });
    let flops = trainingFlops(step);
    const modelFlops = flops;
    const headDim = Math.floor(h / shape.n_heads);
    const attentionForward = step.batch_size * shape.n_heads * 4 * shape.seq_len ** 2 * headDim;
    if (x.recompute === "full") flops += (flops - linearTrainingFlops(step.seq_len * step.batch_size, h, shape.vocab_size)) / 3;
    else if (x.recompute === "selective") flops += L * attentionForward;
    const peak = gpu.peak_flops[data.recipes[x.recipe].compute_format];
    const achieved = peak * a.matmul_efficiency;
    const compute = flops / (d * c * t * p * achieved);
    const forwards = x.recompute === "full" ? 2 : 1;

    const activation = localTokens * h * valueBytes;
    const tpLink = link(t, nvlink, a);
    let tensor = 2 * (forwards + 1) * allReduceRing(activation, t, tpLink);
    if (sp) tensor += 2 * allGather(activation, t, tpLink);
    const tensorParallel = tensor * stageLayers * m;

    let contextParallel = 0.0;
    if (c > 1) {
      const kvHeads = Math.max((shape.n_kv_heads == null ? shape.n_heads : shape.n_kv_heads) / t, 1);
      const kvBlock = 2 * localTokens * kvHeads * headDim * valueBytes;
      const send = link(t * c, nvlink, a);
      const scores = contextBlockScores(shape.seq_len, c);
      let blockS = ((shape.batch_size * shape.n_heads) / t) * 4 * scores * headDim;
      blockS /= achieved;
      const forward = Math.max(0.0, send.alpha + kvBlock * send.beta - blockS);
      const backward = Math.max(0.0, send.alpha + 2 * kvBlock * send.beta - 2 * blockS);
      const perLayer = (c - 1) * (forwards * forward + backward);
      contextParallel = perLayer * stageLayers * m;
    }

    let expertParallel = 0.0;
    if (e > 1) {
      const routedBytes = (activation / t) * k;
      const oneA2a = allToAll(routedBytes, e, link(t * c * p * e, nvlink, a));
      expertParallel = 2 * (forwards + 1) * oneA2a * stageLayers * m;
    }

    const bubble = ((compute + tensorParallel + contextParallel + expertParallel) * (p - 1)) / (v * m);

    let pipeline = 0.0;
    if (p > 1) {
      const hop = link(t * c * p, nvlink, a);
      pipeline = 2 * v * m * (hop.alpha + (activation / t) * hop.beta);
    }

    let dataParallel = 0.0;
    const dataLink = link(t * c * p * d, nvlink, a);
    for (const [n, r] of parts) {
      if (!n || r <= 1) continue;
      const gradBytes = n * per.gradients, weightBytes = n * per.parameters;
      if (x.zero_stage <= 1) {
        dataParallel += allReduceRing(gradBytes, r, dataLink);
      } else if (x.zero_stage === 2) {
        dataParallel += m * reduceScatter(gradBytes, r, dataLink);
        dataParallel += allGather(weightBytes, r, dataLink);
      } else {
        dataParallel += m * reduceScatter(gradBytes, r, dataLink);
        dataParallel += 2 * m * allGather(weightBytes, r, dataLink);
      }
    }
    const backward = (compute * (forwards + 1)) / (forwards + 2);
    const hidden = [backward / m, backward / m, backward, compute][x.zero_stage];
    dataParallel = Math.max(0.0, dataParallel - a.overlap * hidden);

    const time = {
      compute: compute, bubble: bubble, data_parallel: dataParallel, tensor_parallel: tensorParallel,
      context_parallel: contextParallel, expert_parallel: expertParallel, pipeline: pipeline,
    };
    time.step = compute + bubble + dataParallel + tensorParallel + contextParallel + expertParallel + pipeline;
    const peakAll = peak * d * c * t * p;
    const utilization = { mfu: modelFlops / (time.step * peakAll), hfu: flops / (time.step * peakAll) };
    return { memory: memory, fits: memory.total <= gpu.memory_bytes * (1 - a.reserve), time: time, utilization: utilization };
  }

  // --- the widget -----------------------------------------------------------------------------

  const SHAPE_FIELDS = [
    ["vocab_size", "vocabulary"],
    ["d_model", "width d_model"],
    ["n_layers", "layers"],
    ["n_heads", "heads"],
    ["n_kv_heads", "key/value heads"],
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
    ["compute", "compute (matmuls at the assumed efficiency)"],
    ["bubble", "pipeline bubble"],
    ["data_parallel", "gradient reduction not hidden (data parallel)"],
    ["tensor_parallel", "activation all-reduces (tensor parallel)"],
    ["context_parallel", "key/value sends not hidden (context parallel)"],
    ["expert_parallel", "token all-to-alls (expert parallel)"],
    ["pipeline", "sends between stages (pipeline)"],
  ];
  const ASSUMPTION_FIELDS = [
    ["matmul_efficiency", "matmul efficiency (share of peak)"],
    ["overlap", "overlap of the gradient reduction"],
    ["gpus_per_node", "GPUs per NVLink node"],
    ["nvlink_latency_s", "NVLink latency (s)"],
    ["network_latency_s", "network latency (s)"],
    ["network_bytes_per_s", "network bytes/s per GPU"],
    ["reserve", "memory reserve"],
  ];

  /** The label on screen of every input, by its name in TrainingSetup (error messages use it). */
  const LABELS = Object.fromEntries([
    ...SHAPE_FIELDS, ...ASSUMPTION_FIELDS,
    ["recipe", "precision recipe"], ["optimizer", "optimizer"], ["zero_stage", "ZeRO stage"],
    ["recompute", "activation recomputation"], ["batch_size", "micro-batch (sequences)"],
    ["global_batch", "global batch (sequences)"], ["experts", "experts per MLP (1: dense)"],
    ["top_k", "experts per token (top-k)"], ["gpu", "GPU"], ["data", "data parallel d"],
    ["tensor", "tensor parallel t"], ["pipeline", "pipeline parallel p"],
    ["virtual_stages", "virtual stages per rank v"], ["context", "context parallel c"],
    ["expert_parallel", "expert parallel e"],
  ]);

  /** What the reader sees for a problem: the field by its label, the value typed, and why. */
  function describe(fault) {
    if (fault.empty) return `“${LABELS[fault.name]}” is empty: type a number.`;
    return `“${LABELS[fault.name]}” = ${fault.value}: it ${fault.why}.`;
  }

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
    return el("input", { type: "number", name: name, value: String(value), min: step ? "0" : "1", step: step || "1" });
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

  /** A preset's value of a shape field (no key/value heads given: as many as the heads). */
  function shapeValue(shape, name) {
    return name === "n_kv_heads" && shape[name] == null ? shape.n_heads : shape[name];
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
      SHAPE_FIELDS.map(([name, label]) => field(label, numberInput(name, shapeValue(shape, name)))))));
    form.appendChild(el("fieldset", {}, [
      el("legend", { text: "Training" }),
      field("precision recipe", select("recipe", Object.keys(data.recipes), "bf16 + fp32 master")),
      field("optimizer", select("optimizer", Object.keys(data.optimizer_moments), "adamw")),
      field("ZeRO stage", select("zero_stage", [0, 1, 2, 3], 1)),
      field("activation recomputation", select("recompute", data.recompute, "selective")),
      field("dropout", el("input", { type: "checkbox", name: "dropout" })),
      field("sequence parallelism (with t > 1)", el("input", { type: "checkbox", name: "sequence_parallel" })),
      field("micro-batch (sequences)", numberInput("batch_size", 1)),
      field("global batch (sequences)", numberInput("global_batch", 256)),
      field("experts per MLP (1: dense)", numberInput("experts", 1)),
      field("experts per token (top-k)", numberInput("top_k", 1)),
    ]));
    form.appendChild(el("fieldset", {}, [
      el("legend", { text: "Hardware and layout" }),
      field("GPU", select("gpu", Object.keys(data.gpus), Object.keys(data.gpus)[0])),
      field("data parallel d", numberInput("data", 8)),
      field("tensor parallel t", numberInput("tensor", 1)),
      field("pipeline parallel p", numberInput("pipeline", 1)),
      field("virtual stages per rank v", numberInput("virtual_stages", 1)),
      field("context parallel c", numberInput("context", 1)),
      field("expert parallel e", numberInput("expert_parallel", 1)),
    ]));
    form.appendChild(el("fieldset", {}, [el("legend", { text: "Assumptions" })].concat(
      ASSUMPTION_FIELDS.map(([name, label]) => field(label, numberInput(name, data.assumptions[name], "any"))))));
    const output = el("div", { class: "tfc-output", "aria-live": "polite" });
    root.replaceChildren(el("div", { class: "tfc" }, [form, output]));

    /** The setup typed in, and the first empty field's name (an empty field is not 0). */
    function read() {
      let empty = null;
      const value = (name) => form.elements[name].value;
      const int = (name) => {
        const typed = value(name).trim();
        if (typed === "" && empty === null) empty = name;
        return Number(typed);
      };
      const s = {};
      for (const [name] of SHAPE_FIELDS) s[name] = int(name);
      s.batch_size = int("batch_size");
      const assumptions = {};
      for (const [name] of ASSUMPTION_FIELDS) assumptions[name] = int(name);
      const x = { shape: s, recipe: value("recipe"), optimizer: value("optimizer"), gpu: value("gpu"),
        recompute: value("recompute"), dropout: form.elements.dropout.checked,
        sequence_parallel: form.elements.sequence_parallel.checked, assumptions: assumptions };
      for (const name of ["zero_stage", "data", "tensor", "pipeline", "context", "virtual_stages", "experts",
        "top_k", "expert_parallel", "global_batch"]) x[name] = int(name);
      return [x, empty];
    }

    function row(label, key, raw, shown, extra) {
      return el("tr", {}, [el("th", { scope: "row", text: label }),
        el("td", { "data-out": key, "data-value": String(raw), text: shown }), extra || el("td")]);
    }

    const message = el("p", { class: "tfc-error", "data-out": "error", role: "alert", hidden: "" });
    const results = el("div", { class: "tfc-results" });
    output.replaceChildren(message, results);

    function render() {
      const [x, empty] = read();
      const fault = empty !== null ? { name: empty, empty: true } : problem(x, data);
      for (const input of form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
      if (fault) {
        // Keep the last results, greyed, so the layout does not jump while the reader types.
        message.textContent = describe(fault);
        message.hidden = false;
        results.classList.add("tfc-stale");
        results.setAttribute("aria-hidden", "true");
        if (form.elements[fault.name]) form.elements[fault.name].setAttribute("aria-invalid", "true");
        return;
      }
      message.hidden = true;
      message.textContent = "";
      results.classList.remove("tfc-stale");
      results.removeAttribute("aria-hidden");
      const r = estimate(x, data);
      const capacity = data.gpus[x.gpu].memory_bytes;
      const bar = el("div", { class: "tfc-bar", role: "img",
        "aria-label": `memory per GPU: ${gb(r.memory.total)} GB of ${gb(capacity)} GB` });
      const scale = Math.max(capacity, r.memory.total);
      MEMORY_PARTS.forEach(([key, label], i) => {
        bar.appendChild(el("span", { class: `tfc-part tfc-part-${i}`, title: `${label}: ${gb(r.memory[key])} GB`,
          style: `width: ${(100 * r.memory[key]) / scale}%` }));
      });
      const usableAt = (100 * capacity * (1 - x.assumptions.reserve)) / scale;
      bar.appendChild(el("span", { class: "tfc-capacity", style: `left: ${usableAt}%` }));
      const capacityLabel = el("div", { class: "tfc-capacity-label", "data-out": "capacity-label",
        style: usableAt > 50 ? `right: ${100 - usableAt}%` : `left: ${usableAt}%`,
        text: `dashed line: usable memory, ${gb(capacity * (1 - x.assumptions.reserve))} GB` });
      const memoryRows = MEMORY_PARTS.map(([key, label], i) =>
        row(label, "memory." + key, r.memory[key], gb(r.memory[key]) + " GB", el("td", {}, [el("span", { class: `tfc-swatch tfc-part-${i}` })])));
      memoryRows.push(row("total per GPU", "memory.total", r.memory.total, gb(r.memory.total) + " GB"));
      const timeRows = TIME_PARTS.map(([key, label]) => row(label, "time." + key, r.time[key], seconds(r.time[key])));
      timeRows.push(row("step", "time.step", r.time.step, seconds(r.time.step)));
      const percent = (f) => (100 * f).toFixed(0) + " %";
      timeRows.push(row("whole-step MFU (model FLOPs)", "utilization.mfu", r.utilization.mfu, percent(r.utilization.mfu)));
      timeRows.push(row("whole-step HFU (recomputation counted)", "utilization.hfu", r.utilization.hfu, percent(r.utilization.hfu)));
      const tokensPerSecond = (x.global_batch * x.shape.seq_len) / r.time.step;
      const usable = gb(capacity * (1 - x.assumptions.reserve));
      const verdict = r.fits
        ? `Fits: ${gb(r.memory.total)} GB of the ${usable} GB usable on each ${x.gpu}.`
        : `Does not fit: ${gb(r.memory.total)} GB per GPU, more than the ${usable} GB usable on one ${x.gpu}.`;
      results.replaceChildren(
        el("p", { class: r.fits ? "tfc-verdict tfc-fits" : "tfc-verdict tfc-nofit", "data-out": "fits", "data-value": String(r.fits), text: verdict }),
        el("div", { class: "tfc-bar-wrap" }, [bar, capacityLabel]),
        el("table", { class: "tfc-table" }, [el("caption", { text: "Memory per GPU" }), el("tbody", {}, memoryRows)]),
        el("table", { class: "tfc-table" }, [el("caption", { text: "Time per step (a model, not a measurement)" }), el("tbody", {}, timeRows)]),
        el("p", { class: "tfc-note", text:
          `${x.data * x.context * x.tensor * x.pipeline} GPUs, ${Math.floor(x.global_batch / (x.shape.batch_size * x.data))} micro-batches per step, ` +
          `about ${Math.round(tokensPerSecond).toLocaleString("en")} tokens/s. Formulas: trainfast.distributed.step_time.estimate.` }),
      );
    }

    presetSelect.addEventListener("change", () => {
      const chosen = data.shapes[presetSelect.value];
      if (chosen) for (const [name] of SHAPE_FIELDS) form.elements[name].value = shapeValue(chosen, name);
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

  window.trainfastCalculator = { estimate: estimate, problem: problem, describe: describe };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
