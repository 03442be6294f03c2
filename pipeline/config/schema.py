"""JSON Schema of the build config, generated from the Spec (`build_configs/schema.json`)."""

from __future__ import annotations

import json

from pipeline.config.spec import Spec

SCHEMA_ID = "https://trtllm-pipeline.dev/schema/build-config.json"


def spec_schema() -> dict:
    schema = Spec.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def spec_schema_text() -> str:
    return json.dumps(spec_schema(), indent=2, sort_keys=True) + "\n"
