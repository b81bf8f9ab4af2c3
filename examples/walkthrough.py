# %% [markdown]
# # arithmech from Python: the whole study, stage by stage
#
# Each stage is a function `stage(handle, config, out_dir)` that returns a typed result and writes its run
# folder; the same functions back the CLI and `arithmech run`. Run this file top to bottom (`python
# examples/walkthrough.py`), or cell by cell in an editor that understands `# %%` cells.
# `ARITHMECH_EXAMPLE_MODEL` picks another model (default: the built-in SmolLM2-135M-Instruct) and
# `ARITHMECH_EXAMPLE_SMALL=1` shrinks every setting (the tests use it on a tiny random model).

# %%
import os
from pathlib import Path

from arithmech.models.load import ModelConfig, load_model

small = os.environ.get("ARITHMECH_EXAMPLE_SMALL") == "1"
out = Path(os.environ.get("ARITHMECH_EXAMPLE_OUT", "runs/walkthrough"))
handle = load_model(ModelConfig(model=os.environ.get("ARITHMECH_EXAMPLE_MODEL")))
print(handle.source["model"], handle.dims)

# %% [markdown]
# ## 1. Identify: path patching of every head and MLP at the last token

# %%
from arithmech.stages.identify import identify
from arithmech.stages.identify_config import IdentifyConfig

identify_cfg = IdentifyConfig(operations=("addition",), max_prompts=8 if small else 64, fraction_threshold=0.1,
                              filter_correct=not small, n_per_template=2 if small else 16)  # fmt: skip
found = identify(handle, identify_cfg, out / "identify", quiet=True)
print("whole-prompt effect", f"{found.key.total_effect:+.1%}")
print("top components", [(r.component.name, f"{r.effect:+.2%}") for r in found.key.ranked[:5]])

# %% [markdown]
# ## 2. Knockout: effect-ranked vs random heads

# %%
from arithmech.stages.knockout import knockout
from arithmech.stages.knockout_config import KnockoutConfig
from arithmech.stages.knockout_outputs import summarize

ko = knockout(handle, KnockoutConfig(from_run=str(out / "identify"), max_k=4 if small else 16,
                                     n_random=1 if small else 3, max_prompts=8 if small else 32),
              out / "knockout", quiet=True)  # fmt: skip
for row in summarize(ko.rows):  # held-out prompts first (facts the ranking never saw), then the ranked ones
    print(f"{row['prompt_set']} k={row['k']}: effect-rank {row['effect_accuracy']:.0%}, "
          f"random {row['random_accuracy_mean']:.0%}")

# %% [markdown]
# ## 3. Attention roles of the key heads

# %%
from arithmech.stages.analyze_attention import analyze_attention
from arithmech.stages.analyze_attention_config import AttentionConfig

roles = analyze_attention(handle, AttentionConfig(max_prompts=8 if small else 64), out / "identify",
                          out / "attention", quiet=True)  # fmt: skip
print(list(zip([h.name for h in roles.heads], roles.labels, strict=True)))

# %% [markdown]
# ## 4. Causal mediation: which layers carry the result, for arithmetic vs retrieval vs facts

# %%
from arithmech.stages.mediate import mediate
from arithmech.stages.mediate_config import MediateConfig

mediation = mediate(handle, MediateConfig(n_pairs=2 if small else 4, neuron_k=3 if small else 20,
                                          few_shot=0 if small else 3), out / "mediation", quiet=True)  # fmt: skip
for task, result in mediation.results.items():
    print(task, "median total effect", float(result.total_effect.median()))

# %% [markdown]
# ## 5. Do the methods agree?

# %%
from arithmech.stages.agreement import method_agreement
from arithmech.stages.agreement_config import AgreementConfig

agreement = method_agreement(handle, AgreementConfig(from_run=str(out / "identify"), max_prompts=4 if small else 16),
                             out / "agreement", quiet=True)  # fmt: skip
for row in agreement.rows:
    print(row["level"], row["method_a"], "vs", row["method_b"], f"Spearman {row['spearman']:.2f}")

# %% [markdown]
# ## 6. Neurons: head importance per operation, CNA, pruning

# %%
from arithmech.stages.neurons import neurons
from arithmech.stages.neurons_config import NeuronsConfig

neuron_cfg = NeuronsConfig(operations=("addition", "multiplication"), max_prompts=2 if small else 4,
                           filter_correct=not small, keep_sizes=(0, 8) if small else (10, 100, 1000),
                           n_random=1 if small else 3, lora=not small)  # fmt: skip
found_neurons = neurons(handle, neuron_cfg, out / "neurons", quiet=True)
print("key head", found_neurons.head.name, "top neurons", [(n.layer, n.neuron) for n in found_neurons.neurons[:5]])

# %% [markdown]
# ## 7. Everything at once
#
# The same stages, with caching of unchanged stages: `arithmech run --config configs/default-model.yaml`, or
# from Python: `run_pipeline(load_run_config("configs/default-model.yaml"))`.
