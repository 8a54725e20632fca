"""Validate custom resources against the real CRD schemas, strictly (what the API server does with
``kubectl apply --validate=strict``), and vendor those schemas into ``tests/fixtures/crd-schemas``.

``kubernetes-validate`` carries only the built-in kinds' schemas; for a custom resource it warns
"schema not found" and passes. The CRDs' own ``openAPIV3Schema`` (Prometheus Operator, KEDA) are vendored
as JSON with their descriptions removed (size only: descriptions never constrain), one file per
``<group>/<version>/<kind>``; ``PROVENANCE.md`` beside them names the repository, path and commit.

Strict, as the API server's structural-schema pruning plus field validation: an object schema with
``properties`` and neither ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields`` rejects
unknown fields. ``metadata`` is checked by the API server's ObjectMeta rules, not the CRD (only
``name``/``namespace``/``labels``/``annotations`` are allowed here, which is all the package uses).

Re-vendor (after ``fetch``-ing the repositories)::

    python -m tests.support.crd_schema <crd.yaml>... --out tests/fixtures/crd-schemas
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "crd-schemas"
_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_METADATA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}


class KubeLoader(yaml.SafeLoader):
    """A SafeLoader that reads a bare ``=`` as the string it is for Go YAML (kustomize writes
    ``matchType: =`` unquoted; PyYAML would see the YAML 1.1 "value" tag and fail)."""


KubeLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def _strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip_descriptions(v) for v in node]
    return node


def _strict(node: Any) -> Any:
    """A copy of an OpenAPI v3 (structural) schema where objects with ``properties`` reject unknown fields."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get(_PRESERVE):
        out["additionalProperties"] = False
    return out


def vendored_schemas(crd: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file name, schema)`` for every served version of a ``CustomResourceDefinition`` (dict from YAML):
    ``<group>_<version>_<kind>.json`` and its ``openAPIV3Schema`` without descriptions."""
    spec = crd["spec"]
    for version in spec["versions"]:
        if version.get("served", True):
            schema = _strip_descriptions(version["schema"]["openAPIV3Schema"])
            yield f"{spec['group']}_{version['name']}_{spec['names']['kind']}.json", schema


def schema_for(api_version: str, kind: str, directory: Path = SCHEMA_DIR) -> dict[str, Any] | None:
    """The vendored schema of ``api_version`` (``group/version``) ``kind``, or None when none is vendored."""
    group, _, version = api_version.rpartition("/")
    path = directory / f"{group}_{version}_{kind}.json"
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def crd_errors(resource: Mapping[str, Any], directory: Path = SCHEMA_DIR) -> list[str]:
    """Every strict-validation error of one custom resource (``path: message``), ``[]`` when it is valid.

    Raises ``LookupError`` when no schema for its ``apiVersion``/``kind`` is vendored (never passes it)."""
    schema = schema_for(str(resource["apiVersion"]), str(resource["kind"]), directory)
    if schema is None:
        raise LookupError(f"no vendored CRD schema for {resource['apiVersion']} {resource['kind']}")
    strict = _strict(schema)
    strict.setdefault("properties", {})["metadata"] = _METADATA
    validator = jsonschema.Draft7Validator(strict)
    return sorted(
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in validator.iter_errors(dict(resource))
    )


def main(argv: list[str] | None = None) -> None:
    """Write the served versions' schemas of the given CRD files into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crds", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=SCHEMA_DIR)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.crds:
        for doc in yaml.load_all(path.read_text(encoding="utf-8"), Loader=KubeLoader):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                for name, schema in vendored_schemas(doc):
                    (args.out / name).write_text(json.dumps(schema, sort_keys=True, indent=1) + "\n")
                    print(f"{path} -> {args.out / name}")


if __name__ == "__main__":
    main()
