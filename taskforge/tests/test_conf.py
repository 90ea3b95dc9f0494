from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import LazySettings

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


def test_conf_reads_the_setting_at_each_access(settings: LazySettings) -> None:
    settings.TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS = 2.5
    assert conf.HEARTBEAT_TIMEOUT_SECONDS == 2.5
    settings.TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS = 4.0
    assert conf.HEARTBEAT_TIMEOUT_SECONDS == 4.0


def test_conf_refuses_unknown_names() -> None:
    with pytest.raises(AttributeError):
        conf.HEARTBEAT_TIMEOUT  # noqa: B018


def test_readme_documents_every_setting() -> None:
    documented = set(re.findall(r"^\| `(TASKFORGE_[A-Z_]+)`", README.read_text(), re.M))
    assert {f"TASKFORGE_{name}" for name in declared()} <= documented
