/* Train Faster calculator, part 2 of 3: trainfast.distributed.step_time in JavaScript.
 *
 * estimate(setup, data) is step_time.estimate, line for line, returning the dictionary of
 * trainfast.calculator.estimate_dict; problem(setup, data) checks a setup as TrainingSetup,
 * StepAssumptions and TransformerShape do. The model's counts come from calculator-accounting.js.
 */
(function (parts) {
  "use strict";
  const A = parts.accounting;

  // step_time.layer_activation_bytes
  function layerActivationBytes(s, tensor, sequenceParallel, recompute, valueBytes, dropout) {
    if (recompute === "full") return A.checkpointedLayerBytes(s, tensor, sequenceParallel, valueBytes);
    const attention = recompute === "none" ? "manual" : "sdpa";
    return A.activationBytes(s, tensor, sequenceParallel, valueBytes, dropout, attention);
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

  /** step_time.data_parallel_link: across nodes, a node's ranks of the group share its ports and
   * send the rest over NVLink; the slower binds. */
  function dataParallelLink(inner, d, nvlink, a) {
    const base = link(inner * d, nvlink, a);
    if (inner * d <= a.gpus_per_node || !a.hierarchical_data_parallel) return base;
    const g = a.gpus_per_node / Math.min(inner, a.gpus_per_node);
    const nvlinkBeta = link(1, nvlink, a).beta;  // g rings, each leaving through one port
    return { alpha: base.alpha, beta: Math.max(base.beta / g, ((g - 1) / g) * nvlinkBeta) };
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
    const kvHeads = A.kvHeads(x.shape);
    if (!isPositiveInteger(kvHeads)) return { name: "n_kv_heads", value: kvHeads, why: positive };
    if (x.shape.n_heads % kvHeads)
      return { name: "n_kv_heads", value: kvHeads, why: `must divide the heads (${x.shape.n_heads})` };
    for (const [name, allowed] of Object.entries(data.choices)) {
      if (!allowed.includes(x.shape[name]))
        return { name: name, value: x.shape[name], why: `must be one of ${allowed.join(", ")}` };
    }
    if (x.shape.positions === "rope" && A.headDim(x.shape) % 2)
      return { name: "positions", value: x.shape.positions,
        why: `rotates pairs, so it needs an even head dimension (width / heads = ${A.headDim(x.shape)})` };
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
      [x.context > 1 && s.seq_len % (2 * x.context), "context", `2 × it must divide the sequence length (${s.seq_len})`],
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
    const mlp = A.mlpParameterCount(shape); // one expert's
    const expertParams = x.experts > 1 ? L * x.experts * mlp : 0;
    let denseParams = A.parameterCount(shape) - (x.experts > 1 ? L * mlp : 0);
    denseParams += x.experts > 1 ? L * h * x.experts : 0;
    const parts = [[denseParams / (t * p), d * c], [expertParams / (t * p * e), Math.floor((d * c) / e)]];
    const state = [0.0, 0.0, 0.0, 0.0];
    // ZeRO-2 and 3 accumulating before the reduction hold whole gradients during the step
    const accumulate = a.accumulate_before_reduce && x.zero_stage >= 2 && m > 1;
    for (const [n, replicas] of parts) {
      const shard = A.zeroMemory(n, replicas, x.zero_stage, per.parameters, per.gradients, per.optimizer_state);
      const master = A.zeroMemory(n, replicas, x.zero_stage, 2, 2, per.master_weights);
      state[0] += shard.parameters;
      state[1] += accumulate ? n * per.gradients : shard.gradients;
      state[2] += master.optimizer_state;
      state[3] += shard.optimizer_state;
    }
    const sp = x.sequence_parallel && t > 1;
    const one = layerActivationBytes(local, t, sp, x.recompute, valueBytes, x.dropout);
    const [first, last] = layersInFlight(L, p, m, v);
    const working = x.recompute === "full" ? layerActivationBytes(local, t, sp, "selective", valueBytes, x.dropout) : 0.0;
    const localTokens = local.seq_len * local.batch_size;
    const head = localTokens * A.headActivationValues(shape, t) * valueBytes;
    const memory = {
      parameters: state[0],
      gradients: state[1],
      master_weights: state[2],
      optimizer_state: state[3],
      activations: Math.max(first * one, last * one + head) + working,
      // loss_buffer_bytes: the loss's float32 buffers at the start of backward (in the peak only)
      loss_buffers: localTokens * local.vocab_size / t * (data.loss_bytes_per_logit - valueBytes),
    };
    memory.total = 0 + memory.parameters + memory.gradients + memory.master_weights + memory.optimizer_state + memory.activations;

    const step = Object.assign({}, routed, { batch_size: x.global_batch });
    let flops = A.trainingFlops(step);
    const modelFlops = flops;
    const headDim = A.headDim(shape);
    const attentionForward = step.batch_size * shape.n_heads * 4 * shape.seq_len ** 2 * headDim;
    if (x.recompute === "full") flops += (flops - A.linearTrainingFlops(step.seq_len * step.batch_size, h, shape.vocab_size)) / 3;
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
      const kvHeads = Math.max(A.kvHeads(shape) / t, 1);
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

    let reduceS = 0.0, gatherS = 0.0; // the gradient reduction, and the gathers of weights
    // each part has its own ring: the experts' replicas are d / e ranks t c p e apart
    const expertLink = d % e === 0
      ? dataParallelLink(t * c * p * e, d / e, nvlink, a)
      : dataParallelLink(t * c * p * d, 1, nvlink, a);
    const links = [dataParallelLink(t * c * p, d, nvlink, a), expertLink];
    const reductions = accumulate ? 1 : m; // ZeRO-2 and 3: reduce-scatters a step
    for (const [i, [n, r]] of parts.entries()) {
      if (!n || r <= 1) continue;
      const dataLink = links[i];
      const gradBytes = n * per.gradients, weightBytes = n * per.parameters;
      if (x.zero_stage <= 1) {
        reduceS += allReduceRing(gradBytes, r, dataLink);
      } else if (x.zero_stage === 2) {
        reduceS += reductions * reduceScatter(gradBytes, r, dataLink);
        gatherS += allGather(weightBytes, r, dataLink);
      } else {
        reduceS += reductions * reduceScatter(gradBytes, r, dataLink);
        gatherS += 2 * m * allGather(weightBytes, r, dataLink);
      }
    }
    // the last backward hides a reduction of accumulated gradients, every backward stage 2's
    // reduce-scatters; ZeRO-2's gather follows the optimizer step; ZeRO-3 hides behind all compute
    const backward = (compute * (forwards + 1)) / (forwards + 2);
    let dataParallel;
    if (x.zero_stage === 3) {
      dataParallel = Math.max(0.0, reduceS + gatherS - a.overlap * compute);
    } else {
      const hidden = x.zero_stage === 2 && !accumulate ? backward : backward / m;
      dataParallel = Math.max(0.0, reduceS - a.overlap * hidden) + gatherS;
    }

    const time = {
      compute: compute, bubble: bubble, data_parallel: dataParallel, tensor_parallel: tensorParallel,
      context_parallel: contextParallel, expert_parallel: expertParallel, pipeline: pipeline,
    };
    time.step = compute + bubble + dataParallel + tensorParallel + contextParallel + expertParallel + pipeline;
    // MFU and HFU over the dense bf16 peak, whatever format the matmuls run in (one convention)
    const peakAll = A.mfuPeakFlops(gpu, d * c * t * p);
    const utilization = { mfu: modelFlops / time.step / peakAll, hfu: flops / time.step / peakAll };
    return { memory: memory, fits: memory.total <= gpu.memory_bytes * (1 - a.reserve), time: time, utilization: utilization };
  }

  parts.step = { estimate, problem };
})((window.trainfastCalculatorParts = window.trainfastCalculatorParts || {}));
