"""Ship, with each python model of a repository, the specbuild modules its ``model.py`` imports.

A release must serve in the stock ``tritonserver:<yy.mm>-trtllm-python-py3`` image, which has no specbuild.
So packaging copies the import closure of each model source (the ``specbuild.*`` modules it imports, directly
or through each other, found by reading their import statements) next to its ``model.py``; the model puts its
own folder first on ``sys.path``, so it runs this release's copy wherever it is served, the bundled CPU server
included. The closure holds only modules that need what such an image has (numpy, torch, transformers and the
python backend's utils): :func:`closure` refuses anything else, so a change that would make a release depend
on specbuild's own environment fails at packaging, not in a pod.
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

from specbuild.errors import StageError

PACKAGE = "specbuild"
SOURCE_ROOT = Path(__file__).resolve().parents[1]  # .../specbuild
# What the python models may import besides the standard library and specbuild itself: what the NGC
# TensorRT-LLM image ships (TensorRT-LLM 1.2.x's requirements.txt pins numpy < 2, torch, transformers 4.57 and
# pydantic >= 2.9.1, on which its LLM API is built, and xgrammar 0.1.25, its guided decoding backend; the CPU image
# installs the same xgrammar: docker/Dockerfile.cpu).
ALLOWED_THIRD_PARTY = frozenset({"numpy", "pydantic", "torch", "transformers", "triton_python_backend_utils",
                                 "xgrammar"})
PACKAGE_MARKER = '"""specbuild modules shipped with this release (see specbuild.package.vendor)."""\n'


def _module_file(module: str) -> Path | None:
    """The source of ``specbuild.x.y`` (a module or a package's ``__init__``), or None if there is none."""
    relative = Path(*module.split(".")[1:])
    for candidate in (SOURCE_ROOT / relative.with_suffix(".py"), SOURCE_ROOT / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(source: Path) -> set[str]:
    """Every absolute module name ``source`` imports, anywhere in it (lazy and type-checking imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # ``from pkg import module``
    return names


def closure(entry: Path, allowed: frozenset[str] = ALLOWED_THIRD_PARTY) -> dict[str, Path]:
    """``{module name: source}`` of the specbuild modules ``entry`` needs; third-party imports outside
    ``allowed`` (:data:`ALLOWED_THIRD_PARTY`) are refused (naming the module that makes them)."""
    found: dict[str, Path] = {}
    pending = [(entry, "model.py")]
    while pending:
        source, name = pending.pop()
        for imported in sorted(_imports(source)):
            top = imported.split(".")[0]
            if top == PACKAGE:
                module_file = _module_file(imported)
                # packages themselves get an empty marker (see vendor): their own imports are not followed
                if module_file is not None and module_file.name != "__init__.py" and imported not in found:
                    found[imported] = module_file
                    pending.append((module_file, imported))
            elif top not in sys.stdlib_module_names and top not in allowed:
                raise StageError("package", f"{name} imports {imported!r}, which the Triton image does not have",
                                 "keep the serving modules to numpy, pydantic, torch, transformers and xgrammar "
                                 "(a specbuild bug)")
    return found


def vendor(entry: Path, version_dir: Path, allowed: frozenset[str] = ALLOWED_THIRD_PARTY) -> list[Path]:
    """Copy ``entry``'s closure into ``version_dir/specbuild/``, package folders marked; returns the files."""
    written = []
    for module, source in sorted(closure(entry, allowed).items()):
        destination = version_dir / Path(*module.split(".")).with_suffix(".py")
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
        written.append(destination)
    for package_dir in _package_dirs(version_dir / PACKAGE, written):
        marker = package_dir / "__init__.py"
        marker.write_text(PACKAGE_MARKER, encoding="utf-8")
        written.append(marker)
    return written


def _package_dirs(root: Path, files: Iterable[Path]) -> set[Path]:
    """``root`` and every folder between it and ``files``: each needs an ``__init__.py`` to import."""
    folders = {root}
    for path in files:
        folders.update(parent for parent in path.parents if parent == root or root in parent.parents)
    return folders



def source_digest() -> str:
    """One digest of specbuild's own Python sources (bytecode caches aside), which releases ship copies of:
    packaging counts it among its inputs, so an updated specbuild re-packages a release instead of leaving it
    with the old copies."""
    from specbuild.stages.hashing import digest_json, sha256_file

    return digest_json({path.relative_to(SOURCE_ROOT).as_posix(): sha256_file(path)
                        for path in sorted(SOURCE_ROOT.rglob("*.py")) if "__pycache__" not in path.parts})
