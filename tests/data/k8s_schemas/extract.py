"""Refresh the CRD schemas here from upstream CustomResourceDefinition files (see README.md).

    python tests/data/k8s_schemas/extract.py CRD.yaml [CRD.yaml ...]

Writes ``<group>_<version>_<kind>.json.gz`` for every served version: the version's ``openAPIV3Schema`` with its
descriptions dropped (they are most of the bytes; validation does not read them).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: without_descriptions(value) for key, value in node.items() if key != "description"}
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def extract(crd_file: Path) -> list[Path]:
    crd = yaml.safe_load(crd_file.read_text(encoding="utf-8"))
    spec = crd["spec"]
    written = []
    for version in spec["versions"]:
        if not version.get("served"):
            continue
        schema = without_descriptions(version["schema"]["openAPIV3Schema"])
        path = HERE / f"{spec['group']}_{version['name']}_{spec['names']['kind'].lower()}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(schema, sort_keys=True, separators=(",", ":")).encode(), mtime=0))
        written.append(path)
    return written


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        for written in extract(Path(argument)):
            print(written)
