"""Shared pytest fixtures. Tiny-model machinery lives in ``tests/tiny_models.py``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # so tests can `from tiny_models import ...` under any import mode
    sys.path.insert(0, _TESTS_DIR)

from browser_driver import chrome_driver  # noqa: E402

from tiny_models import make_tiny_tokenizer, save_tiny_model_dir, seeded_rng, single_thread  # noqa: E402

DEFAULT_SEED = 0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", default="cpu", help="torch device for tests that take the `device` fixture")


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> str:
    """The ``--device`` option; skips the test when a CUDA device is requested but absent."""
    import torch

    name: str = pytestconfig.getoption("--device")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"--device={name} requested but CUDA is not available")
    return name


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """`single_thread` for a whole module: `pytestmark = pytest.mark.usefixtures("one_thread")`.

    The thread count is restored after the module; a module that also runs the default model uses
    `single_thread` around its tiny-model work instead.
    """
    with single_thread():
        yield


@pytest.fixture
def seed() -> Iterator[int]:
    """A fixed seed; torch (CPU+CUDA), random and numpy are seeded with it for the test, restored after."""
    with seeded_rng(DEFAULT_SEED):
        yield DEFAULT_SEED


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level tiny tokenizer (258 tokens, one per byte + pad + eos), shared per session."""
    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory ``tiny_model_dir(arch) -> Path``: saved tiny model + tokenizer (seed 0), cached per session."""
    cache: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in cache:
            cache[arch] = save_tiny_model_dir(arch, tmp_path_factory.mktemp(f"tiny-{arch}"), seed=DEFAULT_SEED)
        return cache[arch]

    return get


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium (selenium) for a module's browser tests; skipped with the reason when unavailable."""
    yield from chrome_driver()
