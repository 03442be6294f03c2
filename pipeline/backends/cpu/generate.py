"""Offline generation with a built cpu engine: tokenizer from the prepare artifact, refengine in-process."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.errors import PipelineError


class GenerationError(PipelineError):
    """A generation request was refused by the engine (bad prompt or sampling value)."""

    exit_code = 2
    default_hint = "check --prompt, --max-tokens and --temperature against the engine's limits (build.* in the config)"


@dataclass(frozen=True)
class Generation:
    prompt: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    finish_reason: str

    def to_json(self) -> dict:
        return asdict(self)


def generate_offline(
    engine_dir: Path,
    tokenizer_dir: Path,
    prompt: str,
    *,
    max_tokens: int,
    temperature: float,
    seed: int | None = None,
) -> Generation:
    import torch
    from transformers import AutoTokenizer

    from refengine import InvalidRequestError, LLMEngine, SamplingParams

    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    prompt_ids = tokenizer(prompt)["input_ids"]
    engine = LLMEngine.from_engine_dir(engine_dir)
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, end_id=tokenizer.eos_token_id)
        [result] = engine.generate([prompt_ids], params)
    except InvalidRequestError as exc:
        raise GenerationError(f"request refused: {exc}") from None
    completion = result.outputs[0]
    text = tokenizer.decode(list(completion.token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if not isinstance(text, str):  # one id list decodes to one str; transformers types decode for batches too
        raise TypeError(f"the tokenizer decoded one completion to a {type(text).__name__}, not a str")
    return Generation(prompt, list(prompt_ids), list(completion.token_ids), text, completion.finish_reason or "length")
