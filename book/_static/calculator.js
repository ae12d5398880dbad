/* Train Faster: "will it fit, and how long will a step take?" calculator, part 3 of 3: the widget.
 *
 * Hand-written, no dependencies, no network: it fills every <div class="trainfast-calculator">
 * on the page. The formulas are in calculator-accounting.js (trainfast.accounting) and
 * calculator-step.js (trainfast.distributed.step_time), loaded before this file; the presets,
 * default assumptions and a grid of cases computed in Python come from calculator-data.js,
 * which the build writes (trainfast.calculator.write_script), and tests/test_calculator_widget.py
 * checks in a browser that the widget gives the same numbers on every case.
 */
(function (step) {
  "use strict";


  const SHAPE_FIELDS = [
    ["vocab_size", "vocabulary"],
    ["d_model", "width d_model"],
    ["n_layers", "layers"],
    ["n_heads", "heads"],
    ["n_kv_heads", "key/value heads"],
    ["d_ff", "MLP width d_ff"],
    ["seq_len", "sequence length"],
  ];
  // the choices of TransformerShape the costs depend on: [name, label, kind]
  const CHOICE_FIELDS = [
    ["norm", "norm", "select"],
    ["positions", "positions", "select"],
    ["mlp", "MLP", "select"],
    ["qk_norm", "QK-norm", "checkbox"],
    ["bias", "biases", "checkbox"],
    ["tied_head", "head tied to the embedding", "checkbox"],
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
    ["hierarchical_data_parallel", "data parallel reduces inside a node first", "checkbox"],
    ["accumulate_before_reduce", "ZeRO-2/3: accumulate whole gradients, reduce once a step", "checkbox"],
    ["reserve", "memory reserve"],
  ];

  /** The label on screen of every input, by its name in TrainingSetup (error messages use it). */
  const LABELS = Object.fromEntries([
    ...SHAPE_FIELDS, ...ASSUMPTION_FIELDS, ...CHOICE_FIELDS.map(([name, label]) => [name, label]),
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

  function checkbox(name, checked) {
    const node = el("input", { type: "checkbox", name: name });
    node.checked = Boolean(checked);
    return node;
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
    // a page may name a preset the widget no longer offers: it gets the default one
    const preset = root.dataset.preset in data.shapes ? root.dataset.preset : data.default_shape;
    const shape = data.shapes[preset];
    const form = el("form", { class: "tfc-form" });
    const presetSelect = select("preset", Object.keys(data.shapes).concat(["custom"]), preset);
    form.appendChild(el("fieldset", {}, [el("legend", { text: "Model" }), field("preset", presetSelect)].concat(
      SHAPE_FIELDS.map(([name, label]) => field(label, numberInput(name, shapeValue(shape, name)))),
      CHOICE_FIELDS.map(([name, label, kind]) => field(label, kind === "select"
        ? select(name, data.choices[name], shape[name]) : checkbox(name, shape[name]))))));
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
      ASSUMPTION_FIELDS.map(([name, label, kind]) => field(label, kind === "checkbox"
        ? checkbox(name, data.assumptions[name]) : numberInput(name, data.assumptions[name], "any"))))));
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
      for (const [name, , kind] of CHOICE_FIELDS)
        s[name] = kind === "select" ? value(name) : form.elements[name].checked;
      s.batch_size = int("batch_size");
      const assumptions = {};
      for (const [name, , kind] of ASSUMPTION_FIELDS)
        assumptions[name] = kind === "checkbox" ? form.elements[name].checked : int(name);
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
      const fault = empty !== null ? { name: empty, empty: true } : step.problem(x, data);
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
      const r = step.estimate(x, data);
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
      memoryRows.push(row("loss buffers at the start of backward (in the step's peak, not in the total)",
        "memory.loss_buffers", r.memory.loss_buffers, gb(r.memory.loss_buffers) + " GB"));
      const timeRows = TIME_PARTS.map(([key, label]) => row(label, "time." + key, r.time[key], seconds(r.time[key])));
      timeRows.push(row("step", "time.step", r.time.step, seconds(r.time.step)));
      const percent = (f) => (100 * f).toFixed(0) + " %";
      timeRows.push(row("whole-step MFU (model FLOPs over the dense bf16 peak)", "utilization.mfu", r.utilization.mfu, percent(r.utilization.mfu)));
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
      if (chosen) {
        for (const [name] of SHAPE_FIELDS) form.elements[name].value = shapeValue(chosen, name);
        for (const [name, , kind] of CHOICE_FIELDS) {
          if (kind === "select") form.elements[name].value = chosen[name];
          else form.elements[name].checked = chosen[name];
        }
      }
      render();
    });
    form.addEventListener("input", (event) => {
      const shapeField = ([name]) => name === event.target.name;
      if (SHAPE_FIELDS.some(shapeField) || CHOICE_FIELDS.some(shapeField)) presetSelect.value = "custom";
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

  window.trainfastCalculator = { estimate: step.estimate, problem: step.problem, describe: describe };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})(window.trainfastCalculatorParts.step);
