"""`make demo`'s flow on one tiny config per model family the cpu target runs, all served by ONE tritonserver.

For each family of FAMILIES: a tiny random checkpoint (tests/support/family_models.py), `run CONFIG --until package`
in-process on a small config written from build_configs/tiny-cpu.yaml; the packaged repositories are combined
into one, each family's models renamed `<family>-<model>` (combined_repository.py), and one tritonserver serves
them for the module. Per family, as the demo does it: `infer` over gRPC (streamed) and over HTTP through the
pipeline's CLI (the clients package's command) on the family's ensemble, its BLS over HTTP, and the OpenAI front
end (in-process) in front of the family's ensemble: a completion through the ensemble and one with top log-probs,
which goes to the family's LLM model directly; every answer equals refengine's greedy output computed in this
process on the family's engine (as postprocessing decodes it).
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import yaml

from clients.openai_server import running_openai_server
from pipeline.cli import main
from refengine.architectures import HF_MODEL_TYPES
from tests.conftest import BUILD_CONFIGS
from tests.support.combined_repository import combine_repositories, served_name
from tests.support.family_models import make_family_checkpoint
from tests.support.serving import greedy_reference, packaged, serving_repository

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The model types the cpu target runs today (refengine.architectures.HF_MODEL_TYPES): one config each.
FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "granite",
    "phi3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "starcoder2",
    "nemotron",
)
MAX_TOKENS = 12
# The demo's prompts (Makefile): gRPC streamed, HTTP, and one for the OpenAI front end.
GRPC_PROMPT, HTTP_PROMPT, OPENAI_PROMPT = "def __init__(self", "def main(", "class Parser"
# tiny-cpu.yaml, smaller: the batch and beams these tests use.
BUILD = {"max_batch_size": 4, "max_beam_width": 1}


def test_every_family_the_cpu_target_runs_is_served_here():
    assert sorted(FAMILIES) == sorted(HF_MODEL_TYPES)


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """engine, tokenizer and repository of each family's build, by the pipeline's own `run`."""
    root = tmp_path_factory.mktemp("families")
    spec = yaml.safe_load((BUILD_CONFIGS / "tiny-cpu.yaml").read_text())
    spec["build"].update(BUILD)
    config = root / "family.yaml"
    config.write_text(yaml.safe_dump(spec))
    store = root / "store"
    for family in FAMILIES:
        checkpoint = make_family_checkpoint(family, root / "checkpoints" / family)
        code = main(["--artifacts", str(store), "run", str(config), "--set", f"model.source={checkpoint}", "--set", f"name={family}", "--until", "package"])
        assert code == 0, f"run {family}: exit {code}"
    return {family: packaged(family, store) for family in FAMILIES}


@pytest.fixture(scope="module")
def repository(builds, tmp_path_factory) -> Path:
    repositories = {family: build["repository"] for family, build in builds.items()}
    return combine_repositories(repositories, tmp_path_factory.mktemp("combined") / "model_repository")


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    # Triton 2.51 may keep a family's BLS loaded at stop after the cases that call it (serving.STUCK_BLS): a warning.
    with serving_repository(repository, tmp_path_factory.mktemp("serve"), allow_stuck_bls=True) as triton:
        yield triton


@pytest.fixture(scope="module")
def references(builds):
    """refengine's greedy text of each family for a prompt, in this process (loaded when first asked)."""
    loaded = {}

    def reference(family: str, prompt: str) -> str:
        if family not in loaded:
            loaded[family] = greedy_reference(builds[family]["engine"], builds[family]["tokenizer"], MAX_TOKENS)
        return loaded[family](prompt)

    return reference


def infer(capsys, server, prompt: str, protocol: str, model: str, *flags: str) -> str:
    """`trtllm-pipeline infer PROMPT --protocol P --model M`, in-process; its stdout."""
    url = server.options.grpc_url if protocol == "grpc" else server.options.http_url
    capsys.readouterr()
    code = main(["infer", prompt, "--url", url, "--protocol", protocol, "--model", model, "--max-tokens", str(MAX_TOKENS), *flags])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


@pytest.mark.parametrize("family", FAMILIES)
def test_infer_over_grpc_streamed_equals_refengine(family, server, references, capsys):
    expected = references(family, GRPC_PROMPT)
    assert infer(capsys, server, GRPC_PROMPT, "grpc", served_name(family, "ensemble"), "--stream") == expected + "\n"


@pytest.mark.parametrize("family", FAMILIES)
def test_infer_over_http_equals_refengine_on_the_ensemble_and_the_bls(family, server, references, capsys):
    expected = references(family, HTTP_PROMPT) + "\n"
    assert infer(capsys, server, HTTP_PROMPT, "http", served_name(family, "ensemble")) == expected
    assert infer(capsys, server, HTTP_PROMPT, "http", served_name(family, "tensorrt_llm_bls")) == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_openai_completion_equals_refengine(family, server, repository, references):
    with (
        running_openai_server(
            server.options.grpc_url, model_name=family, model_repository=repository, triton_model=served_name(family, "ensemble")
        ) as base_url,
        openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client,
    ):
        answer = client.completions.create(model=family, prompt=OPENAI_PROMPT, max_tokens=MAX_TOKENS, temperature=0)
        # top log-probs go to the family's LLM model directly (the front end tokenizes and detokenizes)
        direct = client.completions.create(model=family, prompt=OPENAI_PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=1)
    assert answer.choices[0].text == direct.choices[0].text == references(family, OPENAI_PROMPT)
    assert len(direct.choices[0].logprobs.top_logprobs) == direct.usage.completion_tokens
