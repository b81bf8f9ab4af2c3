"""The planned memory of a stage, in bytes, from the model's shape and what the engines allocate.

Every term is a tensor an engine keeps or a temporary it makes; b is the bytes of a number of the run's dtype.
Sizes: B prompts of a chunk (micro-batch), T tokens each, L layers, H query and K key-value heads of d_head, d
d_model, F d_mlp, V d_vocab, g = H / K.

Forward pass without gradients (a scan's reference or counterfactual run), per layer at its peak:
    attention  B H T^2 x 8 bytes: the score product and its scaled copy (b each) or, in softmax, the input (b) and
               its float32 output (4), + the cast back (b, 16-bit only): 8 bytes an entry in either dtype
               (transformers' eager_attention_forward; models/load.py runs eager attention)
               + B T^2 b of causal mask + 2 B T H d_head b of keys and values repeated over g (GQA, g > 1)
    MLP        3 B T F b: gate, up and their product (gate_proj, act, up_proj, down_proj), while the layer still
               holds its attention weights (B H T^2 b, returned by the attention module) and the causal mask
    the larger of the two, above the residual stream, 2 B T d b, and the embedding's output, B T d b, which the
    model keeps through the pass.
Key/value cache (a reference run with `keep_cache`): 2 L B T K d_head b.
Full-vocabulary readout of R final residuals (models/view.py vocab_logits, in float32): the logits, R V 4, made a
block of unembedding rows at a time and then concatenated (2 R V 4 at the concatenation); in 16-bit each block is
a float32 copy of at most READOUT_CAST_ELEMENTS numbers of the unembedding (64 MiB), beside the blocks so far.

Training (autograd keeps, per token and layer; LlamaDecoderLayer under eager attention, HF 5):
    two RMSNorms   2 (4 d + b d)   the float32 input (or the float32 residual itself) and the normed cast
    q, k, v        b (H + 2 K) d_head;  rotary: b (2 H + (1 or 2) K) d_head (rotated halves and outputs)
    GQA            2 b H d_head repeated keys and values (g > 1)
    attention      H T (4 + b [16-bit]) the float32 softmax and its cast; b H d_head the o_proj input
    MLP            4 b F (gate, act, up, product)
Loss (finetune/train.py token_loss_sum): the logits (b) and log_softmax's float32 output (4) are kept, (b + 4) V
bytes a token; the shifted copy and its float32 cast are gone once the loss is made. The backward of the loss adds
8 V a token, the gradients of the loss and of log_softmax (largest temporary): 14 V at the peak in 16-bit, 16 V in
float32 (allocator's records on LLaMA2-7B- and Llama-3.1-8B-wide skeletons).

Training's peak is weights + optimizer state + the larger of (graph + temporary) and (gradients + the step's
temporaries): from the second step on the moments exist while the graph is built, and the backward frees the graph
as the gradients appear. torch's AdamW step makes a denominator (sqrt of the second moment) and its quotient: for
every trained tensor at once on a GPU (foreach: as large as the trained numbers), one tensor at a time on a CPU
(the sqrt and the quotient, 2 copies of the largest, and more: the full-SFT skeletons of all five presets measured
2.1 to 2.5 copies, the same in bfloat16 and float32 and at 2 and 4 layers; planned as CPU_STEP_COPIES).
Weights are n_params x b (plan/shape.py). Full SFT: gradients n_params x b, AdamW's two moments 2 n_params x b.
Precise SFT: float32 deltas of the selected heads' slices (finetune/head_slices.py) with float32 gradients, and as
optimizer state two moments and the anchors AnchoredAdamW keeps (float32 copies of the base entries): 16 bytes a
trained number; in 16-bit each forward casts the deltas to the model's dtype and keeps the casts for the backward,
b more. LoRA: r (in + out) per adapted projection, in the model's dtype, with gradients and two moments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from arithmech.patching.scan_cost import TOTAL_MAX_ROWS
from arithmech.plan.shape import ModelShape

ASSEMBLY_FLOAT32_COPIES = 3
"""float32 [3H, batch, pos, d_model] intermediates of the attention norm's vector-Jacobian product, batched over
one layer's head inputs (circuits/gradients.head_input_gradients), beside three tensors of the same size in the
model's dtype: the cotangents per role, their concatenation and the product's result. Read from the allocator's
records on 2-layer skeletons: 18 bytes an element in bfloat16 (LLaMA2-7B), 24 in float32 (LLaMA2-7B, Gemma-2-9B)."""
CPU_STEP_COPIES = 2.6
"""Copies of the largest trained tensor that AdamW's step on a CPU holds beside the weights, gradients and moments:
the most the allocator's records showed on the five presets' full-SFT skeletons (2.1 Gemma-2-9B, 2.2 Llama-3.1-8B
and Qwen2.5-7B, 2.4 LLaMA2-7B, 2.5 Mistral-7B), rounded up."""
READOUT_CAST_ELEMENTS = 2**24
"""models/view.py's _CAST_ELEMENTS (the plan imports no torch; a test holds the two equal)."""
FINGERPRINT_CHUNK = 2**20
"""stages/evaluate.py's FINGERPRINT_CHUNK: the weights' checksum sums float64 copies of this many numbers, two
alive at a time (16 MiB, evaluate's largest temporary on a short float32 run); a test holds the two equal."""
PARTS = ("weights", "activations_clean", "activations_counterfactual", "gradients", "optimizer", "temporary")
"""The parts a planned peak is split into, in the order they are printed."""


