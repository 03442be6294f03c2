"""One source of the tensor contract (pipeline/render/contract.py, docs/architecture.md#tensor-contract): the package
stage writes a contract.json next to the code of each Python model that reads a table of tensor
names, the models load it (model_repo/python/model_contract.py) instead of carrying a copy, and the
clients' own tables are checked against it here."""

from __future__ import annotations

import json
import sys

import pytest
from tritonclient.grpc import model_config_pb2

from clients.types import ARRAY_INPUTS, INPUT_DATATYPES, LLM_INPUT_RENAMES, llm_input_name
from pipeline.render import contract
from pipeline.render.contract_files import CONTRACT_FILE
from tests.pipeline.render.test_render import ALL_MODELS, MODEL_CODE, parse, render
from tests.repo.test_import_direction import imported_packages

MODELS_WITH_A_CONTRACT = {"cpu": ("tensorrt_llm", "tensorrt_llm_bls"), "engine": ("tensorrt_llm_bls",)}


@pytest.fixture
def model_code(monkeypatch):
    monkeypatch.syspath_prepend(str(MODEL_CODE))
    yield
    for name in ("model_contract", "client_contract", "llm_request", "word_lists"):
        sys.modules.pop(name, None)


@pytest.fixture(params=["cpu", "engine"])
def rendered(request, tmp_path):
    return request.param, render(tmp_path, target=request.param)


def _declared(entries) -> list[tuple]:
    return [(t.name, model_config_pb2.DataType.Name(t.data_type), tuple(t.dims), getattr(t, "optional", False)) for t in entries]  # outputs have none


def _loaded(tensors) -> list[tuple]:
    return [(t.name, t.data_type, t.dims, t.optional) for t in tensors]


def test_the_contract_goes_where_code_reads_it(rendered):
    target, repository = rendered
    with_contract = {model for model in ALL_MODELS if (repository / model / "1" / CONTRACT_FILE).is_file()}
    assert with_contract == set(MODELS_WITH_A_CONTRACT[target])  # not the C++ backend's tensorrt_llm, nor the ensemble


def test_each_contract_declares_what_its_config_declares(rendered, model_code):
    from model_contract import load_model_contract

    target, repository = rendered
    for model in MODELS_WITH_A_CONTRACT[target]:
        loaded = load_model_contract(repository / model, "1")
        config = parse(repository / model / "config.pbtxt")
        assert _loaded(loaded.inputs) == _declared(config.input), model
        assert _loaded(loaded.outputs) == _declared(config.output), model


def test_the_bls_runs_the_ensembles_wiring(rendered, model_code):
    from client_contract import BlsWiring
    from model_contract import load_model_contract

    _, repository = rendered
    wiring = BlsWiring.from_contract(load_model_contract(repository / "tensorrt_llm_bls", 1))
    ensemble = parse(repository / "ensemble" / "config.pbtxt")
    steps = {step.model_name: step for step in ensemble.ensemble_scheduling.step}
    pre, llm = steps["preprocessing"], steps["tensorrt_llm"]
    client_inputs = {t.name for t in ensemble.input}
    assert wiring.client_to_preprocessing == {client: name for name, client in pre.input_map.items()}
    assert wiring.preprocessing_to_llm == {
        name: llm_name for name, internal in pre.output_map.items() for llm_name, tensor in llm.input_map.items() if tensor == internal
    }
    assert wiring.client_to_llm == {client: name for name, client in llm.input_map.items() if client in client_inputs}
    assert wiring.llm_to_client == {name: client for name, client in llm.output_map.items() if client in {t.name for t in ensemble.output}}
    assert sorted(wiring.client_inputs) == sorted(client_inputs)


class _LookedUp(dict):
    """Request arrays that remember every name the parser asked for, present or not."""

    def __init__(self, **arrays) -> None:
        super().__init__(**arrays)
        self.names: set[str] = set()

    def get(self, name, default=None):
        self.names.add(name)
        return super().get(name, default)

    def __contains__(self, name) -> bool:
        self.names.add(name)
        return super().__contains__(name)


def test_the_cpu_model_reads_every_input_it_declares(model_code):
    """A declared input the cpu model neither honours nor refuses would be ignored without a word."""
    import numpy as np
    from llm_request import IGNORED_INPUTS, parse_request

    arrays = _LookedUp(input_ids=np.array([[5, 6]], dtype=np.int32), input_lengths=np.array([[2]]), request_output_len=np.array([[3]]))
    parse_request(arrays, exclude_input_default=True, decoupled=True)
    declared = {spec.name for spec in contract.LLM_INPUTS + contract.LLM_LORA_INPUTS}
    assert declared - arrays.names - set(IGNORED_INPUTS) == set()
    assert set(IGNORED_INPUTS) <= declared


