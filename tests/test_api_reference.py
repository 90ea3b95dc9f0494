"""docs/api-reference.md is what docs/generate_api_reference.py renders today."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "docs" / "generate_api_reference.py"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_api_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_up_to_date() -> None:
    generator = load_generator()
    fresh = generator.render(generator.openapi_document())
    committed = (ROOT / "docs" / "api-reference.md").read_text()
    assert committed == fresh, (
        "docs/api-reference.md is stale: run .venv/bin/python docs/generate_api_reference.py"
    )


def test_api_reference_covers_every_operation() -> None:
    generator = load_generator()
    doc = generator.openapi_document()
    text = (ROOT / "docs" / "api-reference.md").read_text()
    for path, item in doc["paths"].items():
        for method in generator.METHODS:
            if method in item:
                assert f"### {method.upper()} `{path}`" in text
    assert "**Roles:** `worker`, `admin`" in text
    assert "### POST `/workers/claim`" in text
