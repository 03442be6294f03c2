"""The spec's sections as the stage digests hash them (plan.py): JSON dumps that leave out what came after digests
were first published while it is absent or default, so that the digests of earlier configs stay what they were."""

from __future__ import annotations

from typing import Any

from pipeline.config.spec import DeployKind, DeploySpec, Spec


def dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json")


# Optional sections added after digests were first published: left out of a dump while absent, so the digests of
# configs that do not use them stay what they were.
_OPTIONAL_SECTIONS = ("lora", "speculative")


def dump_present(model: Any) -> dict[str, Any]:
    dumped = dump(model)
    for key in _OPTIONAL_SECTIONS:
        if key in dumped and dumped[key] is None:
            del dumped[key]
    return dumped


def dump_build(spec: Spec, *, lora_fingerprint: str, draft_fingerprint: str) -> dict[str, Any]:
    """build, with the contents of the directories it names instead of their (absolute) paths, and build.speculative
    without the sections of other modes (so that sections added later leave the digests of earlier configs alone)."""
    build = dump_present(spec.build)
    if "lora" in build:
        build["lora"]["adapter_dirs"] = lora_fingerprint
    if "speculative" in build:
        build["speculative"] = dump_speculative(build["speculative"], draft_fingerprint)
    return build


def dump_speculative(speculative: dict[str, Any], draft_source: str) -> dict[str, Any]:
    """`draft_source` stands for the directory the mode reads (the draft's source, or the medusa / eagle heads)."""
    mode = speculative["mode"]
    sections = {
        "lookahead_decoding": "lookahead",
        "prompt_lookup": "prompt_lookup",
        "draft_tokens_external": "draft",
        "medusa": "medusa",
        "eagle": "eagle",
        "mtp": "mtp",
    }
    dumped = {key: value for key, value in speculative.items() if key not in sections.values() or sections.get(mode) == key}
    if dumped.get("draft") is not None:
        dumped["draft"]["source"] = draft_source
    for section in ("medusa", "eagle"):
        if dumped.get(section) is not None:
            dumped[section]["heads"] = draft_source
    return dumped


# deploy fields that came after digests were first published: left out while they hold their defaults.
_LATER_DEPLOY_FIELDS = ("gpus_per_node", "alerts", "kubernetes")


def dump_deploy(spec: Spec) -> dict[str, Any]:
    """deploy.kind came after digests were first published, with compose the only kind: left out while it is compose."""
    dumped = dump(spec.deploy)
    if dumped["kind"] == DeployKind.compose.value:
        del dumped["kind"]
    defaults = dump(DeploySpec())
    for key in _LATER_DEPLOY_FIELDS:
        if dumped.get(key) == defaults[key]:
            del dumped[key]
    return dumped
