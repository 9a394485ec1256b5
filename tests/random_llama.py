"""Tiny random Llama checkpoints for exactness tests: a target, a perturbed copy of it and an unrelated model.

The vocabulary is small (16 tokens) so a target's distribution over short continuations can be enumerated
exactly; weights are initialised wide (``initializer_range``) so the models' distributions are far from
uniform and greedy argmaxes are not near-ties that float rounding could flip. The perturbed copy has the
target's shape with noise added to every weight, so it agrees with the target often but not always,
which is what a draft looks like.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

VOCAB = 16
# a tokenizer of the 16 ids, one character each after the three specials (ids as the models' config)
TOKENS = ("<pad>", "<s>", "</s>", "a", "b", "c", "d", "0", "1", "2", "3", "{", "}", ":", ",", "x")
END = 2
SUB_VOCABULARY = (5, 2, 9, 3, 12, 7, 0, 14, 8, 11)  # a ranked head vocabulary: 10 of the 16 ids


@dataclass(frozen=True)
class TinyModels:
    target: Path
    perturbed: Path  # the target plus weight noise: a draft that agrees sometimes
    unrelated: Path  # independently initialised: a draft that disagrees often
    sub_vocabulary: Path  # the perturbed draft with a head over SUB_VOCABULARY only (head_vocabulary.json)


def _config(layers: int, hidden: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        initializer_range=0.3, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def _save(model, path: Path) -> Path:
    model.save_pretrained(path)  # safetensors
    return path


@functools.lru_cache(maxsize=None)
def tiny_models(root: Path) -> TinyModels:
    """Build (once per process) the three checkpoints under ``root``; deterministic for a given torch version."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(1234)
    target = LlamaForCausalLM(_config(layers=2, hidden=32)).eval()
    perturbed = LlamaForCausalLM(_config(layers=2, hidden=32)).eval()
    with torch.no_grad():
        noise = torch.Generator().manual_seed(99)
        for name, weight in target.state_dict().items():
            scale = 0.1 * float(weight.std()) if weight.numel() > 1 and float(weight.std()) > 0 else 0.05
            perturbed.state_dict()[name].copy_(weight + scale * torch.randn(weight.shape, generator=noise))
    torch.manual_seed(4321)
    unrelated = LlamaForCausalLM(_config(layers=1, hidden=32)).eval()
    root.mkdir(parents=True, exist_ok=True)
    return TinyModels(
        target=_save(target, root / "target"),
        perturbed=_save(perturbed, root / "perturbed"),
        unrelated=_save(unrelated, root / "unrelated"),
        sub_vocabulary=_with_head_vocabulary(_save(perturbed, root / "sub_vocabulary"), SUB_VOCABULARY),
    )


def _with_head_vocabulary(folder: Path, ids: tuple[int, ...]) -> Path:
    from specbuild.checkpoint.head_vocabulary import HeadVocabulary

    HeadVocabulary.of(ids, {"made": "tests/random_llama.py"}).write(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """The tiny checkpoints, with torch on one thread for the module (tiny models: threads only contend)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_models(Path(tmp_path_factory.getbasetemp()) / "random_llama")
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """A fast tokenizer of :data:`TOKENS` (WordLevel), saved in a folder: ``(tokenizer, folder)``."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({token: i for i, token in enumerate(TOKENS)}, unk_token="x")),
        pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(folder)
    return tokenizer, folder
