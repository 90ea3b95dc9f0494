from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.test import override_settings

import taskforge.settings as settings_module
from taskforge.conf import _Conf, conf

README = Path(__file__).resolve().parents[2] / "README.md"
TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def declared() -> dict[str, str]:
    """TASKFORGE_* settings of settings.py (without the prefix) -> their annotated type."""
    return {
        name.removeprefix("TASKFORGE_"): annotation
        for name, annotation in settings_module.__annotations__.items()
        if name.startswith("TASKFORGE_")
    }


def test_conf_lists_the_settings_of_settings_py_with_their_types() -> None:
    assert declared() == _Conf.__annotations__
    for name, annotation in declared().items():
        value = getattr(settings_module, f"TASKFORGE_{name}")
        assert type(value) is TYPES[annotation], name


def test_conf_reads_the_setting_again_after_it_changed(settings: LazySettings) -> None:
    settings.TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS = 2.5
    assert conf.HEARTBEAT_TIMEOUT_SECONDS == 2.5
    settings.TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS = 4.0
    assert conf.HEARTBEAT_TIMEOUT_SECONDS == 4.0
    with override_settings(TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS=7.0):
        assert conf.HEARTBEAT_TIMEOUT_SECONDS == 7.0
    assert conf.HEARTBEAT_TIMEOUT_SECONDS == 4.0


def test_conf_keeps_a_value_read_until_its_setting_changes(settings: LazySettings) -> None:
    settings.TASKFORGE_RETRY_BASE_MS = 1234
    assert conf.RETRY_BASE_MS == 1234
    assert vars(conf)["RETRY_BASE_MS"] == 1234  # kept: the next read skips Django's settings
    settings.TASKFORGE_BUFFER_SIZE = 7  # another setting: the kept value stays
    assert vars(conf)["RETRY_BASE_MS"] == 1234
    settings.TASKFORGE_RETRY_BASE_MS = 99
    assert "RETRY_BASE_MS" not in vars(conf)
    assert conf.RETRY_BASE_MS == 99


def test_conf_refuses_unknown_names() -> None:
    with pytest.raises(AttributeError):
        conf.HEARTBEAT_TIMEOUT  # noqa: B018


def test_readme_documents_every_setting() -> None:
    documented = set(re.findall(r"^\| `(TASKFORGE_[A-Z_]+)`", README.read_text(), re.M))
    assert {f"TASKFORGE_{name}" for name in declared()} <= documented
