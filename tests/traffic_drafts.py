"""The provenance a traffic-trained draft carries (``specbuild-capture.json``), as the tests write it."""

from __future__ import annotations

from typing import Any


def provenance(**changes: Any) -> dict[str, Any]:
    """A file as ``specbuild draft --from-capture`` writes it (figures per K, and fields the manifest leaves out)."""
    data = {"format": 1,
            "capture": {"first_finished_at": "2026-12-01T00:00:00+00:00", "last_finished_at": "2026-12-05T23:59:00+00:00",
                        "records": 1200, "bytes": 912345, "stores": ["/var/lib/specbuild/capture-0"], "groups": 40},
            "base_draft": {"path": "/models/draft", "sha256": "ab" * 32},
            "held_out": {"records": 120, "share": 0.1, "acceptance_before": {"1": 0.52, "4": 0.31},
                         "acceptance_after": {"1": 0.66, "4": 0.45}, "predicted_speedup_before": {"4": 1.2},
                         "predicted_speedup_after": {"4": 1.5}, "best_k_after": 4},
            "pool": {"share": 0.2, "sequences": 64},
            "bundled": {"prompts": 32, "acceptance_before": {"1": 0.5}, "acceptance_after": {"1": 0.49}}}
    for dotted, value in changes.items():
        *parents, name = dotted.split(".")
        section = data
        for parent in parents:
            section = section[parent]
        if value is None:
            del section[name]
        else:
            section[name] = value
    return data
