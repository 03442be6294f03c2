"""serve.traffic as the model repository carries it: one JSON parameter of the preprocessing model.

The OpenAI front end reads its facts from the preprocessing model's parameters (clients/openai_server/model.py), from
the repository on disk or from a running Triton's model-configuration API, so the class table travels the same way and
a deployment's front end needs nothing but the repository it mounts.
"""

from __future__ import annotations

import json

from pipeline.config.spec.serve import ServeSpec

TRAFFIC_PARAMETER = "traffic_classes"


def traffic_parameters(serve: ServeSpec) -> dict[str, str]:
    """{traffic_classes: JSON of serve.traffic}, or nothing when the spec has no classes."""
    if serve.traffic is None:
        return {}
    return {TRAFFIC_PARAMETER: json.dumps(serve.traffic.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))}