@dataclass(frozen=True)
class MemoryPlan:
    """Planned bytes of one process at the stage's peak, by part (PARTS); `notes` say what each part holds."""

    weights: int
    activations_clean: int = 0
    activations_counterfactual: int = 0
    gradients: int = 0
    optimizer: int = 0
    temporary: int = 0
    notes: tuple[str, ...] = ()
    gradients_replace_graph: bool = False
    """Training: the weight gradients appear as the backward frees the graph, so the two do not add up."""
    optimizer_step: int = 0
    """Training: temporaries of the optimizer step, beside the gradients once the graph is freed."""
    after_backward: int = 0
    """Allocations that appear once the backward has freed the autograd graph, `graph_bytes` of activations_clean,
    and the forward's temporary (EAP: the probes' gradients and their assembly into receiver gradients)."""
    graph_bytes: int = 0

    @property
    def peak(self) -> int:
        if self.gradients_replace_graph:
            during = max(self.activations_clean + self.temporary, self.gradients + self.optimizer_step)
            return self.weights + self.optimizer + self.activations_counterfactual + during
        total = sum(getattr(self, part) for part in PARTS)
        return total + max(0, self.after_backward - self.graph_bytes - self.temporary)

    def as_dict(self) -> dict[str, Any]:
        extra = {k: getattr(self, k) for k in ("after_backward", "optimizer_step") if getattr(self, k)}
        return {**{part: int(getattr(self, part)) for part in PARTS}, **extra, "peak": int(self.peak),
                "notes": list(self.notes)}  # fmt: skip


def weight_bytes(shape: ModelShape, b: int) -> int:
    return shape.n_params * b


def kv_cache_bytes(shape: ModelShape, batch: int, tokens: int, b: int) -> int:
    """Keys and values of every layer and position of `batch` prompts."""
    return 2 * shape.n_layers * batch * tokens * shape.n_kv_heads * shape.d_head * b


def joined_kv_bytes(shape: ModelShape, rows: int, tokens: int, b: int) -> int:
    """One layer's keys and values for `rows` rows that join a run at it (patching/from_layer.py: the base run's
    prefix joined to theirs), and on a grouped-query model their copies repeated over the query heads (eager
    attention's repeat_kv)."""
    joined = 2 * rows * shape.n_kv_heads * shape.d_head * tokens * b
    if shape.group_size > 1:
        joined += 2 * rows * shape.n_heads * shape.d_head * tokens * b
    return joined


def end_state_bytes(shape: ModelShape, batch: int, b: int) -> int:
    """END states of every layer (patching/states.collect_end_states): residuals, attention and MLP reads and
    outputs, the final residual, and every head's z."""
    s = shape
    return (4 * s.n_layers + 1) * batch * s.d_model * b + s.n_layers * batch * s.n_heads * s.d_head * b


def forward_temporary(shape: ModelShape, batch: int, tokens: int, b: int) -> int:
    """The largest temporary of a forward pass without gradients (module docstring), residual stream included."""
    s = shape
    attention = batch * s.n_heads * tokens**2 * 8 + batch * tokens**2 * b
    if s.group_size > 1:
        attention += 2 * batch * tokens * s.n_heads * s.d_head * b
    mlp = 3 * batch * tokens * s.d_mlp * b + batch * (s.n_heads + 1) * tokens**2 * b
    return max(attention, mlp) + 3 * batch * tokens * s.d_model * b


