"""Render docs/api-reference.md from TaskForge's OpenAPI document.

    .venv/bin/python docs/generate_api_reference.py           # rewrite docs/api-reference.md
    .venv/bin/python docs/generate_api_reference.py --check   # exit 1 if it is out of date

The document is the one `/api/schema/` serves (drf-spectacular, generated
in-process, the same as `manage.py spectacular`); the roles come from each
view's `roles` table, which is what the API enforces. No database or Redis is
contacted: DATABASE_URL and SECRET_KEY get placeholder values when unset.
tests/test_api_reference.py fails when the committed file differs from a fresh
rendering, so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api-reference.md"
METHODS = ("get", "post", "put", "patch", "delete")
ROLE_ORDER = ("producer", "worker", "admin")
# Path parameters filled in to resolve a path to its view (the roles live on views).
SAMPLE_PARAMS = {"name": "q", "task_id": "00000000-0000-0000-0000-000000000000"}


def setup_django() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")
    os.environ.setdefault("DATABASE_URL", "postgres://unused@127.0.0.1:1/unused")
    os.environ.setdefault("SECRET_KEY", "api-reference-only")
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, as `/api/schema/` serves it."""
    setup_django()
    from drf_spectacular.generators import SchemaGenerator

    document: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)
    return document


def roles_of(path: str, method: str) -> list[str]:
    """Roles allowed to call `method path`, from the view's `roles` table."""
    from django.urls import resolve

    from taskforge.api.permissions import ADMIN

    url = path
    for name, value in SAMPLE_PARAMS.items():
        url = url.replace("{" + name + "}", value)
    view = getattr(resolve(url).func, "view_class", None) or getattr(resolve(url).func, "cls", None)
    table: dict[str, frozenset[str]] = getattr(view, "roles", {})
    allowed = table.get(method.upper(), ADMIN)
    return [role for role in ROLE_ORDER if role in allowed]


# --- rendering ---------------------------------------------------------------------


def ref_name(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[-1] if ref else None


def type_of(schema: dict[str, Any]) -> str:
    """A short type for a schema: `string (uuid)`, `[Task]`, `integer | null`, ..."""
    if name := ref_name(schema):
        return f"[{name}](#{name.lower()})"
    for key in ("allOf", "oneOf", "anyOf"):
        if key in schema:
            parts = [type_of(s) for s in schema[key]]
            parts = [p for p in parts if p != "[NullEnum](#nullenum)"] + (
                ["null"] if any(ref_name(s) == "NullEnum" for s in schema[key]) else []
            )
            text = " | ".join(parts)
            return f"{text} | null" if schema.get("nullable") else text
    kind = schema.get("type")
    if kind == "array":
        text = f"array of {type_of(schema.get('items', {}))}"
    elif kind is None:
        text = "any JSON"
    else:
        text = str(kind)
        if "format" in schema:
            text += f" ({schema['format']})"
    if "enum" in schema:
        values = ", ".join(f"`{v}`" for v in schema["enum"] if v is not None)
        text += f": {values}"
    if schema.get("nullable"):
        text += " | null"
    return text


def constraints(schema: dict[str, Any]) -> str:
    parts = []
    for key, label in (
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("pattern", "pattern"),
        ("default", "default"),
    ):
        if key in schema:
            value = schema[key]
            parts.append(
                f"{label} `{value}`" if key in ("pattern", "default") else f"{label} {value}"
            )
    if schema.get("readOnly"):
        parts.append("read-only")
    return ", ".join(parts)


def cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def fields_table(schema: dict[str, Any]) -> list[str]:
    props: dict[str, Any] = schema.get("properties", {})
    if not props:
        return [f"Type: {type_of(schema)}", ""]
    required = set(schema.get("required", []))
    lines = ["| field | type | required | notes |", "| --- | --- | --- | --- |"]
    for name, prop in props.items():
        notes = "; ".join(
            part for part in (cell(prop.get("description", "")), constraints(prop)) if part
        )
        lines.append(
            f"| `{name}` | {cell(type_of(prop))} | {'yes' if name in required else 'no'} "
            f"| {cell(notes)} |"
        )
    return [*lines, ""]


def render_operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### {method.upper()} `{path}`", ""]
    if op.get("summary"):
        lines += [op["summary"], ""]
    if op.get("description"):
        lines += [op["description"].strip(), ""]
    if op.get("security"):
        roles = ", ".join(f"`{r}`" for r in roles_of(path, method))
        lines += [f"**Roles:** {roles}", ""]
    else:
        lines += ["**Roles:** none (public)", ""]
    params = op.get("parameters", [])
    if params:
        lines += ["**Parameters**", "", "| name | in | type | required | notes |"]
        lines += ["| --- | --- | --- | --- | --- |"]
        for p in params:
            schema = p.get("schema", {})
            notes = "; ".join(x for x in (cell(p.get("description", "")), constraints(schema)) if x)
            lines.append(
                f"| `{p['name']}` | {p['in']} | {cell(type_of(schema))} "
                f"| {'yes' if p.get('required') else 'no'} | {notes} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body:
        schema = body.get("content", {}).get("application/json", {}).get("schema", {})
        lines += [f"**Request body** ({type_of(schema)})", ""]
    lines += ["**Responses**", "", "| code | body | meaning |", "| --- | --- | --- |"]
    for code in sorted(op.get("responses", {}), key=str):
        response = op["responses"][code]
        content = response.get("content", {})
        schema = next(iter(content.values())).get("schema") if content else None
        shown = cell(type_of(schema)) if schema else "(empty)"
        lines.append(f"| {code} | {shown} | {cell(response.get('description', ''))} |")
    return [*lines, ""]


def render(doc: dict[str, Any]) -> str:
    info = doc["info"]
    lines = [
        "<!-- Generated by docs/generate_api_reference.py from the OpenAPI document; "
        "do not edit by hand. -->",
        "",
        f"# {info['title']} reference (v{info['version']})",
        "",
        info.get("description", "").strip(),
        "",
        "Every endpoint but `/healthz`, `/readyz` and `/metrics` needs `Authorization: Bearer "
        "<key>`; the roles listed may call it (a key of another role gets 403). The contract "
        "is API.md (v1); the choices TaskForge makes where it is silent are in "
        "[api-notes.md](api-notes.md). The live document is served at `/api/schema/` and a "
        "browsable page at `/api/docs/`.",
        "",
        "## Endpoints",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                tag = (item[method].get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((path, method, item[method]))
    for tag, ops in by_tag.items():
        lines += [f"- **{tag}**"]
        for path, method, _ in ops:
            anchor = f"{method} {path}".lower()
            anchor = "".join(c for c in anchor if c.isalnum() or c in " -_").replace(" ", "-")
            lines.append(f"  - [{method.upper()} `{path}`](#{anchor})")
    lines.append("")
    for tag, ops in by_tag.items():
        lines += [f"## {tag}", ""]
        for path, method, op in ops:
            lines += render_operation(path, method, op)
    lines += ["## Schemas", ""]
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        lines += [f"### {name}", ""]
        if schema.get("description"):
            lines += [schema["description"].strip(), ""]
        lines += fields_table(schema)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render(openapi_document())
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
