"""A request's priority: a number in [0, 1], HIGHER runs first, 0.5 when none is given.

The polarity and the default are TensorRT-LLM's: the executor's `Request` takes a `PriorityType`
priority defaulting to 0.5 (`Request::kDefaultPriority`, cpp/include/tensorrt_llm/executor/executor.h),
and the LLM API's `generate_async(priority=...)` (1.3) takes a float in [0, 1] where a higher value
is scheduled first. The scheduler orders both its queues by (higher priority, arrival, sample index).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from refengine.errors import InvalidRequestError

LOWEST_PRIORITY = 0.0
HIGHEST_PRIORITY = 1.0
DEFAULT_PRIORITY = 0.5


def check_priority(value: Any) -> float:
    """`value` as a float if it is a priority in [0, 1]; `InvalidRequestError` naming `priority` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidRequestError("priority", f"must be a number in [{LOWEST_PRIORITY}, {HIGHEST_PRIORITY}], got {value!r}")
    priority = float(value)
    if math.isnan(priority) or not LOWEST_PRIORITY <= priority <= HIGHEST_PRIORITY:
        raise InvalidRequestError("priority", f"{value!r} is outside [{LOWEST_PRIORITY}, {HIGHEST_PRIORITY}] (higher runs first; default {DEFAULT_PRIORITY})")
    return priority
