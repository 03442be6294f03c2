"""Chat messages → the prompt text sent to the ensemble.

With a tokenizer that has a chat template, that template renders the messages (with the
generation prompt), through transformers' `apply_chat_template`. Templates usually write the BOS
token as text; the preprocessing model adds BOS itself when it encodes (`add_special_tokens`), so
a leading BOS text is removed to avoid a doubled BOS.

Without a template, the plain template below is used (the default model has none):

    <content of each system / developer message>\\n\\n
    User: <content>\\n
    Assistant: <content>\\n
    ...
    Assistant:

i.e. system text first as is, then one `User: ` / `Assistant: ` line per turn, and `Assistant:` to
prompt the answer (which the model continues, usually starting with a space).
"""

from __future__ import annotations

from collections.abc import Sequence

from clients.openai_server.tokenizer import PromptTokenizer

PLAIN_ROLE_PREFIX = {"user": "User: ", "assistant": "Assistant: "}
PLAIN_GENERATION_PROMPT = "Assistant:"


def plain_chat_prompt(messages: Sequence[dict[str, str]]) -> str:
    """The documented plain template (roles: system, user, assistant)."""
    system = [message["content"] for message in messages if message["role"] == "system"]
    parts = [text + "\n\n" for text in system]
    for message in messages:
        if message["role"] in PLAIN_ROLE_PREFIX:
            parts.append(PLAIN_ROLE_PREFIX[message["role"]] + message["content"] + "\n")
    parts.append(PLAIN_GENERATION_PROMPT)
    return "".join(parts)


def chat_prompt(messages: Sequence[dict[str, str]], tokenizer: PromptTokenizer) -> str:
    """The prompt for `messages` ({"role", "content"} with role system/user/assistant)."""
    if not tokenizer.has_chat_template:
        return plain_chat_prompt(messages)
    return strip_leading_bos(tokenizer.apply_chat_template(messages), tokenizer)


def strip_leading_bos(text: str, tokenizer: PromptTokenizer) -> str:
    """`text` without a leading BOS token text when the tokenizer adds BOS itself."""
    bos = tokenizer.bos_token
    if tokenizer.adds_bos and bos and text.startswith(bos):
        return text[len(bos) :]
    return text
