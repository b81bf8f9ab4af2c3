"""Precise SFT (Zhang et al. 2024 sec. 4.3): train only the key heads' slices, with full-SFT and LoRA baselines.

Members are imported on first use (arithmech/lazy.py), so the settings (settings.py) need no torch. The training
loop is `arithmech.finetune.train.train`: the package name `train` is its module.
"""

from arithmech.lazy import lazy_exports

_EXPORTS = {
    "delta": ("apply_delta", "read_delta", "save_delta", "save_merged"),
    "head_slices": ("DeltaEntry", "PreciseModel", "PreciseSlices", "SliceDelta", "scale_grad"),
    "methods": ("make_trainable",),
    "optim": ("AnchoredAdamW",),
    "settings": ("HEAD_SCALES", "METHODS", "SCHEDULES", "TARGETS", "TrainConfig"),
    "train": ("TrainResult",),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
