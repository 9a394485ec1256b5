"""Request parameters, which the ensemble does not take: every setting of a request is one of its inputs.

Triton's HTTP ``generate`` and ``generate_stream`` endpoints turn each key of the JSON body that names no input of
the model into a request parameter (``GenerateRequestClass::ExactMappingInput`` in triton-inference-server/server
``src/http_server.cc``, v2.51.0; so do the members of a ``parameters`` object), and the ensemble hands its
request's parameters to every model it calls (``irequest->SetParameters(parameters_)`` in
triton-inference-server/core ``src/ensemble_scheduler/ensemble_scheduler.cc``, r24.10). Left alone, a misspelled
input (``"temprature": 0.9``) would be ignored and the request served with the default; the ensemble's first model
refuses it instead, naming the key (an error its client gets as HTTP 400).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable

from specbuild.errors import RequestError

# What Triton itself adds from a generate request's body: "id" is the request's id (ParseJsonTritonRequestID), also
# passed on as a parameter.
TRITON_KEYS = frozenset({"id"})


def refuse_parameters(parameters: str, inputs: Iterable[str]) -> None:
    """Raise :class:`RequestError` naming every request parameter in ``parameters`` (a python model request's
    ``parameters()``, JSON) that is not Triton's own, with the closest of ``inputs`` where one is near."""
    try:
        given = json.loads(parameters or "{}")
    except json.JSONDecodeError:
        return  # not ours to judge: Triton hands over what it parsed
    unknown = sorted(set(given) - TRITON_KEYS) if isinstance(given, dict) else []
    if not unknown:
        return
    names = list(inputs)
    described = []
    for key in unknown:
        close = difflib.get_close_matches(key, names, n=1)
        described.append(repr(key) + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise RequestError(f"unknown input{'s' * (len(unknown) > 1)} {', '.join(described)}: this model takes every "
                       "setting as an input, and Triton passes a key that names none as a request parameter",
                       "send only the model's inputs (GET /v2/models/ensemble/config lists them)")
