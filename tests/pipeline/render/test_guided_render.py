"""Guided decoding in the rendered repository (#16): TensorRT-LLM's parameters and tokenizer-info
file on both targets, checked; goldens of an engine-target repository with guided decoding."""

from __future__ import annotations

import difflib
import json
import os

import pytest

from pipeline.config.spec import GuidedDecodingBackend
from pipeline.errors import StageError
from pipeline.render import ConfigPaths
from pipeline.render.consistency import check_guided_decoding
from refengine.guided.tokenizer_info import load_tokenizer_info
from tests.pipeline.render.test_render import REPO, parameters, parse, render, tiny_spec

ENGINE_GOLDEN = REPO / "tests" / "golden" / "model_repo_engine_guided"
ENGINE_PATHS = ConfigPaths("/engine", "/tokenizer", "/models")
GUIDE_INPUTS = {"guided_decoding_guide_type", "guided_decoding_guide"}


@pytest.mark.parametrize("target", ["cpu", "engine"])
def test_both_targets_render_the_backend_and_write_nvidias_tokenizer_info_file(tmp_path, target):
    repository = render(tmp_path, target=target)
    values = parameters(parse(repository / "tensorrt_llm" / "config.pbtxt"))
    info_path = repository / "tensorrt_llm" / "xgrammar_tokenizer_info.json"
    assert values["guided_decoding_backend"] == "xgrammar"
    if target == "cpu":  # the cpu model resolves it against the repository: relocatable
        assert values["xgrammar_tokenizer_info_path"] == "tensorrt_llm/xgrammar_tokenizer_info.json"
    else:  # the C++ backend opens it against tritonserver's working directory: the written file, absolutely
        assert values["xgrammar_tokenizer_info_path"] == str(info_path.resolve())
    document = json.loads(info_path.read_text())
    assert set(document) == {"encoded_vocab", "tokenizer_str", "stop_token_ids"}  # generate_xgrammar_tokenizer_info.py's keys
    assert len(document["encoded_vocab"]) == 4096 and document["stop_token_ids"] == [2]
    assert load_tokenizer_info(info_path, vocab_size=4096).vocab_size == 4096  # the cpu model reads the same file
    for model in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        declared = {t.name: t for t in parse(repository / model / "config.pbtxt").input}
        assert GUIDE_INPUTS <= set(declared), model
        assert all(declared[name].data_type == 13 and list(declared[name].dims) == [1] and declared[name].optional for name in GUIDE_INPUTS)


@pytest.mark.parametrize("target", ["cpu", "engine"])
def test_guided_decoding_none_renders_no_guided_parameters(tmp_path, target):
    serve = tiny_spec().serve.model_copy(update={"guided_decoding": GuidedDecodingBackend.none})
    repository = render(tmp_path, target=target, serve=serve)
    values = parameters(parse(repository / "tensorrt_llm" / "config.pbtxt"))
    assert not {"guided_decoding_backend", "xgrammar_tokenizer_info_path"} & set(values)
    assert not (repository / "tensorrt_llm" / "xgrammar_tokenizer_info.json").exists()


def test_the_consistency_check_refuses_parameters_that_do_not_match_the_spec(tmp_path):
    serve = tiny_spec().serve
    written = tmp_path / "tensorrt_llm" / "xgrammar_tokenizer_info.json"
    with pytest.raises(StageError, match="guided_decoding_backend is none"):
        check_guided_decoding(serve, {}, None)
    with pytest.raises(StageError, match="no tokenizer-info file was written"):
        check_guided_decoding(serve, {"guided_decoding_backend": "xgrammar", "tokenizer_dir": "/t"}, written)
    written.parent.mkdir()
    written.write_text("{}")
    with pytest.raises(StageError, match="not the file written"):
        check_guided_decoding(serve, {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": "/x/other.json", "tokenizer_dir": "/t"}, written)
    named = f"/m/{written.parent.name}/{written.name}"
    check_guided_decoding(serve, {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": named, "tokenizer_dir": "/t"}, written)


def test_the_engine_targets_path_names_where_the_repository_will_be_once_the_stage_succeeds(tmp_path):
    """A stage writes into a temporary directory renamed at the end: the path names the final one."""
    final = tmp_path / "store" / "model_repository"
    repository = render(tmp_path, target="engine", final_out_dir=final)
    values = parameters(parse(repository / "tensorrt_llm" / "config.pbtxt"))
    assert values["xgrammar_tokenizer_info_path"] == f"{final.resolve()}/tensorrt_llm/xgrammar_tokenizer_info.json"
    assert values["gpt_model_path"].startswith("/")  # as the engine directory is named


def test_engine_repository_with_guided_decoding_matches_golden_files(tmp_path):
    repository = render(tmp_path, target="engine", config_paths=ENGINE_PATHS)
    rendered = {path.relative_to(repository).as_posix(): path.read_text() for path in sorted(repository.glob("*/config.pbtxt"))}
    if os.environ.get("UPDATE_GOLDEN") == "1":
        for name, text in rendered.items():
            (ENGINE_GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (ENGINE_GOLDEN / name).write_text(text)
        pytest.skip(f"golden files rewritten in {ENGINE_GOLDEN}")
    golden = {path.relative_to(ENGINE_GOLDEN).as_posix(): path.read_text() for path in sorted(ENGINE_GOLDEN.glob("*/config.pbtxt"))}
    assert sorted(golden) == sorted(rendered)
    for name, text in rendered.items():
        if text != golden[name]:
            diff = "".join(difflib.unified_diff(golden[name].splitlines(True), text.splitlines(True), f"golden/{name}", f"rendered/{name}"))
            pytest.fail(f"{name} differs from the golden file; if intended, regenerate with UPDATE_GOLDEN=1\n{diff}")
