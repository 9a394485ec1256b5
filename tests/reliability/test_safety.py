"""Safety: pickles and remote code only on opt-in (and a malicious pickle never runs), output and engine paths
stay inside their folders, manifests record symlinks instead of following them, the server listens on loopback
only, and no secret from the environment reaches a release, the CLI output or the server log.
"""

from __future__ import annotations

import ipaddress
import os
import pickle
import shutil
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from served_tiny import compile_release

from specbuild.checkpoint.info import read_checkpoint
from specbuild.cli import main
from specbuild.serve.client import SpecbuildClient
from specbuild.errors import CheckpointError, StageError, UsageError
from specbuild.package.manifest import verify
from specbuild.serve.server import TritonServer
from specbuild.runtimes.torch.engine_loading import check_head_vocabulary, resolve_engine_dir

SECRETS = {"HF_TOKEN": "hf_specbuildSECRETtoken1234", "AWS_SECRET_ACCESS_KEY": "awsSECRETkey5678",
           "TRITON_API_KEY": "tritonSECRETkey9012"}


# --- pickles ----------------------------------------------------------------------------------------------
def test_pickle_weights_need_opt_in_and_the_release_ships_safetensors_only(checkpoints, tmp_path):
    with pytest.raises(StageError) as refused:
        compile_release(checkpoints, tmp_path / "refused", **{"draft.checkpoint": str(checkpoints.pickle_only)})
    assert refused.value.stage == "check" and "pytorch_model.bin" in refused.value.message
    assert "allow-pickle" in (refused.value.fix or "") or "allow_pickle" in (refused.value.fix or "")

    result = compile_release(checkpoints, tmp_path / "allowed", **{"draft.checkpoint": str(checkpoints.pickle_only),
                                                                   "security.allow_pickle": True})
    shipped = [p.name for root in (result.engines, result.repository) for p in root.rglob("*") if p.is_file()]
    assert "model.safetensors" in shipped
    assert not [name for name in shipped if name.endswith((".bin", ".pt", ".pth", ".pkl"))]


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: the file appears if the pickle is executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_malicious_pickle_never_runs_even_with_allow_pickle(checkpoints, tmp_path):
    folder = shutil.copytree(checkpoints.pickle_only, tmp_path / "evil")
    marker = tmp_path / "pwned"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": _Payload(marker)}))
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(folder, allow_pickle=True)
    assert "pytorch_model.bin" in refused.value.message
    with pytest.raises(StageError):
        compile_release(checkpoints, tmp_path / "out",
                        **{"draft.checkpoint": str(folder), "security.allow_pickle": True})
    assert not marker.exists()


# --- remote code ------------------------------------------------------------------------------------------
def test_remote_code_is_refused_and_never_imported(checkpoints, tmp_path):
    folder = shutil.copytree(checkpoints.target, tmp_path / "remote")
    marker = tmp_path / "imported"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = (folder / "config.json").read_text()
    (folder / "config.json").write_text(config.replace("{", '{"auto_map": {"AutoModelForCausalLM": '
                                                            '"modeling_evil.EvilForCausalLM"},', 1))
    with pytest.raises(StageError) as refused:
        compile_release(checkpoints, tmp_path / "out", **{"target.checkpoint": str(folder)})
    assert refused.value.stage == "check" and "auto_map" in refused.value.message
    assert "trust-remote-code" in (refused.value.fix or "")
    assert not marker.exists() and not (tmp_path / "out" / "engines").exists()


# --- paths ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, where", [
    ("engines_dir", lambda ck: ck.target.parent),  # the folder holding both checkpoints
    ("repository_dir", lambda ck: ck.target),  # the checkpoint itself
    ("engines_dir", lambda ck: Path.cwd()),  # the working directory
    ("build_dir", None),  # build/<runtime> is replaced: a checkpoint is put there
])
def test_outputs_that_would_replace_a_checkpoint_or_the_cwd_are_refused(checkpoints, tmp_path, monkeypatch, field,
                                                                        where):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(outside)
    if where is None:
        target = tmp_path / "build"
        shutil.copytree(checkpoints.target, target / "torch")
        overrides = {"target.checkpoint": str(target / "torch")}
    else:
        target, overrides = where(checkpoints), {}
    before = sorted(p.name for p in checkpoints.target.iterdir())
    with pytest.raises(UsageError) as refused:
        compile_release(checkpoints, tmp_path, **overrides, **{f"outputs.{field}": str(target)})
    assert f"outputs.{field}" in refused.value.message and "replaces its output folders whole" in refused.value.message
    assert sorted(p.name for p in checkpoints.target.iterdir()) == before