def readout_bytes(shape: ModelShape, b: int, rows: int) -> int:
    """The full-vocabulary float32 logits of `rows` final residuals at their peak (module docstring); a soft-capped
    model's cap makes two more, tanh(logits / cap) and its product with cap, beside the logits (and in 16-bit the
    blocks they were joined from): 4 copies at the peak in bfloat16 (allocator's records, Gemma-2-9B-wide skeleton)."""
    s = shape
    logits = rows * s.d_vocab * 4
    capped = 2 * logits if s.logit_softcap else 0
    if b >= 4:
        return logits + capped + rows * s.d_model * 4
    step = min(s.d_vocab, max(1, READOUT_CAST_ELEMENTS // s.d_model))
    return max(logits + step * (s.d_model + rows) * 4, 2 * logits + capped) + rows * s.d_model * 4


def saved_per_token_layer(shape: ModelShape, tokens: int, b: int, frozen: bool = False) -> int:
    """Bytes autograd keeps per token and layer for the backward (module docstring); `frozen` weights save less:
    autograd keeps a product's input only for the gradient of a factor that needs one, so a frozen projection
    or norm weight keeps no input, and rotary keeps none (cos and sin need no gradient). The inputs a trained
    delta or adapter keeps come on top, in the layers that have one (`hooked_input_bytes`)."""
    s = shape
    q, kv = s.n_heads * s.d_head, s.n_kv_heads * s.d_head
    if frozen:
        keys = 2 * (q if s.group_size > 1 else kv)  # the matmuls' repeated keys and values
        probs = s.n_heads * tokens * (4 + (b if b < 4 else 0))
        return 4 * s.norms_per_layer * s.d_model + b * (q + keys) + probs + 3 * b * s.d_mlp  # a norm's float32 input
    norms = s.norms_per_layer * (4 * s.d_model + b * s.d_model)
    projections = b * (q + 2 * kv) + b * (2 * q + (1 if s.group_size > 1 else 2) * kv)
    repeated = 2 * b * q if s.group_size > 1 else 0
    probs = s.n_heads * tokens * (4 + (b if b < 4 else 0)) + b * q
    return norms + projections + repeated + probs + 4 * b * s.d_mlp


def hooked_input_bytes(shape: ModelShape, b: int) -> int:
    """Bytes a token keeps in a layer whose projections get a trained delta (precise SFT's hooks) or an adapter
    (LoRA on q, k, v, o): the attention's input, read by q, k and v, and o_proj's input, b (d + H d_head)."""
    return b * (shape.d_model + shape.n_heads * shape.d_head)


def loss_bytes(shape: ModelShape, batch: int, tokens: int, b: int) -> tuple[int, int]:
    """(kept, backward temporary) of the logits and the token loss of a micro-batch; a soft-capped model's logits
    keep one more [token, vocabulary] tensor for the backward, tanh's output in the model's dtype (the division and
    product by the cap keep nothing; allocator's records, Gemma-2-9B-wide skeleton)."""
    cap = b if shape.logit_softcap else 0
    return (b + 4 + cap) * shape.d_vocab * batch * tokens, 8 * shape.d_vocab * batch * tokens


SWEEP_ROW_RESIDUALS = 1.5
"""Residual-sized tensors beside each row's MLP in the path scan's sweep (the block's mid residual, its norm's
work), one more with Gemma's two more norms a layer: read from the growth per layer, 2 to 4 layers, on the presets'
skeletons (allocator's records: 0.9-1.6 a row, Gemma 2.4; without them the plan grew 0.68-0.92 of measured)."""


def scan_memory(shape: ModelShape, b: int, batch: int, tokens: int, variant: str) -> MemoryPlan:
    """identify's exact scans (patching/path.py `_patch_chunk`): the reference run keeps every key and value, the
    counterfactual run continues it and grows its own cache; the END states of both are [layer, batch, d_model]
    tensors; the sweep carries one END residual per (sender so far, prompt) through each later MLP."""
    s = shape
    end_states = end_state_bytes(s, batch, b)
    cache = kv_cache_bytes(s, batch, tokens, b)
    senders = s.n_layers * (s.n_heads + 1)
    counterfactual = cache + end_states
    if variant == "total":  # decoding steps of max_rows (sender, prompt) rows on the reference cache
        slots = min(senders, max(1, TOTAL_MAX_ROWS // batch))  # senders per step (total.patched_end_logits)
        mlp_rows = min(slots, max((s.n_layers - 1) * (s.n_heads + 1), 1)) * batch  # the last layer's join after it
        # at the peak, a step whose rows all run an MLP (on 2 layers, the first layer's senders only): each row's
        # MLP and two residuals (b each); the step's attention, every prompt's slots over its prefix and the slots
        # themselves, [batch, H, slots, T - 1 + slots] scores at 8 bytes an entry (module docstring);
        # beside them every sender's END residual (stacked, then joined), the group's copy of the reference cache
        # (shared_prefix.prefix_cache) and the cache it grows into as the slots join; the counterfactual run's
        # cache is gone by then (allocator's records on LLaMA2-7B-wide skeletons of 2 and 4 layers)
        joined = mlp_rows // batch  # that step's slots
        step = mlp_rows * 3 * s.d_mlp * b + joined * batch * 2 * s.d_model * b
        step += batch * s.n_heads * joined * (tokens - 1 + joined) * 8
        sweep = step + 2 * senders * batch * s.d_model * b + 2 * kv_cache_bytes(s, batch, tokens, b)
        counterfactual = end_states
    else:  # every sender's END residual, and the MLP on the earlier layers' senders at the last layer (the last
        # layer's own heads pass their MLP apart, patching/path.sweep_senders) with SWEEP_ROW_RESIDUALS beside it
        mlp_rows = max((s.n_layers - 1) * (s.n_heads + 1), s.n_heads)
        residuals = SWEEP_ROW_RESIDUALS + (s.norms_per_layer == 4)
        row = 3 * s.d_mlp * b + math.ceil(residuals * s.d_model * b)
        sweep = senders * batch * 2 * s.d_model * b + mlp_rows * batch * row
    return MemoryPlan(
        weights=weight_bytes(s, b),
        activations_clean=cache + end_states,
        activations_counterfactual=counterfactual,
        temporary=max(forward_temporary(s, batch, tokens, b), sweep),
        notes=("clean and counterfactual: each run's key/value cache and END states (total: the reference's only)",
               "temporary: the larger of a layer's attention or MLP and the sweep over senders"),
    )  # fmt: skip


def attribution_memory(shape: ModelShape, b: int, batch: int, tokens: int) -> MemoryPlan:
    """identify --method attribution (patching/attribution.py): a reference and a counterfactual run, then one
    forward with gradients to the END states: its autograd graph and the gradients at each layer's END."""
    s = shape
    graph = s.n_layers * batch * tokens * saved_per_token_layer(s, tokens, b)
    end_states = end_state_bytes(s, batch, b)
    return MemoryPlan(
        weights=weight_bytes(s, b),
        activations_clean=graph + end_states,
        activations_counterfactual=end_states,
        gradients=end_states,
        temporary=forward_temporary(s, batch, tokens, b),
        notes=("clean: the autograd graph of one forward pass", "gradients: d metric / d END state"),
    )


def edge_attribution_memory(shape: ModelShape, b: int, batch: int, tokens: int) -> MemoryPlan:
    """circuit's EAP / EAP-IG (circuits/gradients.receiver_gradients): one forward's autograd graph (attention on
    g replicas), both runs' sender outputs (the embedding, every layer's z and MLP output), the probes (a zero
    tensor added to every projection's output, tiled over the g replicas, and to every MLP's and the final norm's
    input) and the float32 gradients of every receiver's input. Once the backward has freed the graph: the probes'
    gradients (as large as the probes) and one layer's assembly of its 3H head-input gradients, [3H, batch, pos,
    d_model] tensors (the cotangents, their concatenation and the norm's batched vector-Jacobian product,
    ASSEMBLY_FLOAT32_COPIES); then, the probes freed, every sender's float32 difference between the runs, which
    the gradients are contracted with (attribution.contract)."""
    s = shape
    rows = batch * tokens
    receivers = s.n_layers * (3 * s.n_heads + 1) + 1
    senders = s.n_layers * (s.n_heads + 1) + 1
    per_layer = saved_per_token_layer(s, tokens, b) + (s.group_size - 1) * s.n_heads * tokens * 8
    graph = s.n_layers * rows * per_layer
    outputs = (2 * s.n_layers + 1) * rows * s.d_model * b
    projections = s.group_size * (s.n_heads + 2 * s.n_kv_heads) * s.d_head  # tiled over the g replicas
    probes = rows * (s.n_layers * (projections + s.d_model) + s.d_model) * b
    assembly = 3 * s.n_heads * rows * s.d_model * (3 * b + 4 * ASSEMBLY_FLOAT32_COPIES)
    differences = 4 * senders * rows * s.d_model
    return MemoryPlan(
        weights=weight_bytes(s, b),
        activations_clean=graph + outputs + probes,
        activations_counterfactual=outputs,
        gradients=4 * receivers * rows * s.d_model,
        temporary=forward_temporary(s, batch, tokens, b),
        after_backward=max(probes + assembly, differences - probes),
        graph_bytes=graph,
        notes=("gradients: float32 d metric / d x_r of every receiver", "clean: the autograd graph, sender outputs "
               "and probes", "after_backward: the probes' gradients and one layer's assembly, as the graph is "
               "freed, or after them the senders' differences"),
    )  # fmt: skip


def sweep_memory(shape: ModelShape, b: int, batch: int, rows: int, tokens: int) -> MemoryPlan:
    """circuit's faithfulness sweep (circuits/patched.py, swaps.py): a patched pass of `rows` circuit x prompt rows
    on the positions after the shared prefix. It keeps every sender's swap term out_s(ablated) - out_s(run) and
    their sums at each block boundary, beside the counterfactual run's sender outputs of the chunk's `batch`
    prompts. At a layer's attention norm, the head inputs that deviate from the shared base are built one circuit
    at a time: at most 3H per prompt, first as a product over senders (beside the terms it gathers, up to half the
    senders), then as their sum with the base and the norm's temporaries (a float32 copy and product); each is
    projected at once, so only their d_head outputs are kept for the layer's attention, which runs on g replicas."""
    s = shape
    senders = s.n_layers * (s.n_heads + 1) + 1
    position = rows * tokens * s.d_model
    one_circuit = 3 * s.n_heads * batch * tokens * s.d_model
    gathered = senders // 2 * batch * tokens * s.d_model * b
    projected = 3 * s.n_heads * rows * tokens * s.d_head * b
    return MemoryPlan(
        weights=weight_bytes(s, b),
        activations_clean=(senders + 2 * s.n_layers + 1) * position * b,
        activations_counterfactual=(2 * s.n_layers + 1) * batch * tokens * s.d_model * b,
        temporary=projected + max(one_circuit * (b + 8), gathered + one_circuit * b,
                                  forward_temporary(s, rows * s.group_size, tokens, b)),
        notes=("clean: every sender's swap term and their sums at block boundaries", "counterfactual: the "
               "counterfactual run's sender outputs", "temporary: one circuit's deviating head inputs, 3H a prompt "
               "at most, normed, and every circuit's projections of them"),
    )  # fmt: skip


def forward_memory(shape: ModelShape, b: int, batch: int, tokens: int, cache: bool = False) -> MemoryPlan:
    """A stage that runs plain forward passes of its prompts (with `cache`, keeping their keys and values)."""
    return MemoryPlan(
        weights=weight_bytes(shape, b),
        activations_clean=kv_cache_bytes(shape, batch, tokens, b) if cache else 0,
        temporary=max(
            forward_temporary(shape, batch, tokens, b),
            3 * batch * tokens * shape.d_model * b + readout_bytes(shape, b, batch),
        ),
        notes=(
            "temporary: the larger of a layer's attention or MLP and, after the last layer, the last position's "
            "readout beside the residual stream",
        ),
    )


def generation_memory(shape: ModelShape, b: int, batch: int, tokens: int, new_tokens: int) -> MemoryPlan:
    """evaluate's greedy generation of one batch: the key/value cache of prompt and new tokens, and the prompt's
    pass (the decoding steps, one token each, are smaller) with the last position's logits."""
    return MemoryPlan(
        weights=weight_bytes(shape, b),
        activations_clean=kv_cache_bytes(shape, batch, tokens + new_tokens, b),
        temporary=max(
            forward_temporary(shape, batch, tokens, b) + batch * shape.d_vocab * 4,
            3 * batch * tokens * shape.d_model * b + readout_bytes(shape, b, batch),
        ),
        notes=(
            "clean: the key/value cache of the prompts and their new tokens",
            "temporary: the prompts' pass and the last position's logits, or their float32 readout (the answer check)",
        ),
    )


def checksum_memory(shape: ModelShape, b: int) -> MemoryPlan:
    """evaluate's checksum of the weights (its cache key), before any generation: FINGERPRINT_CHUNK's copies."""
    notes = ("temporary: float64 copies of two chunks of a weight (the weights' checksum)",)
    chunk = min(FINGERPRINT_CHUNK, max(shape.d_vocab, shape.d_mlp) * shape.d_model)  # a small model's whole tensor
    return MemoryPlan(weights=weight_bytes(shape, b), temporary=2 * chunk * 8, notes=notes)


def training_memory(
    shape: ModelShape,
    b: int,
    batch: int,
    tokens: int,
    method: str,
    trained: int,
    processes: int = 1,
    fsdp: bool = False,
    hooked_layers: int | None = None,
    mlp_layers: int = 0,
    step_temporary: int = 0,
) -> MemoryPlan:
    """One finetune step (finetune/train.py): `trained` numbers train (full: every parameter); under FSDP2 the
    weights, gradients and moments are split over `processes`, plus one layer gathered whole. `hooked_layers`:
    the layers whose projections keep their inputs for a trained delta (precise SFT: the chosen heads' layers;
    LoRA and the default: every layer); `mlp_layers`: whole MLPs trained by precise SFT, whose projections keep
    their inputs too, b (d + d_mlp) a token; `step_temporary`: the optimizer step's (`optimizer_step_bytes`)."""
    s = shape
    kept, backward = loss_bytes(s, batch, tokens, b)
    graph = s.n_layers * batch * tokens * saved_per_token_layer(s, tokens, b, frozen=method != "full") + kept
    if method != "full":
        hooked = s.n_layers if hooked_layers is None else hooked_layers
        graph += hooked * batch * tokens * hooked_input_bytes(s, b)
        graph += mlp_layers * batch * tokens * b * (s.d_model + s.d_mlp)
    weights = weight_bytes(s, b)
    if method == "full":
        gradients, optimizer = s.n_params * b, 2 * s.n_params * b
    elif method == "lora":
        gradients, optimizer = trained * b, 2 * trained * b
        weights += trained * b
    else:  # precise: float32 deltas, their gradients, two moments and AnchoredAdamW's anchors (the optimizer's
        # state: made at the first step, as the moments are); in 16-bit the graph keeps the deltas' casts
        gradients, optimizer = 4 * trained, 12 * trained
        weights += 4 * trained
        graph += trained * b if b < 4 else 0
    if fsdp:
        gathered = s.layer_params() * b
        weights, gradients, optimizer = weights // processes + gathered, gradients // processes, optimizer // processes
        step_temporary //= processes
    return MemoryPlan(
        weights=weights,
        activations_clean=graph,
        gradients=gradients,
        optimizer=optimizer,
        temporary=max(backward, forward_temporary(s, batch, tokens, b)),
        notes=(
            "clean: the autograd graph of one micro-batch and its loss",
            "temporary: the loss's backward",
            "peak: weights + optimizer + the larger of graph + temporary and gradients (steady state)",
        ),
        gradients_replace_graph=True,
        optimizer_step=step_temporary,
    )


def optimizer_step_bytes(shape: ModelShape, trained_bytes: int, number_bytes: int, method: str, gpu: bool) -> int:
    """AdamW's step temporaries (module docstring): the trained bytes on a GPU; on a CPU CPU_STEP_COPIES of the
    largest trained tensor (full SFT: the embedding or an MLP matrix; precise SFT and LoRA: a slice or an adapter,
    planned as an MLP matrix or all the trained numbers, whichever is smaller: an upper bound)."""
    if gpu:
        return trained_bytes
    s = shape
    largest = max(s.d_vocab, s.d_mlp) * s.d_model if method == "full" else s.d_mlp * s.d_model
    return math.ceil(CPU_STEP_COPIES * min(trained_bytes, largest * number_bytes))
