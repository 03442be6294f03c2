"""The model the server offers (`ServedModel`): its public name, the Triton model it calls, and the
facts it needs to answer exactly like the served preprocessing does (tokenizer, context limits).

The facts are the preprocessing model's parameters in the served repository (`tokenizer_dir`,
`add_special_tokens`, `max_input_len`, `max_seq_len`, and whether the engine returns logits:
`gather_context_logits`, `gather_generation_logits`), read from the repository's config.pbtxt
(`from_repository`) or asked from the running Triton (`from_triton`, model-config API). The
preprocessing model is the first step of the ensemble (`preprocessing` for any other Triton
model, e.g. tensorrt_llm_bls). The LLM model, which direct choices call, is the ensemble's step that
takes `input_ids`, or the BLS's `tensorrt_llm_model_name` (`tensorrt_llm` for any other).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from clients.openai_server.traffic import TrafficTable, TrafficTableError

if TYPE_CHECKING:  # for annotations; the functions below import them where they run
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

DEFAULT_PREPROCESSING = "preprocessing"
DEFAULT_LLM = "tensorrt_llm"
LLM_INPUT = "input_ids"  # of the ensemble's steps, only the LLM model takes the token ids
PRIORITY_INPUT = "priority"
TRAFFIC_PARAMETER = "traffic_classes"  # pipeline/render/traffic.py writes it


class ModelSetupError(RuntimeError):
    """The served model's facts cannot be found or read."""