def test_cli_refuses_an_output_holding_the_checkpoints_with_exit_2(checkpoints, tmp_path):
    result = CliRunner().invoke(main, ["compile", "--target", str(checkpoints.target),
                                       "--draft", str(checkpoints.draft),
                                       "--set", f"outputs.engines_dir={checkpoints.target.parent}",
                                       "--set", f"outputs.build_dir={tmp_path / 'b'}",
                                       "--set", f"outputs.repository_dir={tmp_path / 'r'}"])
    assert result.exit_code == 2 and "outputs.engines_dir" in result.output and "Traceback" not in result.output


def test_engine_dir_parameter_cannot_climb_out_of_the_release(tmp_path):
    release = tmp_path / "release"
    (release / "engines" / "target").mkdir(parents=True)
    (release / "engines" / "target" / "build_info.json").write_text("{}")
    (release / "triton_repo").mkdir()
    (release / "escape").symlink_to(tmp_path)
    assert resolve_engine_dir("engines/target", release) == release / "engines" / "target"
    for value in ("../engines", "engines/../../..", "escape/elsewhere"):
        with pytest.raises(ValueError, match="escapes the release folder"):
            resolve_engine_dir(value, release)
    with pytest.raises(ValueError, match="no engine at"):  # the backend refuses a gpt_model_path without engine
        resolve_engine_dir("engines", release)


def test_a_draft_loads_only_with_the_head_vocabulary_it_was_built_and_packaged_with():
    a, b = "a" * 64, "b" * 64
    check_head_vocabulary(None, None, None)  # a full head
    check_head_vocabulary(a, a, a)
    for loaded, recorded, parameter in ((b, a, a), (a, b, a), (a, a, b), (None, a, a), (a, None, None)):
        with pytest.raises(ValueError, match="head vocabulary mismatch.*recompile"):
            check_head_vocabulary(loaded, recorded, parameter)


def test_manifest_records_symlinks_instead_of_following_them(checkpoints, tmp_path):
    result = compile_release(checkpoints, tmp_path / "release")
    config = result.engines / "draft" / "config.json"
    copy = shutil.copy(config, tmp_path / "outside.json")  # same bytes, outside the release
    config.unlink()
    config.symlink_to(copy)
    report = verify(result.repository)
    assert report.changed == ["../engines/draft/config.json"]  # paths from the repository folder


# --- loopback and secrets ---------------------------------------------------------------------------------
def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    return getattr(address, "ipv4_mapped", None) or address


def _listening(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.append(str(_address(address)))
    return found


@pytest.fixture(scope="module")
def secret_run(checkpoints, tmp_path_factory) -> Any:
    """A release compiled through the CLI and served, with secrets in the environment of both."""
    root = tmp_path_factory.mktemp("secrets")
    with pytest.MonkeyPatch.context() as env:
        for key, value in SECRETS.items():
            env.setenv(key, value)
        compiled = CliRunner().invoke(main, [
            "compile", "--json", "--target", str(checkpoints.target), "--draft", str(checkpoints.draft),
            "--set", f"outputs.build_dir={root / 'build'}", "--set", f"outputs.engines_dir={root / 'engines'}",
            "--set", f"outputs.repository_dir={root / 'triton_repo'}", "--set", "limits.max_input_len=64",
            "--set", "limits.max_seq_len=128"])
        assert compiled.exit_code == 0, compiled.output
        with TritonServer(root / "triton_repo", log_verbose=1, startup_timeout=300) as server:
            generated = SpecbuildClient(server.grpc_url, timeout=300).generate("def parse(text):", 8)
            listening = {port: _listening(port) for port in server.ports.values()}
            log = server.read_log()
    yield types.SimpleNamespace(root=root, output=compiled.output, generated=generated, listening=listening, log=log)


@pytest.mark.slow
@pytest.mark.e2e
def test_the_server_listens_on_loopback_only_by_default(secret_run):
    assert secret_run.generated.output_token_count == 8
    assert all(secret_run.listening.values()), secret_run.listening
    for port, addresses in secret_run.listening.items():
        assert set(addresses) == {"127.0.0.1"}, (port, addresses)  # nothing on 0.0.0.0 or ::


@pytest.mark.slow
@pytest.mark.e2e
def test_no_secret_reaches_the_release_the_cli_output_or_the_server_log(secret_run):
    assert secret_run.log and secret_run.output
    texts = {"cli output": secret_run.output, "server log": secret_run.log}
    for path in secret_run.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            texts[str(path)] = path.read_bytes().decode("utf-8", "replace")
    assert any(name.endswith("manifest.json") for name in texts) and any(".specbuild-state" in n for n in texts)
    leaks = [(where, key) for where, text in texts.items() for key, value in SECRETS.items() if value in text]
    assert leaks == []
    assert os.environ.get("HF_TOKEN") != SECRETS["HF_TOKEN"]  # the fixture restored the environment
