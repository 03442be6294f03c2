"""The pipeline's error types. The CLI is the one place that turns them into exit codes."""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error the CLI reports without a traceback."""

    exit_code = 1
    default_hint = "re-run with --verbose for the traceback"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint or self.default_hint


class SpecError(PipelineError):
    """The build config (YAML, `--set` overrides, or what they point at) is invalid."""

    exit_code = 2
    default_hint = "fix the build config; `trtllm-pipeline validate CONFIG` checks it without running anything"


class StoreLocationError(PipelineError):
    """The artifacts directory the user named cannot be used (not a directory, not writable, ...)."""

    exit_code = 2
    default_hint = "pass --artifacts DIR (or set TRTLLM_PIPELINE_ARTIFACTS) to a directory you can write"


class StageError(PipelineError):
    """A stage failed while running; nothing it wrote was kept."""

    exit_code = 1
    default_hint = "the failed stage left no artifact; fix the cause and run again (cached stages are reused)"


class ToolError(StageError):
    """An external command (trtllm-build, docker, tritonserver, ...) failed."""

    def __init__(self, command: list[str], returncode: int, stderr_tail: str, *, hint: str | None = None) -> None:
        self.command = list(command)
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        shown = " ".join(self.command)
        super().__init__(
            f"command failed with exit code {returncode}: {shown}\n{stderr_tail}".rstrip(),
            hint=hint,
        )


class ArtifactError(StageError):
    """An artifact on disk is missing, incomplete or does not match its manifest."""
