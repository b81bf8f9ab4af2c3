"""A hub name on a machine that cannot reach the hub is decided at once (issue 34.15), not after the libraries'
retries (about 27 s of "Retrying in 8s"): one connection attempt, then the local cache or one sentence."""

from __future__ import annotations

import socket
import time

import pytest

from arithmech import hub
from arithmech.errors import ConfigError, DataError


@pytest.fixture
def no_route(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The hub's name does not resolve (as on a machine without network); the attempts are recorded."""
    import huggingface_hub.constants

    tried: list[tuple[str, int]] = []

    def refuse(address: tuple[str, int], timeout: float | None = None) -> socket.socket:
        tried.append(address)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(hub.socket, "create_connection", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for name in hub.PROXIES:
        monkeypatch.delenv(name, raising=False)
    hub._probe.cache_clear()
    yield tried
    hub._probe.cache_clear()


def test_the_reason_is_found_at_once(no_route, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hub.unreachable() == "huggingface.co:443: Name or service not known"
    assert hub.unreachable() is not None and no_route == [("huggingface.co", 443)]  # tried once per process
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert hub.unreachable() is None  # through a proxy: the libraries decide
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert hub.unreachable() == "HF_HUB_OFFLINE is set"


def test_a_hub_model_without_a_route_is_one_sentence_at_once(no_route, capfd) -> None:
    from arithmech.models.load import load_model
    from arithmech.models.model_config import ModelConfig

    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        load_model(ModelConfig(model="nobody/no-such-model-34"))
    assert time.monotonic() - start < 10  # the libraries' retries alone took 27 s
    said = str(err.value)
    assert "could not find model 'nobody/no-such-model-34' as a local folder or in the local cache, and the Hugging " \
           "Face hub cannot be reached from this machine (huggingface.co:443: Name or service not known)" in said, said
    assert "local folder or a .gguf file" in said and "Retrying" not in capfd.readouterr().err


def test_a_hub_dataset_without_a_route_is_one_sentence_at_once(no_route) -> None:
    from arithmech.data.mib_dataset import read_mib_rows

    with pytest.raises(DataError, match=r"cannot be reached from this machine \(huggingface.co:443: Name or service "
                                        r"not known\); give a local copy to --mib-dataset"):
        read_mib_rows("mib-bench/arithmetic_addition")
