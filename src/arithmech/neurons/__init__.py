"""Comparative neuron analysis (Yu & Ananiadou 2024, METHODS.md sec. 6).

coefficients  FFN neuron activation coefficients at END, value vectors, neuron masking
readout       a norm with its scale held fixed, and the vocabulary readout through it
log_increase  log-probability increase (LI) of FFN neurons and attention layers at END
comparative   CNA scores: LI intact minus LI with a head zeroed; top-neuron report
importance    head importance by zero ablation per operation; operation-specific heads
pruning       keep only the top-scored neurons of the deep layers vs random neurons of the same number
lora_adapter  a LoRA adapter apart from the model: saved as a peft folder, applied for one block, then removed
lora_train    train a LoRA adapter on chosen layers to predict the answer token at END
lora_effect   how an adapter (trained here or a user's peft folder) moves chosen neurons' coefficients and LI
"""

from arithmech.models.readout import FixedNorm, final_norm, log_probs
from arithmech.neurons.coefficients import (
    d_mlp,
    down_proj_bias,
    end_coefficients,
    mask_neurons,
    value_vectors,
)
from arithmech.neurons.comparative import (
    ComparativeNeurons,
    NeuronReport,
    cna_scores,
    comparative_neurons,
    top_neurons_report,
)
from arithmech.neurons.importance import (
    HeadImportance,
    Specialisation,
    head_importance,
    heldout_set,
    operation_sets,
    specialised_heads,
)
from arithmech.neurons.log_increase import (
    EndBatch,
    EndStates,
    Scales,
    attention_li,
    attention_li_from_states,
    end_states,
    neuron_directions,
    neuron_li,
    neuron_li_from_states,
    neuron_li_of_runs,
    predictions,
    run_scales,
)
from arithmech.neurons.lora_adapter import LoraAdapter, applied_lora
from arithmech.neurons.lora_effect import CoefficientChange, coefficient_change
from arithmech.neurons.lora_train import LoraTrainConfig, train_layer_lora
from arithmech.neurons.pruning import PruningResult, pruning_sweep, random_keep_sets, top_keep_sets

__all__ = [
    "CoefficientChange",
    "LoraAdapter",
    "LoraTrainConfig",
    "PruningResult",
    "applied_lora",
    "coefficient_change",
    "pruning_sweep",
    "random_keep_sets",
    "top_keep_sets",
    "train_layer_lora",
    "ComparativeNeurons",
    "EndBatch",
    "EndStates",
    "FixedNorm",
    "HeadImportance",
    "NeuronReport",
    "Scales",
    "Specialisation",
    "attention_li",
    "attention_li_from_states",
    "cna_scores",
    "comparative_neurons",
    "d_mlp",
    "down_proj_bias",
    "end_coefficients",
    "end_states",
    "final_norm",
    "head_importance",
    "heldout_set",
    "log_probs",
    "mask_neurons",
    "neuron_directions",
    "neuron_li",
    "neuron_li_from_states",
    "neuron_li_of_runs",
    "operation_sets",
    "predictions",
    "run_scales",
    "specialised_heads",
    "top_neurons_report",
    "value_vectors",
]
