"""arithmech: find, explain and improve the parts of a language model that do arithmetic.

The front door for Python is this module:

    >>> import arithmech as am
    >>> model = am.load_model()
    >>> am.identify(model, max_prompts=32, out="runs/nb/identify")
    >>> am.open_run("runs/nb").identify.effects

Every name is imported on first use (arithmech/lazy.py), so `import arithmech` loads neither torch nor pandas.
The modules beneath stay importable but are not the front door. `am.knockout`, `am.neurons`, `am.evaluate` and
`am.finetune` are the stage functions even though subpackages of those names exist: importing such a subpackage
does not replace the function (`_Package`), and the subpackage is reached with
`importlib.import_module("arithmech.knockout")` or `from arithmech.knockout.sweep import ...`.
"""

import sys
import types

from arithmech.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "api": (
        "load_model", "identify", "knockout", "transfer", "analyze_attention", "analyze_mlp", "analyze_fourier",
        "analyze_agreement", "analyze_heuristics", "analyze_numbers",
        "mediate", "neurons", "circuit", "finetune", "evaluate", "run",
        "write_report",
    ),
    "run_results": ("open_run", "Run"),
    "errors": ("ArithmechError", "ConfigError"),
}  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["__version__", *(name for names in _EXPORTS.values() for name in names)]


class _Package(types.ModuleType):
    """This package's module type: a subpackage imported later (arithmech.knockout) never hides the function of
    its name, which the import system would otherwise do by setting the package attribute to the subpackage."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in __all__ and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