@dataclass(frozen=True)
class ServedModel:
    """`name` is what clients pass as `model`; `triton_model` is called over gRPC."""

    name: str
    tokenizer_dir: Path
    max_seq_len: int
    max_input_len: int
    add_special_tokens: bool = True
    triton_model: str = "ensemble"
    max_prompt_bytes: int = 0  # a longer prompt cannot fit max_input_len tokens (0: not known)
    context_logits: bool = False  # tensorrt_llm returns context logits (prompt log-probs)
    generation_logits: bool = False  # tensorrt_llm returns generation logits (top-N log-probs)
    llm_model: str = DEFAULT_LLM  # the LLM model, called directly for token-id prompts and log-probs
    ensemble: bool = False  # triton_model is an ensemble: its streams are ended early by a `stop` to llm_model
    traffic: TrafficTable | None = None  # serve.traffic (the `traffic_classes` parameter); None: one class
    takes_priority: bool = False  # triton_model declares the `priority` input (the cpu target's repositories)
    max_batch_size: int = 0  # triton_model's: the requests the engine runs at once (0: not known)

    def __post_init__(self) -> None:
        if not self.name:
            raise ModelSetupError("the served model needs a name")
        if not 0 < self.max_input_len < self.max_seq_len:
            raise ModelSetupError(f"need 0 < max_input_len ({self.max_input_len}) < max_seq_len ({self.max_seq_len})")

    @classmethod
    def from_parameters(
        cls,
        parameters: Mapping[str, str],
        *,
        name: str,
        triton_model: str,
        source: str,
        llm_model: str = DEFAULT_LLM,
        ensemble: bool = False,
        takes_priority: bool = False,
        max_batch_size: int = 0,
    ) -> ServedModel:
        """From the preprocessing model's string parameters; `source` names where they came from."""
        missing = [key for key in ("tokenizer_dir", "max_input_len", "max_seq_len") if not parameters.get(key)]
        if missing:
            raise ModelSetupError(f"{source}: the preprocessing model has no parameter(s) {', '.join(missing)}")
        try:
            max_seq_len, max_input_len = int(parameters["max_seq_len"]), int(parameters["max_input_len"])
            max_prompt_bytes = int(parameters.get("max_prompt_bytes") or 0)
        except ValueError as error:
            raise ModelSetupError(f"{source}: {error}") from None
        try:
            traffic = TrafficTable.from_json(parameters[TRAFFIC_PARAMETER], source) if parameters.get(TRAFFIC_PARAMETER) else None
        except TrafficTableError as error:
            raise ModelSetupError(str(error)) from None
        return cls(
            name=name,
            tokenizer_dir=Path(parameters["tokenizer_dir"]),
            max_seq_len=max_seq_len,
            max_input_len=max_input_len,
            add_special_tokens=_flag(parameters.get("add_special_tokens", "true")),
            triton_model=triton_model,
            max_prompt_bytes=max_prompt_bytes,
            context_logits=_flag(parameters.get("gather_context_logits", "false")),
            generation_logits=_flag(parameters.get("gather_generation_logits", "false")),
            llm_model=llm_model,
            ensemble=ensemble,
            traffic=traffic,
            takes_priority=takes_priority,
            max_batch_size=max_batch_size,
        )

    @classmethod
    def from_repository(cls, repository: str | Path, *, name: str, triton_model: str = "ensemble") -> ServedModel:
        """From a rendered Triton model repository on disk."""
        repository = Path(repository)
        model_config = _read_config(repository / triton_model / "config.pbtxt")
        preprocessing = _preprocessing_name(model_config)
        config = _read_config(repository / preprocessing / "config.pbtxt")
        return cls.from_parameters(
            _parameters(config),
            name=name,
            triton_model=triton_model,
            source=str(repository / preprocessing),
            llm_model=_llm_name(model_config),
            ensemble=_is_ensemble(model_config),
            takes_priority=PRIORITY_INPUT in {tensor.name for tensor in model_config.input},
            max_batch_size=model_config.max_batch_size,
        )

    @classmethod
    def from_triton(cls, triton_url: str, *, name: str, triton_model: str = "ensemble", timeout_s: float = 10.0) -> ServedModel:
        """From a running Triton (gRPC `host:port`), through its model-configuration API."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        try:
            client = grpcclient.InferenceServerClient(triton_url)
        except InferenceServerException as error:  # e.g. a URL with a scheme
            raise ModelSetupError(f"Triton at {triton_url}: {error.message() or error}") from None
        asked = triton_model
        try:
            model_config = client.get_model_config(triton_model, client_timeout=timeout_s).config
            asked = preprocessing = _preprocessing_name(model_config)
            config = client.get_model_config(preprocessing, client_timeout=timeout_s).config
        except InferenceServerException as error:
            raise ModelSetupError(_triton_setup_error(client, triton_url, asked, error, timeout_s)) from None
        finally:
            client.close()
        return cls.from_parameters(
            _parameters(config),
            name=name,
            triton_model=triton_model,
            source=f"{triton_url}/{preprocessing}",
            llm_model=_llm_name(model_config),
            ensemble=_is_ensemble(model_config),
            takes_priority=PRIORITY_INPUT in {tensor.name for tensor in model_config.input},
            max_batch_size=model_config.max_batch_size,
        )


def _triton_setup_error(client: grpcclient.InferenceServerClient, triton_url: str, triton_model: str, error: InferenceServerException, timeout_s: float) -> str:
    """One line: what was found at `triton_url` instead of a Triton serving `triton_model`."""
    from tritonclient.utils import InferenceServerException

    detail = " ".join(str(error.message() or error).split())
    if "unknown model" not in detail.lower():  # nothing answers, or what answers is not Triton's gRPC API
        what = "nothing answers there" if "connection refused" in detail.lower() else "no Triton gRPC API answers there"
        return f"cannot reach Triton at {triton_url}: {what} ({detail})"
    try:
        served = sorted(model.name for model in client.get_model_repository_index(client_timeout=timeout_s).models if model.state == "READY")
    except InferenceServerException:
        served = []
    return f"Triton at {triton_url} does not serve model {triton_model!r} (it serves: {', '.join(served) or 'none ready'})"


def _flag(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes")


def _read_config(path: Path) -> model_config_pb2.ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ModelSetupError(f"cannot read {path}: {error.strerror or error}") from None
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        raise ModelSetupError(f"{path}: {error}") from None
    return config


def _preprocessing_name(config: model_config_pb2.ModelConfig) -> str:
    """An ensemble's first step, else the BLS's preprocessing_model_name parameter."""
    steps = config.ensemble_scheduling.step
    return steps[0].model_name if steps else _parameters(config).get("preprocessing_model_name") or DEFAULT_PREPROCESSING


def _is_ensemble(config: model_config_pb2.ModelConfig) -> bool:
    return bool(config.ensemble_scheduling.step)


def _llm_name(config: model_config_pb2.ModelConfig) -> str:
    for step in config.ensemble_scheduling.step:
        if LLM_INPUT in step.input_map:
            name: str = step.model_name
            return name
    return _parameters(config).get("tensorrt_llm_model_name") or DEFAULT_LLM


def _parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}
