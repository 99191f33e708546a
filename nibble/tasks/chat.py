"""Prompts in a model's chat format: its Jinja ``chat_template`` from ``tokenizer_config.json``, or plain text.

Chat templates are the Hugging Face convention: a Jinja2 template over ``messages`` (a list of
``{"role", "content"}``), ``add_generation_prompt`` and the tokenizer's special tokens (``bos_token``,
``eos_token``, ...), rendered in a sandbox with ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols``
extension and a ``raise_exception`` function, as ``transformers``' ``apply_chat_template`` renders
them (the tests compare the two). A template renders whatever special tokens the model expects at the
start (a Llama-3 template writes ``<|begin_of_text|>`` itself), so a chat prompt gets no extra bos.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.sandbox
from jinja2.ext import loopcontrols

CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"  # where transformers >= 4.47 saves the template, beside the config


class PromptFormat:
    """Turns a problem into the text the policy is conditioned on.

    Args:
        chat_template: a Jinja chat template, or ``None`` for plain text (the system prompt, a blank
            line, then the problem and a newline).
        special_tokens: values of ``bos_token``, ``eos_token``, ... the template may refer to.
        system_prompt: the system turn (its content); ``None`` or ``""`` for none, in which case the
            template may add its own default (SmolLM2's does).
        source: where the template came from, for error messages.

    Raises:
        ValueError: naming ``source``, when the template is not valid Jinja.
    """

    def __init__(
        self,
        chat_template: str | None,
        *,
        special_tokens: dict[str, str] | None = None,
        system_prompt: str | None = None,
        source: str = "chat_template",
    ):
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self.system_prompt = system_prompt or None
        self.source = source
        self._template = None if chat_template is None else _compile(chat_template, source)

    @property
    def is_chat(self) -> bool:
        """Whether prompts go through a chat template (else plain text, conditioned after a bos token)."""
        return self._template is not None

    @classmethod
    def from_model_dir(cls, folder: str | Path, *, system_prompt: str | None = None) -> PromptFormat:
        """The chat template of the model (or tokenizer) directory ``folder``, plain text when it has none.

        The template is ``chat_template.jinja`` when the directory has one, else ``tokenizer_config.json``'s
        ``chat_template`` (a string, or a list of named templates of which ``"default"`` is taken);
        special tokens are the config's ``*_token`` entries.

        Raises:
            ValueError: naming the file, when it is not valid JSON or its template is not valid Jinja.
        """
        path, template_file = Path(folder) / CONFIG_FILE, Path(folder) / TEMPLATE_FILE
        if not path.is_file() and not template_file.is_file():
            return cls(None, system_prompt=system_prompt, source=str(path))
        config = _read_config(path) if path.is_file() else {}
        tokens = {}
        for key, value in config.items():
            if isinstance(value, dict):
                value = value.get("content")
            if key.endswith("_token") and isinstance(value, str):
                tokens[key] = value
        if template_file.is_file():
            template, source = template_file.read_text(encoding="utf-8"), str(template_file)
        else:
            template, source = _pick_template(config.get("chat_template"), path), f"{path}: chat_template"
        return cls(template, special_tokens=tokens, system_prompt=system_prompt, source=source)

    def render(self, problem: str) -> str:
        """The prompt text for ``problem``: system and user turns, then the assistant's generation prompt.

        Raises:
            ValueError: naming the template's source, when rendering it fails (a template may raise).
        """
        if self._template is None:
            return f"{self.system_prompt}\n\n{problem}\n" if self.system_prompt else f"{problem}\n"
        messages = [{"role": "user", "content": problem}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        try:
            return self._template.render(messages=messages, add_generation_prompt=True, **self.special_tokens)
        except jinja2.TemplateError as exc:
            raise ValueError(f"{self.source}: rendering failed ({exc})") from exc

    def __repr__(self) -> str:
        kind = "chat template" if self.is_chat else "plain text"
        return f"PromptFormat({kind}, source={self.source!r})"


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it as JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def _pick_template(value: object, path: Path) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise ValueError(f"{path}: chat_template lists templates {sorted(map(str, named))} but none named 'default'")
    raise ValueError(f"{path}: chat_template must be a string or a list of named templates, got {type(value).__name__}")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _compile(source_text: str, source: str) -> jinja2.Template:
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return environment.from_string(source_text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"{source}: not a valid Jinja template ({exc.message}, line {exc.lineno})") from exc
