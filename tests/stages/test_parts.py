"""Files in parts (specbuild.stages.parts): split, joined back by its shell line or by ``joined``, checked."""

from __future__ import annotations

import subprocess

import pytest

from specbuild.errors import UsageError
from specbuild.stages.hashing import sha256_file
from specbuild.stages.parts import CHECKSUMS, joined, parse_size, reassembly, split

DATA = bytes(range(256)) * 41 + b"tail"  # 10,500 bytes


def test_sizes_are_binary_units_and_nonsense_is_refused():
    assert [parse_size(text) for text in ("15M", "15MiB", "500K", "1G", "4096", "2k")] == [
        15 * 2**20, 15 * 2**20, 500 * 2**10, 2**30, 4096, 2048]
    for text in ("0", "-3M", "fifteen", "15T", ""):
        with pytest.raises(UsageError, match="not a size"):
            parse_size(text)


@pytest.fixture
def whole(tmp_path):
    path = tmp_path / "layers.safetensors"
    path.write_bytes(DATA)
    (tmp_path / CHECKSUMS).write_text(f"{sha256_file(path)}  {path.name}\n", encoding="utf-8")
    return path


def test_a_file_in_parts_comes_back_whole_by_its_one_line(whole):
    parts = split(whole, 4096)
    assert [part.name for part in parts] == [f"{whole.name}.part-0{i}" for i in range(3)]
    assert not whole.exists() and [part.stat().st_size for part in parts] == [4096, 4096, 10_500 - 8192]
    done = subprocess.run(["sh", "-c", reassembly(whole)], cwd=whole.parent, capture_output=True, text=True)
    assert done.returncode == 0 and f"{whole.name}: OK" in done.stdout
    assert whole.read_bytes() == DATA


def test_a_file_no_larger_than_a_part_stays_whole(whole):
    assert split(whole, len(DATA)) == [] and whole.read_bytes() == DATA


def test_joined_puts_parts_together_and_refuses_damaged_or_missing_ones(whole):
    assert joined(whole) == whole  # there already
    parts = split(whole, 4096)
    assert joined(whole).read_bytes() == DATA
    split(whole, 4096)
    parts[2].unlink()
    with pytest.raises(UsageError, match="sha256") as caught:
        joined(whole)
    assert "copy the parts again" in caught.value.fix and not whole.exists()
    for part in parts[:2]:
        part.unlink()
    with pytest.raises(UsageError, match="its parts"):
        joined(whole)
