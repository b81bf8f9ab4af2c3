"""Precise SFT (Zhang et al. 2024 sec. 4.3): train only the key heads' slices, with full-SFT and LoRA baselines."""

from arithmech.finetune.delta import apply_delta, read_delta, save_delta, save_merged
from arithmech.finetune.head_slices import HEAD_SCALES, DeltaEntry, PreciseModel, PreciseSlices, SliceDelta, scale_grad
from arithmech.finetune.methods import METHODS, make_trainable
from arithmech.finetune.optim import AnchoredAdamW
from arithmech.finetune.train import TrainConfig, TrainResult, train

__all__ = [
    "HEAD_SCALES",
    "METHODS",
    "AnchoredAdamW",
    "DeltaEntry",
    "PreciseModel",
    "PreciseSlices",
    "SliceDelta",
    "TrainConfig",
    "TrainResult",
    "apply_delta",
    "make_trainable",
    "read_delta",
    "save_delta",
    "save_merged",
    "scale_grad",
    "train",
]
