"""OpenAI request bodies (chat completions, completions) and how they map onto spd.v1 parameters.

What SPD serves: one choice (`n` = 1), `max_tokens` / `max_completion_tokens`, `temperature`
(OpenAI's default 1.0 when absent), `top_p`, `seed` (a fresh random one when absent, as OpenAI
samples without a seed), `stop` (a string or up to 16), `stream` with
`stream_options.include_usage`. Fields that would change the output in ways SPD does not implement
(penalties, logprobs, tools, logit_bias, n > 1, ...) are refused with a clear 400 rather than
silently ignored; purely informational ones (`user`, `metadata`, ...) are accepted.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

UNSUPPORTED = {  # field -> value that means "off" (anything else is refused)
    "frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "top_logprobs": None, "logit_bias": None,
    "tools": None, "tool_choice": None, "functions": None, "function_call": None, "response_format": None,
    "best_of": 1, "echo": False, "suffix": None, "audio": None, "modalities": None, "prediction": None,
}


class Unsupported(ValueError):
    """A request field SPD does not implement, with a value that matters."""

    def __init__(self, field: str, value):
        super().__init__(f"'{field}' = {value!r} is not supported by this server")
        self.field = field


class StreamOptions(BaseModel):
    include_usage: bool = False  # a last chunk with `usage` and no choices


class TextPart(BaseModel):
    type: str  # only "text" is served
    text: str = ""


class ChatMessage(BaseModel):
    role: str  # system | user | assistant (developer counts as system)
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            if any(p.type != "text" for p in self.content):
                raise Unsupported("messages[].content[].type", next(p.type for p in self.content if p.type != "text"))
            return "".join(p.text for p in self.content)
        return self.content or ""


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send many optional fields; see check()
    model: str | None = None  # must name the served model when given
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None

    def inputs(self) -> dict:
        """What is generated from: the SDK's prompt / messages keywords (each request kind says)."""
        raise NotImplementedError

    def check(self) -> None:
        if self.n != 1:
            raise Unsupported("n", self.n)
        for field, off in UNSUPPORTED.items():
            value = (self.model_extra or {}).get(field, off)
            if value != off and not (off is None and value in ([], {})):
                raise Unsupported(field, value)

    def params(self) -> dict:
        """Keyword arguments of SPDClient.generate / stream."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return {"max_tokens": self.max_completion_tokens or self.max_tokens,
                "temperature": 1.0 if self.temperature is None else self.temperature,
                "top_p": self.top_p, "stop": stop,
                "seed": random.getrandbits(63) if self.seed is None else self.seed}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)

    def inputs(self) -> dict:
        roles = {"developer": "system"}
        return {"messages": [(roles.get(m.role, m.role), m.text()) for m in self.messages]}


class CompletionRequest(OpenAIRequest):
    prompt: str | list[str]

    def inputs(self) -> dict:
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise Unsupported("prompt", f"a list of {len(prompt)} prompts")
            prompt = prompt[0]
        return {"prompt": prompt, "raw": True}  # a completion continues the text as is: no chat template