def test_a_missing_or_malformed_contract_names_the_file_and_the_tensor(tmp_path, model_code):
    from model_contract import ContractFileError, load_model_contract

    model_dir = tmp_path / "tensorrt_llm"
    (model_dir / "1").mkdir(parents=True)
    with pytest.raises(ContractFileError, match=r"tensorrt_llm/1/contract\.json is missing: the package stage writes it"):
        load_model_contract(model_dir, "1")
    path = model_dir / "1" / CONTRACT_FILE
    cases = {
        "{": "cannot be read as JSON",
        "[]": "expected a JSON object",
        '{"inputs": {}}': "'inputs' must be a list of tensors",
        '{"inputs": [{"name": "seed", "data_type": "UINT64", "dims": [1], "optional": true}], "outputs": []}': (
            r"inputs\[0\] \(seed\): 'data_type' must be a Triton TYPE_\* name"
        ),
        '{"inputs": [], "outputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["1"], "optional": false}]}': r"outputs\[0\] \(x\): 'dims'",
        '{"inputs": [], "outputs": [], "wiring": {"client_to_llm": {"a": 1}}}': "wiring 'client_to_llm' must map tensor names",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ContractFileError, match=message):
            load_model_contract(model_dir, "1")
    path.write_text(json.dumps({"inputs": [], "outputs": []}))
    with pytest.raises(ContractFileError, match="no wiring 'client_to_llm'"):
        load_model_contract(model_dir, "1").wiring_map("client_to_llm")


def test_model_code_never_imports_pipeline_or_clients():
    """It is copied into the repository and runs in Triton's Python backend stub, without either."""
    wrong = [f"{path.name} imports {name}" for path in sorted(MODEL_CODE.glob("*.py")) for name in imported_packages(path) & {"pipeline", "clients"}]
    assert wrong == []


# -- the clients' tables ---------------------------------------------------------------------------
def _wire_datatype(data_type: str) -> str:
    """A config.pbtxt TYPE_* name as the inference protocol spells it."""
    return "BYTES" if data_type == "TYPE_STRING" else data_type.removeprefix("TYPE_")


def test_the_clients_input_datatypes_are_the_ensembles():
    declared = {spec.name: _wire_datatype(spec.data_type) for spec in contract.CLIENT_INPUTS + contract.CLIENT_LORA_INPUTS + contract.CLIENT_PRIORITY_INPUTS}
    assert {name: declared.get(name) for name in INPUT_DATATYPES} == INPUT_DATATYPES
    assert set(ARRAY_INPUTS) <= set(declared)  # sent typed by their arrays (lora_weights: the engine's LoRA dtype)


def test_the_clients_llm_input_names_are_the_ensembles_wiring():
    wiring = {**contract.CLIENT_TO_LLM, **contract.LORA_CLIENT_TO_LLM}
    passed_through = [name for name in INPUT_DATATYPES if name in wiring]
    assert {name: llm_input_name(name) for name in passed_through} == {name: wiring[name] for name in passed_through}
    assert set(LLM_INPUT_RENAMES) <= set(passed_through)


def test_the_cpu_model_reads_num_draft_tokens_and_use_draft_logits(model_code):
    """Speculative decoding's per-request draft length and acceptance (the cpu model's extra inputs)."""
    import numpy as np
    from llm_request import parse_request

    assert [spec.name for spec in contract.CPU_LLM_EXTRA_INPUTS] == ["num_draft_tokens", "use_draft_logits", "priority"]
    base = dict(input_ids=np.array([[5, 6]], dtype=np.int32), input_lengths=np.array([[2]]), request_output_len=np.array([[3]]))
    assert parse_request(base, exclude_input_default=True, decoupled=True).params.num_draft_tokens is None
    request = parse_request(base | {"num_draft_tokens": np.array([[2]], dtype=np.int32)}, exclude_input_default=True, decoupled=True)
    assert request.params.num_draft_tokens == 2 and request.params.use_draft_logits is None
    request = parse_request(base | {"use_draft_logits": np.array([[False]])}, exclude_input_default=True, decoupled=True)
    assert request.params.use_draft_logits is False


@pytest.mark.parametrize(("sent", "read"), [(None, 0.5), (0.0, 0.0), (1.0, 1.0), (0.75, 0.75)])
def test_the_cpu_model_reads_priority(model_code, sent, read):
    """`priority` (the cpu model's extra input): higher first, absent is TensorRT-LLM's 0.5."""
    import numpy as np
    from llm_request import parse_request

    arrays = dict(input_ids=np.array([[5, 6]], dtype=np.int32), input_lengths=np.array([[2]]), request_output_len=np.array([[3]]))
    if sent is not None:
        arrays["priority"] = np.array([[sent]], dtype=np.float32)
    assert parse_request(arrays, exclude_input_default=True, decoupled=True).priority == read


@pytest.mark.parametrize("sent", [-0.5, 1.01, float("nan"), float("inf")])
def test_the_cpu_model_refuses_a_priority_outside_0_to_1_by_name(model_code, sent):
    import numpy as np
    from llm_request import ContractError, parse_request

    arrays = dict(input_ids=np.array([[5, 6]], dtype=np.int32), input_lengths=np.array([[2]]), request_output_len=np.array([[3]]))
    with pytest.raises(ContractError, match=r"^priority: "):
        parse_request(arrays | {"priority": np.array([[sent]], dtype=np.float32)}, exclude_input_default=True, decoupled=True)
