"""The doctor a specbuild release ships (as ``doctor.py`` in its repository folder): does this environment build or
serve the release as specbuild built it? Run it where the release runs, the NGC ``tritonserver:<yy.mm>-trtllm-python-
py3`` image above all (``specbuild doctor RELEASE --image IMAGE`` starts it there, mounted as ``serve`` mounts it).

Standard library only at import, and no specbuild import: the image has no specbuild; its checks are its parts
(:data:`PARTS`), shipped beside it, the same modules as in ``specbuild.doctor``. Each check uses what it finds
(transformers, torch, xgrammar, tensorrt_llm, ``nvidia-smi``, the image's Triton version) and says "not checkable
here", with why, where something is missing. The rules it checks come from files beside it: ``image_rules.py`` (the
packages specbuild depends on in the image), ``manifest.json`` (the release's files, the checkpoints' facts as
specbuild read them, the build records, the memory plan) and ``doctor_facts.json`` (next-token logits and the python
backend's known bugs, recorded at build time).

Usage: python doctor.py [--json] [--engines DIR] [--checkpoint ROLE=DIR ...]
Exit 0: no check failed; 1: a check failed (each names its fix); 2: the release cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

if __package__:  # specbuild.doctor.release_doctor
    from specbuild.doctor.checked_release import FAIL, HERE, ROLES, UNCHECKABLE, Check, FoundRelease, Unreadable
    from specbuild.doctor.checkpoint_checks import check_checkpoint_config, check_logits, check_tokenizer
    from specbuild.doctor.environment_checks import check_files, check_gpus, check_packages, check_python_backend
    from specbuild.doctor.runtime_checks import check_engines, check_model_yaml, check_tokenizer_info
else:  # doctor.py in a release: its parts lie beside it (no bytecode cache: a folder in a model repository is a model)
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from checked_release import FAIL, HERE, ROLES, UNCHECKABLE, Check, FoundRelease, Unreadable
    from checkpoint_checks import check_checkpoint_config, check_logits, check_tokenizer
    from environment_checks import check_files, check_gpus, check_packages, check_python_backend
    from runtime_checks import check_engines, check_model_yaml, check_tokenizer_info

# The doctor's modules beside it (in specbuild.doctor; in a release, beside doctor.py under the same names).
PARTS = ("checked_release.py", "checkpoint_checks.py", "environment_checks.py", "runtime_checks.py")


def checks(release: FoundRelease) -> list[tuple[str, Callable[[], Iterator[Check]]]]:
    """The checks that apply to the release, in order, each by the name its verdicts carry."""
    found: list[tuple[str, Callable[[], Iterator[Check]]]] = [("files", lambda: check_files(release)),
                                                              ("packages", lambda: check_packages(release))]
    for role in ROLES:
        found += [(f"config:{role}", lambda role=role: check_checkpoint_config(release, role)),
                  (f"logits:{role}", lambda role=role: check_logits(release, role))]
    found.append(("tokenizer", lambda: check_tokenizer(release)))
    if release.runtime == "tensorrt-llm-llmapi":
        found.append(("model.yaml", lambda: check_model_yaml(release)))
    if release.runtime == "tensorrt-llm":
        found.append(("engines", lambda: check_engines(release)))
    if release.guided:
        found.append(("tokenizer-info", lambda: check_tokenizer_info(release)))
    found.append(("python-backend", lambda: check_python_backend(release)))
    if release.gpu:
        found.append(("gpus", lambda: check_gpus(release)))
    return found


def run(release: FoundRelease) -> list[Check]:
    results = []
    for name, check in checks(release):
        try:
            results += list(check())
        except Unreadable as exc:
            results.append(Check(name, UNCHECKABLE, str(exc)))
        except Exception as exc:  # noqa: BLE001 - one check's surprise must not hide the others' verdicts
            results.append(Check(name, FAIL, f"the check itself raised {type(exc).__name__}: {exc}",
                                 "report it as a specbuild bug with this output; `specbuild serve --no-doctor` "
                                 "starts the release meanwhile"))
    return results


def _role_path(text: str) -> tuple[str, Path]:
    role, _, path = text.partition("=")
    if role not in ROLES or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: want ROLE=DIR, ROLE one of {', '.join(ROLES)}")
    return role, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--engines", type=Path, help="the release's engines folder here")
    parser.add_argument("--checkpoint", type=_role_path, action="append", default=[], metavar="ROLE=DIR",
                        help="where a checkpoint is here")
    args = parser.parse_args(argv)
    try:
        release = FoundRelease(HERE, args.engines, dict(args.checkpoint))
    except Unreadable as exc:
        print(f"error: {exc}\n  fix: run the doctor inside a release folder that specbuild compiled",
              file=sys.stderr)
        return 2
    results = run(release)
    failed = any(check.verdict == FAIL for check in results)
    if args.json:
        print(json.dumps({"release": release.spec.get("name"), "runtime": release.runtime,
                          "python": sys.version.split()[0], "triton": release.triton_version, "ok": not failed,
                          "checks": [asdict(check) for check in results]}))
    else:
        for check in results:
            print(f"{check.verdict:>18}  {check.name}: {check.evidence}")
            if check.fix:
                print(f"{'':>18}  fix: {check.fix}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
