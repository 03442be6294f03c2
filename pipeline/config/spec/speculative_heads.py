"""build.speculative's sections for drafts made by trained heads on the model's own hidden states: Medusa (a tree of
candidates from K heads), EAGLE (a draft layer: EAGLE-3 on the llmapi target, EAGLE-1/2 on the engine target) and
MTP (the model's own next-n prediction layers, DeepSeek-V3 family, on the llmapi target)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field, model_validator

from pipeline.config.eagle_tree import MC_SIM_7B_63
from pipeline.config.spec.strict import StrictModel
from refengine.speculative.medusa_tree import tree_problem

MEDUSA_HEADS_FILE = "medusa_lm_head.safetensors"
MEDUSA_CONFIG_FILE = "config.json"


def recommended_choices(heads: Path) -> list[list[int]]:
    """The tree the heads' config.json recommends (medusa_choices). Raises ValueError naming the field."""
    config_file = heads / MEDUSA_CONFIG_FILE
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"build.speculative.medusa.choices is not set and the heads' {config_file} cannot be read "
            f"({type(exc).__name__}): give the tree, or point build.speculative.medusa.heads at a Medusa heads directory"
        ) from None
    choices = config.get("medusa_choices") if isinstance(config, dict) else None
    if choices is None:
        raise ValueError(
            f"build.speculative.medusa.choices is required: the heads' {config_file} recommends no tree (no "
            "medusa_choices), e.g. choices: [[0], [0, 0], [1], [0, 1]]"
        )
    problem = tree_problem(choices)
    if problem is not None:
        raise ValueError(f"build.speculative.medusa.heads: {config_file} medusa_choices {problem}")
    return choices


def heads_vocab_size(heads: Path) -> int | None:
    """The heads' config.json vocab_size, None when it cannot be read (the choices' check names that file)."""
    try:
        config = json.loads((heads / MEDUSA_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    vocab = config.get("vocab_size") if isinstance(config, dict) else None
    return vocab if isinstance(vocab, int) else None


class MedusaSpec(StrictModel):
    """Medusa: K trained heads on the model's last hidden state propose a tree of candidates, verified in one step."""

    heads: Path = Field(
        description="Local directory of the Medusa heads, relative to the YAML file like model.source: "
        f"{MEDUSA_HEADS_FILE} (FasterDecoding Medusa's layout, which TensorRT-LLM's Medusa conversion reads: "
        "{h}.{l}.linear.weight/bias and {h}.{L}.weight per head) and config.json (medusa_num_heads, medusa_num_layers, "
        "hidden_size, vocab_size, and optionally the recommended medusa_choices). Safetensors only."
    )
    choices: list[list[int]] | None = Field(
        default=None,
        description="The tree of candidates (TensorRT-LLM's medusa_choices): a list of paths [i_1, ..., i_d], the node "
        "reached by the i_1-th most likely token of head 0, then the i_2-th of head 1, ...; every prefix of a path is "
        "also a path. Its number of nodes is the engine's max_draft_len. Default: the heads' config.json medusa_choices.",
    )
    vocab_size: int | None = Field(
        default=None,
        ge=1,
        description="Target cpu only: the heads propose only the first M token ids, at most the heads' vocab_size "
        "(each head's lm_head keeps those rows: cheaper heads where the vocabulary is large against the hidden size). "
        "Byte-level BPE numbers frequent tokens first, so acceptance falls little, and the output never changes (the "
        "model verifies every node). The engine and llmapi targets refuse it (TensorRT-LLM's Medusa has no such cut).",
    )

    @model_validator(mode="after")
    def _tree(self) -> MedusaSpec:
        if self.vocab_size is not None:
            heads_vocab = heads_vocab_size(self.heads)
            if heads_vocab is not None and self.vocab_size > heads_vocab:
                raise ValueError(
                    f"build.speculative.medusa.vocab_size ({self.vocab_size}) exceeds the heads' vocab_size "
                    f"({heads_vocab}, {self.heads / MEDUSA_CONFIG_FILE}): it keeps the first M token ids"
                )
        if self.choices is None:
            object.__setattr__(self, "choices", recommended_choices(self.heads))
            return self
        problem = tree_problem(self.choices)
        if problem is not None:
            raise ValueError(f"build.speculative.medusa.choices {problem}")
        return self

    @property
    def tree(self) -> list[list[int]]:
        return self.choices or []


class EagleSpec(StrictModel):
    """A trained EAGLE draft layer fed the model's hidden states. One section, two checkpoint generations, by target:
    EAGLE-3 on the llmapi target (TensorRT-LLM's PyTorch backend, Eagle3DecodingConfig), EAGLE-1/2 on the engine
    target (trtllm-build's EagleForCausalLM, a tree of eagle_choices)."""

    heads: Path = Field(
        description="Local directory of the draft checkpoint (config.json + safetensors), relative to the YAML file like "
        "model.source. Target llmapi: an EAGLE-3 checkpoint (speculative_config's speculative_model_dir). Target engine: "
        "an EAGLE-1/2 checkpoint in SafeAILab EAGLE's layout (fc.weight/bias, embed_tokens.weight, layers.{l}.*; "
        "examples/eagle/convert_checkpoint.py --eagle_model_dir)."
    )
    one_model: bool = Field(
        default=True,
        description="Target llmapi only: eagle3_one_model, run the draft layer inside the model's forward (TensorRT-LLM's "
        "default and faster form) instead of as a second model.",
    )
    choices: list[list[int]] | None = Field(
        default=None,
        description="Target engine only: the tree of candidates (TensorRT-LLM's eagle_choices, medusa_choices' syntax: "
        "paths [i_1, ..., i_d], every prefix of a path also a path). Its depth is the engine's num_eagle_layers and its "
        "nodes its max_draft_len. Default: NVIDIA's mc_sim_7b_63 (63 nodes, 4 deep).",
    )

    @model_validator(mode="after")
    def _tree(self) -> EagleSpec:
        problem = tree_problem(self.choices) if self.choices is not None else None
        if problem is not None:
            raise ValueError(f"build.speculative.eagle.choices {problem}")
        return self

    @property
    def tree(self) -> list[list[int]]:
        """The engine's tree: choices, or NVIDIA's default."""
        return self.choices if self.choices is not None else MC_SIM_7B_63


class MtpSpec(StrictModel):
    """MTP on the llmapi target: the model's own multi-token-prediction layers draft (DeepSeek-V3 family;
    MTPDecodingConfig)."""

    num_nextn_predict_layers: int = Field(
        default=1,
        ge=1,
        le=16,
        description="MTP modules used, each drafting one more token (MTPDecodingConfig.num_nextn_predict_layers; its "
        "max_draft_len). At most the model's config.json num_nextn_predict_layers.",
    )
