"""Content hashes of files, trees and stage inputs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from specbuild.errors import UsageError
from specbuild.stages.hashing import HashCache, fingerprint, hash_tree, sha256_file


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_bytes(b"bee")
    (root / "sub" / "a.bin").write_bytes(b"\x00" * (3 << 20))  # spans several read blocks
    return root


def test_sha256_file_streams_large_files(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(os.urandom(3 << 20))
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_hash_tree_lists_every_file_sorted(tmp_path: Path) -> None:
    files = hash_tree(_tree(tmp_path / "t"))
    assert list(files) == ["b.txt", "sub/a.bin"]
    assert files["b.txt"] == hashlib.sha256(b"bee").hexdigest()
    assert list(hash_tree(tmp_path / "t", exclude={"b.txt"})) == ["sub/a.bin"]


def test_symlinks_are_refused_recorded_or_followed(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    (root / "link").symlink_to("b.txt")
    with pytest.raises(UsageError, match="symlink"):
        hash_tree(root)
    assert hash_tree(root, symlinks="record")["link"] == "symlink:b.txt"
    followed = hash_tree(root, symlinks="follow")
    assert followed["link"] == followed["b.txt"]


def test_symlink_loop_and_broken_link_are_errors(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    (root / "sub" / "up").symlink_to("..")
    with pytest.raises(UsageError, match="loop"):
        hash_tree(root, symlinks="follow")
    (root / "sub" / "up").unlink()
    (root / "dangling").symlink_to("nowhere")
    with pytest.raises(UsageError, match="broken"):
        hash_tree(root, symlinks="follow")


def test_fingerprint_counts_content_not_location(tmp_path: Path) -> None:
    first, second = _tree(tmp_path / "one"), _tree(tmp_path / "two")
    assert fingerprint({"checkpoint": first, "dtype": "float16"}) == fingerprint({"checkpoint": second, "dtype": "float16"})
    assert fingerprint({"checkpoint": first, "dtype": "float16"}) != fingerprint({"checkpoint": first, "dtype": "bfloat16"})
    (second / "b.txt").write_bytes(b"bee!")
    assert fingerprint(first) != fingerprint(second)
    assert fingerprint(tmp_path / "missing") != fingerprint(tmp_path / "one" / "b.txt")


def test_fingerprint_rejects_values_it_cannot_hash() -> None:
    with pytest.raises(TypeError, match="cannot hash"):
        fingerprint({"when": object()})


def test_cache_never_stores_recently_modified_files(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(b"aaaa")
    cache = HashCache()
    assert sha256_file(path, cache=cache) == hashlib.sha256(b"aaaa").hexdigest()
    assert cache.to_json() == {}


def test_cache_reuses_unchanged_files_and_notices_same_size_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(b"aaaa")
    key = HashCache._key(path.stat())
    cache = HashCache({str(path.resolve()): [*key, "cached"]})
    assert sha256_file(path, cache=cache) == "cached"
    assert list(cache.to_json()) == [str(path.resolve())]
    # Rewrite in place with the same size and the old mtime put back: only ctime tells.
    path.write_bytes(b"bbbb")
    while path.stat().st_ctime_ns == key[4]:  # until the filesystem's coarse clock has ticked
        os.utime(path, ns=(key[3], key[3]))
    os.utime(path, ns=(key[3], key[3]))
    assert path.stat().st_mtime_ns == key[3] and path.stat().st_size == key[2]
    assert sha256_file(path, cache=cache) == hashlib.sha256(b"bbbb").hexdigest()
