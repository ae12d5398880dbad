/* Train Faster calculator, part 1 of 3: trainfast.accounting in JavaScript.
 *
 * Parameters, matmul FLOPs and the bytes a layer saves for backward, for every choice of
 * trainfast.transformer.TransformerShape the costs depend on: norm (LayerNorm or RMSNorm),
 * positions (learned or rotary), MLP (GELU, SwiGLU or ReLU²), key/value heads, QK-norm, biases
 * and a tied or untied head. Each function is the Python function of the same name, line for
 * line; tests/test_calculator_widget.py checks the whole widget against Python in a browser.
 * Loaded before calculator-step.js and calculator.js (the widget).
 */
(function (parts) {
  "use strict";

  function headDim(s) {
    return Math.floor(s.d_model / s.n_heads);
  }

  function kvHeads(s) {
    return s.n_kv_heads == null ? s.n_heads : s.n_kv_heads;
  }

  // keys' (and values') width: the key/value heads times the head dimension
  function kvDim(s) {
    return kvHeads(s) * headDim(s);
  }

  // _norm_parameters: LayerNorm's gain and bias, or RMSNorm's gain alone
  function normParameters(s) {
    return s.d_model * (s.norm === "layernorm" && s.bias ? 2 : 1);
  }

  // _mlp_matrices: two h x f matrices, three for SwiGLU's gate
  function mlpMatrices(s) {
    return (s.mlp === "swiglu" ? 3 : 2) * s.d_model * s.d_ff;
  }

  // mlp_parameter_count: one layer's (or one expert's) MLP
  function mlpParameterCount(s) {
    const gatedF = (s.mlp === "swiglu" ? 2 : 1) * s.d_ff;
    return mlpMatrices(s) + (s.bias ? gatedF + s.d_model : 0);
  }

  // parameter_count
  function parameterCount(s) {
    const h = s.d_model, k = kvDim(s);
    let attention = h * (h + 2 * k) + h * h + (s.bias ? h + 2 * k + h : 0);
    attention += s.qk_norm ? 2 * headDim(s) : 0;
    const layer = attention + mlpParameterCount(s) + 2 * normParameters(s);
    let embeddings = s.vocab_size * h * (s.tied_head ? 1 : 2);
    embeddings += s.positions === "learned" ? s.seq_len * h : 0;
    return embeddings + s.n_layers * layer + normParameters(s);
  }

  // linear_training_flops: forward, then dX and dW
  function linearTrainingFlops(tokens, inFeatures, outFeatures) {
    const forward = 2 * tokens * inFeatures * outFeatures;
    return forward + forward + forward;
  }

  // training_flops
  function trainingFlops(s) {
    const tokens = s.seq_len * s.batch_size, h = s.d_model, f = s.d_ff;
    const gatedF = (s.mlp === "swiglu" ? 2 : 1) * f;
    const attentionForward = s.batch_size * s.n_heads * 2 * (2 * s.seq_len * headDim(s) * s.seq_len);
    const layer =
      linearTrainingFlops(tokens, h, h + 2 * kvDim(s)) +
      linearTrainingFlops(tokens, h, h) +
      linearTrainingFlops(tokens, h, gatedF) +
      linearTrainingFlops(tokens, f, h) +
      3 * attentionForward;
    return s.n_layers * layer + linearTrainingFlops(tokens, h, s.vocab_size);
  }

  // _norm_keeps: the norm's input, and RMSNorm's normalised input too
  function normKeeps(s) {
    return (s.norm === "rmsnorm" ? 2 : 1) * s.d_model;
  }

  // _attention_keeps: values per token attention keeps besides the probabilities
  function attentionKeeps(s, attention) {
    const h = s.d_model, k = kvDim(s), grouped = kvHeads(s) !== s.n_heads;
    const qkNorm = s.qk_norm ? h + 2 * k + h + k : 0;
    if (attention === "manual") return h + 2 * (grouped ? h : k) + qkNorm + h;
    const newQ = s.positions === "rope" || s.qk_norm; // Q (and K) no longer views
    const projection = (!newQ || !grouped) && !s.qk_norm ? h + 2 * k : 0;
    const operands = (newQ ? h : 0) + (grouped ? 2 * h : newQ ? k : 0);
    return projection + operands + qkNorm + h;
  }

  // _mlp_keeps: GELU and ReLU² 2f, SwiGLU 4f
  function mlpKeeps(s) {
    return (s.mlp === "swiglu" ? 4 : 2) * s.d_ff;
  }

  // activation_bytes
  function activationBytes(s, tensor, sequenceParallel, valueBytes, dropout, attention) {
    const h = s.d_model, a = s.n_heads;
    const tokenWise = 2 * (normKeeps(s) + h) * valueBytes + (dropout ? 2 * h : 0);
    let split = (attentionKeeps(s, attention) + mlpKeeps(s)) * valueBytes;
    if (attention === "manual") split += a * s.seq_len * (valueBytes + (dropout ? 1 + valueBytes : 0));
    else split += a * 4;
    if (sequenceParallel) return (s.seq_len * s.batch_size * (tokenWise + split)) / tensor;
    return s.seq_len * s.batch_size * (tokenWise + split / tensor);
  }

  // checkpointed_layer_bytes
  function checkpointedLayerBytes(s, tensor, sequenceParallel, valueBytes) {
    const kept = s.seq_len * s.batch_size * s.d_model * valueBytes;
    return sequenceParallel ? kept / tensor : kept;
  }

  // head_activation_values: the final norm's input (and normalised input), output, V / t logits
  function headActivationValues(s, tensor) {
    return normKeeps(s) + s.d_model + s.vocab_size / tensor;
  }

  // zero_memory: the part of each kind of model state a rank keeps under ZeRO stage `stage`
  function zeroMemory(n, worldSize, stage, paramBytes, gradBytes, optimizerBytes) {
    const shard = 1.0 / worldSize;
    return {
      parameters: n * paramBytes * (stage >= 3 ? shard : 1.0),
      gradients: n * gradBytes * (stage >= 2 ? shard : 1.0),
      optimizer_state: n * optimizerBytes * (stage >= 1 ? shard : 1.0),
    };
  }

  // trainfast.utilization.mfu_peak_flops: MFU's denominator, the dense bf16 peak (fp16 on a T4)
  function mfuPeakFlops(gpu, nDevices) {
    const peak = "bf16" in gpu.peak_flops ? gpu.peak_flops.bf16 : gpu.peak_flops.fp16;
    return nDevices * peak;
  }

  parts.accounting = {
    headDim, kvHeads, mlpParameterCount, parameterCount, linearTrainingFlops, trainingFlops,
    activationBytes, checkpointedLayerBytes, headActivationValues, zeroMemory, mfuPeakFlops,
  };
})((window.trainfastCalculatorParts = window.trainfastCalculatorParts || {}));
