"""scripts/gpu-check.sh (specbuild.gpu_check): the torch runtime's check for a GPU machine, run on the CPU."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_gpu_check_script_runs_on_the_cpu_and_proves_greedy_identity(tiny_pair, tmp_path):
    """scripts/gpu-check.sh (made for a GPU machine) on the CPU with small settings, with only the device machine's
    packages importable: the report it prints."""
    import subprocess

    from conftest import CACHE_DIR, REPO_ROOT
    from device_machine import device_env

    result = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "gpu-check.sh"), "--device", "cpu", "--cache", str(CACHE_DIR),
         "--prompts", "3", "--max-tokens", "12", "--no-sized", "--json", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=900, env=device_env(tmp_path / "site"))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["greedy_identical"] is True and report["device"] == "cpu"
    assert set(report["tiny_pair"]) == {"K=0", "K=2", "K=4"}
    assert all(row["identical_to_k0"] == 3 for row in report["tiny_pair"].values())
    costs = report["step_costs"]["tiny_pair"]
    assert costs["target_step_ms"] > 0 and 0 < costs["c"] and costs["V(2)"] > 0
    assert set(costs["expected_speedup_at_a=0.6"]) == {"K=2", "K=4"}
