"""Bad input at every door, tried systematically: requests against a live server, spec values and CLI flags,
and damaged checkpoints. Every refusal must be a clear message that names what is wrong (and, for specs,
the field); nothing may crash the server or print a traceback.

Checkpoint damage already covered by test_checkpoints.py (truncated files, huge header lengths and shapes,
missing files) is not repeated here.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from served_tiny import MAX_INPUT_LEN
from triton_requests import raw_stream

from specbuild.checkpoint.info import read_checkpoint
from specbuild.checkpoint.weights import read_safetensors_header
from specbuild.cli import main
from specbuild.errors import CheckpointError, SpecError
from specbuild.spec import BuildSpec, load_spec

LIVE = settings(max_examples=25, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
FAST = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

INT32 = (-(2**31), 2**31 - 1)
UNCLEAR = re.compile(r"Traceback|Exception\(|Error\(|object at 0x|stub process|Stub process", re.IGNORECASE)


# --- requests against a live server -----------------------------------------------------------------------
def _send(server: Any, arrays: dict[str, np.ndarray]) -> str | None:
    """Send to the ensemble; return the error (None on success) after checking the server survived."""
    responses, error = raw_stream(server, "ensemble", arrays, timeout=300)
    assert server.is_running(), "the server died"
    if error is None:
        assert any(r.as_numpy("text_output") is not None for r in responses)
    else:
        assert not UNCLEAR.search(error), error
    return error


def _request(text: bytes | str = b"def parse(text):", max_tokens: int = 2, **extra: np.ndarray) -> dict[str, Any]:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return {"text_input": np.array([[raw]], dtype=object), "max_tokens": np.array([[max_tokens]], np.int32), **extra}


@pytest.mark.slow
@pytest.mark.e2e
@LIVE
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_any_prompt_text_is_served_or_refused_clearly(served, text):
    error = _send(served, _request(text))
    if error is not None:
        assert "text_input is empty" in error or f"more than max_input_len ({MAX_INPUT_LEN})" in error, error
    else:
        assert text.strip()


def _invalid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.e2e
@LIVE
@given(data=st.binary(min_size=1, max_size=64).filter(_invalid_utf8),
       where=st.sampled_from(["text_input", "stop_words", "bad_words"]))
def test_invalid_utf8_is_refused_naming_the_input(served, data, where):
    arrays = _request(data) if where == "text_input" else _request(**{where: np.array([[data]], dtype=object)})
    error = _send(served, arrays)
    assert error is not None and f"{where} is not valid UTF-8" in error, error


def _edges(low: int, high: int, *inner: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([low, low + 1, -1, 0, 1, high - 1, high, *inner]), st.integers(low, high))


NUMERIC = {
    "max_tokens": (np.int32, _edges(*INT32, 2, 64, 191, 192)),
    "num_draft_tokens": (np.int32, _edges(*INT32, 4, 5, 64)),
    "top_k": (np.int32, _edges(*INT32, 20, 399, 400, 401)),
    "beam_width": (np.int32, _edges(*INT32, 2)),
    "end_id": (np.int32, _edges(*INT32, 399, 400)),
    "temperature": (np.float32, st.floats(width=32, allow_nan=True, allow_infinity=True)),
    "top_p": (np.float32, st.floats(width=32, allow_nan=True, allow_infinity=True)),
    "random_seed": (np.uint64, st.integers(0, 2**64 - 1)),
}


@pytest.mark.slow
@pytest.mark.e2e
@LIVE
@given(values=st.fixed_dictionaries({}, optional={name: strategy for name, (_, strategy) in NUMERIC.items()}),
       stream=st.booleans())
def test_numeric_inputs_at_and_beyond_limits_are_served_or_refused_naming_the_input(served, values, stream):
    max_tokens = values.pop("max_tokens", 2)
    arrays = _request(max_tokens=max_tokens, stream=np.array([[stream]]),
                      **{name: np.array([[value]], dtype=NUMERIC[name][0]) for name, value in values.items()})
    error = _send(served, arrays)
    if error is not None:
        sent = {"max_tokens", *values}
        assert any(name in error for name in sent), error


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("arrays, expected", [
    ({"max_tokens": np.array([[2]], np.int32)}, "text_input"),
    ({"text_input": np.array([[b"hi"]], dtype=object)}, "max_tokens"),
    ({**_request(), "no_such_input": np.array([[1]], np.int32)}, "no_such_input"),
    ({**_request(), "max_tokens": np.array([[2.0]], np.float32)}, "max_tokens"),
    ({**_request(), "stream": np.array([[1]], np.int32)}, "stream"),
    ({"text_input": np.array([[b"hi"]] * 5, dtype=object), "max_tokens": np.array([[2]] * 5, np.int32)},
     "batch-size"),
    ({"text_input": np.array([[b"hi"]] * 2, dtype=object), "max_tokens": np.array([[2]], np.int32)}, "batch"),
], ids=["missing-text", "missing-max-tokens", "extra-input", "wrong-dtype", "wrong-bool-dtype", "batch-too-large",
        "batch-mismatch"])
def test_missing_extra_and_mistyped_inputs_are_refused_clearly(served, arrays, expected):
    error = _send(served, arrays)
    assert error is not None and expected in error, error
    assert _send(served, _request()) is None  # and the next request is served


# --- spec values and CLI flags ----------------------------------------------------------------------------
def _leaf_fields(model: type, prefix: str = "") -> list[str]:
    fields = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            fields += _leaf_fields(annotation, f"{prefix}{name}.")
        else:
            fields.append(prefix + name)
    return fields


FIELDS = _leaf_fields(BuildSpec)
VALUES = st.one_of(st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                   st.text(max_size=30), st.lists(st.integers(), max_size=3),
                   st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def _names_field(message: str, key: str) -> bool:
    """The error names the key; or its section and its leaf (rules across a section's fields name the
    section); or the misspelled part of the key as unknown."""
    section, _, leaf = key.rpartition(".")
    parts = key.split(".")
    unknown = any(f"{'.'.join(parts[:i])}: unknown key" in message for i in range(1, len(parts) + 1))
    return key in message or unknown or (bool(section) and section in message and leaf in message)


@FAST
@given(key=st.one_of(st.sampled_from(FIELDS), st.sampled_from(["speculation.k", "limit.max_seq_len", "triton.hostt"])),
       value=VALUES)
def test_fuzzed_spec_values_are_accepted_or_name_the_field(key, value):
    try:
        load_spec(None, {"target.checkpoint": "t", "draft.checkpoint": "d", key: value})
    except SpecError as exc:
        assert _names_field(exc.message, key), exc.message
        assert exc.fix


@pytest.mark.parametrize("key", ["target.checkpoint", "outputs.build_dir"])
def test_a_path_with_a_nul_character_names_its_field(key):
    """Found by the fuzz test above: the operating system refuses such a path, which escaped as a ValueError."""
    with pytest.raises(SpecError) as error:
        load_spec(None, {"target.checkpoint": "t", "draft.checkpoint": "d", key: "a\0b"})
    assert error.value.message.startswith(f"{key}: a path cannot contain a NUL character") and error.value.fix


@pytest.mark.parametrize("key, value, allowed", [
    ("runtime", "tensorrt", "'torch', 'tensorrt-llm', 'tensorrt-llm-llmapi' or 'auto'"),
    ("speculation.acceptance", "exact", "'token-match' or 'draft-logits'"),
    ("target.dtype", "int8", "'auto', 'float16', 'bfloat16' or 'float32'"),
    ("speculation.max_draft_len", 65, "less than or equal to 64"),
    ("limits.max_batch_size", 0, "greater than or equal to 1"),
])
def test_spec_errors_list_the_allowed_values(key, value, allowed):
    with pytest.raises(SpecError) as error:
        load_spec(None, {"target.checkpoint": "t", "draft.checkpoint": "d", key: value})
    assert key in error.value.message and allowed in error.value.message


@FAST
@given(key=st.sampled_from(FIELDS), value=st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30))
def test_fuzzed_set_flags_exit_0_or_2_naming_the_field_without_traceback(checkpoints, key, value):
    result = CliRunner().invoke(main, ["compile", "--dry-run", "--json", "--target", str(checkpoints.target),
                                       "--draft", str(checkpoints.draft), "--set", f"{key}={value}"])
    # 1: a checkpoint path that holds no checkpoint (a CheckpointError naming it); 2: a spec error
    assert result.exit_code in ((0, 1, 2) if key.endswith(".checkpoint") else (0, 2)), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code:
        assert "error:" in result.output and "fix:" in result.output, result.output
    if result.exit_code == 2:
        assert _names_field(result.output, key), result.output


@FAST
@given(flag=st.sampled_from(["--max-draft-len", "--num-draft-tokens", "--runtime", "--dtype", "--acceptance"]),
       value=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12))
def test_fuzzed_typed_flags_exit_0_or_2_without_traceback(checkpoints, flag, value):
    result = CliRunner().invoke(main, ["compile", "--dry-run", "--json", "--target", str(checkpoints.target),
                                       "--draft", str(checkpoints.draft), flag, value])
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 2:
        assert flag in result.output or flag.lstrip("-").replace("-", "_") in result.output, result.output


def test_deeply_nested_spec_file_and_flag_are_spec_errors(tmp_path):
    deep = "[" * 5000 + "]" * 5000
    (tmp_path / "deep.yaml").write_text(f"name: {deep}\n")
    with pytest.raises(SpecError, match="nests too deeply"):
        load_spec(tmp_path / "deep.yaml")
    result = CliRunner().invoke(main, ["compile", "--dry-run", "--target", "t", "--draft", "d",
                                       "--set", f"name={deep}"])
    assert result.exit_code == 2 and "name" in result.output and result.exception is not None
    assert isinstance(result.exception, SystemExit)


# --- checkpoints ------------------------------------------------------------------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


def _header_file(path: Path, header: bytes, data: bytes, declared: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if declared is None else declared) + header + data)
    return path


@FAST
@given(content=st.binary(max_size=256))
def test_random_bytes_as_safetensors_are_checkpoint_errors(tmp_path, content):
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    try:
        read_safetensors_header(path)
    except CheckpointError as exc:
        assert str(path) in exc.message and exc.fix


@FAST
@given(header=st.one_of(JSON, st.dictionaries(st.text(max_size=6), JSON, max_size=3)), data=st.binary(max_size=64),
       declared=st.one_of(st.none(), st.integers(0, 2**64 - 1)))
def test_random_safetensors_headers_are_read_or_refused_without_allocating(tmp_path, header, data, declared):
    path = _header_file(tmp_path / "model.safetensors", json.dumps(header).encode(), data, declared)
    try:
        tensors = read_safetensors_header(path)
    except CheckpointError as exc:
        assert str(path) in exc.message
        return
    assert all(entry["bytes"] <= len(data) for entry in tensors.values())


def _nest(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def _nest_header(path: Path) -> None:
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    _header_file(path, b"[" * 100_000 + b"]" * 100_000, raw[8 + length:])


@pytest.mark.parametrize("name, damage", [("config.json", _nest), ("tokenizer.json", _nest),
                                          ("model.safetensors", _nest_header)])
def test_deeply_nested_json_is_a_checkpoint_error(checkpoints, tmp_path, name, damage):
    folder = shutil.copytree(checkpoints.target, tmp_path / "deep")
    damage(folder / name)
    with pytest.raises(CheckpointError) as error:
        read_checkpoint(folder)
    assert str(folder / name) in error.value.message


def _convert(folder: Path, tmp_path: Path) -> None:
    from specbuild.runtimes.torch import runtime as torch_runtime

    spec = load_spec(None, {"target.checkpoint": str(folder), "draft.checkpoint": str(folder), "runtime": "torch"})
    torch_runtime.convert(spec, "target", tmp_path / "converted")


@pytest.mark.parametrize("change, expected", [
    ({"num_hidden_layers": 8}, "declares weights that the target checkpoint does not hold: model.layers.4"),
    ({"hidden_size": 128}, "cannot load target checkpoint"),
    ({"vocab_size": 2**40}, "cannot load target checkpoint"),
    ({"intermediate_size": 2**40}, "cannot load target checkpoint"),
])
def test_config_that_disagrees_with_its_weights_is_refused_at_convert(checkpoints, tmp_path, change, expected):
    """Huge declared sizes are refused before anything that size is allocated (weights load on meta first)."""
    folder = shutil.copytree(checkpoints.target, tmp_path / "mismatch")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError) as error:
        _convert(folder, tmp_path)
    assert expected in error.value.message and str(folder) in error.value.message
    assert not (tmp_path / "converted" / "model.safetensors").exists()
